/* The RL loop: setup, one step, evals, checkpoints and resume (rl.h). */
#define _GNU_SOURCE
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <jansson.h>
#ifdef _OPENMP
#include <omp.h>
#endif
#include "orchestrator/rl.h"
#include "backends/backend.h"
#include "models/checkpoint.h"
#include "models/tokenizer.h"
#include "orchestrator/ckpt.h"
#include "orchestrator/dp.h"
#include "orchestrator/grpo.h"
#include "orchestrator/metrics.h"
#include "orchestrator/rl_data.h"
#include "orchestrator/task.h"
#include "quant/fileio.h"
#include "quant/splitmix64.h"
#include "rewards/sandbox.h"

/* One rollout sample, after rewards. */
typedef struct {
    int prob;           /* index into the training set */
    int64_t pos;        /* data position of its prompt */
    int rlen;           /* response tokens (end token included) */
    float reward, score; /* reward (penalties included) and correctness */
    float adv;
    int grp;            /* its group in the step's (global) order: groups [0, kept) of all ranks */
} sample;

/* The samples a step trains on: (S, M) response tokens and rollout log-probs. */
typedef struct {
    int S, cap, M;
    sample *s;
    int32_t *tok;  /* (cap, M) */
    float *lp_ro;  /* (cap, M) rollout log-probs */
} sample_set;

typedef struct {
    const qd_config *cfg;
    const qd_knobs *k;             /* cfg's values */
    const qd_rl_options *o;
    char dir[4096], model_dir[4096];
    qd_model_config mcfg;
    qd_tokenizer *tok;
    int32_t end_id;
    qd_backend *rollout, *trainer, *ref;
    size_t nf;
    float *w;                      /* (nf) host weights: the model loaded, checkpoints, checksums */
    qd_rl_data data;               /* training and held-out problems */
    qd_code_opts code;             /* code tasks: how the sandbox runs the tests (reward.*) */
    qd_task_grader grader;         /* exact match, or code in the sandbox */
    int64_t *perm, perm_epoch;     /* (train.n) order of the current epoch */
    uint64_t seed;
    int64_t step, data_pos, opt_step, steps, P, G, M, J;
    qd_grpo_params gp;
    qd_adv_kind adv;
    qd_lr_schedule sched;
    qd_metrics *metrics;
    qd_rl_hooks hooks;             /* o->hooks, or none */
    qd_dp dp;                      /* data parallel: this rank and the collectives */
    double fwd_s;                  /* seconds in forward_resp since the train phase began */
    int32_t *ro_topk;              /* the rollout's router top-k over this step's first micro-batch
                                      (rollout_stats; NULL: a dense model, or no samples) */
    int ro_moe, ro_tok, ro_k;      /* its MoE layers, tokens and top_k */
    /* where this process's wall time went (the summary's time line; its steps
     * are the progress line's): from qd_rl_run's start, in evals and in
     * checkpoints, and how many */
    double t_begin, t_evals, t_ckpt;
    int64_t n_evals, n_ckpt;
} rl_run;

/* ---- small helpers */

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static uint64_t mix64(uint64_t x) { return qd_splitmix64_mix(x + QD_SPLITMIX64_GAMMA); }

/* Prefixes the current message with "where: " (copied first: qd_error writes
 * the buffer qd_last_error reads). */
static qd_status prefixed(qd_status st, const char *where)
{
    char msg[1024];
    snprintf(msg, sizeof msg, "%s", qd_last_error());
    return qd_error(st, "%s: %s", where, msg);
}

/* ... with "step S: where: " (where may be ""). */
static qd_status at_step(qd_status st, int64_t step, const char *where)
{
    char w[128];
    snprintf(w, sizeof w, "step %lld%s%s", (long long)step, *where ? ": " : "", where);
    return prefixed(st, w);
}

/* ---- run directory and model */

qd_status qd_rl_run_dir(const qd_config *cfg, char *buf, size_t n)
{
    const char *dir = qd_config_knobs(cfg)->run.dir, *name = qd_config_knobs(cfg)->run.name;
    char stamp[32];
    if (!*name) {
        time_t t = time(NULL);
        strftime(stamp, sizeof stamp, "%Y%m%d-%H%M%S", gmtime(&t));
        name = stamp;
    }
    int w = *dir ? snprintf(buf, n, "%s", dir) : snprintf(buf, n, "runs/%s", name);
    if (w < 0 || (size_t)w >= n)
        return qd_error(QD_ERR_ARG, "config: run.dir: path too long");
    return QD_OK;
}

/* The model folder: model.path, else the embedded tiny model, looked for in
 * ./models/tiny, $QD_SRCDIR/models/tiny, models/tiny beside the quads
 * executable (an in-tree build), the installed copy (QD_PKGDATADIR/tiny) and
 * last the source tree the program was built from (QD_SOURCE_DIR: an
 * out-of-tree build; after the installed copy, which an installed program
 * must use even when its source tree is still there). */
static qd_status model_dir(const qd_config *cfg, char *buf, size_t n)
{
    const char *p = qd_config_knobs(cfg)->model.path;
    if (*p) {
        snprintf(buf, n, "%s", p);
        return QD_OK;
    }
    char srcd[2048] = "", exed[2048] = "", exe[1024];
    const char *src = getenv("QD_SRCDIR");
    if (src)
        snprintf(srcd, sizeof srcd, "%.1000s/models/tiny", src);
    ssize_t len = readlink("/proc/self/exe", exe, sizeof exe - 1);
    if (len > 0) {
        exe[len] = '\0';
        char *slash = strrchr(exe, '/');
        if (slash)
            *slash = '\0';
        snprintf(exed, sizeof exed, "%s/models/tiny", exe);
    }
    const char *cands[] = {"models/tiny", srcd, exed, QD_PKGDATADIR "/tiny", QD_SOURCE_DIR "/models/tiny"};
    for (size_t i = 0; i < sizeof cands / sizeof cands[0]; i++) {
        char cfgp[4200];
        snprintf(cfgp, sizeof cfgp, "%.2048s/config.json", cands[i]);
        if (cands[i][0] && access(cfgp, R_OK) == 0) {
            snprintf(buf, n, "%s", cands[i]);
            return QD_OK;
        }
    }
    return qd_error(QD_ERR_IO, "config: model.path: empty and the embedded tiny model was found neither in "
                               "./models/tiny, beside the quads program, in %s/tiny nor in %s/models/tiny; set "
                               "model.path", QD_PKGDATADIR, QD_SOURCE_DIR);
}

/* The backend's message with the config keys that chose it in front (copied
 * first: qd_error writes the buffer qd_last_error reads); a memory plan that
 * does not fit names the keys that size it. */
static qd_status backend_error(const rl_run *r)
{
    char msg[1024];
    snprintf(msg, sizeof msg, "%s", qd_last_error());
    bool plan = strstr(msg, "memory plan") != NULL;
    return qd_error(QD_ERR_ARG, "config: rollout.backend %s, rollout.mode %s: %s%s", r->k->rollout.backend,
                    r->k->rollout.mode, msg,
                    plan ? " (the batches: rollout.prompts_per_step x rollout.group_size sequences, and "
                           "trainer.micro_batch, of the longest prompt (data.max_prompt_tokens bounds it) + "
                           "rollout.max_tokens tokens)" : "");
}

/* The largest calls the run makes on an instance, for its memory plan: the
 * trainer's micro-batches (forward, backward, AdamW), the rollout's
 * generation batch and the router measurement's forward (a micro-batch), the
 * KL reference's forwards (ref), and on rank 0 the held-out eval's generates
 * on the instance eval.precision names; prompts of the data's longest. */
static qd_workload workload_of(const rl_run *r, qd_role role, bool ref)
{
    const qd_knobs *k = r->k;
    int Tp = r->data.longest, M = (int)r->M, W = r->dp.world;
    qd_workload w = {.fwd_B = (int)k->trainer.micro_batch, .fwd_T = Tp + M,
                     .train = role == QD_ROLE_TRAINER && !ref};
    if (role == QD_ROLE_ROLLOUT)
        w.gen_B = (int)((r->P + W - 1) / W * r->G), w.gen_Tp = Tp, w.gen_M = M;
    bool on_trainer = strcmp(k->eval.precision, "trainer") == 0;
    if (!ref && r->dp.rank == 0 && k->eval.every > 0 && on_trainer == (role == QD_ROLE_TRAINER)) {
        int64_t n = (k->eval.limit > 0 ? k->eval.limit : 256) * k->eval.samples;
        int eb = n < QD_TASK_EVAL_CHUNK ? (int)n : QD_TASK_EVAL_CHUNK;
        w.gen_B = eb > w.gen_B ? eb : w.gen_B, w.gen_Tp = Tp, w.gen_M = M;
    }
    return w;
}

/* Bytes the instances made so far planned and do not hold yet (training
 * state, activations, KV cache): the next instance's plan is checked against
 * the free memory less these. */
