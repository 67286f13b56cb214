/* quads rl: the RL run of a config (defaults: the embedded tiny model, the
 * quads recipe, the synthetic task), or the continuation of a run. */
#include <errno.h>
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include "orchestrator/commands.h"
#include "orchestrator/rl.h"
#include "orchestrator/rl_config.h"

static void usage(FILE *f)
{
    fprintf(f, "usage: quads rl [--config FILE] [--set KEY=VALUE]... [--backend B] [--mode M] [--quiet]\n"
               "       quads rl --resume RUN [--set KEY=VALUE]... [--backend B] [--mode M]\n\n"
               "GRPO with a rollout and a trainer of one precision recipe. Writes RUN/config.json,\n"
               "RUN/metrics.jsonl (one line a step), RUN/tb/ (TensorBoard event files of the same\n"
               "numbers and the config; --set log.tensorboard=false for none) and checkpoints\n"
               "RUN/step_XXXXXXXX; RUN defaults to ./runs/<run.name>. --resume continues RUN from its\n"
               "latest checkpoint (with RUN/config.json; --set may change e.g. run.steps) and reproduces\n"
               "the uninterrupted run bit for bit on the CPU.\n\n"
               "  --config FILE      JSON config over the defaults (quads rl --schema lists every knob)\n"
               "  --set KEY=VALUE    one knob (repeatable, after --config), e.g. --set trainer.lr=1e-6\n"
               "  --backend B        --set rollout.backend=B: auto (default: CUDA if present, else\n"
               "                     the CPU), cpu or cuda; both instances\n"
               "  --mode M           --set rollout.mode=M: exact (default: the CPU's bits) or fast\n"
               "                     (CUDA only)\n"
               "  --resume RUN       continue a run\n"
               "  --schema           print every knob with its default and range as JSON\n"
               "  --quiet            no progress line (on a terminal it names the step's phase and its ETA)\n\n"
               "Precision recipes (--set rollout.recipe=R, default quads), rollout / trainer:\n"
               "  bf16            BF16 / BF16\n"
               "  fp8             FP8 W8A8 / BF16\n"
               "  nvfp4           NVFP4 W4A4 / BF16\n"
               "  nvfp4-aqat      W4A4 / BF16 activations, NVFP4 fake-quant weights\n"
               "  nvfp4-rac       W4A4 + RAC / BF16\n"
               "  quads           W4A4 + RAC / BF16 activations, NVFP4 fake-quant weights\n"
               "  nvfp4-sym-qat   W4A4 / NVFP4 fake-quant weights and activations\n"
               "  nvfp4-replay    W4A4 / the rollout's W4A4 forward, straight-through backward\n"
               "                  (no rollout-trainer gap in exact mode)\n"
               "  quads-replay    W4A4 + RAC / the rollout's W4A4 + RAC forward (its channel sets),\n"
               "                  straight-through backward (no gap in exact mode)\n");
}

/* One override of the command line, applied in order after --config: a
 * --set KEY=VALUE, or a shorthand (--backend, --mode) for one key. */
typedef struct {
    const char *opt, *arg;
} override;

static qd_status apply(qd_config *cfg, const override *o)
{
    if (!strcmp(o->opt, "--set"))
        return qd_config_set(cfg, o->arg);
    return qd_config_set_str(cfg, !strcmp(o->opt, "--backend") ? "rollout.backend" : "rollout.mode", o->arg, o->opt);
}

/* Loads the config of argv into *cfg; 0 to proceed, else the exit status + 1. */
static int parse(int argc, char **argv, qd_config **cfg, const char **resume, int *quiet)
{
    static const struct option longs[] = {{"config", required_argument, 0, 'c'}, {"set", required_argument, 0, 's'},
                                          {"resume", required_argument, 0, 'r'}, {"schema", no_argument, 0, 'S'},
                                          {"quiet", no_argument, 0, 'q'}, {"help", no_argument, 0, 'h'},
                                          {"backend", required_argument, 0, 'b'},
                                          {"mode", required_argument, 0, 'm'}, {0, 0, 0, 0}};
    const char *file = NULL;
    int c, nsets = 0;
    override *sets = calloc((size_t)argc + 1, sizeof *sets);
    optind = 1;
    while (sets && (c = getopt_long(argc, argv, "", longs, NULL)) != -1) {
        switch (c) {
        case 'c': file = optarg; break;
        case 's': sets[nsets++] = (override){.opt = "--set", .arg = optarg}; break;
        case 'b': sets[nsets++] = (override){.opt = "--backend", .arg = optarg}; break;
        case 'm': sets[nsets++] = (override){.opt = "--mode", .arg = optarg}; break;
        case 'r': *resume = optarg; break;
        case 'q': *quiet = 1; break;
        case 'h': usage(stdout); free(sets); return 1;
        case 'S': {
            json_t *j = qd_config_schema_json();
            char *t = j ? json_dumps(j, JSON_INDENT(2) | JSON_PRESERVE_ORDER) : NULL;
            if (t)
                puts(t);
            free(t), json_decref(j), free(sets);
            return t ? 1 : 2;
        }
        default: usage(stderr); free(sets); return 3;
        }
    }
    if (!sets || optind < argc || (file && *resume)) {
        fprintf(stderr, "quads rl: %s\n", !sets ? "out of memory" : optind < argc ? "unexpected argument"
                                                                                   : "--config and --resume exclude each other (a run keeps its config)");
        free(sets);
        return 3;
    }
    char path[4200];
    if (*resume)
        snprintf(path, sizeof path, "%s/config.json", *resume);
    const char *load = *resume ? path : file;
    struct stat sb;
    qd_status st = QD_OK;
    if (*resume && stat(*resume, &sb) != 0)
        st = qd_error(QD_ERR_IO, "--resume %s: the run directory is missing: %s", *resume, strerror(errno));
    else if (*resume && access(path, F_OK) != 0)
        st = qd_error(QD_ERR_IO, "--resume %s: not a run directory (no config.json)", *resume);
    if (!st)
        st = (*cfg = qd_config_new()) ? QD_OK : qd_error(QD_ERR_NOMEM, "config");
    if (!st && load)
        st = qd_config_load_file(*cfg, load);
    for (int i = 0; i < nsets && !st; i++)
        st = apply(*cfg, &sets[i]);
    if (!st)
        st = qd_config_validate(*cfg);
    free(sets);
    if (st) {
        fprintf(stderr, "quads rl: %s\n", qd_last_error());
        return 3;
    }
    return 0;
}

int qd_cmd_rl(int argc, char **argv) { return qd_cmd_rl_hooked(argc, argv, NULL); }

int qd_cmd_rl_hooked(int argc, char **argv, const qd_rl_hooks *hooks)
{
    qd_config *cfg = NULL;
    const char *resume = NULL;
    int quiet = 0, rc = parse(argc, argv, &cfg, &resume, &quiet);
    if (rc) {
        qd_config_free(cfg);
        return rc - 1;
    }
    char dir[4096];
    qd_rl_options o = {.resume_dir = resume, .log = stdout, .progress = !quiet, .hooks = hooks};
    fflush(stdout);
    qd_status st = qd_rl_run(cfg, &o, dir, sizeof dir);
    qd_config_free(cfg);
    if (st) {
        fflush(stdout);
        fprintf(stderr, "quads rl: %s\n", qd_last_error());
        return 1;
    }
    return 0;
}
