/* Check suite of the rewards module (filled in by its issue). */
#include "tests/suites.h"

Suite *suite_rewards(void)
{
    return suite_create("rewards");
}
