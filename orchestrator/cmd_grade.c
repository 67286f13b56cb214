/* quads grade (not yet implemented). */
#include <stdio.h>
#include "orchestrator/commands.h"

int qd_cmd_grade(int argc, char **argv)
{
    fprintf(stderr, "quads grade: not implemented yet\n");
    return 2;
}
