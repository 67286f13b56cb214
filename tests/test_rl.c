/* Suite "rl": the RL loop end to end (placeholder while the loop is built). */
#include "tests/suites.h"

Suite *suite_rl(void)
{
    Suite *s = suite_create("rl");
    return s;
}
