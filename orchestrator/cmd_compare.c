/* quads compare: one config run once per precision recipe and seed (the same
 * data and config otherwise), then report.md, report.json and plots over the
 * runs, a row per recipe (orchestrator/report.h). */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>
#include <jansson.h>
#include "orchestrator/ckpt.h"
#include "orchestrator/commands.h"
#include "orchestrator/metrics.h"
#include "orchestrator/report.h"
#include "orchestrator/rl.h"
#include "orchestrator/rl_config.h"
#include "quant/fileio.h"

#define MAX_RECIPES 16
#define MAX_SEEDS 64
#define DIR_N 4200
#define MAX_JOBS 64

static void usage(FILE *f)
{
    fprintf(f, "usage: quads compare [--recipes R1,R2,...] [--seeds S1,S2,...] [--config FILE] [--set KEY=VALUE]...\n"
               "                     [--out DIR] [--continue | --report-only] [--jobs N] [--quiet]\n\n"
               "Runs the config once per recipe and seed, the same config otherwise, into DIR/RECIPE\n"
               "(DIR/RECIPE/seed-S with --seeds), with eval.bf16 on (the first and the last weights of each\n"
               "run are also evaluated with the bf16 recipe's rollout; --set eval.bf16=false turns it off),\n"
               "and writes DIR/report.md and DIR/report.json (a row per recipe: final pass@1 at the rollout's\n"
               "precision and in bf16, mean and max log-prob gap, mismatch KL, router agreement, tokens/s; each\n"
               "the mean over the recipe's complete runs with min-max, and the standard deviation in the JSON;\n"
               "then each recipe seed by seed against the bf16 row's final pass@1 and the nvfp4 row's gap)\n"
               "with DIR/reward.svg, DIR/pass1.svg and DIR/gap.svg (a line per recipe, the mean, and a band\n"
               "from min to max over its seeds). A run that fails is reported and not averaged; the other\n"
               "runs still go, and the exit status is 1.\n\n"
               "  --recipes LIST  comma-separated among bf16, fp8, nvfp4, nvfp4-aqat, nvfp4-rac, quads,\n"
               "                  nvfp4-sym-qat, nvfp4-replay, quads-replay (default bf16,nvfp4,quads)\n"
               "  --seeds LIST    comma-separated run.seed values, each run in DIR/RECIPE/seed-S\n"
               "                  (default: the config's run.seed, once, in DIR/RECIPE)\n"
               "  --config FILE   JSON config over the defaults\n"
               "  --set KEY=VALUE one knob (repeatable)\n"
               "  --out DIR       output directory (default ./runs/compare-<run.name>)\n"
               "  --continue      use what DIR holds: a finished run of the same config is kept, one with\n"
               "                  a checkpoint resumed, one stopped before its first checkpoint started\n"
               "                  again; a run of another config there is an error (without --continue,\n"
               "                  any run there is)\n"
               "  --report-only   run nothing: the report of what DIR holds for these recipes and seeds\n"
               "                  (a run not there is listed as missing, one short of run.steps as\n"
               "                  incomplete, one of another config as failed)\n"
               "  --jobs N        N runs at once, each in a process of its own (default 1), its output in\n"
               "                  RUNDIR.log (DIR/RECIPE/seed-S.log) instead of this one's; each run's numbers\n"
               "                  are the same as alone (exact mode's too), its tokens/s those of a shared\n"
               "                  device and host\n"
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

/* --seeds: distinct integers in run.seed's range; returns the count or -1. */
static int split_seeds(char *list, char (*out)[16])
{
    int n = 0;
    for (char *tok = strtok(list, ","); tok; tok = strtok(NULL, ",")) {
        uint64_t v;
        const char *why = !qd_cli_uint(tok, 2147483647, &v) ? "not an integer in 0..2147483647"
                        : n == MAX_SEEDS ? "more than 64 seeds" : NULL;
        for (int i = 0; i < n && !why; i++)
            why = strtoull(out[i], NULL, 10) == v ? "named twice" : NULL;
        if (why) {
            fprintf(stderr, "quads compare: --seeds: '%s': %s\n", tok, why);
            return -1;
        }
        snprintf(out[n++], sizeof out[0], "%llu", (unsigned long long)v);
    }
    if (n == 0)
        fprintf(stderr, "quads compare: --seeds: no seed named\n");
    return n ? n : -1;
}

/* The config of one run: eval.bf16 on, then the file and the sets, then the
 * recipe, the seed (NULL: the config's) and the directory. */
static qd_config *run_config(const char *file, char **sets, int nsets, const char *recipe, const char *seed,
                             const char *dir)
{
    qd_config *cfg = qd_config_new();
    qd_status st = cfg ? qd_config_set_str(cfg, "eval.bf16", "true", "quads compare") : qd_error(QD_ERR_NOMEM, "config");
    if (!st && file)
        st = qd_config_load_file(cfg, file);
    for (int i = 0; i < nsets && !st; i++)
        st = qd_config_set(cfg, sets[i]);
    if (!st)
        st = qd_config_set_str(cfg, "rollout.recipe", recipe, "--recipes");
    if (!st && seed)
        st = qd_config_set_str(cfg, "run.seed", seed, "--seeds");
    if (!st)
        st = qd_config_set_str(cfg, "run.dir", dir, "--out");
    if (!st)
        st = qd_config_validate(cfg);
    if (st) {
        fprintf(stderr, "quads compare: %s\n", qd_last_error());
        qd_config_free(cfg);
        return NULL;
    }
    return cfg;
}

typedef enum { RUN_FRESH, RUN_DONE, RUN_RESUME, RUN_CONFLICT } run_action;

/* What --continue does with dir: a config.json there must be cfg's (run.threads
 * aside, and run.dir: a run directory moved or unpacked elsewhere is the same run). A run that stopped before its first checkpoint loses its metrics
 * (unless look_only: --report-only changes nothing). */
static run_action existing_run(const char *dir, const qd_config *cfg, int look_only)
{
    char p[DIR_N + 32];
    snprintf(p, sizeof p, "%s/config.json", dir);
    if (access(p, F_OK) != 0)
        return RUN_FRESH;
    json_t *have, *want = qd_config_to_json(cfg);
    (void)qd_json_load_regular(p, JSON_REJECT_DUPLICATES, &have); /* NULL (unreadable, not a file): not this config */
    for (int i = 0; i < 2; i++) {
        json_object_del(json_object_get(i ? want : have, "run"), "threads");
        json_object_del(json_object_get(i ? want : have, "run"), "dir");
    }
    int same = have && json_equal(have, want);
    json_decref(have), json_decref(want);
    if (!same) {
        fprintf(stderr, "quads compare: %s holds a run of another config; remove it or give another "
                        "--out\n", p);
        return RUN_CONFLICT;
    }
    qd_run_summary s;
    int64_t step = -1;
    if (qd_run_summarize(dir, NULL, &s) == QD_OK && s.status == QD_RUN_OK)
        return RUN_DONE;
    if (look_only || (qd_ckpt_latest(dir, &step) == QD_OK && step >= 0))
        return RUN_RESUME;
    snprintf(p, sizeof p, "%s/metrics.jsonl", dir);
    if (access(p, F_OK) == 0 && unlink(p) != 0) {
        fprintf(stderr, "quads compare: --continue: %s: cannot remove the metrics of a run with no checkpoint\n", p);
        return RUN_CONFLICT;
    }
    return RUN_FRESH;
}

typedef struct {
    char *recipes[MAX_RECIPES], seeds[MAX_SEEDS][16], out[4096];
    int nr, ns; /* ns 0: no --seeds */
    const char *file;
    char **sets;
    int nsets, quiet, cont, report_only, jobs;
} compare_args;

typedef struct {
    int failed;
    char failure[1024]; /* why it failed */
} run_outcome;

typedef struct {
    qd_config *cfg;
    char dir[DIR_N];
    run_outcome out;
} one_run;

/* Every run's config, checked before the first (long) run starts; 0 on a bad one. */
static int make_configs(const compare_args *a, one_run *runs)
{
    int k = 0;
    for (int i = 0; i < a->nr; i++)
        for (int j = 0; j < (a->ns ? a->ns : 1); j++, k++) {
            one_run *r = &runs[k];
            int w = a->ns ? snprintf(r->dir, sizeof r->dir, "%s/%s/seed-%s", a->out, a->recipes[i], a->seeds[j])
                          : snprintf(r->dir, sizeof r->dir, "%s/%s", a->out, a->recipes[i]);
            if (w < 0 || (size_t)w >= sizeof r->dir) {
                fprintf(stderr, "quads compare: --out: path too long\n");
                return 0;
            }
            r->cfg = run_config(a->file, a->sets, a->nsets, a->recipes[i], a->ns ? a->seeds[j] : NULL, r->dir);
            if (!r->cfg)
                return 0;
        }
    return 1;
}

/* The line naming run r and what happens to it (what: "" or ": ..."). */
static void run_line(const one_run *r, const char *what)
{
    const qd_knobs *k = qd_config_knobs(r->cfg);
    printf("== recipe %s, seed %lld: %s%s ==\n", k->rollout.recipe, (long long)k->run.seed, r->dir, what);
    fflush(stdout);
}

/* Run r's failure, on stderr. */
static void run_failure(const one_run *r)
{
    const qd_knobs *k = qd_config_knobs(r->cfg);
    fprintf(stderr, "quads compare: %s, seed %lld: %s\n", k->rollout.recipe, (long long)k->run.seed, r->out.failure);
}

static const char *const action_what[] = {"", ": finished before, kept", ": resumed",
                                          ": another config's run there"};

/* A run that --continue keeps (RUN_DONE) or cannot touch (RUN_CONFLICT): its
 * line, and for a conflict its failure; nothing runs. */
static void settle(one_run *r, run_action act)
{
    run_line(r, action_what[act]);
    if (act == RUN_CONFLICT) {
        r->out.failed = 1;
        snprintf(r->out.failure, sizeof r->out.failure, "the directory holds a run of another config");
    }
}

/* Runs (or, with --continue, keeps or resumes) one run; a failure is kept in r. */
static void go(const compare_args *a, one_run *r)
{
    run_action act = a->cont || a->report_only ? existing_run(r->dir, r->cfg, a->report_only) : RUN_FRESH;
    if (a->report_only && act != RUN_CONFLICT)
        return; /* the report says what the directory holds */
    if (act == RUN_DONE || act == RUN_CONFLICT) {
        settle(r, act);
        return;
    }
    run_line(r, action_what[act]);
    qd_rl_options o = {.log = stdout, .progress = !a->quiet && a->jobs <= 1,
                       .resume_dir = act == RUN_RESUME ? r->dir : NULL};
    if (!qd_rl_run(r->cfg, &o, NULL, 0))
        return;
    r->out.failed = 1;
    snprintf(r->out.failure, sizeof r->out.failure, "%s", qd_last_error());
    run_failure(r);
}

/* A run in a child process (--jobs): its output into RUNDIR.log, its
 * failure (if any) into *shared, the status it exits with 1 if it failed. */
static void go_child(const compare_args *a, one_run *r, run_outcome *shared)
{
    char log[DIR_N + 8];
    snprintf(log, sizeof log, "%s.log", r->dir);
    if (qd_mkdirs_parent(log)) { /* DIR/RECIPE */
        snprintf(shared->failure, sizeof shared->failure, "%s", qd_last_error());
        shared->failed = 1;
        _exit(1);
    }
    int fd = open(log, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
    if (fd < 0 || dup2(fd, STDOUT_FILENO) < 0 || dup2(fd, STDERR_FILENO) < 0) {
        snprintf(shared->failure, sizeof shared->failure, "%.900s: cannot write: %s", log, strerror(errno));
        shared->failed = 1;
        _exit(1);
    }
    close(fd);
    setvbuf(stdout, NULL, _IOLBF, 0);
    go(a, r);
    fflush(stdout);
    fflush(stderr);
    *shared = r->out;
    _exit(r->out.failed ? 1 : 0);
}

/* --jobs N: the runs, at most N at a time, each forked from this process
 * before it touches a device (it has only read the configs); a child's
 * failure comes back through a shared mapping, a child that dies without
 * saying why is a failure too. */
static void go_jobs(const compare_args *a, one_run *runs, int n)
{
    run_outcome *shared =
        mmap(NULL, sizeof *shared * (size_t)n, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (shared == MAP_FAILED) {
        fprintf(stderr, "quads compare: --jobs: %s; the runs go one at a time\n", strerror(errno));
        for (int i = 0; i < n; i++)
            go(a, &runs[i]);
        return;
    }
    memset(shared, 0, sizeof *shared * (size_t)n);
    pid_t pid[MAX_JOBS];
    int slot_run[MAX_JOBS], busy = 0, next = 0;
    for (int j = 0; j < a->jobs; j++)
        pid[j] = 0;
    while (next < n || busy > 0) {
        if (next < n && busy < a->jobs) {
            int j = 0;
            while (pid[j])
                j++;
            one_run *r = &runs[next];
            if (a->cont) { /* a run kept or refused needs no process (looking changes nothing) */
                run_action act = existing_run(r->dir, r->cfg, 1);
                if (act == RUN_DONE || act == RUN_CONFLICT) {
                    settle(r, act);
                    next++;
                    continue;
                }
            }
            char what[DIR_N + 40];
            snprintf(what, sizeof what, ": started (its output in %s.log)", r->dir);
            run_line(r, what);
            fflush(stderr);
            pid_t c = fork();
            if (c == 0)
                go_child(a, r, &shared[next]);
            if (c < 0) {
                r->out.failed = 1;
                snprintf(r->out.failure, sizeof r->out.failure, "fork: %s", strerror(errno));
                run_failure(r);
                next++;
                continue;
            }
            pid[j] = c;
            slot_run[j] = next++;
            busy++;
            continue;
        }
        int status;
        pid_t c = wait(&status);
        if (c < 0) {
            if (errno == EINTR)
                continue;
            break; /* no children left: cannot happen while busy > 0 */
        }
        for (int j = 0; j < a->jobs; j++) {
            if (pid[j] != c)
                continue;
            one_run *r = &runs[slot_run[j]];
            const run_outcome *sr = &shared[slot_run[j]];
            int ok = WIFEXITED(status) && WEXITSTATUS(status) == 0;
            r->out.failed = !ok;
            if (!ok)
                snprintf(r->out.failure, sizeof r->out.failure, "%s",
                         sr->failed && sr->failure[0] ? sr->failure
                         : WIFSIGNALED(status)       ? "its process was killed by a signal"
                                                     : "its process exited without saying why");
            run_line(r, ok ? ": done" : ": failed");
            if (!ok)
                run_failure(r);
            pid[j] = 0;
            busy--;
        }
    }
    munmap(shared, sizeof *shared * (size_t)n);
}

/* "quads compare ARGS..." as it was typed (arguments with spaces quoted). */
static char *command_line(int argc, char **argv)
{
    size_t n = 16;
    for (int i = 1; i < argc; i++)
        n += strlen(argv[i]) + 3;
    char *s = malloc(n);
    if (!s)
        return NULL;
    strcpy(s, "quads compare");
    for (int i = 1; i < argc; i++) {
        int q = strpbrk(argv[i], " \t'\"") != NULL;
        strcat(s, q ? " '" : " ");
        strcat(s, argv[i]);
        if (q)
            strcat(s, "'");
    }
    return s;
}

static qd_status report(const compare_args *a, const one_run *runs, const char *command)
{
    int per = a->ns ? a->ns : 1;
    qd_report_run rr[MAX_RECIPES * MAX_SEEDS];
    qd_report_group g[MAX_RECIPES];
    for (int i = 0; i < a->nr; i++) {
        for (int j = 0; j < per; j++) {
            const one_run *r = &runs[i * per + j];
            rr[i * per + j] = (qd_report_run){.dir = r->dir, .failure = r->out.failed ? r->out.failure : NULL};
        }
        g[i] = (qd_report_group){.name = a->recipes[i], .runs = &rr[i * per], .n = per};
    }
    return qd_report_write(g, a->nr, a->out, command);
}

/* 0: proceed; else the exit status + 1. */
static int parse(int argc, char **argv, compare_args *a)
{
    static const struct option longs[] = {{"recipes", required_argument, 0, 'r'}, {"config", required_argument, 0, 'c'},
                                          {"set", required_argument, 0, 's'},     {"out", required_argument, 0, 'o'},
                                          {"seeds", required_argument, 0, 'S'},   {"continue", no_argument, 0, 'C'},
                                          {"report-only", no_argument, 0, 'R'},   {"jobs", required_argument, 0, 'j'},
                                          {"quiet", no_argument, 0, 'q'},         {"help", no_argument, 0, 'h'},
                                          {0, 0, 0, 0}};
    static char deflist[] = "bf16,nvfp4,quads";
    char *list = deflist, *seeds = NULL;
    const char *outarg = NULL;
    int c;
    optind = 1;
    while ((c = getopt_long(argc, argv, "", longs, NULL)) != -1) {
        switch (c) {
        case 'r': list = optarg; break;
        case 'c': a->file = optarg; break;
        case 's': a->sets[a->nsets++] = optarg; break;
        case 'o': outarg = optarg; break;
        case 'S': seeds = optarg; break;
        case 'C': a->cont = 1; break;
        case 'R': a->report_only = 1; break;
        case 'q': a->quiet = 1; break;
        case 'j': {
            char *end;
            long v = strtol(optarg, &end, 10);
            if (end == optarg || *end || v < 1 || v > MAX_JOBS) {
                fprintf(stderr, "quads compare: --jobs: '%s': a whole number from 1 to %d\n", optarg, MAX_JOBS);
                return 3;
            }
            a->jobs = (int)v;
            break;
        }
        case 'h': usage(stdout); return 1;
        default: usage(stderr); return 3;
        }
    }
    a->nr = optind == argc ? split_recipes(list, a->recipes) : -1;
    if (a->nr > 0 && seeds)
        a->ns = split_seeds(seeds, a->seeds);
    if (a->nr <= 0 || a->ns < 0) {
        if (a->nr == 0 || optind < argc)
            usage(stderr);
        return 3;
    }
    if (a->cont && a->report_only) {
        fprintf(stderr, "quads compare: --continue and --report-only exclude each other\n");
        return 3;
    }
    if (outarg) {
        snprintf(a->out, sizeof a->out, "%s", outarg);
        return 0;
    }
    qd_config *base = run_config(a->file, a->sets, a->nsets, a->recipes[0], NULL, ".");
    if (base)
        snprintf(a->out, sizeof a->out, "runs/compare-%s", qd_config_knobs(base)->run.name);
    qd_config_free(base);
    return base ? 0 : 3;
}

int qd_cmd_compare(int argc, char **argv)
{
    compare_args a = {.sets = calloc((size_t)argc + 1, sizeof(char *)), .jobs = 1};
    char *cmd = command_line(argc, argv); /* before the lists are split in place */
    int rc = a.sets && cmd ? parse(argc, argv, &a) : 2;
    if (rc) {
        free(a.sets), free(cmd);
        return rc - 1;
    }
    int n = a.nr * (a.ns ? a.ns : 1);
    one_run *runs = calloc((size_t)n, sizeof *runs);
    int configs_ok = runs && make_configs(&a, runs), failed = 0;
    if (configs_ok && a.jobs > 1 && !a.report_only && n > 1)
        go_jobs(&a, runs, n);
    else
        for (int i = 0; i < n && configs_ok; i++)
            go(&a, &runs[i]);
    for (int i = 0; i < n && configs_ok; i++)
        failed += runs[i].out.failed;
    qd_status st = configs_ok ? report(&a, runs, cmd) : QD_ERR_ARG;
    if (configs_ok && st)
        fprintf(stderr, "quads compare: report: %s\n", qd_last_error());
    if (configs_ok && !st)
        printf("report: %s/report.md%s\n", a.out, failed ? " (runs failed: listed there, not averaged)" : "");
    rc = !configs_ok ? 2 : st || failed ? 1 : 0; /* 2: a config error, nothing ran */
    for (int i = 0; runs && i < n; i++)
        qd_config_free(runs[i].cfg);
    free(runs), free(cmd), free(a.sets);
    return rc;
}
