/* Check suite of the quant module (filled in by its issue). */
#include "tests/suites.h"

Suite *suite_quant(void)
{
    return suite_create("quant");
}