static size_t still_planned(rl_run *r)
{
    qd_backend *made[3] = {r->trainer, r->rollout, r->ref};
    size_t n = 0;
    for (int i = 0; i < 3; i++) {
        qd_memory m;
        if (made[i] && qd_backend_memory(made[i], &m) == QD_OK && m.plan.total > m.peak.total)
            n += m.plan.total - m.peak.total;
    }
    return n;
}

static qd_backend *new_backend(rl_run *r, qd_role role, bool ref)
{
    qd_backend_options opt = {.role = role, .rac_ratio = r->k->rac.ratio, .num_threads = (int)r->k->run.threads,
                              .diagnostics = 1, .device = r->dp.local_rank, .workload = workload_of(r, role, ref),
                              .mem_reserved = still_planned(r),
                              .recompute = role == QD_ROLE_TRAINER && r->k->trainer.recompute};
    qd_recipe_parse(&opt.recipe, r->k->rollout.recipe); /* the config admits only valid names */
    qd_mode_parse(&opt.mode, r->k->rollout.mode);
    return qd_backend_init_by_name(r->k->rollout.backend, &r->mcfg, &opt);
}

/* ---- data (the problems: rl_data.c) */

static qd_status load_data(rl_run *r)
{
    const qd_rl_data *d = &r->data;
    qd_status st = qd_rl_data_load(&r->data, r->k, r->tok, r->seed);
    r->perm = st ? NULL : malloc(sizeof(int64_t) * d->train.n);
    if (!st && !r->perm)
        st = qd_error(QD_ERR_NOMEM, "training prompts");
    if (!st && r->o->log)
        fprintf(r->o->log, "data: %s, %zu training problems, %zu held out (%zu of %zu over data.max_prompt_tokens "
                           "skipped)\n", r->k->data.task, d->train.n, d->test.n, d->dropped, d->total);
    r->perm_epoch = -1;
    return st;
}

/* Code tasks grade in the sandbox (reward.*): no usable interpreter fails
 * the run here rather than every sample with sandbox_error. */
static qd_status code_grader(rl_run *r)
{
    r->grader = (qd_task_grader){.edit = r->hooks.code_text, .edit_ctx = r->hooks.ctx};
    if (!r->data.code)
        return QD_OK;
    qd_sandbox_level level;
    const char *python;
    qd_status st = qd_sandbox_isolation(&level, &python);
    if (st)
        return prefixed(st, "config: data.task: code rewards");
    long cpus = sysconf(_SC_NPROCESSORS_ONLN);
    r->code = qd_code_opts_default();
    r->code.jobs = r->k->reward.code_jobs ? (int)r->k->reward.code_jobs : cpus > 0 ? (int)(cpus < 4096 ? cpus : 4096) : 1;
    r->code.test_s = r->k->reward.code_timeout_s;
    r->code.mem_bytes = (size_t)r->k->reward.code_memory_mb << 20;
    r->grader.code = &r->code;
    if (r->o->log)
        fprintf(r->o->log, "code rewards: each sample's last ``` block against its problem's tests in the sandbox "
                           "(%s, %s), %d at once, %g s and %lld MiB a test\n", qd_sandbox_level_name(level), python,
                r->code.jobs, r->code.test_s, (long long)r->k->reward.code_memory_mb);
    return QD_OK;
}

/* The training problem at data position pos: epochs in a seeded order. */
static int problem_at(rl_run *r, int64_t pos)
{
    int64_t n = (int64_t)r->data.train.n, epoch = pos / n;
    if (epoch != r->perm_epoch) {
        for (int64_t i = 0; i < n; i++)
            r->perm[i] = i;
        if (r->k->data.shuffle) {
            uint64_t h = mix64(r->seed ^ mix64((uint64_t)epoch + 0x5eedull));
            for (int64_t i = n - 1; i > 0; i--) {
                h = mix64(h);
                int64_t j = (int64_t)(h % (uint64_t)(i + 1)), t = r->perm[i];
                r->perm[i] = r->perm[j];
                r->perm[j] = t;
            }
        }
        r->perm_epoch = epoch;
    }
    return (int)r->perm[pos % n];
}

/* ---- the rollout's RAC state, kept across a sync between refreshes (the old
 * channel sets stay) and copied for data-parallel checkpoints. Evaluations and
 * the router measurement do not touch the statistics (only the rollout's
 * generates ask for them: qd_generate_request.rac_stats). */

/* A copy of the rollout's RAC state (*rb bytes, malloc'ed) into *blob. */
static qd_status rac_snapshot(rl_run *r, void **blob, size_t *rb)
{
    *rb = qd_backend_rac_state_size(r->rollout);
    *blob = malloc(*rb + 1);
    if (!*blob)
        return qd_error(QD_ERR_NOMEM, "RAC state");
    return qd_backend_get_rac_state(r->rollout, *blob, *rb);
}

/* quads-replay: the trainer replays the rollout's products, so it takes the
 * rollout's RAC channel sets (those its next generates use) whenever they
 * change: after setup, a weight sync and a checkpoint's install. */
static qd_status replay_rac(rl_run *r)
{
    size_t tb = qd_backend_rac_state_size(r->trainer), rb;
    if (tb == 0)
        return QD_OK;
    void *blob;
    qd_status st = rac_snapshot(r, &blob, &rb);
    if (!st)
        st = rb == tb ? qd_backend_set_rac_state(r->trainer, blob, rb)
                      : qd_error(QD_ERR_SHAPE, "RAC state: rollout %zu bytes, trainer %zu", rb, tb);
    free(blob);
    return st;
}

/* ---- rollout */

static qd_status set_reserve(sample_set *ss, int S)
{
    if (S <= ss->cap)
        return QD_OK;
    sample *s = realloc(ss->s, sizeof *s * (size_t)S);
    if (s)
        ss->s = s;
    int32_t *t = realloc(ss->tok, sizeof *t * (size_t)S * ss->M);
    if (t)
        ss->tok = t;
    float *l = realloc(ss->lp_ro, sizeof *l * (size_t)S * ss->M);
    if (l)
        ss->lp_ro = l;
    if (!s || !t || !l)
        return qd_error(QD_ERR_NOMEM, "rollout samples");
    ss->cap = S;
    return QD_OK;
}

/* Generation batch gb of step: P prompts x G samples, of which this rank
 * generates groups g = rank, rank + W, ... (*nb samples), appended to all.
 * Sequence ids and the seed are global, so a sample's tokens do not depend on
 * the world size. */
static qd_status rollout_batch(rl_run *r, sample_set *all, int gb, int *nb)
{
    int W = r->dp.world, rk = r->dp.rank, Tp = 1, M = (int)r->M;
    int B = (int)((r->P - rk + W - 1) / W * r->G);
    *nb = B;
    qd_status st = set_reserve(all, all->S + B);
    if (st)
        return st;
    for (int b = 0; b < B; b++) {
        sample *s = &all->s[all->S + b];
        s->grp = rk + b / (int)r->G * W;
        s->pos = r->data_pos + s->grp;
        s->prob = problem_at(r, s->pos);
        if (r->data.plen[s->prob] > Tp)
            Tp = r->data.plen[s->prob];
    }
    int32_t *prompt = calloc((size_t)B * Tp, sizeof *prompt), *plen = malloc(sizeof *plen * B);
    uint64_t *seq = malloc(sizeof *seq * B);
    if (!prompt || !plen || !seq) {
        free(prompt), free(plen), free(seq);
        return qd_error(QD_ERR_NOMEM, "rollout batch");
    }
    for (int b = 0; b < B; b++) {
        const sample *s = &all->s[all->S + b];
        plen[b] = r->data.plen[s->prob];
        memcpy(prompt + (size_t)b * Tp, r->data.pids[s->prob], sizeof(int32_t) * plen[b]);
        seq[b] = (uint64_t)s->pos * (uint64_t)r->G + (uint64_t)(b % r->G);
    }
    int32_t *lens = malloc(sizeof *lens * B);
    qd_generate_request rq = {
        .B = B, .Tp = Tp, .prompt = prompt, .prompt_len = plen, .seq_id = seq,
        .seed = mix64(r->seed * 1000003ull + (uint64_t)r->step * 64 + (uint64_t)gb),
        .max_new_tokens = M, .temperature = (float)r->k->rollout.temperature, .top_k = (int)r->k->rollout.top_k,
        .top_p = (float)r->k->rollout.top_p, .stop = &r->end_id, .num_stop = 1,
        .rac_stats = 1, /* the rollout gathers the RAC statistics of the next pick */
        .no_diagnostics = 1, /* measured in one forward afterwards (rollout_stats) */
    };
    qd_generate_result res = {.tokens = all->tok + (size_t)all->S * M, .logp = all->lp_ro + (size_t)all->S * M,
                              .lengths = lens};
    st = lens ? qd_backend_generate(r->rollout, &rq, &res) : qd_error(QD_ERR_NOMEM, "rollout");
    for (int b = 0; b < B && !st; b++) {
        sample *s = &all->s[all->S + b];
        s->rlen = lens[b];
        const float *lp = res.logp + (size_t)b * M;
        for (int i = 0; i < s->rlen && !st; i++)
            if (!isfinite(lp[i]))
                st = qd_error(QD_ERR_NONFINITE, "rollout log-prob of sample %d token %d is %g", b, i, lp[i]);
    }
    free(prompt), free(plen), free(seq), free(lens);
    return st;
}

