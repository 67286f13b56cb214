/* Check suite of the tokenizer module (filled in by its issue). */
#include "tests/suites.h"

Suite *suite_tokenizer(void)
{
    return suite_create("tokenizer");
}
