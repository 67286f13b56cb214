/* quads quantize (not yet implemented). */
#include <stdio.h>
#include "orchestrator/commands.h"

int qd_cmd_quantize(int argc, char **argv)
{
    fprintf(stderr, "quads quantize: not implemented yet\n");
    return 2;
}