/* Rewards of samples [first, first + B) of all (correctness + overlong
 * penalty); code tasks count their verdicts and grading time into rs. */
static qd_status grade_batch(rl_run *r, sample_set *all, int first, int B, qd_rollout_stats *rs)
{
    int64_t buf = r->k->algo.overlong_buffer_len;
    double pen = r->k->algo.overlong_penalty, t0 = now_s();
    const qd_bench_record **recs = malloc(sizeof *recs * (size_t)B + 1);
    int32_t *len = malloc(sizeof *len * (size_t)B + 1);
    float *score = malloc(sizeof *score * (size_t)B + 1);
    qd_status st = recs && len && score ? QD_OK : qd_error(QD_ERR_NOMEM, "rewards");
    for (int b = 0; !st && b < B; b++) {
        const sample *s = &all->s[first + b];
        recs[b] = &r->data.train.rec[s->prob];
        len[b] = s->rlen;
    }
    if (!st)
        st = qd_task_grade(&r->grader, r->tok, all->tok + (size_t)first * r->M, (size_t)r->M, len, recs, B, score,
                           NULL, rs->verdicts);
    for (int b = 0; !st && b < B; b++) {
        sample *s = &all->s[first + b];
        s->score = score[b];
        s->reward = s->score + (float)qd_grpo_overlong_penalty(s->rlen, r->M, buf, pen);
    }
    if (r->grader.code)
        rs->grade_s += now_s() - t0;
    free(recs), free(len), free(score);
    return st;
}

/* Dynamic sampling: keeps the groups g of the last batch (all ranks' numbering)
 * with keep[g], while fewer than P were kept, in place. This rank holds group
 * g = rank + i W of the batch as its local group first_group + i; *local counts
 * its kept groups, whose grp becomes their place among all kept. Returns the
 * kept count over all ranks. */
static int compact_groups(rl_run *r, sample_set *all, int first_group, const uint8_t *keep, int kept, int *local)
{
    int G = (int)r->G, M = (int)r->M, W = r->dp.world, rk = r->dp.rank;
    for (int g = 0; g < r->P && kept < r->P; g++) {
        if (!keep[g])
            continue;
        if (g % W == rk) {
            int src = (first_group + (g - rk) / W) * G, dst = *local * G;
            if (src != dst) {
                memmove(&all->s[dst], &all->s[src], sizeof(sample) * G);
                memmove(all->tok + (size_t)dst * M, all->tok + (size_t)src * M, sizeof(int32_t) * G * M);
                memmove(all->lp_ro + (size_t)dst * M, all->lp_ro + (size_t)src * M, sizeof(float) * G * M);
            }
            for (int j = 0; j < G; j++)
                all->s[dst + j].grp = kept;
            (*local)++;
        }
        kept++;
    }
    return kept;
}

/* The step's rollouts: one batch, or under dynamic sampling batches until P
 * groups with signal (or algo.max_gen_batches). all->S = this rank's kept
 * samples; *kept_out = the kept groups of all ranks. rs: this rank's sums. */
static qd_status do_rollouts(rl_run *r, sample_set *all, qd_rollout_stats *rs, int *kept_out)
{
    bool dyn = r->k->algo.dynamic_sampling;
    int tries = dyn ? (int)r->k->algo.max_gen_batches : 1, kept = 0, local = 0;
    all->S = 0;
    for (int gb = 0; gb < tries && (gb == 0 || kept < r->P); gb++) {
        int first = all->S, B;
        qd_status st = rollout_batch(r, all, gb, &B);
        if (!st)
            st = grade_batch(r, all, first, B, rs);
        if (st)
            return st;
        r->data_pos += r->P;
        rs->gen_batches++;
        for (int b = first; b < first + B; b++) {
            rs->reward_sum += all->s[b].reward;
            rs->score_sum += all->s[b].score;
            rs->len_sum += all->s[b].rlen;
            rs->tokens += all->s[b].rlen;
        }
        rs->generated += B;
        all->S = first + B;
        int nl = B / (int)r->G;
        if (!dyn) {
            kept = (int)r->P, local = nl;
            continue;
        }
        uint8_t *keep = malloc((size_t)r->P), *lkeep = malloc((size_t)nl + 1);
        float *score = malloc(sizeof(float) * B + 1);
        if (!keep || !lkeep || !score)
            st = qd_error(QD_ERR_NOMEM, "dynamic sampling");
        for (int b = 0; b < B && !st; b++)
            score[b] = all->s[first + b].reward;
        if (!st)
            qd_grpo_filter_groups(lkeep, score, nl, r->G);
        if (!st)
            st = qd_dp_keep_flags(&r->dp, lkeep, keep, (int)r->P);
        if (!st)
            kept = compact_groups(r, all, first / (int)r->G, keep, kept, &local);
        all->S = local * (int)r->G;
        free(keep), free(lkeep), free(score);
        if (st)
            return st;
    }
    all->S = local * (int)r->G;
    *kept_out = kept;
    return QD_OK;
}

/* ---- trainer */

/* Token rows of samples [a, b): prompt + response, right-padded to *T. */
static qd_status build_batch(rl_run *r, const sample_set *ss, int a, int b, int32_t **tokens, int32_t **lens,
                             int *T)
{
    int n = b - a, t = 1;
    for (int i = a; i < b; i++)
        if (r->data.plen[ss->s[i].prob] + ss->s[i].rlen > t)
            t = r->data.plen[ss->s[i].prob] + ss->s[i].rlen;
    *tokens = calloc((size_t)n * t, sizeof(int32_t));
    *lens = malloc(sizeof(int32_t) * n);
    if (!*tokens || !*lens)
        return qd_error(QD_ERR_NOMEM, "trainer batch");
    for (int i = 0; i < n; i++) {
        const sample *s = &ss->s[a + i];
        int pl = r->data.plen[s->prob];
        memcpy(*tokens + (size_t)i * t, r->data.pids[s->prob], sizeof(int32_t) * pl);
        memcpy(*tokens + (size_t)i * t + pl, ss->tok + (size_t)(a + i) * r->M, sizeof(int32_t) * s->rlen);
        (*lens)[i] = pl + s->rlen;
    }
    *T = t;
    return QD_OK;
}

/* Response log-probs (n, M) of samples [a, b) under backend bk; logp_out's
 * padding is 0. Checks they are finite (what names where a NaN came from). */
static qd_status forward_resp(rl_run *r, qd_backend *bk, const sample_set *ss, int a, int b, float *out,
                              const char *what)
{
    int32_t *tokens = NULL, *lens = NULL;
    int T = 1;
    qd_status st = build_batch(r, ss, a, b, &tokens, &lens, &T);
    float *lp = st ? NULL : malloc(sizeof(float) * (size_t)(b - a) * T);
    if (!st && !lp)
        st = qd_error(QD_ERR_NOMEM, "trainer log-probs");
    /* at the rollout's temperature, so trainer and rollout log-probs (gap, ratio,
     * TIS) are of the same distribution */
    qd_batch bt = {.B = b - a, .T = T, .tokens = tokens, .lengths = lens,
                   .temperature = (float)r->k->rollout.temperature};
    double t0 = now_s();
    if (!st)
        st = qd_backend_forward(bk, &bt, lp, NULL);
    r->fwd_s += now_s() - t0; /* the log-probs come back to the host: the forward has finished */
    for (int i = 0; i < b - a && !st; i++) {
        const sample *s = &ss->s[a + i];
        int pl = r->data.plen[s->prob];
        float *o = out + (size_t)i * r->M;
        memset(o, 0, sizeof(float) * r->M);
        for (int k = 0; k < s->rlen; k++)
            o[k] = lp[(size_t)i * T + pl - 1 + k];
    }
    if (!st && bk == r->trainer && r->hooks.trainer_logp)
        r->hooks.trainer_logp(r->hooks.ctx, r->step, a, out, b - a, (int)r->M);
    for (int i = 0; i < b - a && !st; i++) {
        const float *o = out + (size_t)i * r->M;
        for (int k = 0; k < ss->s[a + i].rlen && !st; k++)
            if (!isfinite(o[k]))
                st = qd_error(QD_ERR_NONFINITE, "%s log-prob of sample %d token %d is %g", what, a + i, k, o[k]);
    }
    free(tokens), free(lens), free(lp);
    return st;
}

