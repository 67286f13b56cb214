/* quads bench (not yet implemented). */
#include <stdio.h>
#include "orchestrator/commands.h"

int qd_cmd_bench(int argc, char **argv)
{
    fprintf(stderr, "quads bench: not implemented yet\n");
    return 2;
}
