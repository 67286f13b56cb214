/* quads compare: one config run once per precision recipe (same seeds, same
 * data), then report.md and plots over the runs. */
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "orchestrator/commands.h"
#include "orchestrator/rl.h"
#include "orchestrator/rl_config.h"

#define MAX_RECIPES 16

static void usage(FILE *f)
{
    fprintf(f, "usage: quads compare [--recipes R1,R2,...] [--config FILE] [--set KEY=VALUE]... [--out DIR] [--quiet]\n\n"
               "Runs the config once per recipe into DIR/RECIPE (same seeds and data) and writes\n"
               "DIR/report.md (final pass@1, mean and max log-prob gap, mismatch KL, tokens/s) with\n"
               "DIR/reward.svg, DIR/pass1.svg and DIR/gap.svg.\n\n"
               "  --recipes LIST  comma-separated among bf16, fp8, nvfp4, nvfp4-aqat, nvfp4-rac, quads,\n"
               "                  nvfp4-sym-qat, nvfp4-replay, quads-replay (default bf16,nvfp4,quads)\n"
               "  --config FILE   JSON config over the defaults\n"
               "  --set KEY=VALUE one knob (repeatable)\n"
               "  --out DIR       output directory (default ./runs/compare-<run.name>)\n"
               "  --quiet         no progress lines\n");
}

/* Splits list at commas into out (pointers into list); returns the count or -1. */
static int split_recipes(char *list, char **out)
{
    int n = 0;
    for (char *tok = strtok(list, ","); tok; tok = strtok(NULL, ",")) {
        if (n == MAX_RECIPES)
            return -1;
        for (int i = 0; i < n; i++)
            if (!strcmp(out[i], tok)) {
                fprintf(stderr, "quads compare: --recipes: '%s' named twice\n", tok);
                return -1;
            }
        out[n++] = tok;
    }
    return n;
}

/* The config of one recipe's run: file, sets, then the recipe and directory. */
static qd_config *recipe_config(const char *file, char **sets, int nsets, const char *recipe, const char *out)
{
    qd_config *cfg = qd_config_new();
    char v[4200];
    qd_status st = cfg ? QD_OK : qd_error(QD_ERR_NOMEM, "config");
    if (!st && file)
        st = qd_config_load_file(cfg, file);
    for (int i = 0; i < nsets && !st; i++)
        st = qd_config_set(cfg, sets[i]);
    if (!st)
        st = qd_config_set_str(cfg, "rollout.recipe", recipe, "--recipes");
    snprintf(v, sizeof v, "%s/%s", out, recipe);
    if (!st)
        st = qd_config_set_str(cfg, "run.dir", v, "--out");
    if (!st)
        st = qd_config_validate(cfg);
    if (st) {
        fprintf(stderr, "quads compare: %s\n", qd_last_error());
        qd_config_free(cfg);
        return NULL;
    }
    return cfg;
}

int qd_cmd_compare(int argc, char **argv)
{
    static const struct option longs[] = {{"recipes", required_argument, 0, 'r'}, {"config", required_argument, 0, 'c'},
                                          {"set", required_argument, 0, 's'},     {"out", required_argument, 0, 'o'},
                                          {"quiet", no_argument, 0, 'q'},         {"help", no_argument, 0, 'h'},
                                          {0, 0, 0, 0}};
    char deflist[] = "bf16,nvfp4,quads", *list = deflist, *recipes[MAX_RECIPES], out[4096] = "";
    const char *file = NULL, *outarg = NULL;
    char **sets = calloc((size_t)argc + 1, sizeof(char *));
    int c, nsets = 0, quiet = 0;
    optind = 1;
    while (sets && (c = getopt_long(argc, argv, "", longs, NULL)) != -1) {
        switch (c) {
        case 'r': list = optarg; break;
        case 'c': file = optarg; break;
        case 's': sets[nsets++] = optarg; break;
        case 'o': outarg = optarg; break;
        case 'q': quiet = 1; break;
        case 'h': usage(stdout); free(sets); return 0;
        default: usage(stderr); free(sets); return 2;
        }
    }
    int n = sets && optind == argc ? split_recipes(list, recipes) : -1;
    if (n <= 0) {
        if (n == 0 || optind < argc)
            usage(stderr);
        free(sets);
        return 2;
    }
    /* Check every recipe's config before the first (long) run starts. */
    qd_config *cfgs[MAX_RECIPES] = {0};
    qd_config *base = recipe_config(file, sets, nsets, recipes[0], ".");
    if (base)
        snprintf(out, sizeof out, "%s", outarg ? outarg : "");
    if (base && !outarg)
        snprintf(out, sizeof out, "runs/compare-%s", qd_config_knobs(base)->run.name);
    qd_config_free(base);
    int ok = base != NULL;
    for (int i = 0; i < n && ok; i++)
        ok = (cfgs[i] = recipe_config(file, sets, nsets, recipes[i], out)) != NULL;
    int configs_ok = ok;
    const char *dirs[MAX_RECIPES];
    char dbuf[MAX_RECIPES][4200];
    for (int i = 0; i < n && ok; i++) {
        printf("== recipe %s ==\n", recipes[i]);
        fflush(stdout);
        qd_rl_options o = {.log = stdout, .progress = !quiet};
        qd_status st = qd_rl_run(cfgs[i], &o, dbuf[i], sizeof dbuf[i]);
        dirs[i] = dbuf[i];
        if (st) {
            fprintf(stderr, "quads compare: %s: %s\n", recipes[i], qd_last_error());
            ok = 0;
        }
    }
    if (ok && qd_rl_report(dirs, (const char *const *)recipes, n, out)) {
        fprintf(stderr, "quads compare: report: %s\n", qd_last_error());
        ok = 0;
    }
    if (ok)
        printf("report: %s/report.md\n", out);
    int rc = ok ? 0 : configs_ok ? 1 : 2; /* 2: a config error, nothing ran */
    for (int i = 0; i < n; i++)
        qd_config_free(cfgs[i]);
    free(sets);
    return rc;
}
