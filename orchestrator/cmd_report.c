/* quads report: report.md, report.json and plots from existing RL runs, a row
 * a run or (--by-recipe) a row per recipe over its seeds. */
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "orchestrator/commands.h"
#include "orchestrator/report.h"
#include "orchestrator/rl.h"

static void usage(FILE *f)
{
    fprintf(f, "usage: quads report RUN... [--by-recipe] [--out DIR]\n\n"
               "Writes DIR/report.md and DIR/report.json (a row per run: recipe, held-out pass@1 first\n"
               "and final at the rollout's precision and in bf16, log-prob gap, mismatch KL, router\n"
               "agreement, tokens/s) and DIR/{reward,pass1,gap}.svg from RUN/metrics.jsonl and\n"
               "RUN/config.json. DIR defaults to the current directory.\n\n"
               "  --by-recipe  a row per recipe instead: the mean over its complete runs, with min-max\n"
               "               (report.json: and the standard deviation), a band over them in the plots;\n"
               "               the runs of a recipe must differ only in run.seed (and run.dir, run.name,\n"
               "               run.threads); a run short of run.steps is listed, not averaged\n");
}

/* The rows of --by-recipe: runs grouped by their config's recipe, rows in
 * the order of their first run. */
static qd_status by_recipe(char **dirs, int n, const char *out)
{
    qd_report_run *r = calloc((size_t)n, sizeof *r);
    qd_report_group *g = calloc((size_t)n, sizeof *g);
    char(*rec)[64] = calloc((size_t)n, sizeof *rec);
    qd_status st = r && g && rec ? QD_OK : qd_error(QD_ERR_NOMEM, "report");
    for (int i = 0; i < n && !st; i++) {
        qd_run_summary s;
        st = qd_run_summarize(dirs[i], NULL, &s);
        snprintf(rec[i], sizeof rec[i], "%s", s.recipe);
    }
    int ng = 0, k = 0;
    for (int i = 0; i < n && !st; i++) {
        int first = 1;
        for (int j = 0; j < i && first; j++)
            first = strcmp(rec[i], rec[j]) != 0;
        if (!first)
            continue;
        g[ng] = (qd_report_group){.name = rec[i], .runs = &r[k]};
        for (int j = i; j < n; j++)
            if (!strcmp(rec[i], rec[j]))
                r[k++] = (qd_report_run){.dir = dirs[j]}, g[ng].n++;
        ng++;
    }
    if (!st)
        st = qd_report_write(g, ng, out, NULL);
    free(r), free(g), free(rec);
    return st;
}

int qd_cmd_report(int argc, char **argv)
{
    static const struct option longs[] = {{"out", required_argument, 0, 'o'}, {"by-recipe", no_argument, 0, 'b'},
                                          {"help", no_argument, 0, 'h'}, {0, 0, 0, 0}};
    const char *out = ".";
    int c, group = 0;
    optind = 1;
    while ((c = getopt_long(argc, argv, "", longs, NULL)) != -1) {
        if (c == 'o')
            out = optarg;
        else if (c == 'b')
            group = 1;
        else {
            usage(c == 'h' ? stdout : stderr);
            return c == 'h' ? 0 : 2;
        }
    }
    if (optind == argc) {
        fprintf(stderr, "quads report: no run directory given (usage: quads report RUN... [--by-recipe] [--out DIR])\n");
        return 2;
    }
    for (int i = optind; i < argc; i++) { /* a name given by hand that is no run is a mistake, not a row */
        char p[4200];
        snprintf(p, sizeof p, "%s/config.json", argv[i]);
        int cfg = access(p, R_OK) == 0;
        snprintf(p, sizeof p, "%s/metrics.jsonl", argv[i]);
        if (!cfg || access(p, R_OK) != 0) {
            fprintf(stderr, "quads report: %s: not a run directory (config.json and metrics.jsonl expected)\n", argv[i]);
            return 1;
        }
    }
    qd_status st = group ? by_recipe(argv + optind, argc - optind, out)
                         : qd_rl_report((const char *const *)argv + optind, NULL, argc - optind, out);
    if (st) {
        fprintf(stderr, "quads report: %s\n", qd_last_error());
        return 1;
    }
    printf("report: %s/report.md\n", out);
    return 0;
}