/* Backward of coef (n, M) for the trainer's last forward (samples [a, b)). */
static qd_status backward_resp(rl_run *r, const sample_set *ss, int a, int b, const float *coef)
{
    int T = 1;
    for (int i = a; i < b; i++)
        if (r->data.plen[ss->s[i].prob] + ss->s[i].rlen > T)
            T = r->data.plen[ss->s[i].prob] + ss->s[i].rlen;
    float *d = calloc((size_t)(b - a) * T, sizeof(float));
    if (!d)
        return qd_error(QD_ERR_NOMEM, "trainer gradient");
    for (int i = 0; i < b - a; i++) {
        const sample *s = &ss->s[a + i];
        int pl = r->data.plen[s->prob];
        for (int k = 0; k < s->rlen; k++)
            d[(size_t)i * T + pl - 1 + k] = coef[(size_t)i * r->M + k];
    }
    qd_status st = qd_backend_backward(r->trainer, d);
    free(d);
    return st;
}

/* The rollout's quantization errors and router choices, from forwards of the
 * rollout over all of this rank's samples of the step (prompts and responses,
 * a micro-batch at a time), summed: the generate measured nothing
 * (no_diagnostics: measuring every decode step cost as much as the decode
 * itself at a3b's shape), and these are the same tokens' activations in
 * batched passes; the sums over ranks are those of one rank. The first
 * forward is train_mini's first micro-batch (of mini-batch 0, at most
 * micro_batch samples), whose top-k router_agreement compares with the
 * trainer's. Rank 0 writes RUN/layers.json, which names the layers. */
static int local_first(const sample_set *ss, int grp);

static qd_status rollout_stats(rl_run *r, const sample_set *ss, int kept, qd_layer_stats *ls)
{
    int micro = (int)r->k->trainer.micro_batch;
    int b0 = kept > 0 ? local_first(ss, (int)((int64_t)kept / r->J)) : 0, n0 = b0 < micro ? b0 : micro;
    free(r->ro_topk);
    r->ro_topk = NULL;
    float *scratch = ss->S ? malloc(sizeof(float) * (size_t)micro * r->M) : NULL;
    qd_status st = ss->S && !scratch ? qd_error(QD_ERR_NOMEM, "rollout statistics") : QD_OK;
    for (int c = 0, d; c < ss->S && !st; c = d) {
        d = c == 0 && n0 > 0 ? n0 : (c + micro < ss->S ? c + micro : ss->S);
        qd_diagnostics dg;
        st = forward_resp(r, r->rollout, ss, c, d, scratch, "rollout (prefill)");
        if (!st)
            st = qd_backend_diagnostics(r->rollout, &dg);
        if (!st && c == 0) {
            char p[4400];
            snprintf(p, sizeof p, "%s/layers.json", r->dir);
            if (r->dp.rank == 0)
                st = qd_metrics_write_layers(p, &dg, &r->mcfg);
            if (!st)
                st = qd_layer_stats_quant(ls, &dg);
        } else if (!st) {
            for (int i = 0; i < dg.num_linear && i < ls->nlin; i++)
                ls->act_sq[i] += dg.act_err[i], ls->act_norm[i] += dg.act_norm[i];
        }
        if (!st && c == 0 && n0 > 0 && dg.num_moe_layers > 0) {
            size_t cnt = (size_t)dg.num_moe_layers * dg.num_tokens * dg.top_k;
            if (!(r->ro_topk = malloc(sizeof(int32_t) * cnt)))
                st = qd_error(QD_ERR_NOMEM, "router agreement");
            else {
                memcpy(r->ro_topk, dg.router_topk, sizeof(int32_t) * cnt);
                r->ro_moe = dg.num_moe_layers, r->ro_tok = dg.num_tokens, r->ro_k = dg.top_k;
            }
        }
    }
    free(scratch);
    return st;
}

/* Router agreement: the trainer's top-k (its last forward, samples [0, n) of
 * the step's first micro-batch) against the rollout's on the same tokens
 * (rollout_stats). */
static qd_status router_agreement(rl_run *r, qd_layer_stats *ls)
{
    qd_diagnostics dt;
    qd_status st = qd_backend_diagnostics(r->trainer, &dt);
    if (st || dt.num_moe_layers == 0 || !r->ro_topk)
        return st;
    st = qd_layer_stats_router(ls, dt.num_moe_layers);
    if (!st && (r->ro_tok != dt.num_tokens || r->ro_moe != dt.num_moe_layers || r->ro_k != dt.top_k))
        st = qd_error(QD_ERR_SHAPE, "router agreement: rollout and trainer saw different tokens");
    if (!st)
        qd_layer_stats_agree(ls, dt.router_topk, r->ro_topk, dt.num_tokens, dt.top_k);
    return st;
}

static void fill_mask(const sample_set *ss, int a, int b, int M, uint8_t *mask)
{
    for (int i = a; i < b; i++)
        for (int k = 0; k < M; k++)
            mask[(size_t)(i - a) * M + k] = k < ss->s[i].rlen;
}

/* One optimizer update on this rank's samples [a, b) of a mini-batch of nseq
 * sequences over all ranks. lp_old of these samples is filled by the first
 * forward when first is set. */
static qd_status train_mini(rl_run *r, const sample_set *ss, int a, int b, int64_t nseq, bool first,
                            float *lp_old, uint8_t *mask, qd_layer_stats *ls, qd_train_stats *ts)
{
    int M = (int)r->M, micro = (int)r->k->trainer.micro_batch;
    double toks = 0;
    for (int i = a; i < b; i++)
        toks += ss->s[i].rlen;
    qd_grpo_params gp = r->gp;
    /* the whole mini-batch's normalizer: token_mean needs every rank's tokens */
    qd_status st = gp.agg == QD_AGG_TOKEN_MEAN ? qd_dp_sum_f64(&r->dp, &toks, 1) : QD_OK;
    if (st)
        return prefixed(st, "token count");
    gp.norm = gp.agg == QD_AGG_TOKEN_MEAN ? toks : (double)nseq;
    size_t cap = (size_t)micro * M;
    float *lp = malloc(sizeof(float) * cap), *coef = malloc(sizeof(float) * cap);
    float *lref = gp.kl_coef > 0 ? malloc(sizeof(float) * cap) : NULL, *adv = malloc(sizeof(float) * micro);
    st = !lp || !coef || !adv || (gp.kl_coef > 0 && !lref) ? qd_error(QD_ERR_NOMEM, "trainer") : QD_OK;
    qd_backend_zero_grad(r->trainer);
    for (int c = a; c < b && !st; c += micro) {
        int d = c + micro < b ? c + micro : b, n = d - c;
        if (lref)
            st = forward_resp(r, r->ref, ss, c, d, lref, "reference");
        if (!st)
            st = forward_resp(r, r->trainer, ss, c, d, lp, "trainer");
        if (!st && first)
            memcpy(lp_old + (size_t)c * M, lp, sizeof(float) * (size_t)n * M);
        if (!st && first && c == 0 && !ls->agree)
            st = router_agreement(r, ls);
        if (st)
            break;
        for (int i = 0; i < n; i++)
            adv[i] = ss->s[c + i].adv;
        fill_mask(ss, c, d, M, mask);
        qd_grpo_batch gb = {.B = n, .T = M, .logp = lp, .logp_old = lp_old + (size_t)c * M,
                            .logp_rollout = ss->lp_ro + (size_t)c * M, .logp_ref = lref, .adv = adv, .mask = mask};
        qd_grpo_stats gs;
        st = qd_grpo_loss(coef, &gs, &gb, &gp);
        if (!st && !isfinite(gs.loss))
            st = qd_error(QD_ERR_NONFINITE, "loss is %g", gs.loss);
        if (st) {
            st = prefixed(st, "loss");
            break;
        }
        qd_train_stats_add(ts, &gs);
        st = backward_resp(r, ss, c, d, coef);
        if (st)
            st = prefixed(st, "backward");
    }
    /* each rank's loss is normalized by the whole mini-batch's count, so the
     * sum over ranks is the 1-rank gradient */
    if (!st && r->dp.world > 1 && (st = qd_dp_sum_grads(&r->dp, r->trainer, r->nf)))
        st = prefixed(st, "gradient all-reduce");
    if (!st) {
        qd_adamw opt = {.beta1 = (float)r->k->trainer.beta1, .beta2 = (float)r->k->trainer.beta2,
                        .eps = (float)r->k->trainer.eps, .weight_decay = (float)r->k->trainer.weight_decay,
                        .grad_clip = (float)r->k->trainer.grad_clip};
        ts->lr = qd_grpo_lr(r->sched, r->k->trainer.lr,
                            r->k->trainer.min_lr_ratio,
                            r->k->trainer.warmup_steps, r->steps * r->J, r->opt_step);
        opt.lr = (float)ts->lr;
        float gn = 0;
        st = qd_backend_optimizer_step(r->trainer, &opt, (int)(r->opt_step + 1), &gn);
        if (!st)
            r->opt_step++, ts->grad_norm += gn, ts->updates++;
    }
    free(lp), free(coef), free(lref), free(adv);
    return st;
}

