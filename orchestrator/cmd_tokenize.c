/* quads tokenize (not yet implemented). */
#include <stdio.h>
#include "orchestrator/commands.h"

int qd_cmd_tokenize(int argc, char **argv)
{
    fprintf(stderr, "quads tokenize: not implemented yet\n");
    return 2;
}
