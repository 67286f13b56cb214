/* The RL loop: setup, one step, evals, checkpoints and resume (rl.h). */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>
#include <jansson.h>
#ifdef _OPENMP
#include <omp.h>
#endif
#include "orchestrator/rl.h"
#include "backends/backend.h"
#include "backends/shared.h"
#include "benchmarks/synth.h"
#include "models/checkpoint.h"
#include "models/tokenizer.h"
#include "orchestrator/ckpt.h"
#include "orchestrator/dp.h"
#include "orchestrator/grpo.h"
#include "orchestrator/metrics.h"
#include "orchestrator/task.h"
#include "quant/fileio.h"
#include "quant/quant.h"
#include "quant/splitmix64.h"

#define TRAIN_POOL 4096  /* training problems drawn (fewer when the split is smaller) */
#define ADAM_MAGIC "QDADAMW1"
#define RAC_MAGIC "QDRAC001"

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
    const qd_rl_options *o;
    char dir[4096], model_dir[4096];
    qd_model_config mcfg;
    qd_tokenizer *tok;
    int32_t end_id;
    qd_backend *rollout, *trainer, *ref;
    size_t nf;
    float *w;                      /* (nf) the sync buffer */
    qd_bench_set train, test;
    int32_t **pids;                /* (train.n) prompt ids */
    int *plen;                     /* (train.n) */
    int64_t *perm, perm_epoch;     /* (train.n) order of the current epoch */
    uint64_t seed;
    int64_t step, data_pos, opt_step, steps, P, G, M, J;
    qd_grpo_params gp;
    qd_adv_kind adv;
    qd_lr_schedule sched;
    qd_metrics *metrics;
    int kill_step, nan_step;       /* test hooks; 0 = off */
    qd_dp dp;                      /* data parallel: this rank and the collectives */
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

static int env_int(const char *name)
{
    const char *s = getenv(name);
    return s ? atoi(s) : 0;
}

/* ---- run directory and model */