/* The first of this rank's samples whose group (global order) is >= grp. */
static int local_first(const sample_set *ss, int grp)
{
    int i = 0;
    while (i < ss->S && ss->s[i].grp < grp)
        i++;
    return i;
}

/* The gap over the trained samples of all ranks (ng groups), in the 1-rank
 * order: every rank sends (sample place, length, logp_old (M), rollout logp (M)). */
static qd_status step_gap(rl_run *r, const sample_set *ss, const float *lp_old, int ng, qd_gap_stats *g)
{
    int G = (int)r->G, M = (int)r->M, S = ng * G;
    int32_t *place = malloc(sizeof(int32_t) * ss->S + 1), *rlen = malloc(sizeof(int32_t) * ss->S + 1);
    int32_t *all_len = calloc((size_t)S + 1, sizeof(int32_t));
    float *lo = calloc((size_t)S * M + 1, sizeof(float)), *lr = calloc((size_t)S * M + 1, sizeof(float));
    int *len = calloc((size_t)S + 1, sizeof(int));
    qd_status st = !place || !rlen || !all_len || !lo || !lr || !len ? qd_error(QD_ERR_NOMEM, "gap") : QD_OK;
    for (int i = 0; i < ss->S && !st; i++)
        place[i] = ss->s[i].grp * G + i % G, rlen[i] = ss->s[i].rlen;
    qd_dp_rows mine = {.n = ss->S, .M = M, .place = place, .rlen = rlen, .a = (float *)lp_old, .b = ss->lp_ro};
    qd_dp_rows all = {.n = S, .M = M, .rlen = all_len, .a = lo, .b = lr};
    if (!st)
        st = qd_dp_gather_rows(&r->dp, &mine, &all, S);
    for (int i = 0; i < S && !st; i++)
        len[i] = all_len[i];
    if (!st)
        st = qd_metrics_gap(g, lo, lr, len, S, M);
    free(place), free(rlen), free(all_len), free(lo), free(lr), free(len);
    return st;
}

/* Advantages, logp_old of the later mini-batches, the updates, the gap. This
 * rank trains its ss->S samples of the ng groups kept over all ranks; global
 * mini-batch j is groups [j ng / J, (j + 1) ng / J) of every rank. */
static qd_status train_step(rl_run *r, sample_set *ss, int ng, qd_layer_stats *ls, qd_train_stats *ts)
{
    int G = (int)r->G, M = (int)r->M, nl = ss->S / G;
    if (ng == 0) { /* dynamic sampling found no group with signal: no update, no gap */
        ts->gap = (qd_gap_stats){.mean_abs = NAN, .max_abs = NAN, .k3_kl = NAN, .pearson = NAN, .entropy = NAN};
        return QD_OK;
    }
    float *reward = malloc(sizeof(float) * ss->S + 1), *adv = malloc(sizeof(float) * ss->S + 1);
    float *lp_old = calloc((size_t)ss->S * M + 1, sizeof(float));
    uint8_t *mask = malloc((size_t)ss->S * M + 1);
    int *rlen = malloc(sizeof(int) * ss->S + 1);
    qd_status st = !reward || !adv || !lp_old || !mask || !rlen ? qd_error(QD_ERR_NOMEM, "trainer") : QD_OK;
    for (int i = 0; i < ss->S && !st; i++)
        reward[i] = ss->s[i].reward, rlen[i] = ss->s[i].rlen;
    if (!st) /* whole groups on each rank: the advantages are local */
        st = qd_grpo_advantages(adv, reward, nl, G, r->adv, r->k->algo.adv_eps);
    for (int i = 0; i < ss->S && !st; i++)
        ss->s[i].adv = adv[i];
    int J = (int)r->J;
    /* logp_old of mini-batches 1.. before any update (PPO's old policy) */
    int a1 = local_first(ss, (int)((int64_t)1 * ng / J)), micro = (int)r->k->trainer.micro_batch;
    for (int c = a1; c < ss->S && !st && J > 1; c += micro) {
        int d = c + micro < ss->S ? c + micro : ss->S;
        st = forward_resp(r, r->trainer, ss, c, d, lp_old + (size_t)c * M, "trainer");
    }
    for (int j = 0; j < J && !st; j++) {
        int lo = (int)((int64_t)j * ng / J), hi = (int)((int64_t)(j + 1) * ng / J);
        if (lo < hi)
            st = train_mini(r, ss, local_first(ss, lo), local_first(ss, hi), (int64_t)(hi - lo) * G, j == 0,
                            lp_old, mask, ls, ts);
    }
    if (!st)
        st = r->dp.world == 1 ? qd_metrics_gap(&ts->gap, lp_old, ss->lp_ro, rlen, ss->S, M)
                              : step_gap(r, ss, lp_old, ng, &ts->gap);
    free(reward), free(adv), free(lp_old), free(mask), free(rlen);
    return st;
}

/* ---- eval, sync */

/* Held-out pass@1 (eval.precision: on the rollout or the trainer instance);
 * its generates do not ask for RAC statistics, so they are left as they were. */
static qd_status run_eval(rl_run *r, qd_task_eval_result *ev)
{
    qd_backend *b = strcmp(r->k->eval.precision, "trainer") ? r->rollout : r->trainer;
    return qd_task_eval(b, r->tok, &r->data.test, (int)r->k->eval.limit, (int)r->k->eval.samples,
                        (float)r->k->eval.temperature, (uint64_t)r->k->eval.seed, (int)r->M, &r->grader, ev);
}

/* The held-out eval in bf16 (eval.bf16) of the trainer's current weights: a
 * rollout instance of the bf16 recipe on the run's backend and mode, made for
 * the call (its memory plan: the eval's generates) and freed after it. The
 * run's own instances are not touched, so the run's numbers do not change. */
static qd_status run_eval_bf16(rl_run *r, qd_task_eval_result *ev)
{
    const qd_knobs *k = r->k;
    int64_t n = (k->eval.limit > 0 ? k->eval.limit : 256) * k->eval.samples;
    qd_backend_options opt = {.recipe = QD_RECIPE_BF16, .role = QD_ROLE_ROLLOUT, .num_threads = (int)k->run.threads,
                              .device = r->dp.local_rank, .mem_reserved = still_planned(r),
                              .workload = {.gen_B = n < QD_TASK_EVAL_CHUNK ? (int)n : QD_TASK_EVAL_CHUNK,
                                           .gen_Tp = r->data.longest, .gen_M = (int)r->M}};
    qd_mode_parse(&opt.mode, k->rollout.mode);
    qd_backend *b = qd_backend_init_by_name(k->rollout.backend, &r->mcfg, &opt);
    if (!b)
        return backend_error(r);
    qd_status st = qd_backend_sync_from(b, r->trainer, NULL);
    if (!st)
        st = qd_task_eval(b, r->tok, &r->data.test, (int)k->eval.limit, (int)k->eval.samples,
                          (float)k->eval.temperature, (uint64_t)k->eval.seed, (int)r->M, &r->grader, ev);
    qd_backend_free(b);
    return st;
}

/* Before a RAC pick (data parallel): this rank's rollout takes the job's
 * summed statistics, so every rank picks the same channels from all the
 * rollouts. */
static qd_status rac_merge(rl_run *r)
{
    size_t n = qd_backend_rac_stats_count(r->rollout);
    double *e = malloc(sizeof(double) * (n ? n : 1));
    qd_status st = e ? qd_backend_get_rac_stats(r->rollout, e, n) : qd_error(QD_ERR_NOMEM, "RAC statistics");
    if (!st)
        st = qd_dp_sum_f64(&r->dp, e, n);
    if (!st)
        st = qd_backend_set_rac_stats(r->rollout, e, n);
    free(e);
    return st;
}

/* Trainer master weights -> rollout (quantize(W) once), device to device
 * when both live on one device (qd_backend_sync_from). The rollout re-picks
 * its RAC channels at every sync; between refreshes (rac.refresh) its own
 * state is installed again first (set_rac_state: the next sync builds with
 * those sets and keeps the errors gathered since the last pick), so a refresh
 * picks from the statistics of all rollouts since the previous one. */
static qd_status sync_weights(rl_run *r)
{
    int64_t every = r->k->rac.refresh;
    size_t rb = qd_backend_rac_state_size(r->rollout);
    bool keep = rb > 0 && (every == 0 || r->step % every != 0);
    void *rac = NULL;
    qd_status st = QD_OK;
    if (!keep && rb > 0 && r->dp.world > 1)
        st = rac_merge(r); /* the pick below sees every rank's rollouts */
    if (!st && keep)
        st = rac_snapshot(r, &rac, &rb);
    if (!st && keep)
        st = qd_backend_set_rac_state(r->rollout, rac, rb);
    free(rac);
    if (!st)
        st = qd_backend_sync_from(r->rollout, r->trainer, NULL);
    if (!st)
        st = replay_rac(r);
    return st ? at_step(st, r->step, "weight sync") : QD_OK;
}

