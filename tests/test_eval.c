/* Check suite of the evaluation harness (stub). */
#include "tests/suites.h"
Suite *suite_eval(void)
{
    return suite_create("eval");
}
