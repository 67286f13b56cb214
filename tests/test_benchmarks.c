/* Check suite of the benchmarks module (filled in by its issue). */
#include "tests/suites.h"

Suite *suite_benchmarks(void)
{
    return suite_create("benchmarks");
}