/* ---- checkpoints (the files: ckpt.c) */

/* Saves step r->step: the trainer's weights and moments, and the RAC state
 * rac_job (the job's summed statistics under data parallelism) or, when
 * NULL, this rollout's own. */
static qd_status save_checkpoint(rl_run *r, const void *rac_job)
{
    size_t rb = qd_backend_rac_state_size(r->rollout);
    char tok[4400];
    snprintf(tok, sizeof tok, "%s/tokenizer.json", r->model_dir);
    qd_ckpt_data d = {.mcfg = &r->mcfg, .nf = r->nf, .w = r->w, .m = malloc(sizeof(float) * r->nf),
                      .v = malloc(sizeof(float) * r->nf), .rac = malloc(rb + 1), .rac_bytes = rb, .tokenizer = tok};
    d.params = qd_backend_params(r->trainer, &d.n_params);
    qd_ckpt_state s = {.step = r->step, .data_pos = r->data_pos, .optimizer_step = r->opt_step, .seed = r->seed};
    snprintf(s.recipe, sizeof s.recipe, "%s", r->k->rollout.recipe);
    qd_status st = !d.m || !d.v || !d.rac ? qd_error(QD_ERR_NOMEM, "checkpoint") : QD_OK;
    if (!st)
        st = qd_backend_get_weights(r->trainer, r->w, r->nf);
    if (!st)
        st = qd_backend_get_adam(r->trainer, d.m, d.v, r->nf);
    if (!st && rac_job)
        memcpy(d.rac, rac_job, rb);
    else if (!st)
        st = qd_backend_get_rac_state(r->rollout, d.rac, rb);
    if (!st)
        st = qd_ckpt_save(r->dir, &s, &d, (int)r->k->checkpoint.keep_last);
    free(d.m), free(d.v), free(d.rac);
    return st ? at_step(st, r->step, "checkpoint") : QD_OK;
}

/* A loaded checkpoint into both backends; a backend's refusal names the
 * checkpoint file the values came from. */
static qd_status install_checkpoint(rl_run *r, const qd_ckpt_data *d, const char *ck)
{
    char f[4400];
    qd_status st = qd_backend_set_weights(r->trainer, d->w, r->nf);
    snprintf(f, sizeof f, "%s/model.safetensors", ck);
    if (st)
        return prefixed(st, f);
    st = qd_backend_set_adam(r->trainer, d->m, d->v, r->nf);
    snprintf(f, sizeof f, "%s/optimizer.bin", ck);
    if (st)
        return prefixed(st, f);
    if (d->rac_bytes > 0 && r->dp.rank > 0)
        st = qd_dp_zero_rac(&r->mcfg, d->rac, d->rac_bytes); /* the job's statistics live on rank 0 only */
    if (!st) /* the rollout's weight sync below builds its RAC copies with these sets */
        st = qd_backend_set_rac_state(r->rollout, d->rac, d->rac_bytes);
    snprintf(f, sizeof f, "%s/rac.bin", ck);
    if (st)
        return prefixed(st, f);
    st = qd_backend_set_weights(r->rollout, d->w, r->nf);
    snprintf(f, sizeof f, "%s/model.safetensors", ck);
    if (st)
        return prefixed(st, f);
    st = replay_rac(r);
    snprintf(f, sizeof f, "%s/rac.bin", ck);
    return st ? prefixed(st, f) : QD_OK;
}

/* Loads the run's latest checkpoint into both backends. */
static qd_status load_checkpoint(rl_run *r)
{
    size_t rb = qd_backend_rac_state_size(r->rollout);
    qd_ckpt_data d = {.mcfg = &r->mcfg, .nf = r->nf, .w = r->w, .m = malloc(sizeof(float) * r->nf),
                      .v = malloc(sizeof(float) * r->nf), .rac = malloc(rb + 1), .rac_bytes = rb};
    d.params = qd_backend_params(r->trainer, &d.n_params);
    qd_ckpt_state want = {.seed = r->seed}, s;
    snprintf(want.recipe, sizeof want.recipe, "%s", r->k->rollout.recipe);
    char ck[4200];
    qd_status st = !d.m || !d.v || !d.rac ? qd_error(QD_ERR_NOMEM, "checkpoint") : QD_OK;
    if (!st)
        st = qd_ckpt_load(r->dir, &want, &s, &d);
    if (!st)
        st = qd_ckpt_path(ck, sizeof ck, r->dir, s.step);
    if (!st)
        st = install_checkpoint(r, &d, ck);
    if (!st)
        r->step = s.step, r->data_pos = s.data_pos, r->opt_step = s.optimizer_step;
    free(d.m), free(d.v), free(d.rac);
    return st;
}

/* ---- the step */

static bool eval_due(const rl_run *r)
{
    int64_t every = r->k->eval.every;
    return every > 0 && (r->step % every == 0 || r->step == r->steps);
}

static bool ckpt_due(const rl_run *r)
{
    int64_t every = r->k->checkpoint.every;
    return r->step == r->steps || (every > 0 && r->step % every == 0);
}

static qd_status log_eval(rl_run *r, json_t *o, json_t *tm)
{
    qd_task_eval_result ev, eb;
    double t0 = now_s();
    qd_status st = run_eval(r, &ev);
    if (st)
        return at_step(st, r->step, "eval");
    qd_metrics_put_eval(o, tm, &ev, now_s() - t0);
    bool bf16 = r->k->eval.bf16 && (r->step == 0 || r->step == r->steps);
    t0 = now_s();
    if (bf16 && (st = run_eval_bf16(r, &eb)))
        return at_step(st, r->step, "eval in bf16");
    if (bf16)
        qd_metrics_put_eval_as(o, tm, "bf16", &eb, now_s() - t0);
    if (r->o->log && r->o->progress && isatty(STDERR_FILENO))
        fputs("\r\033[K", stderr); /* clear the live progress line first */
    if (r->o->log)
        fprintf(r->o->log, "step %lld: held-out pass@1 %.4f (%d problems)", (long long)r->step, ev.pass1, ev.problems);
    if (r->o->log && bf16)
        fprintf(r->o->log, ", in bf16 %.4f", eb.pass1);
    if (r->o->log)
        fputc('\n', r->o->log);
    return QD_OK;
}

/* Held-out eval: on rank 0 only; the other ranks wait for it. */
static qd_status eval_step(rl_run *r, json_t *o, json_t *tm)
{
    double t0 = now_s();
    qd_status st = r->dp.rank == 0 ? log_eval(r, o, tm) : QD_OK;
    r->t_evals += now_s() - t0, r->n_evals++;
    char name[64];
    snprintf(name, sizeof name, "eval at step %lld", (long long)r->step);
    return st ? st : qd_dp_barrier(&r->dp, name);
}

/* Checkpoint: written by rank 0 once every rank has finished the step. */
static qd_status checkpoint_step(rl_run *r)
{
    double t0 = now_s();
    char name[64];
    snprintf(name, sizeof name, "checkpoint at step %lld", (long long)r->step);
    qd_status st = qd_dp_barrier(&r->dp, name);
    size_t rb = qd_backend_rac_state_size(r->rollout);
    void *rac = NULL;
    if (!st && r->dp.world > 1 && rb > 0) { /* the job's RAC statistics, not rank 0's share */
        st = rac_snapshot(r, &rac, &rb);
        if (!st)
            st = qd_dp_sum_rac(&r->dp, &r->mcfg, rac, rb);
    }
    if (!st && r->dp.rank == 0)
        st = save_checkpoint(r, rac);
    free(rac);
    r->t_ckpt += now_s() - t0, r->n_ckpt++;
    return st;
}

static bool checksum_due(const rl_run *r)
{
    int64_t every = r->k->dist.checksum_every;
    return r->dp.world > 1 && every > 0 && (r->step % every == 0 || r->step == r->steps);
}

/* What a step measured, on its way into metrics.jsonl. */
typedef struct {
    qd_rollout_stats rs;
    qd_train_stats ts;
    qd_layer_stats ls;
    int kept;
    double t[5]; /* seconds: rollout, train, sync, the whole step, the train phase's forwards */
} step_record;

/* The live progress line names the phase the step is in (on a terminal only). */
static void phase(const rl_run *r, qd_progress *pg, qd_phase ph)
{
    qd_progress_phase(pg, ph, now_s());
    if (ph == QD_PHASE_NONE)
        return;
    pg->step = r->step - 1; /* the last finished step (a resumed run's first is not 0) */
    if (r->o->progress)
        qd_progress_print(pg);
}

