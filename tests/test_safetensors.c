/* Check suite of the safetensors module (filled in by its issue). */
#include "tests/suites.h"

Suite *suite_safetensors(void)
{
    return suite_create("safetensors");
}
