/* quads report: report.md and plots from existing RL runs. */
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include "orchestrator/commands.h"
#include "orchestrator/rl.h"

int qd_cmd_report(int argc, char **argv)
{
    static const struct option longs[] = {{"out", required_argument, 0, 'o'}, {"help", no_argument, 0, 'h'},
                                          {0, 0, 0, 0}};
    const char *out = ".";
    int c;
    optind = 1;
    while ((c = getopt_long(argc, argv, "", longs, NULL)) != -1) {
        if (c == 'o')
            out = optarg;
        else {
            fprintf(c == 'h' ? stdout : stderr,
                    "usage: quads report RUN... [--out DIR]\n\n"
                    "Writes DIR/report.md (a table per run: recipe, pass@1, log-prob gap, mismatch KL,\n"
                    "router agreement, tokens/s) and DIR/{reward,pass1,gap}.svg from RUN/metrics.jsonl\n"
                    "and RUN/config.json. DIR defaults to the current directory.\n");
            return c == 'h' ? 0 : 2;
        }
    }
    if (optind == argc) {
        fprintf(stderr, "quads report: no run directory given (usage: quads report RUN... [--out DIR])\n");
        return 2;
    }
    if (qd_rl_report((const char *const *)argv + optind, NULL, argc - optind, out)) {
        fprintf(stderr, "quads report: %s\n", qd_last_error());
        return 1;
    }
    printf("report: %s/report.md\n", out);
    return 0;
}