/* The step's metrics line (data parallel: of all ranks, with the weight
 * checksum when due), its eval when due, appended to metrics.jsonl. */
static qd_status record_step(rl_run *r, step_record *sr, qd_progress *pg)
{
    uint64_t cks = 0;
    qd_status st = QD_OK;
    if (r->dp.world > 1 && (st = qd_dp_reduce_stats(&r->dp, &sr->rs, &sr->ts, &sr->ls)))
        st = at_step(st, r->step, "metrics over ranks");
    if (!st && checksum_due(r))
        st = qd_backend_get_weights(r->trainer, r->w, r->nf);
    if (!st && checksum_due(r))
        st = qd_dp_check_weights(&r->dp, r->w, r->nf, r->step, &cks);
    if (st)
        return st;
    qd_layer_stats_ratios(&sr->ls);
    qd_step_metrics m = {.step = r->step, .data_pos = r->data_pos, .optimizer_step = r->opt_step,
                         .groups_kept = sr->kept, .rollout = &sr->rs, .train = &sr->ts, .layers = &sr->ls};
    memcpy(m.t, sr->t, sizeof m.t);
    json_t *o = qd_metrics_step_json(&m);
    if (!o)
        return qd_error(QD_ERR_NOMEM, "metrics");
    if (r->dp.world > 1) {
        char hex[20];
        snprintf(hex, sizeof hex, "%016llx", (unsigned long long)cks);
        json_object_set_new(o, "world_size", json_integer(r->dp.world));
        if (checksum_due(r))
            json_object_set_new(o, "weights_checksum", json_string(hex));
    }
    if (eval_due(r)) {
        phase(r, pg, QD_PHASE_EVAL);
        st = eval_step(r, o, json_object_get(o, "time"));
    }
    phase(r, pg, QD_PHASE_NONE);
    if (!st && r->metrics)
        st = qd_metrics_append(r->metrics, o);
    json_decref(o);
    return st;
}

static void progress(rl_run *r, const step_record *sr, qd_progress *pg)
{
    pg->step = r->step, pg->steps_done++, pg->elapsed_s += sr->t[3];
    pg->reward = sr->rs.reward_sum / (double)(sr->rs.generated ? sr->rs.generated : 1);
    pg->gap = sr->ts.gap.mean_abs;
    pg->tokens_per_s = sr->t[3] > 0 ? (double)sr->rs.tokens / sr->t[3] : 0;
    if (r->o->progress)
        qd_progress_print(pg);
}

static qd_status one_step(rl_run *r, sample_set *ss, qd_progress *pg)
{
    step_record sr = {0};
    double t0 = now_s();
    r->step++;
    phase(r, pg, QD_PHASE_ROLLOUT);
    qd_status st = do_rollouts(r, ss, &sr.rs, &sr.kept);
    if (st)
        st = at_step(st, r->step, "rollout");
    if (!st && (st = rollout_stats(r, ss, sr.kept, &sr.ls)))
        st = at_step(st, r->step, "diagnostics");
    if (!st && r->hooks.after_rollout)
        r->hooks.after_rollout(r->hooks.ctx, r->step);
    sr.t[0] = now_s() - t0;
    double t1 = now_s();
    r->fwd_s = 0;
    phase(r, pg, QD_PHASE_TRAIN);
    if (!st && (st = train_step(r, ss, sr.kept, &sr.ls, &sr.ts)))
        st = at_step(st, r->step, "");
    /* the optimizer step's update may still be queued on the device: it is
     * the train phase's (the sync would wait for it and show it as its own) */
    if (!st && (st = qd_backend_wait(r->trainer)))
        st = at_step(st, r->step, "train");
    sr.t[1] = now_s() - t1;
    sr.t[4] = r->fwd_s;
    double t2 = now_s();
    phase(r, pg, QD_PHASE_SYNC);
    if (!st)
        st = sync_weights(r);
    sr.t[2] = now_s() - t2;
    sr.t[3] = now_s() - t0;
    if (!st)
        st = record_step(r, &sr, pg);
    qd_layer_stats_free(&sr.ls);
    if (!st && ckpt_due(r))
        st = checkpoint_step(r);
    if (!st)
        progress(r, &sr, pg);
    return st;
}

/* ---- setup */

static qd_status setup(rl_run *r)
{
    char p[4400];
    qd_status st = model_dir(r->cfg, r->model_dir, sizeof r->model_dir);
    if (!st)
        st = qd_checkpoint_read_config(r->model_dir, &r->mcfg);
    snprintf(p, sizeof p, "%s/tokenizer.json", r->model_dir);
    if (!st)
        st = qd_tokenizer_load(p, &r->tok);
    if (!st)
        st = qd_task_end_id(r->tok, &r->end_id);
    if (!st && qd_tokenizer_n_ids(r->tok) > r->mcfg.vocab_size)
        st = qd_error(QD_ERR_FORMAT, "%s: %d ids, more than the model's vocab_size %d", p,
                      qd_tokenizer_n_ids(r->tok), r->mcfg.vocab_size);
    if (!st) /* the memory plans need the longest prompt */
        st = load_data(r);
    if (st)
        return st;
    r->trainer = new_backend(r, QD_ROLE_TRAINER, false);
    r->rollout = r->trainer ? new_backend(r, QD_ROLE_ROLLOUT, false) : NULL;
    if (!r->rollout)
        return backend_error(r);
    r->nf = qd_backend_num_floats(r->trainer);
    r->w = malloc(sizeof(float) * r->nf);
    if (!r->w)
        return qd_error(QD_ERR_NOMEM, "weights");
    int np;
    const qd_param_info *pi = qd_backend_params(r->trainer, &np);
    st = qd_checkpoint_load(r->model_dir, pi, np, r->w);
    if (!st && r->k->algo.kl_coef > 0) {
        r->ref = new_backend(r, QD_ROLE_TRAINER, true);
        st = r->ref ? qd_backend_set_weights(r->ref, r->w, r->nf) : backend_error(r);
    }
    if (!st)
        st = qd_backend_set_weights(r->trainer, r->w, r->nf);
    if (!st)
        st = qd_backend_set_weights(r->rollout, r->w, r->nf);
    if (!st)
        st = replay_rac(r);
    return st ? st : code_grader(r);
}

static void init_params(rl_run *r)
{
    const qd_knobs *k = r->k;
    r->seed = (uint64_t)k->run.seed;
    r->steps = k->run.steps;
    r->P = k->rollout.prompts_per_step;
    r->G = k->rollout.group_size;
    r->M = k->rollout.max_tokens;
    r->J = k->trainer.mini_batches;
    qd_grpo_params_from_config(&r->gp, r->cfg);
    r->adv = (qd_adv_kind)qd_grpo_adv_kind_parse(k->algo.advantage);
    r->sched = (qd_lr_schedule)qd_grpo_lr_schedule_parse(k->trainer.lr_schedule);
    if (r->o->hooks)
        r->hooks = *r->o->hooks;
}

static void run_free(rl_run *r, sample_set *ss)
{
    qd_metrics_close(r->metrics);
    qd_backend_free(r->rollout);
    qd_backend_free(r->trainer);
    qd_backend_free(r->ref);
    qd_tokenizer_free(r->tok);
    qd_rl_data_free(&r->data);
    free(r->perm), free(r->w), free(r->ro_topk);
    free(ss->s), free(ss->tok), free(ss->lp_ro);
}

/* A new run: the directory must not hold another run's metrics. */
static qd_status check_new(rl_run *r, const char *metrics)
{
    if (access(metrics, F_OK) == 0)
        return qd_error(QD_ERR_ARG, "%s: a run already lives here; resume it with --resume %s or pick another "
                                    "run.name", r->dir, r->dir);
    return QD_OK;
}

/* The resolved config, one line a section ("trainer: lr=1e-05 ..."). */
static void print_config(const qd_config *cfg, FILE *f)
{
    json_t *j = qd_config_to_json(cfg), *sec, *v;
    const char *name, *key;
    json_object_foreach(j, name, sec) {
        fprintf(f, "  %s:", name);
        json_object_foreach(sec, key, v) {
            char *t = json_dumps(v, JSON_ENCODE_ANY | JSON_REAL_PRECISION(6));
            fprintf(f, " %s=%s", key, t ? t : "?");
            free(t);
        }
        fputc('\n', f);
    }
    json_decref(j);
}

/* Each instance's memory plan, one line each, and the bytes free at its start. */
static void print_memory(rl_run *r, FILE *f)
{
    qd_backend *b[3] = {r->trainer, r->rollout, r->ref};
    const char *name[3] = {"trainer", "rollout", "reference"};
    for (int i = 0; i < 3; i++) {
        qd_memory m;
        char plan[512], fr[32];
        if (!b[i] || qd_backend_memory(b[i], &m) != QD_OK || m.plan.total == 0)
            continue;
        qd_mem_plan_format(&m.plan, plan, sizeof plan);
        qd_format_bytes(m.free_at_init, fr, sizeof fr);
        fprintf(f, "memory plan of the %s: %s; %s free at its start\n", name[i], plan, fr);
    }
}