qd_status qd_rl_run_dir(const qd_config *cfg, char *buf, size_t n)
{
    const char *dir = qd_config_str(cfg, "run.dir"), *name = qd_config_str(cfg, "run.name");
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
 * executable (a build tree) and the installed copy (QD_PKGDATADIR/tiny). */
static qd_status model_dir(const qd_config *cfg, char *buf, size_t n)
{
    const char *p = qd_config_str(cfg, "model.path");
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
    const char *cands[4] = {"models/tiny", srcd, exed, QD_PKGDATADIR "/tiny"};
    for (int i = 0; i < 4; i++) {
        char cfgp[4200];
        snprintf(cfgp, sizeof cfgp, "%.2048s/config.json", cands[i]);
        if (cands[i][0] && access(cfgp, R_OK) == 0) {
            snprintf(buf, n, "%s", cands[i]);
            return QD_OK;
        }
    }
    return qd_error(QD_ERR_IO, "config: model.path: empty and the embedded tiny model was found neither in "
                               "./models/tiny, beside the quads program, nor in %s/tiny; set model.path",
                    QD_PKGDATADIR);
}

/* The backend's message with the config keys that chose it in front (copied
 * first: qd_error writes the buffer qd_last_error reads). */
static qd_status backend_error(const rl_run *r)
{
    char msg[1024];
    snprintf(msg, sizeof msg, "%s", qd_last_error());
    return qd_error(QD_ERR_ARG, "config: rollout.backend %s, rollout.mode %s: %s",
                    qd_config_str(r->cfg, "rollout.backend"), qd_config_str(r->cfg, "rollout.mode"), msg);
}

static qd_backend *new_backend(rl_run *r, qd_role role)
{
    qd_backend_options opt = {0};
    qd_recipe_parse(&opt.recipe, qd_config_str(r->cfg, "rollout.recipe"));
    qd_mode_parse(&opt.mode, qd_config_str(r->cfg, "rollout.mode"));
    opt.role = role;
    opt.rac_ratio = qd_config_float(r->cfg, "rac.ratio");
    opt.num_threads = (int)qd_config_int(r->cfg, "run.threads");
    opt.diagnostics = 1;
    opt.device = r->dp.local_rank;
    return qd_backend_init_by_name(qd_config_str(r->cfg, "rollout.backend"), &r->mcfg, &opt);
}

/* ---- data */

static qd_status load_data(rl_run *r)
{
    qd_synth_opts so = {0};
    if (*qd_config_str(r->cfg, "data.benchmark"))
        return qd_error(QD_ERR_UNSUPPORTED, "config: data.benchmark: '%s': quads rl evaluates on the task's "
                                            "held-out split only (leave it empty; use quads eval for benchmarks)",
                        qd_config_str(r->cfg, "data.benchmark"));
    qd_status st = qd_task_parse(qd_config_str(r->cfg, "data.task"), &so);
    if (st)
        return qd_error(st, "config: data.task: %s", qd_last_error());
    so.seed = r->seed;
    size_t n = TRAIN_POOL;
    while ((st = qd_synth_generate(&so, QD_SPLIT_TRAIN, n, &r->train)) == QD_ERR_ARG && n > 16)
        n /= 2;
    if (st)
        return st;
    int64_t lim = qd_config_int(r->cfg, "eval.limit");
    n = lim > 0 ? (size_t)lim : 256;
    so.seed = (uint64_t)qd_config_int(r->cfg, "eval.seed"); /* one held-out set for every run seed */
    while ((st = qd_synth_generate(&so, QD_SPLIT_TEST, n, &r->test)) == QD_ERR_ARG && n > 1)
        n /= 2;
    if (st)
        return st;
    r->pids = calloc(r->train.n, sizeof *r->pids);
    r->plen = calloc(r->train.n, sizeof *r->plen);
    r->perm = malloc(sizeof(int64_t) * r->train.n);
    if (!r->pids || !r->plen || !r->perm)
        return qd_error(QD_ERR_NOMEM, "training prompts");
    int64_t maxp = qd_config_int(r->cfg, "data.max_prompt_tokens");
    for (size_t i = 0; i < r->train.n; i++) {
        size_t nids, np;
        st = qd_task_encode(r->tok, r->train.rec[i].problem, NULL, &r->pids[i], &nids, &np);
        if (st)
            return st;
        if ((int64_t)np > maxp)
            return qd_error(QD_ERR_ARG, "config: data.max_prompt_tokens: %lld, but a prompt has %zu tokens",
                            (long long)maxp, np);
        r->plen[i] = (int)np;
    }
    r->perm_epoch = -1;
    return QD_OK;
}

/* The training problem at data position pos: epochs in a seeded order. */
static int problem_at(rl_run *r, int64_t pos)
{
    int64_t n = (int64_t)r->train.n, epoch = pos / n;
    if (epoch != r->perm_epoch) {
        for (int64_t i = 0; i < n; i++)
            r->perm[i] = i;
        if (qd_config_bool(r->cfg, "data.shuffle")) {
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
        if (r->plen[s->prob] > Tp)
            Tp = r->plen[s->prob];
    }
    int32_t *prompt = calloc((size_t)B * Tp, sizeof *prompt), *plen = malloc(sizeof *plen * B);
    uint64_t *seq = malloc(sizeof *seq * B);
    if (!prompt || !plen || !seq) {
        free(prompt), free(plen), free(seq);
        return qd_error(QD_ERR_NOMEM, "rollout batch");
    }
    for (int b = 0; b < B; b++) {
        const sample *s = &all->s[all->S + b];
        plen[b] = r->plen[s->prob];
        memcpy(prompt + (size_t)b * Tp, r->pids[s->prob], sizeof(int32_t) * plen[b]);
        seq[b] = (uint64_t)s->pos * (uint64_t)r->G + (uint64_t)(b % r->G);
    }
    int32_t *lens = malloc(sizeof *lens * B);
    qd_generate_request rq = {B, Tp, prompt, plen, seq,
                              mix64(r->seed * 1000003ull + (uint64_t)r->step * 64 + (uint64_t)gb),
                              M, (float)qd_config_float(r->cfg, "rollout.temperature"),
                              (int)qd_config_int(r->cfg, "rollout.top_k"),
                              (float)qd_config_float(r->cfg, "rollout.top_p"), &r->end_id, 1,
                              1 /* the rollout gathers the RAC statistics of the next pick */};
    qd_generate_result res = {all->tok + (size_t)all->S * M, all->lp_ro + (size_t)all->S * M, lens};
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

/* Rewards of the last B samples of all (correctness + overlong penalty). */
static qd_status grade_batch(rl_run *r, sample_set *all, int first, int B)
{
    int64_t buf = qd_config_int(r->cfg, "algo.overlong_buffer_len");
    double pen = qd_config_float(r->cfg, "algo.overlong_penalty");
    for (int b = first; b < first + B; b++) {
        sample *s = &all->s[b];
        qd_status st = qd_task_reward(r->tok, all->tok + (size_t)b * r->M, (size_t)s->rlen,
                                      r->train.rec[s->prob].answer, &s->score, NULL);
        if (st)
            return st;
        s->reward = s->score + (float)qd_grpo_overlong_penalty(s->rlen, r->M, buf, pen);
    }
    return QD_OK;
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

/* keep (P) of every group of the batch from this rank's lkeep (its groups, in
 * order): the flags of all ranks. */
static qd_status global_keep(rl_run *r, const uint8_t *lkeep, uint8_t *keep)
{
    int W = r->dp.world, rk = r->dp.rank, P = (int)r->P;
    double *k = calloc((size_t)P, sizeof(double));
    if (!k)
        return qd_error(QD_ERR_NOMEM, "dynamic sampling");
    for (int g = rk, i = 0; g < P; g += W, i++)
        k[g] = lkeep[i];
    qd_status st = qd_dp_sum_f64(&r->dp, k, (size_t)P);
    for (int g = 0; g < P; g++)
        keep[g] = k[g] > 0;
    free(k);
    return st;
}

typedef struct {
    double reward_sum, score_sum, len_sum;
    int64_t generated, tokens, gen_batches;
} rollout_stats;

/* The step's rollouts: one batch, or under dynamic sampling batches until P
 * groups with signal (or algo.max_gen_batches). all->S = this rank's kept
 * samples; *kept_out = the kept groups of all ranks. rs: this rank's sums. */
static qd_status do_rollouts(rl_run *r, sample_set *all, rollout_stats *rs, int *kept_out)
{
    bool dyn = qd_config_bool(r->cfg, "algo.dynamic_sampling");
    int tries = dyn ? (int)qd_config_int(r->cfg, "algo.max_gen_batches") : 1, kept = 0, local = 0;
    all->S = 0;
    for (int gb = 0; gb < tries && (gb == 0 || kept < r->P); gb++) {
        int first = all->S, B;
        qd_status st = rollout_batch(r, all, gb, &B);
        if (!st)
            st = grade_batch(r, all, first, B);
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
            st = global_keep(r, lkeep, keep);
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
        if (r->plen[ss->s[i].prob] + ss->s[i].rlen > t)
            t = r->plen[ss->s[i].prob] + ss->s[i].rlen;
    *tokens = calloc((size_t)n * t, sizeof(int32_t));
    *lens = malloc(sizeof(int32_t) * n);
    if (!*tokens || !*lens)
        return qd_error(QD_ERR_NOMEM, "trainer batch");
    for (int i = 0; i < n; i++) {
        const sample *s = &ss->s[a + i];
        int pl = r->plen[s->prob];
        memcpy(*tokens + (size_t)i * t, r->pids[s->prob], sizeof(int32_t) * pl);
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
    qd_batch bt = {b - a, T, tokens, lens, (float)qd_config_float(r->cfg, "rollout.temperature")};
    if (!st)
        st = qd_backend_forward(bk, &bt, lp, NULL);
    for (int i = 0; i < b - a && !st; i++) {
        const sample *s = &ss->s[a + i];
        int pl = r->plen[s->prob];
        float *o = out + (size_t)i * r->M;
        memset(o, 0, sizeof(float) * r->M);
        for (int k = 0; k < s->rlen; k++)
            o[k] = lp[(size_t)i * T + pl - 1 + k];
        if (bk == r->trainer && r->nan_step == r->step && a == 0 && i == 0 && what[0] == 't')
            o[0] = NAN; /* test hook: QD_RL_TEST_NAN_STEP */
        for (int k = 0; k < s->rlen && !st; k++)
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
        if (r->plen[ss->s[i].prob] + ss->s[i].rlen > T)
            T = r->plen[ss->s[i].prob] + ss->s[i].rlen;
    float *d = calloc((size_t)(b - a) * T, sizeof(float));
    if (!d)
        return qd_error(QD_ERR_NOMEM, "trainer gradient");
    for (int i = 0; i < b - a; i++) {
        const sample *s = &ss->s[a + i];
        int pl = r->plen[s->prob];
        for (int k = 0; k < s->rlen; k++)
            d[(size_t)i * T + pl - 1 + k] = coef[(size_t)i * r->M + k];
    }
    qd_status st = qd_backend_backward(r->trainer, d);
    free(d);
    return st;
}

/* Per-layer measurements of the step (rollout vs trainer). */
typedef struct {
    int nlin, nmoe;
    double *act_err, *weight_err; /* (nlin) relative NVFP4 errors of the rollout */
    double *act_sq, *act_norm;    /* (nlin) their sums (this rank's until reduced) */
    double *agree;                /* (nmoe) router top-k agreement */
    double *hits, *picks;         /* (nmoe) its counts: experts both picked, tokens x top_k */
} layer_stats;

static void layer_stats_free(layer_stats *ls)
{
    free(ls->act_err), free(ls->weight_err), free(ls->act_sq), free(ls->act_norm);
    free(ls->agree), free(ls->hits), free(ls->picks);
}

/* The ratios of the per-layer sums (after they are reduced over ranks). */
static void layer_ratios(layer_stats *ls)
{
    for (int i = 0; i < ls->nlin; i++)
        ls->act_err[i] = ls->act_norm[i] > 0 ? ls->act_sq[i] / ls->act_norm[i] : 0.0;
    for (int l = 0; l < ls->nmoe; l++)
        ls->agree[l] = ls->picks[l] > 0 ? ls->hits[l] / ls->picks[l] : 1.0;
}

/* RUN/layers.json: what the per-layer arrays of the metrics index
 * (quant.*: the quantized linears' weight names; router.agree: the MoE layers). */
static qd_status write_layers(rl_run *r, const qd_diagnostics *d)
{
    char p[4400];
    snprintf(p, sizeof p, "%s/layers.json", r->dir);
    if (access(p, F_OK) == 0)
        return QD_OK;
    json_t *o = json_object(), *lin = json_array(), *moe = json_array();
    for (int i = 0; i < d->num_linear; i++)
        json_array_append_new(lin, json_string(d->names[i]));
    for (int l = 0; l < r->mcfg.num_hidden_layers; l++)
        if (qd_model_config_is_moe_layer(&r->mcfg, l))
            json_array_append_new(moe, json_integer(l));
    json_object_set_new(o, "quant", lin);
    json_object_set_new(o, "router", moe);
    char *text = json_dumps(o, JSON_INDENT(2));
    json_decref(o);
    qd_status st = text ? qd_atomic_write(p, text, strlen(text)) : qd_error(QD_ERR_NOMEM, "%s", p);
    free(text);
    return st;
}

/* The rollout's quantization errors over the step's generation. */
static qd_status rollout_quant_errors(rl_run *r, layer_stats *ls)
{
    qd_diagnostics d;
    qd_status st = qd_backend_diagnostics(r->rollout, &d);
    if (!st && r->dp.rank == 0)
        st = write_layers(r, &d);
    if (st)
        return st;
    ls->nlin = d.num_linear;
    size_t n = (size_t)d.num_linear + 1;
    ls->act_err = calloc(n, sizeof(double)), ls->weight_err = calloc(n, sizeof(double));
    ls->act_sq = calloc(n, sizeof(double)), ls->act_norm = calloc(n, sizeof(double));
    if (!ls->act_err || !ls->weight_err || !ls->act_sq || !ls->act_norm)
        return qd_error(QD_ERR_NOMEM, "diagnostics");
    for (int i = 0; i < d.num_linear; i++) {
        ls->act_sq[i] = d.act_err[i], ls->act_norm[i] = d.act_norm[i];
        ls->weight_err[i] = d.weight_err[i];
    }
    return QD_OK;
}

/* Router agreement: the trainer's top-k (its last forward, samples [0, n))
 * against the rollout's top-k on the same tokens. The rollout forward leaves
 * the RAC statistics as they were. */
static qd_status router_agreement(rl_run *r, const sample_set *ss, int n, layer_stats *ls)
{
    qd_diagnostics dt, dr;
    qd_status st = qd_backend_diagnostics(r->trainer, &dt);
    if (st || dt.num_moe_layers == 0)
        return st;
    size_t cnt = (size_t)dt.num_moe_layers * dt.num_tokens * dt.top_k;
    int32_t *tk = malloc(sizeof(int32_t) * cnt);
    float *scratch = malloc(sizeof(float) * (size_t)n * r->M);
    size_t rb = qd_backend_rac_state_size(r->rollout);
    void *rac = malloc(rb + 1);
    ls->nmoe = dt.num_moe_layers;
    ls->agree = calloc((size_t)ls->nmoe, sizeof(double));
    ls->hits = calloc((size_t)ls->nmoe, sizeof(double)), ls->picks = calloc((size_t)ls->nmoe, sizeof(double));
    if (!tk || !scratch || !rac || !ls->agree || !ls->hits || !ls->picks)
        st = qd_error(QD_ERR_NOMEM, "router agreement");
    if (!st) {
        memcpy(tk, dt.router_topk, sizeof(int32_t) * cnt);
        st = qd_backend_get_rac_state(r->rollout, rac, rb);
    }
    if (!st)
        st = forward_resp(r, r->rollout, ss, 0, n, scratch, "rollout (prefill)");
    if (!st)
        st = qd_backend_set_rac_state(r->rollout, rac, rb);
    if (!st)
        st = qd_backend_diagnostics(r->rollout, &dr);
    if (!st && (dr.num_tokens != dt.num_tokens || dr.num_moe_layers != dt.num_moe_layers))
        st = qd_error(QD_ERR_SHAPE, "router agreement: rollout and trainer saw different tokens");
    int K = dt.top_k, N = dt.num_tokens;
    for (int l = 0; l < ls->nmoe && !st; l++) {
        int64_t hit = 0;
        for (int t = 0; t < N; t++) {
            const int32_t *a = tk + ((size_t)l * N + t) * K, *b = dr.router_topk + ((size_t)l * N + t) * K;
            for (int i = 0; i < K; i++)
                for (int j = 0; j < K; j++)
                    hit += a[i] == b[j];
        }
        ls->hits[l] = (double)hit, ls->picks[l] = (double)N * K;
    }
    free(tk), free(scratch), free(rac);
    return st;
}

typedef struct {
    double loss, kl, clip_frac, clip_low, clip_high, ratio_max, tis_mean, tis_clipped;
    double grad_norm, lr;           /* grad_norm, loss, kl: sums over the updates */
    int64_t tokens, updates;
    qd_gap_stats gap;
} train_stats;

/* Weighted sums of the per-micro-batch statistics (weights: tokens). */
static void add_stats(train_stats *ts, const qd_grpo_stats *g)
{
    double w = (double)g->tokens;
    ts->loss += g->loss;
    ts->kl += g->kl;
    ts->clip_frac += g->clip_frac * w;
    ts->clip_low += g->clip_frac_low * w;
    ts->clip_high += g->clip_frac_high * w;
    ts->tis_mean += g->tis_mean * w;
    ts->tis_clipped += g->tis_clipped_frac * w;
    if (g->ratio_max > ts->ratio_max)
        ts->ratio_max = g->ratio_max;
    ts->tokens += g->tokens;
}

static void fill_mask(const sample_set *ss, int a, int b, int M, uint8_t *mask)
{
    for (int i = a; i < b; i++)
        for (int k = 0; k < M; k++)
            mask[(size_t)(i - a) * M + k] = k < ss->s[i].rlen;
}

/* The trainer's gradients summed over ranks (each rank's loss is normalized
 * by the whole mini-batch's count, so the sum is the 1-rank gradient). */
static qd_status allreduce_grads(rl_run *r)
{
    float *g = malloc(sizeof(float) * r->nf);
    qd_status st = g ? qd_backend_get_grads(r->trainer, g, r->nf) : qd_error(QD_ERR_NOMEM, "gradients");
    if (!st)
        st = qd_dp_sum_f32(&r->dp, g, r->nf);
    if (!st)
        st = qd_backend_set_grads(r->trainer, g, r->nf);
    free(g);
    return st ? prefixed(st, "gradient all-reduce") : QD_OK;
}

/* One optimizer update on this rank's samples [a, b) of a mini-batch of nseq
 * sequences over all ranks. lp_old of these samples is filled by the first
 * forward when first is set. */
static qd_status train_mini(rl_run *r, const sample_set *ss, int a, int b, int64_t nseq, bool first,
                            float *lp_old, uint8_t *mask, layer_stats *ls, train_stats *ts)
{
    int M = (int)r->M, micro = (int)qd_config_int(r->cfg, "trainer.micro_batch");
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
            st = router_agreement(r, ss, n, ls);
        if (st)
            break;
        for (int i = 0; i < n; i++)
            adv[i] = ss->s[c + i].adv;
        fill_mask(ss, c, d, M, mask);
        qd_grpo_batch gb = {n, M, lp, lp_old + (size_t)c * M, ss->lp_ro + (size_t)c * M, lref, adv, mask};
        qd_grpo_stats gs;
        st = qd_grpo_loss(coef, &gs, &gb, &gp);
        if (!st && !isfinite(gs.loss))
            st = qd_error(QD_ERR_NONFINITE, "loss is %g", gs.loss);
        if (st) {
            st = prefixed(st, "loss");
            break;
        }
        add_stats(ts, &gs);
        st = backward_resp(r, ss, c, d, coef);
        if (st)
            st = prefixed(st, "backward");
    }
    if (!st && r->dp.world > 1)
        st = allreduce_grads(r);
    if (!st) {
        qd_adamw opt = {0, (float)qd_config_float(r->cfg, "trainer.beta1"),
                        (float)qd_config_float(r->cfg, "trainer.beta2"), (float)qd_config_float(r->cfg, "trainer.eps"),
                        (float)qd_config_float(r->cfg, "trainer.weight_decay"),
                        (float)qd_config_float(r->cfg, "trainer.grad_clip")};
        ts->lr = qd_grpo_lr(r->sched, qd_config_float(r->cfg, "trainer.lr"),
                            qd_config_float(r->cfg, "trainer.min_lr_ratio"),
                            qd_config_int(r->cfg, "trainer.warmup_steps"), r->steps * r->J, r->opt_step);
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

/* The gap over S samples: logp_old, the rollout's, their masks and the
 * entropy estimate (-log p of the sampled token). */
static qd_status gap_of(qd_gap_stats *g, const float *lp_old, const float *lp_ro, const int *rlen, int S, int M)
{
    float *ent = malloc(sizeof(float) * (size_t)S * M + 1);
    uint8_t *mask = malloc((size_t)S * M + 1);
    if (!ent || !mask) {
        free(ent), free(mask);
        return qd_error(QD_ERR_NOMEM, "gap");
    }
    for (size_t i = 0; i < (size_t)S * M; i++) {
        mask[i] = (int)(i % M) < rlen[i / M];
        ent[i] = mask[i] ? -lp_ro[i] : 0.0f;
    }
    qd_status st = qd_grpo_gap(g, lp_old, lp_ro, ent, mask, S, M);
    free(ent), free(mask);
    return st;
}

/* The gap over the trained samples of all ranks (ng groups), in the 1-rank
 * order: every rank sends (sample place, length, logp_old (M), rollout logp (M)). */
static qd_status step_gap(rl_run *r, const sample_set *ss, const float *lp_old, int ng, qd_gap_stats *g)
{
    int G = (int)r->G, M = (int)r->M, S = ng * G;
    size_t rec = 2 * sizeof(int32_t) + 2 * sizeof(float) * M, *off = malloc(sizeof(size_t) * (r->dp.world + 1));
    uint8_t *mine = malloc(rec * ss->S + 1), *all = NULL;
    float *lo = calloc((size_t)S * M + 1, sizeof(float)), *lr = calloc((size_t)S * M + 1, sizeof(float));
    int *rlen = calloc((size_t)S + 1, sizeof(int));
    qd_status st = !off || !mine || !lo || !lr || !rlen ? qd_error(QD_ERR_NOMEM, "gap") : QD_OK;
    for (int i = 0; i < ss->S && !st; i++) {
        int32_t h[2] = {ss->s[i].grp * G + i % G, ss->s[i].rlen};
        memcpy(mine + rec * i, h, sizeof h);
        memcpy(mine + rec * i + sizeof h, lp_old + (size_t)i * M, sizeof(float) * M);
        memcpy(mine + rec * i + sizeof h + sizeof(float) * M, ss->lp_ro + (size_t)i * M, sizeof(float) * M);
    }
    if (!st)
        st = qd_dp_gatherv(&r->dp, mine, rec * ss->S, &all, off);
    for (size_t p = 0; !st && p < off[r->dp.world]; p += rec) {
        int32_t h[2];
        memcpy(h, all + p, sizeof h);
        if (h[0] < 0 || h[0] >= S)
            st = qd_error(QD_ERR_FORMAT, "gap: a rank sent sample %d of %d", h[0], S);
        else {
            rlen[h[0]] = h[1];
            memcpy(lo + (size_t)h[0] * M, all + p + sizeof h, sizeof(float) * M);
            memcpy(lr + (size_t)h[0] * M, all + p + sizeof h + sizeof(float) * M, sizeof(float) * M);
        }
    }
    if (!st)
        st = gap_of(g, lo, lr, rlen, S, M);
    free(off), free(mine), free(all), free(lo), free(lr), free(rlen);
    return st;
}

/* Advantages, logp_old of the later mini-batches, the updates, the gap. This
 * rank trains its ss->S samples of the ng groups kept over all ranks; global
 * mini-batch j is groups [j ng / J, (j + 1) ng / J) of every rank. */
static qd_status train_step(rl_run *r, sample_set *ss, int ng, layer_stats *ls, train_stats *ts)
{
    int G = (int)r->G, M = (int)r->M, nl = ss->S / G;
    if (ng == 0) { /* dynamic sampling found no group with signal: no update, no gap */
        ts->gap = (qd_gap_stats){NAN, NAN, NAN, NAN, NAN, 0};
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
        st = qd_grpo_advantages(adv, reward, nl, G, r->adv, qd_config_float(r->cfg, "algo.adv_eps"));
    for (int i = 0; i < ss->S && !st; i++)
        ss->s[i].adv = adv[i];
    int J = (int)r->J;
    /* logp_old of mini-batches 1.. before any update (PPO's old policy) */
    int a1 = local_first(ss, (int)((int64_t)1 * ng / J)), micro = (int)qd_config_int(r->cfg, "trainer.micro_batch");
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
        st = r->dp.world == 1 ? gap_of(&ts->gap, lp_old, ss->lp_ro, rlen, ss->S, M)
                              : step_gap(r, ss, lp_old, ng, &ts->gap);
    free(reward), free(adv), free(lp_old), free(mask), free(rlen);
    return st;
}

/* ---- eval, sync */

/* Held-out pass@1 (eval.precision: on the rollout or the trainer instance);
 * the rollout's RAC statistics are left as they were. */
static qd_status run_eval(rl_run *r, qd_task_eval_result *ev)
{
    qd_backend *b = strcmp(qd_config_str(r->cfg, "eval.precision"), "trainer") ? r->rollout : r->trainer;
    size_t rb = qd_backend_rac_state_size(r->rollout);
    void *rac = malloc(rb + 1);
    if (!rac)
        return qd_error(QD_ERR_NOMEM, "eval");
    qd_status st = qd_backend_get_rac_state(r->rollout, rac, rb);
    if (!st)
        st = qd_task_eval(b, r->tok, &r->test, (int)qd_config_int(r->cfg, "eval.limit"),
                          (int)qd_config_int(r->cfg, "eval.samples"),
                          (float)qd_config_float(r->cfg, "eval.temperature"),
                          (uint64_t)qd_config_int(r->cfg, "eval.seed"), (int)r->M, ev);
    if (!st)
        st = qd_backend_set_rac_state(r->rollout, rac, rb);
    free(rac);
    return st;
}

/* Data parallel RAC: rac (rb bytes, this rank's RAC state) gets, in place of
 * its activation-error statistics, their sum over ranks (rank order, double):
 * the statistics of every rollout of the job since the last pick, as one
 * process running them all would have gathered (up to the order of the
 * double sums). Every rank then picks the same channels. */
static qd_status rac_global(rl_run *r, void *rac, size_t rb)
{
    size_t ne = 0;
    qd_status st = qd_rac_state_errors(rac, rb, &r->mcfg, NULL, &ne, 0);
    double *e = st ? NULL : malloc(sizeof(double) * (ne ? ne : 1));
    if (!st && !e)
        st = qd_error(QD_ERR_NOMEM, "RAC statistics");
    if (!st)
        st = qd_rac_state_errors(rac, rb, &r->mcfg, e, &ne, 0);
    if (!st)
        st = qd_dp_sum_f64(&r->dp, e, ne);
    if (!st)
        st = qd_rac_state_errors(rac, rb, &r->mcfg, e, &ne, 1);
    free(e);
    return st;
}

/* Before a RAC pick (data parallel): this rank's rollout takes the job's summed statistics. */
static qd_status rac_merge(rl_run *r, size_t rb)
{
    void *rac = malloc(rb);
    qd_status st = rac ? qd_backend_get_rac_state(r->rollout, rac, rb) : qd_error(QD_ERR_NOMEM, "RAC state");
    if (!st)
        st = rac_global(r, rac, rb);
    if (!st)
        st = qd_backend_set_rac_state(r->rollout, rac, rb);
    free(rac);
    return st;
}

/* Trainer master weights -> rollout (quantize(W) once). The rollout re-picks
 * its RAC channels at every sync; between refreshes (rac.refresh) the old sets
 * and the errors gathered since the last pick are put back, so a refresh picks
 * from the statistics of all rollouts since the previous one. */
static qd_status sync_weights(rl_run *r)
{
    int64_t every = qd_config_int(r->cfg, "rac.refresh");
    size_t rb = qd_backend_rac_state_size(r->rollout);
    bool keep = rb > 0 && (every == 0 || r->step % every != 0);
    void *rac = keep ? malloc(rb) : NULL;
    qd_status st = keep && !rac ? qd_error(QD_ERR_NOMEM, "RAC state") : QD_OK;
    if (!st && !keep && rb > 0 && r->dp.world > 1)
        st = rac_merge(r, rb);  /* the pick below sees every rank's rollouts */
    if (!st && keep)
        st = qd_backend_get_rac_state(r->rollout, rac, rb);
    if (!st)
        st = qd_backend_get_weights(r->trainer, r->w, r->nf);
    if (!st)
        st = qd_backend_set_weights(r->rollout, r->w, r->nf);
    if (!st && keep)
        st = qd_backend_set_rac_state(r->rollout, rac, rb);
    free(rac);
    return st ? at_step(st, r->step, "weight sync") : QD_OK;
}

/* ---- checkpoints */

static qd_status write_blob(const char *path, const char *magic, const void *a, size_t na, const void *b, size_t nb)
{
    size_t n = 16 + na + nb;
    char *buf = malloc(n);
    if (!buf)
        return qd_error(QD_ERR_NOMEM, "%s", path);
    uint64_t len = na + nb;
    memcpy(buf, magic, 8);
    memcpy(buf + 8, &len, 8);
    memcpy(buf + 16, a, na);
    if (nb)
        memcpy(buf + 16 + na, b, nb);
    qd_status st = qd_atomic_write(path, buf, n);
    free(buf);
    return st;
}

/* The payload of a blob file into *data (malloc'ed), checked against magic and size n. */
static qd_status read_blob(const char *path, const char *magic, void **data, size_t n)
{
    char *text;
    size_t len;
    qd_status st = qd_read_file(path, &text, &len);
    if (st)
        return st;
    uint64_t want = 0;
    if (len >= 16)
        memcpy(&want, text + 8, 8);
    if (len < 16 || memcmp(text, magic, 8) != 0 || want != n || len != 16 + n) {
        free(text);
        return qd_error(QD_ERR_FORMAT, "%s: not a %.8s file of %zu bytes for this model and recipe", path, magic, n);
    }
    memmove(text, text + 16, n);
    *data = text;
    return QD_OK;
}

/* Removes a flat directory (a stale step_XXXXXXXX.tmp) and its files. */
static void remove_flat_dir(const char *dir)
{
    DIR *d = opendir(dir);
    if (!d)
        return;
    struct dirent *e;
    char p[4400];
    while ((e = readdir(d)))
        if (strcmp(e->d_name, ".") && strcmp(e->d_name, "..")) {
            snprintf(p, sizeof p, "%s/%s", dir, e->d_name);
            unlink(p);
        }
    closedir(d);
    rmdir(dir);
}

static qd_status copy_file(const char *from, const char *to)
{
    char *text;
    size_t len;
    qd_status st = qd_read_file(from, &text, &len);
    if (!st)
        st = qd_atomic_write(to, text, len);
    if (!st)
        free(text);
    return st;
}

static qd_status write_state(rl_run *r, const char *path)
{
    json_t *j = json_pack("{s:I, s:I, s:I, s:I, s:s}", "step", (json_int_t)r->step, "data_pos",
                          (json_int_t)r->data_pos, "optimizer_step", (json_int_t)r->opt_step, "seed",
                          (json_int_t)r->seed, "recipe", qd_config_str(r->cfg, "rollout.recipe"));
    char *text = j ? json_dumps(j, JSON_INDENT(2)) : NULL;
    json_decref(j);
    if (!text)
        return qd_error(QD_ERR_NOMEM, "%s", path);
    qd_status st = qd_atomic_write(path, text, strlen(text));
    free(text);
    return st;
}

/* rac_job: the RAC state to save (the job's summed statistics under data
 * parallelism), or NULL for this rollout's own. */
static qd_status write_checkpoint_files(rl_run *r, const char *tmp, const void *rac_job)
{
    int np;
    const qd_param_info *pi = qd_backend_params(r->trainer, &np);
    float *m = malloc(sizeof(float) * r->nf), *v = malloc(sizeof(float) * r->nf);
    size_t rb = qd_backend_rac_state_size(r->rollout);
    void *rac = malloc(rb + 1);
    char p[4400];
    qd_status st = !m || !v || !rac ? qd_error(QD_ERR_NOMEM, "checkpoint") : QD_OK;
    if (!st)
        st = qd_backend_get_weights(r->trainer, r->w, r->nf);
    if (!st)
        st = qd_checkpoint_save(tmp, &r->mcfg, pi, np, r->w, QD_ST_F32);
    if (!st)
        st = qd_backend_get_adam(r->trainer, m, v, r->nf);
    if (!st) {
        st = qd_amax(&(float){0}, m, (int64_t)r->nf);
        st = st ? st : qd_amax(&(float){0}, v, (int64_t)r->nf);
        if (st)
            st = qd_error(st, "optimizer state is not finite");
    }
    snprintf(p, sizeof p, "%s/optimizer.bin", tmp);
    if (!st)
        st = write_blob(p, ADAM_MAGIC, m, sizeof(float) * r->nf, v, sizeof(float) * r->nf);
    if (!st && rac_job)
        memcpy(rac, rac_job, rb);
    else if (!st)
        st = qd_backend_get_rac_state(r->rollout, rac, rb);
    snprintf(p, sizeof p, "%s/rac.bin", tmp);
    if (!st)
        st = write_blob(p, RAC_MAGIC, rac, rb, NULL, 0);
    snprintf(p, sizeof p, "%s/state.json", tmp);
    if (!st)
        st = write_state(r, p);
    char from[4400];
    snprintf(from, sizeof from, "%s/tokenizer.json", r->model_dir);
    snprintf(p, sizeof p, "%s/tokenizer.json", tmp);
    if (!st && access(from, R_OK) == 0)
        st = copy_file(from, p);
    free(m), free(v), free(rac);
    return st;
}

/* RUN/step_XXXXXXXX via a .tmp directory and a rename; then keep-last-K. */
static qd_status save_checkpoint(rl_run *r, const void *rac_job)
{
    char fin[4200], tmp[4300];
    qd_status st = qd_ckpt_path(fin, sizeof fin, r->dir, r->step);
    if (st)
        return st;
    snprintf(tmp, sizeof tmp, "%s.tmp", fin);
    remove_flat_dir(tmp);
    st = qd_mkdirs(tmp);
    if (!st)
        st = write_checkpoint_files(r, tmp, rac_job);
    if (!st)
        st = qd_fsync_dir(tmp);
    if (!st) {
        remove_flat_dir(fin); /* a checkpoint of this step from a run that was cut back */
        if (rename(tmp, fin) != 0)
            st = qd_error(QD_ERR_IO, "%s: rename to %s: %s", tmp, fin, strerror(errno));
    }
    if (!st)
        st = qd_fsync_dir(r->dir);
    if (!st)
        st = qd_ckpt_rotate(r->dir, (int)qd_config_int(r->cfg, "checkpoint.keep_last"), NULL);
    if (st) {
        remove_flat_dir(tmp);
        return at_step(st, r->step, "checkpoint");
    }
    return QD_OK;
}

static qd_status read_state(rl_run *r, const char *path)
{
    json_error_t err;
    json_t *j = json_load_file(path, 0, &err);
    json_int_t step, pos, opt, seed;
    const char *recipe;
    if (!j)
        return qd_error(QD_ERR_FORMAT, "%s:%d: %s", path, err.line, err.text);
    int bad = json_unpack(j, "{s:I, s:I, s:I, s:I, s:s}", "step", &step, "data_pos", &pos, "optimizer_step", &opt,
                          "seed", &seed, "recipe", &recipe);
    if (!bad && strcmp(recipe, qd_config_str(r->cfg, "rollout.recipe")) != 0) {
        qd_status st = qd_error(QD_ERR_ARG, "%s: recipe: '%s', but the config says '%s' (a run keeps its recipe)",
                                path, recipe, qd_config_str(r->cfg, "rollout.recipe"));
        json_decref(j);
        return st;
    }
    json_decref(j);
    if (bad || step < 0 || pos < 0 || opt < 0)
        return qd_error(QD_ERR_FORMAT,
                        "%s: step, data_pos, optimizer_step, seed, recipe: expected non-negative integers and a string",
                        path);
    if ((uint64_t)seed != r->seed)
        return qd_error(QD_ERR_FORMAT, "%s: seed: %lld, but the run's config says %llu", path, (long long)seed,
                        (unsigned long long)r->seed);
    r->step = step, r->data_pos = pos, r->opt_step = opt;
    return QD_OK;
}

/* Zeroes the statistics of a RAC state blob (a resumed rank other than 0:
 * the saved statistics are the job's, and the next pick sums all ranks'). */
static qd_status rac_zero_errors(rl_run *r, void *rac, size_t rb)
{
    size_t ne = 0;
    qd_status st = qd_rac_state_errors(rac, rb, &r->mcfg, NULL, &ne, 0);
    double *z = st ? NULL : calloc(ne ? ne : 1, sizeof(double));
    if (!st && !z)
        st = qd_error(QD_ERR_NOMEM, "RAC statistics");
    if (!st)
        st = qd_rac_state_errors(rac, rb, &r->mcfg, z, &ne, 1);
    free(z);
    return st;
}

/* Loads the run's latest checkpoint into both backends. */
static qd_status load_checkpoint(rl_run *r)
{
    int64_t k;
    qd_status st = qd_ckpt_latest(r->dir, &k);
    if (st)
        return st;
    if (k < 0)
        return qd_error(QD_ERR_IO, "%s: no checkpoint (step_XXXXXXXX) to resume from", r->dir);
    char d[4200], p[4400];
    qd_ckpt_path(d, sizeof d, r->dir, k);
    int np;
    const qd_param_info *pi = qd_backend_params(r->trainer, &np);
    void *m = NULL, *rac = NULL;
    size_t rb = qd_backend_rac_state_size(r->rollout);
    snprintf(p, sizeof p, "%s/state.json", d);
    st = read_state(r, p);
    if (!st)
        st = qd_checkpoint_load(d, pi, np, r->w);
    if (!st)
        st = qd_backend_set_weights(r->trainer, r->w, r->nf);
    if (!st)
        st = qd_backend_set_weights(r->rollout, r->w, r->nf);
    snprintf(p, sizeof p, "%s/optimizer.bin", d);
    if (!st)
        st = read_blob(p, ADAM_MAGIC, &m, 2 * sizeof(float) * r->nf);
    if (!st)
        st = qd_backend_set_adam(r->trainer, m, (float *)m + r->nf, r->nf);
    snprintf(p, sizeof p, "%s/rac.bin", d);
    if (!st)
        st = read_blob(p, RAC_MAGIC, &rac, rb);
    if (!st && rb > 0 && r->dp.rank > 0)
        st = rac_zero_errors(r, rac, rb);  /* the job's statistics live on rank 0 only */
    if (!st)
        st = qd_backend_set_rac_state(r->rollout, rac, rb);
    free(m), free(rac);
    if (!st && r->step != k)
        st = qd_error(QD_ERR_FORMAT, "%s: step %lld in a directory named for step %lld", p, (long long)r->step,
                      (long long)k);
    return st;
}

/* ---- metrics */

static json_t *array_of(const double *x, int n)
{
    json_t *a = json_array();
    for (int i = 0; a && i < n; i++)
        json_array_append_new(a, isfinite(x[i]) ? json_real(x[i]) : json_null());
    return a;
}

static double mean_of(const double *x, int n)
{
    double s = 0;
    for (int i = 0; i < n; i++)
        s += x[i];
    return n ? s / n : NAN;
}

static void put_eval(json_t *o, const qd_task_eval_result *ev, double secs, json_t *time)
{
    json_t *e = json_object();
    qd_metrics_set(e, "pass1", ev->pass1);
    qd_metrics_set(e, "mean_len", ev->mean_len);
    qd_metrics_set(e, "format_rate", ev->format_rate);
    json_object_set_new(e, "problems", json_integer(ev->problems));
    json_object_set_new(o, "eval", e);
    qd_metrics_set(time, "eval_s", secs);
}

static json_t *step_json(rl_run *r, const rollout_stats *rs, const train_stats *ts, const layer_stats *ls,
                         int kept, const double *t)
{
    json_t *o = json_object(), *gap = json_object(), *q = json_object(), *rt = json_object(), *tm = json_object();
    json_object_set_new(o, "step", json_integer(r->step));
    double g = (double)(rs->generated ? rs->generated : 1), tok = (double)(ts->tokens ? ts->tokens : 1);
    double u = (double)(ts->updates ? ts->updates : 1);
    qd_metrics_set(o, "reward_mean", rs->reward_sum / g);
    qd_metrics_set(o, "pass1_train", rs->score_sum / g);
    qd_metrics_set(o, "response_len", rs->len_sum / g);
    qd_metrics_set(o, "entropy", ts->gap.entropy);
    qd_metrics_set(o, "loss", ts->loss / u);
    qd_metrics_set(o, "kl", ts->kl / u);
    qd_metrics_set(o, "clip_frac", ts->clip_frac / tok);
    qd_metrics_set(o, "clip_frac_low", ts->clip_low / tok);
    qd_metrics_set(o, "clip_frac_high", ts->clip_high / tok);
    qd_metrics_set(o, "ratio_max", ts->ratio_max);
    qd_metrics_set(o, "tis_mean", ts->tis_mean / tok);
    qd_metrics_set(o, "tis_clipped_frac", ts->tis_clipped / tok);
    qd_metrics_set(o, "grad_norm", ts->grad_norm / u);
    json_object_set_new(o, "updates", json_integer(ts->updates));
    qd_metrics_set(o, "lr", ts->lr);
    json_object_set_new(o, "samples", json_integer(rs->generated));
    json_object_set_new(o, "groups_kept", json_integer(kept));
    json_object_set_new(o, "gen_batches", json_integer(rs->gen_batches));
    json_object_set_new(o, "data_pos", json_integer(r->data_pos));
    json_object_set_new(o, "optimizer_step", json_integer(r->opt_step));
    qd_metrics_set(gap, "mean_abs", ts->gap.mean_abs);
    qd_metrics_set(gap, "max_abs", ts->gap.max_abs);
    qd_metrics_set(gap, "k3_kl", ts->gap.k3_kl);
    qd_metrics_set(gap, "pearson", ts->gap.pearson);
    json_object_set_new(gap, "tokens", json_integer(ts->gap.tokens));
    json_object_set_new(o, "gap", gap);
    json_object_set_new(q, "act_err", array_of(ls->act_err, ls->nlin));
    json_object_set_new(q, "weight_err", array_of(ls->weight_err, ls->nlin));
    qd_metrics_set(q, "act_err_mean", mean_of(ls->act_err, ls->nlin));
    qd_metrics_set(q, "weight_err_mean", mean_of(ls->weight_err, ls->nlin));
    json_object_set_new(o, "quant", q);
    json_object_set_new(rt, "agree", array_of(ls->agree, ls->nmoe));
    qd_metrics_set(rt, "agree_mean", mean_of(ls->agree, ls->nmoe));
    json_object_set_new(o, "router", rt);
    qd_metrics_set(tm, "rollout_s", t[0]);
    qd_metrics_set(tm, "train_s", t[1]);
    qd_metrics_set(tm, "sync_s", t[2]);
    qd_metrics_set(tm, "step_s", t[3]);
    qd_metrics_set(tm, "tokens_per_s", t[3] > 0 ? (double)rs->tokens / t[3] : 0);
    json_object_set_new(o, "time", tm);
    return o;
}

/* ---- the step */

static bool eval_due(const rl_run *r)
{
    int64_t every = qd_config_int(r->cfg, "eval.every");
    return every > 0 && (r->step % every == 0 || r->step == r->steps);
}

static bool ckpt_due(const rl_run *r)
{
    int64_t every = qd_config_int(r->cfg, "checkpoint.every");
    return r->step == r->steps || (every > 0 && r->step % every == 0);
}

static qd_status log_eval(rl_run *r, json_t *o, json_t *tm)
{
    qd_task_eval_result ev;
    double t0 = now_s();
    qd_status st = run_eval(r, &ev);
    if (st)
        return at_step(st, r->step, "eval");
    put_eval(o, &ev, now_s() - t0, tm);
    if (r->o->log && r->o->progress && isatty(STDERR_FILENO))
        fputs("\r\033[K", stderr); /* clear the live progress line first */
    if (r->o->log)
        fprintf(r->o->log, "step %lld: held-out pass@1 %.4f (%d problems)\n", (long long)r->step, ev.pass1,
                ev.problems);
    return QD_OK;
}

/* Held-out eval: on rank 0 only; the other ranks wait for it. */
static qd_status eval_step(rl_run *r, json_t *o, json_t *tm)
{
    qd_status st = r->dp.rank == 0 ? log_eval(r, o, tm) : QD_OK;
    char name[64];
    snprintf(name, sizeof name, "eval at step %lld", (long long)r->step);
    return st ? st : qd_dp_barrier(&r->dp, name);
}

/* Checkpoint: written by rank 0 once every rank has finished the step. */
static qd_status checkpoint_step(rl_run *r)
{
    char name[64];
    snprintf(name, sizeof name, "checkpoint at step %lld", (long long)r->step);
    qd_status st = qd_dp_barrier(&r->dp, name);
    size_t rb = qd_backend_rac_state_size(r->rollout);
    void *rac = r->dp.world > 1 && rb > 0 ? malloc(rb) : NULL;
    if (!st && r->dp.world > 1 && rb > 0) {  /* the job's RAC statistics, not rank 0's share */
        st = rac ? qd_backend_get_rac_state(r->rollout, rac, rb) : qd_error(QD_ERR_NOMEM, "RAC state");
        if (!st)
            st = rac_global(r, rac, rb);
    }
    if (!st && r->dp.rank == 0)
        st = save_checkpoint(r, rac);
    free(rac);
    return st;
}

/* Data parallel: this rank's sums of the step -> those of all ranks, so the
 * metrics are of the whole batch (grad_norm, lr and the updates are equal on
 * every rank already; the gap was gathered). */
static qd_status reduce_stats(rl_run *r, rollout_stats *rs, train_stats *ts, layer_stats *ls)
{
    double v[] = {rs->reward_sum, rs->score_sum, rs->len_sum, (double)rs->generated, (double)rs->tokens,
                  ts->loss, ts->kl, ts->clip_frac, ts->clip_low, ts->clip_high, ts->tis_mean, ts->tis_clipped,
                  (double)ts->tokens};
    double mx[2] = {ts->ratio_max, (double)ls->nmoe};
    qd_status st = qd_dp_sum_f64(&r->dp, v, sizeof v / sizeof *v);
    if (!st)
        st = qd_dp_max_f64(&r->dp, mx, 2);
    if (!st)
        st = qd_dp_sum_f64(&r->dp, ls->act_sq, (size_t)ls->nlin);
    if (!st)
        st = qd_dp_sum_f64(&r->dp, ls->act_norm, (size_t)ls->nlin);
    if (!st && ls->nmoe < (int)mx[1]) { /* router agreement is measured on ranks that had mini-batch 0's data */
        layer_stats_free(&(layer_stats){.agree = ls->agree, .hits = ls->hits, .picks = ls->picks});
        ls->nmoe = (int)mx[1];
        ls->agree = calloc((size_t)ls->nmoe, sizeof(double));
        ls->hits = calloc((size_t)ls->nmoe, sizeof(double)), ls->picks = calloc((size_t)ls->nmoe, sizeof(double));
        if (!ls->agree || !ls->hits || !ls->picks)
            st = qd_error(QD_ERR_NOMEM, "router agreement");
    }
    if (!st)
        st = qd_dp_sum_f64(&r->dp, ls->hits, (size_t)ls->nmoe);
    if (!st)
        st = qd_dp_sum_f64(&r->dp, ls->picks, (size_t)ls->nmoe);
    rs->reward_sum = v[0], rs->score_sum = v[1], rs->len_sum = v[2];
    rs->generated = (int64_t)v[3], rs->tokens = (int64_t)v[4];
    ts->loss = v[5], ts->kl = v[6], ts->clip_frac = v[7], ts->clip_low = v[8], ts->clip_high = v[9];
    ts->tis_mean = v[10], ts->tis_clipped = v[11], ts->tokens = (int64_t)v[12], ts->ratio_max = mx[0];
    return st ? at_step(st, r->step, "metrics over ranks") : QD_OK;
}

static bool checksum_due(const rl_run *r)
{
    int64_t every = qd_config_int(r->cfg, "dist.checksum_every");
    return r->dp.world > 1 && every > 0 && (r->step % every == 0 || r->step == r->steps);
}

/* Every rank's checksum of its master weights (r->w, just synced); a rank
 * whose weights differ from rank 0's stops the run, named. */
static qd_status check_weights(rl_run *r, uint64_t *sum)
{
    int W = r->dp.world;
    uint64_t *all = malloc(sizeof(uint64_t) * W);
    *sum = qd_dp_fnv1a(r->w, sizeof(float) * r->nf);
    qd_status st = all ? qd_dp_gather_u64(&r->dp, *sum, all) : qd_error(QD_ERR_NOMEM, "checksum");
    char msg[900] = "";
    for (int k = 1; k < W && !st; k++)
        if (all[k] != all[0] && strlen(msg) < sizeof msg - 64)
            snprintf(msg + strlen(msg), sizeof msg - strlen(msg), ", rank %d has %016llx", k,
                     (unsigned long long)all[k]);
    if (!st && *msg)
        st = qd_error(QD_ERR_FORMAT, "step %lld: the master weights differ across ranks: rank 0 has checksum %016llx%s",
                      (long long)r->step, (unsigned long long)all[0], msg);
    free(all);
    return st;
}

static qd_status one_step(rl_run *r, sample_set *ss, qd_progress *pg)
{
    rollout_stats rs = {0};
    train_stats ts = {0};
    layer_stats ls = {0};
    double t[4], t0 = now_s();
    int kept = 0;
    uint64_t cks = 0;
    r->step++;
    qd_status st = do_rollouts(r, ss, &rs, &kept);
    if (st)
        st = at_step(st, r->step, "rollout");
    if (!st && (st = rollout_quant_errors(r, &ls)))
        st = at_step(st, r->step, "diagnostics");
    if (!st && r->kill_step == r->step)
        _exit(QD_RL_KILL_EXIT); /* test hook: a crash in the middle of a step */
    t[0] = now_s() - t0;
    double t1 = now_s();
    if (!st && (st = train_step(r, ss, kept, &ls, &ts)))
        st = at_step(st, r->step, "");
    t[1] = now_s() - t1;
    double t2 = now_s();
    if (!st)
        st = sync_weights(r);
    t[2] = now_s() - t2;
    if (!st && r->dp.world > 1)
        st = reduce_stats(r, &rs, &ts, &ls);
    if (!st && checksum_due(r))
        st = check_weights(r, &cks);
    layer_ratios(&ls);
    t[3] = now_s() - t0;
    json_t *o = st ? NULL : step_json(r, &rs, &ts, &ls, kept, t);
    if (!st && !o)
        st = qd_error(QD_ERR_NOMEM, "metrics");
    if (!st && r->dp.world > 1) {
        char hex[20];
        snprintf(hex, sizeof hex, "%016llx", (unsigned long long)cks);
        json_object_set_new(o, "world_size", json_integer(r->dp.world));
        if (checksum_due(r))
            json_object_set_new(o, "weights_checksum", json_string(hex));
    }
    if (!st && eval_due(r))
        st = eval_step(r, o, json_object_get(o, "time"));
    if (!st && r->metrics)
        st = qd_metrics_append(r->metrics, o);
    json_decref(o);
    layer_stats_free(&ls);
    if (!st && ckpt_due(r))
        st = checkpoint_step(r);
    pg->step = r->step, pg->steps_done++, pg->elapsed_s += t[3];
    pg->reward = rs.reward_sum / (double)(rs.generated ? rs.generated : 1);
    pg->gap = ts.gap.mean_abs;
    pg->tokens_per_s = t[3] > 0 ? (double)rs.tokens / t[3] : 0;
    if (!st && r->o->progress)
        qd_progress_print(pg);
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
    if (st)
        return st;
    r->trainer = new_backend(r, QD_ROLE_TRAINER);
    r->rollout = r->trainer ? new_backend(r, QD_ROLE_ROLLOUT) : NULL;
    if (!r->rollout)
        return backend_error(r);
    r->nf = qd_backend_num_floats(r->trainer);
    r->w = malloc(sizeof(float) * r->nf);
    if (!r->w)
        return qd_error(QD_ERR_NOMEM, "weights");
    int np;
    const qd_param_info *pi = qd_backend_params(r->trainer, &np);
    st = qd_checkpoint_load(r->model_dir, pi, np, r->w);
    if (!st && qd_config_float(r->cfg, "algo.kl_coef") > 0) {
        r->ref = new_backend(r, QD_ROLE_TRAINER);
        st = r->ref ? qd_backend_set_weights(r->ref, r->w, r->nf) : backend_error(r);
    }
    if (!st)
        st = qd_backend_set_weights(r->trainer, r->w, r->nf);
    if (!st)
        st = qd_backend_set_weights(r->rollout, r->w, r->nf);
    return st ? st : load_data(r);
}

static void init_params(rl_run *r)
{
    const qd_config *c = r->cfg;
    r->seed = (uint64_t)qd_config_int(c, "run.seed");
    r->steps = qd_config_int(c, "run.steps");
    r->P = qd_config_int(c, "rollout.prompts_per_step");
    r->G = qd_config_int(c, "rollout.group_size");
    r->M = qd_config_int(c, "rollout.max_tokens");
    r->J = qd_config_int(c, "trainer.mini_batches");
    qd_grpo_params_from_config(&r->gp, c);
    r->adv = (qd_adv_kind)qd_grpo_adv_kind_parse(qd_config_str(c, "algo.advantage"));
    r->sched = (qd_lr_schedule)qd_grpo_lr_schedule_parse(qd_config_str(c, "trainer.lr_schedule"));
    r->kill_step = env_int("QD_RL_TEST_KILL_STEP");
    r->nan_step = env_int("QD_RL_TEST_NAN_STEP");
}

static void run_free(rl_run *r, sample_set *ss)
{
    qd_metrics_close(r->metrics);
    qd_backend_free(r->rollout);
    qd_backend_free(r->trainer);
    qd_backend_free(r->ref);
    qd_tokenizer_free(r->tok);
    for (size_t i = 0; r->pids && i < r->train.n; i++)
        free(r->pids[i]);
    free(r->pids), free(r->plen), free(r->perm), free(r->w);
    qd_bench_set_free(&r->train);
    qd_bench_set_free(&r->test);
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

/* The final line: held-out pass@1 of the first and the last eval of the run
 * (metrics.jsonl, so a resumed run reports its start too). */
static void print_summary(rl_run *r, const char *metrics)
{
    double *x = NULL, *y = NULL;
    int64_t n = 0;
    if (qd_metrics_read_series(metrics, "eval.pass1", &x, &y, &n) == QD_OK && n >= 2)
        fprintf(r->o->log, "held-out pass@1: %.4f at step %lld, %.4f at step %lld\n", y[0], (long long)x[0],
                y[n - 1], (long long)x[n - 1]);
    free(x), free(y);
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
    if (st)
        return st;
    if (r->o->log) {
        char sum[2048];
        qd_config_summary(r->cfg, sum, sizeof sum);
        fprintf(r->o->log, "%sresolved config (%s/config.json):\n", sum, r->dir);
        print_config(r->cfg, r->o->log);
        fprintf(r->o->log, "%s %s at step %lld of %lld on the %s backend\n", r->o->resume_dir ? "resuming" : "starting",
                r->dir, (long long)r->step, (long long)r->steps, qd_backend_name(r->trainer));
        if (r->dp.world > 1)
            fprintf(r->o->log, "data parallel over %d ranks: group g of each generation batch on rank g mod %d; "
                               "rank 0 writes the run directory\n", r->dp.world, r->dp.world);
        const char *rec = qd_config_str(r->cfg, "rollout.recipe");
        double rac = qd_config_float(r->cfg, "rac.ratio");
        int narrow = r->mcfg.hidden_size < r->mcfg.moe_intermediate_size || !r->mcfg.moe_intermediate_size
                         ? r->mcfg.hidden_size : r->mcfg.moe_intermediate_size;
        if ((!strcmp(rec, "quads") || !strcmp(rec, "nvfp4-rac")) && (int64_t)(rac * narrow) / 16 == 0)
            fprintf(r->o->log, "note: rac.ratio %g picks no channel on %d-wide layers (whole 16s only): "
                               "RAC is off in some layers\n", rac, narrow);
        fflush(r->o->log);
    }
    if (r->step == 0 && qd_config_int(r->cfg, "eval.every") > 0) {
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
        print_summary(r, metrics);
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
    st = qd_dp_open(&r->dp, &env, qd_rdzv_run_id(text), qd_config_float(r->cfg, "dist.timeout_s"));
    free(text);
    if (!st && env.rank != 0) {
        *quiet = (qd_rl_options){o->resume_dir, NULL, false};
        r->o = quiet;
    }
    return st;
}

qd_status qd_rl_run(const qd_config *cfg, const qd_rl_options *o, char *run_dir, size_t n)
{
    rl_run r = {.cfg = cfg, .o = o, .dp = {0, 1, 0, NULL}};
    qd_rl_options quiet;
    sample_set ss = {0};
    qd_status st = qd_config_validate(cfg);
    if (!st && o->resume_dir)
        snprintf(r.dir, sizeof r.dir, "%s", o->resume_dir);
    else if (!st)
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
        if (qd_config_int(cfg, "run.threads") > 0)
            omp_set_num_threads((int)qd_config_int(cfg, "run.threads"));
#endif
        st = run_loop(&r, &ss);
#ifdef _OPENMP
        omp_set_num_threads(saved);
#endif
    }
    /* every rank ends together; a failing one tells the others why */
    st = st ? qd_dp_fail(&r.dp, st) : qd_dp_finish(&r.dp);
    run_free(&r, &ss);
    return st;
}
