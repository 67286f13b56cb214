/* Check suite of the orchestrator library. */
#include "tests/suites.h"

Suite *suite_orchestrator(void)
{
    return suite_create("orchestrator");
}