/* The final line: held-out pass@1 of the first and the last eval of the run
 * (metrics.jsonl, so a resumed run reports its start too). */
static void print_summary(rl_run *r, const char *metrics, const qd_progress *pg)
{
    double *x = NULL, *y = NULL;
    int64_t n = 0;
    if (qd_metrics_read_series(metrics, "eval.pass1", &x, &y, &n) == QD_OK && n >= 2)
        fprintf(r->o->log, "held-out pass@1: %.4f at step %lld, %.4f at step %lld\n", y[0], (long long)x[0],
                y[n - 1], (long long)x[n - 1]);
    free(x), free(y);
    if (qd_metrics_read_series(metrics, "eval.bf16.pass1", &x, &y, &n) == QD_OK && n >= 2)
        fprintf(r->o->log, "held-out pass@1 in bf16: %.4f at step %lld, %.4f at step %lld\n", y[0],
                (long long)x[0], y[n - 1], (long long)x[n - 1]);
    free(x), free(y);
    double all = now_s() - r->t_begin;
    fprintf(r->o->log,
            "time: %.1f s in all; steps: %lld in %.1f s; evals: %lld in %.1f s; checkpoints: %lld in %.1f s; "
            "the rest (start, data, metrics, end): %.1f s\n",
            all, (long long)pg->steps_done, pg->elapsed_s, (long long)r->n_evals, r->t_evals, (long long)r->n_ckpt,
            r->t_ckpt, all - pg->elapsed_s - r->t_evals - r->t_ckpt);
    fprintf(r->o->log, "run directory: %s\n", r->dir);
}

static qd_status run_loop(rl_run *r, sample_set *ss)
{
    char metrics[4400];
    snprintf(metrics, sizeof metrics, "%s/metrics.jsonl", r->dir);
    char cfgp[4400];
    snprintf(cfgp, sizeof cfgp, "%s/config.json", r->dir);
    bool files = r->dp.rank == 0; /* rank 0 alone writes the run directory */
    qd_status st = r->o->resume_dir || !files ? QD_OK : check_new(r, metrics);
    if (!st) /* before the run directory: a backend that cannot start leaves nothing behind */
        st = setup(r);
    if (!st && r->o->resume_dir) /* on every rank: nothing in a checkpoint belongs to one rank */
        st = load_checkpoint(r);
    if (!st && !r->o->resume_dir && files)
        st = qd_mkdirs(r->dir);
    if (!st && files) /* on resume kept up to date with --set (e.g. more steps) once the checkpoint fits */
        st = qd_config_save(r->cfg, cfgp);
    if (!st && r->o->resume_dir && files)
        st = qd_metrics_truncate(metrics, r->step);
    if (!st && files)
        st = qd_metrics_open(&r->metrics, metrics);
    if (!st && files && r->k->log.tensorboard)
        st = qd_metrics_tensorboard(r->metrics, r->dir, r->step);
    if (st)
        return st;
    if (r->o->log) {
        char sum[2048];
        qd_config_summary(r->cfg, sum, sizeof sum);
        fprintf(r->o->log, "%sresolved config (%s/config.json):\n", sum, r->dir);
        print_config(r->cfg, r->o->log);
        fprintf(r->o->log, "%s %s at step %lld of %lld on the %s backend\n", r->o->resume_dir ? "resuming" : "starting",
                r->dir, (long long)r->step, (long long)r->steps, qd_backend_name(r->trainer));
        print_memory(r, r->o->log);
        if (r->dp.world > 1)
            fprintf(r->o->log, "data parallel over %d ranks: group g of each generation batch on rank g mod %d; "
                               "rank 0 writes the run directory\n", r->dp.world, r->dp.world);
        const char *rec = r->k->rollout.recipe;
        double rac = r->k->rac.ratio;
        int narrow = r->mcfg.hidden_size < r->mcfg.moe_intermediate_size || !r->mcfg.moe_intermediate_size
                         ? r->mcfg.hidden_size : r->mcfg.moe_intermediate_size;
        int uses_rac = !strcmp(rec, "quads") || !strcmp(rec, "nvfp4-rac") || !strcmp(rec, "quads-replay");
        if (uses_rac && (int64_t)(rac * narrow) / 16 == 0)
            fprintf(r->o->log, "note: rac.ratio %g picks no channel on %d-wide layers (whole 16s only): "
                               "RAC is off in some layers\n", rac, narrow);
        fflush(r->o->log);
    }
    if (r->step == 0 && r->k->eval.every > 0) {
        json_t *o = json_pack("{s:I}", "step", (json_int_t)0), *tm = json_object();
        json_object_set_new(o, "time", tm);
        st = eval_step(r, o, tm);
        if (!st && r->metrics)
            st = qd_metrics_append(r->metrics, o);
        json_decref(o);
    }
    ss->M = (int)r->M;
    qd_progress pg = {.steps = r->steps};
    while (!st && r->step < r->steps)
        st = one_step(r, ss, &pg);
    if (!st && r->o->log)
        print_summary(r, metrics, &pg);
    return st;
}

/* Joins the data-parallel job the launcher's environment describes (world
 * size 1: none). The run id is the hash of the resolved config, so ranks
 * started with different configs refuse each other. Only rank 0 logs. */
static qd_status join(rl_run *r, const qd_rl_options *o, qd_rl_options *quiet)
{
    qd_dist_env env;
    qd_status st = qd_dist_env_read(&env);
    if (st)
        return st;
    if (env.world_size > 1 && r->P < env.world_size)
        return qd_error(QD_ERR_ARG, "config: rollout.prompts_per_step: %lld, below the world size %d (every rank "
                                    "takes whole groups: at least one each)", (long long)r->P, env.world_size);
    json_t *j = qd_config_to_json(r->cfg);
    char *text = j ? json_dumps(j, JSON_COMPACT | JSON_SORT_KEYS) : NULL;
    json_decref(j);
    if (!text)
        return qd_error(QD_ERR_NOMEM, "run id");
    st = qd_dp_open(&r->dp, &env, qd_rdzv_run_id(text), r->k->dist.timeout_s);
    free(text);
    if (!st && env.rank != 0) {
        *quiet = (qd_rl_options){.resume_dir = o->resume_dir, .hooks = o->hooks};
        r->o = quiet;
    }
    return st;
}

/* A resumed run lives in the directory it resumes, whatever run.dir and
 * run.name say (a moved run, or --set run.dir): *own (NULL when cfg already
 * names that directory) is cfg with run.dir set to it, so that config.json
 * records where the run is. */
static qd_status resume_config(const qd_config *cfg, const char *dir, qd_config **own)
{
    char named[4096];
    *own = NULL;
    qd_status st = qd_rl_run_dir(cfg, named, sizeof named);
    if (st || strcmp(named, dir) == 0)
        return st;
    *own = qd_config_dup(cfg);
    if (!*own)
        return qd_error(QD_ERR_NOMEM, "config");
    return qd_config_set_str(*own, "run.dir", dir, "--resume");
}

qd_status qd_rl_run(const qd_config *cfg, const qd_rl_options *o, char *run_dir, size_t n)
{
    rl_run r = {.cfg = cfg, .k = qd_config_knobs(cfg), .o = o, .dp = {.rank = 0, .world = 1}, .t_begin = now_s()};
    qd_rl_options quiet;
    qd_config *own = NULL;
    sample_set ss = {0};
    qd_status st = qd_config_validate(cfg);
    if (!st && o->resume_dir) {
        snprintf(r.dir, sizeof r.dir, "%s", o->resume_dir);
        st = resume_config(cfg, r.dir, &own);
        if (own)
            r.cfg = own, r.k = qd_config_knobs(own);
    } else if (!st)
        st = qd_rl_run_dir(cfg, r.dir, sizeof r.dir);
    if (!st && run_dir)
        snprintf(run_dir, n, "%s", r.dir);
    if (!st) {
        init_params(&r);
        st = join(&r, o, &quiet);
    }
    if (!st) {
#ifdef _OPENMP
        /* run.threads bounds every parallel region of the run, not only the
         * backends' (idle OpenMP workers spin and slow a busy machine) */
        int saved = omp_get_max_threads();
        if (r.k->run.threads > 0)
            omp_set_num_threads((int)r.k->run.threads);
#endif
        st = run_loop(&r, &ss);
#ifdef _OPENMP
        omp_set_num_threads(saved);
#endif
    }
    /* every rank ends together; a failing one tells the others why */
    st = st ? qd_dp_fail(&r.dp, st) : qd_dp_finish(&r.dp);
    run_free(&r, &ss);
    qd_config_free(own);
    return st;
}
