/* bench/bench_backend: trainer and rollout throughput through the backend
 * interface (backends/backend.h), on any backend (cpu, cuda, auto), in either
 * execution mode, for a list of precision recipes.
 *
 * Ops, each timed per iteration after untimed warm-up iterations (median and
 * fastest of --iters):
 *   train step  trainer role: zero_grad + forward + backward + one AdamW step
 *               (which includes the weight sync) on B sequences of T tokens;
 *               tokens = B x T;
 *   forward     rollout role: the scoring pass, forward of the same B x T
 *               tokens (log-probs only);
 *   rollout     rollout role: generate with the KV cache, B prompts of P
 *               tokens, M new tokens each (temperature --temperature, no top-k,
 *               no top-p, no stop token, so every sequence gets M); tokens =
 *               B x M, the time includes the prompts' prefill;
 *   weight sync a trainer instance (no training state) and a rollout instance
 *               as quads rl makes them (lean: no float32 master, every recipe
 *               but fp32) of one backend: qd_backend_sync_from(rollout,
 *               trainer), device to device where both share the device (the
 *               note says "through the host" otherwise). Bytes: the trainer's
 *               master read once plus the rollout's copies written (the bytes
 *               it holds of master, working and quantized weights); TB/s over
 *               the median;
 *               bandwidth fraction over --copy-tb-per-s, else over the fp32
 *               row's TB/s in the same run (the fp32 sync is a copy of the
 *               master: a measured device-to-device copy through the same call).
 * Every call returns its results in host memory (log-probs, grad norm,
 * tokens), or finishes the device's work (the sync), so the wall clock around
 * it covers the device's work.
 *
 * Models: "tiny" (the shipped checkpoint, models/tiny), "moe8", a Qwen3-MoE
 * built in memory (8 layers, hidden 1024, 32 experts top-4, expert width 512,
 * 16 heads, 4 KV heads, head_dim 64, vocab 32000), or "a3b", Qwen3-30B-A3B's
 * layer shapes (hidden 2048, 128 experts top-8 of width 768, 32 / 4 heads of
 * 128, vocab 151936) at --layers depth; both with seeded random weights
 * (normal, std 0.02; norm weights 1), the init of transformers, made tensor
 * by tensor as a backend asks for them (qd_backend_set_weights_fill), so the
 * host never holds the whole model (a3b at 48 layers: 122 GB of float32).
 * Each instance plans its memory for the sizes given and fails at init,
 * before allocating, when the device lacks it; --plan-only prints those
 * plans by kind (qd_backend_plan) and runs nothing.
 *
 * A backend that refuses an op (QD_ERR_UNSUPPORTED), or a backend init that
 * returns NULL, makes an "n/a" row with the reason; another error makes an
 * "error" row, and the program exits 1 after the table. Backends are made one
 * at a time, so only one copy of the model's state is alive.
 *
 * --ops picks some of the ops (default: all but weight sync); --layers
 * changes moe8's and a3b's depth (a quick run on a small CPU).
 *
 * Output: one table (markdown) on stdout, a line per row on stderr as it is
 * done; --json FILE also writes one JSON object per row; --vs FILE reads such
 * lines (bench/bench_torch.py's) and adds the ratio to the matching row of the
 * same model, layers, op and sizes. JSON rows carry the fields of
 * docs/results/train-h200.jsonl too: engine "quads", commit (--commit), ms,
 * the sync's op as "weight_sync" with bytes, tb_per_s and bandwidth_fraction,
 * and for a train step flops_per_iter (6 x active parameters x tokens plus
 * attention, PaLM's 6N + 12 L H Q T per token) and, with --peak-tflops, mfu. */
#include <errno.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <jansson.h>
#ifdef _OPENMP
#include <omp.h>
#endif
#include "bench/bench_a3b.h"
#include "bench/bench_util.h"
#include "backends/backend.h"
#include "backends/layout.h"
#include "models/checkpoint.h"
#include "models/model_config.h"
#include "quant/splitmix64.h"

typedef enum { OP_TRAIN = 0, OP_FORWARD, OP_ROLLOUT, OP_SYNC, OP_COUNT } bench_op;
static const char *const op_name[OP_COUNT] = {"train step", "forward", "rollout", "weight sync"};
/* The op in JSON (bench_torch.py's names; the sync as docs/results' rows). */
static const char *const op_json[OP_COUNT] = {"train step", "forward", "rollout", "weight_sync"};

#define MAX_RECIPES 16

typedef struct {
    const char *backend, *model, *tiny_dir, *json, *vs;
    qd_exec_mode mode;
    qd_recipe recipes[MAX_RECIPES];
    int nrecipes;
    int use_op[OP_COUNT];  /* --ops */
    int B, T, P, M, iters, warmup, threads, layers;
    int plan_only;         /* --plan-only */
    int recompute;         /* --recompute: the trainer's options.recompute */
    int diagnostics;       /* --diagnostics: every instance's options.diagnostics (as quads rl's) */
    double rac_ratio, temperature;
    double copy_tbs, peak_tflops; /* --copy-tb-per-s, --peak-tflops (0: none) */
    const char *commit;
    uint64_t seed;
} bench_args;

typedef enum { ROW_OK = 0, ROW_NA, ROW_ERROR, ROW_SKIP /* not in --ops */ } row_status;

typedef struct {
    qd_recipe recipe;
    bench_op op;
    row_status status;
    char backend[32];    /* the backend that ran it (auto resolves to one) */
    char why[240];
    long tokens;         /* per iteration */
    double ms, ms_min;   /* median, fastest */
    double bytes;        /* the sync: bytes read and written per iteration */
    int direct;          /* the sync: device to device */
} bench_row;

/* ---- helpers */

static void die(const char *what, const char *msg)
{
    fprintf(stderr, "bench_backend: %s: %s\n", what, msg);
    exit(1);
}

static void *xmalloc(size_t n)
{
    void *p = malloc(n ? n : 1);
    if (!p)
        die("out of memory", "malloc");
    return p;
}

/* ---- the model */

/* The moe8 shape: a small Qwen3-MoE of the published models' proportions. */
static void moe8_config(qd_model_config *c, int layers)
{
    memset(c, 0, sizeof *c);
    c->arch = QD_ARCH_QWEN3_MOE;
    c->vocab_size = 32000;
    c->hidden_size = 1024;
    c->intermediate_size = 3072;  /* unused: every layer is sparse */
    c->moe_intermediate_size = 512;
    c->num_hidden_layers = layers;
    c->num_attention_heads = 16;
    c->num_key_value_heads = 4;
    c->head_dim = 64;
    c->rope_theta = 1000000.0;
    c->rms_norm_eps = 1e-6;
    c->num_experts = 32;
    c->num_experts_per_tok = 4;
    c->norm_topk_prob = 1;
    c->decoder_sparse_step = 1;
    c->max_position_embeddings = 4096;
    snprintf(c->torch_dtype, sizeof c->torch_dtype, "bfloat16");
}


/* n floats normal(0, std) from the stream starting at state s: Box-Muller,
 * both outputs of each pair used; pair p draws outputs 2p and 2p + 1 of the
 * stream (splitmix64 jumps ahead by adding multiples of its gamma), so the
 * threads split the pairs and the values stay those of one sequential pass. */
static void fill_normal(float *w, size_t n, double std, uint64_t s)
{
    #pragma omp parallel for schedule(static)
    for (size_t p = 0; p < (n + 1) / 2; p++) {
        uint64_t st = s + 2 * (uint64_t)p * QD_SPLITMIX64_GAMMA;
        double r = std * sqrt(-2.0 * log(1.0 - qd_splitmix64_unit(&st)));
        double a = 6.283185307179586 * qd_splitmix64_unit(&st);
        w[2 * p] = (float)(r * cos(a));
        if (2 * p + 1 < n)
            w[2 * p + 1] = (float)(r * sin(a));
    }
}

/* The weights of the model: the tiny checkpoint's (all of them, on the
 * host), or moe8's and a3b's made tensor by tensor when a backend asks for
 * them (qd_backend_set_weights_fill), so the host never holds the whole
 * model (a3b at 48 layers: 122 GB of float32). */
typedef struct {
    const float *w;       /* tiny: the master weights; else NULL */
    const qd_param_info *info; /* (ninfo) */
    int ninfo;
    uint64_t seed;
} bench_weights;

/* transformers' init: matrices normal(0, 0.02), norm weights (1-D) 1. Tensor
 * t draws from its own stream (seed mixed with t). */
static qd_status fill_weights(void *user, int t, float *dst, size_t n)
{
    const bench_weights *bw = user;
    const qd_param_info *p = &bw->info[t];
    if (bw->w) {
        memcpy(dst, bw->w + p->offset, sizeof(float) * n);
    } else if (p->rows == 1) {
        for (size_t k = 0; k < n; k++)
            dst[k] = 1.0f;
    } else {
        fill_normal(dst, n, 0.02, qd_splitmix64_mix(bw->seed ^ qd_splitmix64_mix((uint64_t)t + 1)));
    }
    return QD_OK;
}

/* The config of the model a names. */
static void model_config(const bench_args *a, qd_model_config *cfg)
{
    if (!strcmp(a->model, "tiny")) {
        if (qd_checkpoint_read_config(a->tiny_dir, cfg) != QD_OK)
            die(a->tiny_dir, qd_last_error());
    } else {
        if (!strcmp(a->model, "a3b"))
            qd_bench_a3b_config(cfg, a->layers);
        else
            moe8_config(cfg, a->layers);
        if (qd_model_config_check(cfg) != QD_OK)
            die("model config", qd_last_error());
    }
}

/* The model's parameter table (*m) and the tiny checkpoint's master weights,
 * or NULL for the models made in memory (fill_weights). */
static float *load_model(const bench_args *a, const qd_model_config *cfg, qd_model_layout *m)
{
    if (qd_model_layout_init(m, cfg) != QD_OK)
        die("parameter table", qd_last_error());
    if (strcmp(a->model, "tiny"))
        return NULL;
    float *w = xmalloc(sizeof(float) * m->nfloats);
    if (qd_checkpoint_load(a->tiny_dir, m->info, m->ninfo, w) != QD_OK)
        die(a->tiny_dir, qd_last_error());
    return w;
}

/* ---- inputs */

typedef qd_bench_inputs bench_inputs;

/* train tokens from seed + 1, prompts from seed + 2, no separate prefill */
static bench_inputs make_inputs(const bench_args *a, int vocab)
{
    return qd_bench_inputs_make("bench_backend", a->B, a->P, a->T, a->M, vocab, 0, a->seed + 2, a->seed + 1);
}

/* ---- the ops */

/* A rollout of at least 1,024 new tokens: a line on stderr at every
 * sixteenth of its steps (steps done, seconds since the generate began, ms a
 * step since the line before), so that one cut off by a time limit (the
 * 48-layer row of run_decode_h200.sh) still tells its pace. */
typedef struct {
    double t0, tl;
    int sl;
} gen_pace;

static void pace_step(int done, int steps, void *ctx)
{
    gen_pace *p = ctx;
    if (steps < 1024 || (done % (steps / 16) && done != steps))
        return;
    double now = qd_bench_now();
    fprintf(stderr, "bench_backend: rollout step %d of %d, %.1f s, %.2f ms a step since step %d\n", done, steps,
            now - p->t0, 1e3 * (now - p->tl) / (done - p->sl), p->sl);
    p->tl = now;
    p->sl = done;
}

static qd_status run_op(bench_op op, qd_backend *b, const bench_args *a, const bench_inputs *in, int step)
{
    qd_batch bt = {.B = a->B, .T = a->T, .tokens = in->train_tok, .lengths = in->len_t, .temperature = 1.0f};
    double t0 = qd_bench_now();
    gen_pace pace = {.t0 = t0, .tl = t0, .sl = 0};
    qd_generate_request rq = {.B = a->B, .Tp = a->P, .prompt = in->prompt, .prompt_len = in->len_p,
                              .seq_id = in->seq_id, .seed = a->seed, .max_new_tokens = a->M,
                              .temperature = (float)a->temperature, .top_k = 0, .top_p = 1.0f, .stop = NULL,
                              .num_stop = 0, .on_step = pace_step, .on_step_ctx = &pace};
    qd_generate_result res = {.tokens = in->gen_tok, .logp = in->logp, .lengths = in->gen_len};
    switch (op) {
    case OP_TRAIN:
        return qd_bench_train_step(b, in, a->B, a->T, 1e-5f, step);
    case OP_FORWARD:
        return qd_backend_forward(b, &bt, in->logp, NULL);
    default:
        return qd_backend_generate(b, &rq, &res);
    }
}

/* Marks row n/a (refused) or error (anything else) with the message. */
static void fail_row(bench_row *row, qd_status st, const char *what)
{
    row->status = st == QD_ERR_UNSUPPORTED ? ROW_NA : ROW_ERROR;
    snprintf(row->why, sizeof row->why, "%s: %s", what, qd_last_error());
}

/* Warm-up then timed iterations of op into row. */
static void measure(bench_op op, qd_backend *b, const bench_args *a, const bench_inputs *in, bench_row *row)
{
    double *t = xmalloc(sizeof(double) * (size_t)a->iters);
    for (int k = 0; k < a->warmup + a->iters; k++) {
        double t0 = qd_bench_now();
        qd_status st = run_op(op, b, a, in, k + 1);
        if (st != QD_OK) {
            fail_row(row, st, op_name[op]);
            free(t);
            return;
        }
        if (k >= a->warmup)
            t[k - a->warmup] = qd_bench_now() - t0;
    }
    row->ms = 1e3 * qd_bench_median(t, a->iters);
    row->ms_min = 1e3 * t[0];  /* median sorted t */
    row->tokens = (long)a->B * (op == OP_ROLLOUT ? a->M : a->T);
    row->status = ROW_OK;
    free(t);
}

/* The sync's row: the trainer tr and rollout ro of one recipe; bytes: the
 * trainer's master read once, the rollout's copies written (the bytes its
 * driver holds of master, working and quantized weights). */
static void measure_sync(qd_backend *ro, qd_backend *tr, const bench_args *a, bench_row *row)
{
    double *t = xmalloc(sizeof(double) * (size_t)a->iters);
    qd_memory mem;
    if (qd_backend_memory(ro, &mem) != QD_OK)
        memset(&mem, 0, sizeof mem);
    for (int k = 0; k < a->warmup + a->iters; k++) {
        double t0 = qd_bench_now();
        qd_status st = qd_backend_sync_from(ro, tr, &row->direct);
        if (st != QD_OK) {
            fail_row(row, st, op_name[OP_SYNC]);
            free(t);
            return;
        }
        if (k >= a->warmup)
            t[k - a->warmup] = qd_bench_now() - t0;
    }
    row->ms = 1e3 * qd_bench_median(t, a->iters);
    row->ms_min = 1e3 * t[0];
    row->bytes = sizeof(float) * (double)qd_backend_num_floats(tr) + (double)mem.peak.bytes[QD_MEM_MASTER] +
                 (double)mem.peak.bytes[QD_MEM_WORKING] + (double)mem.peak.bytes[QD_MEM_QUANT];
    row->tokens = 0;
    row->status = ROW_OK;
    free(t);
}

/* One line on stderr per row as it is done: a log that survives a kill. */
static void progress(const bench_args *a, const bench_row *r)
{
    fprintf(stderr, "bench_backend: %s, %s, %s, %s, %s: ", a->model, r->backend, qd_mode_name(a->mode),
            qd_recipe_name(r->recipe), op_name[r->op]);
    if (r->status == ROW_OK && r->op == OP_SYNC)
        fprintf(stderr, "%.3f ms/iter, %.3f TB/s%s\n", r->ms, r->bytes / (r->ms * 1e9),
                r->direct ? "" : " (through the host)");
    else if (r->status == ROW_OK)
        fprintf(stderr, "%.3f ms/iter, %.1f tokens/s\n", r->ms, 1e3 * (double)r->tokens / r->ms);
    else
        fprintf(stderr, "%s\n", r->why);
}

/* The ops of one role for recipe r: one backend made, loaded, measured, freed.
 * rows: the role's ops' rows (op, recipe already set; ROW_SKIP ones left alone). */
/* The options of an instance of role for recipe r, its workload the
 * largest calls of the role's ops (the memory plan checked at init). */
static qd_backend_options role_options(const bench_args *a, qd_recipe r, qd_role role)
{
    qd_backend_options o = {.recipe = r, .role = role, .rac_ratio = a->rac_ratio, .num_threads = a->threads,
                            .mode = a->mode, .recompute = role == QD_ROLE_TRAINER && a->recompute,
                            .diagnostics = a->diagnostics};
    if (role == QD_ROLE_TRAINER)
        o.workload = (qd_workload){.fwd_B = a->B, .fwd_T = a->T, .train = 1};
    if (role == QD_ROLE_ROLLOUT && a->use_op[OP_FORWARD])
        o.workload.fwd_B = a->B, o.workload.fwd_T = a->T;
    if (role == QD_ROLE_ROLLOUT && a->use_op[OP_ROLLOUT])
        o.workload.gen_B = a->B, o.workload.gen_Tp = a->P, o.workload.gen_M = a->M;
    return o;
}

static void run_role(const bench_args *a, const qd_model_config *cfg, bench_weights *bw, qd_recipe r,
                     qd_role role, const bench_inputs *in, bench_row *rows, int nrows)
{
    int todo = 0;
    for (int i = 0; i < nrows; i++)
        todo |= rows[i].status != ROW_SKIP;
    if (!todo)
        return;
    qd_backend_options o = role_options(a, r, role);
    qd_backend *b = qd_backend_init_by_name(a->backend, cfg, &o);
    if (!b) {
        fprintf(stderr, "bench_backend: %s backend, recipe %s, %s role: %s\n", a->backend, qd_recipe_name(r),
                role == QD_ROLE_TRAINER ? "trainer" : "rollout", qd_last_error());
        for (int i = 0; i < nrows; i++) {
            if (rows[i].status == ROW_SKIP)
                continue;
            rows[i].status = ROW_NA;
            snprintf(rows[i].backend, sizeof rows[i].backend, "%s", a->backend);
            snprintf(rows[i].why, sizeof rows[i].why, "init: %s", qd_last_error());
        }
        return;
    }
    qd_status st = qd_backend_set_weights_fill(b, fill_weights, bw);
    qd_memory mem;
    if (!st && qd_backend_memory(b, &mem) == QD_OK) { /* a log line before the ops: the plan fitted */
        char pb[32], fb[32], tb[32];
        qd_format_bytes(mem.plan.total, pb, sizeof pb);
        qd_format_bytes(mem.free_at_init, fb, sizeof fb);
        qd_format_bytes(mem.device_total, tb, sizeof tb);
        fprintf(stderr, "bench_backend: %s, recipe %s, %s role: weights set; memory plan %s, %s free of %s at init\n",
                qd_backend_name(b), qd_recipe_name(r), role == QD_ROLE_TRAINER ? "trainer" : "rollout", pb, fb, tb);
    }
    for (int i = 0; i < nrows; i++) {
        if (rows[i].status == ROW_SKIP)
            continue;
        snprintf(rows[i].backend, sizeof rows[i].backend, "%s", qd_backend_name(b));
        if (st != QD_OK)
            fail_row(&rows[i], st, "set_weights");
        else
            measure(rows[i].op, b, a, in, &rows[i]);
        progress(a, &rows[i]);
    }
    qd_backend_free(b);
}

/* The weight sync of recipe r: a trainer (its weights set) and a rollout
 * made, the sync timed, both freed. */
static void run_sync(const bench_args *a, const qd_model_config *cfg, bench_weights *bw, qd_recipe r, bench_row *row)
{
    if (row->status == ROW_SKIP)
        return;
    qd_backend_options ot = {.recipe = r, .role = QD_ROLE_TRAINER, .rac_ratio = a->rac_ratio,
                             .num_threads = a->threads, .mode = a->mode};
    qd_backend_options orl = ot;
    orl.role = QD_ROLE_ROLLOUT;
    snprintf(row->backend, sizeof row->backend, "%s", a->backend);
    qd_backend *tr = qd_backend_init_by_name(a->backend, cfg, &ot);
    qd_backend *ro = tr ? qd_backend_init_by_name(a->backend, cfg, &orl) : NULL;
    if (!tr || !ro) {
        row->status = ROW_NA;
        snprintf(row->why, sizeof row->why, "init (%s): %s", tr ? "rollout" : "trainer", qd_last_error());
    } else {
        snprintf(row->backend, sizeof row->backend, "%s", qd_backend_name(ro));
        qd_status st = qd_backend_set_weights_fill(tr, fill_weights, bw);
        if (st != QD_OK)
            fail_row(row, st, "set_weights");
        else
            measure_sync(ro, tr, a, row);
    }
    progress(a, row);
    if (ro)
        qd_backend_free(ro);
    if (tr)
        qd_backend_free(tr);
}

/* Every recipe: train step (trainer role), then forward and rollout (rollout
 * role), then the weight sync (both). rows: (nrecipes, OP_COUNT). */
static void run_all(const bench_args *a, const qd_model_config *cfg, bench_weights *bw, bench_row *rows)
{
    bench_inputs in = make_inputs(a, cfg->vocab_size);
    for (int i = 0; i < a->nrecipes; i++) {
        bench_row *rr = rows + (size_t)i * OP_COUNT;
        for (int op = 0; op < OP_COUNT; op++) {
            rr[op].recipe = a->recipes[i];
            rr[op].op = (bench_op)op;
            rr[op].status = a->use_op[op] ? ROW_NA : ROW_SKIP;  /* n/a until measured */
        }
        run_role(a, cfg, bw, a->recipes[i], QD_ROLE_TRAINER, &in, rr, 1);
        run_role(a, cfg, bw, a->recipes[i], QD_ROLE_ROLLOUT, &in, rr + 1, 2);
        run_sync(a, cfg, bw, a->recipes[i], rr + OP_SYNC);
    }
    qd_bench_inputs_free(&in);
}

/* ---- --plan-only: the memory plan of each instance the run would make */

static void print_plan(const bench_args *a, const qd_model_config *cfg, qd_recipe r, qd_role role)
{
    qd_backend_options o = role_options(a, r, role);
    if (role == QD_ROLE_TRAINER && !a->use_op[OP_TRAIN]) /* the sync's trainer: no training state */
        o.workload = (qd_workload){0};
    qd_mem_plan p;
    const char *rn = role == QD_ROLE_TRAINER ? "trainer" : "rollout";
    if (qd_backend_plan(cfg, &o, &p) != QD_OK)
        die("plan", qd_last_error());
    char b[32];
    printf("| %s | %d | %s | %s |", a->model, cfg->num_hidden_layers, qd_recipe_name(r), rn);
    for (int k = 0; k < QD_MEM_COUNT; k++) {
        qd_format_bytes(p.bytes[k], b, sizeof b);
        printf(" %s |", b);
    }
    qd_format_bytes(p.total, b, sizeof b);
    printf(" %s |\n", b);
}

/* One row per instance (recipe, role) of the ops asked for; nothing made. */
static void plan_only(const bench_args *a, const qd_model_config *cfg)
{
    printf("memory plan (qd_backend_plan; the CUDA fast mode adds its BF16 copy of the working weights): "
           "train/forward B %d x T %d, rollout B %d x (P %d + M %d)\n\n| model | layers | recipe | role |",
           a->B, a->T, a->B, a->P, a->M);
    for (int k = 0; k < QD_MEM_COUNT; k++)
        printf(" %s |", qd_mem_kind_name(k));
    printf(" total |\n|---|---:|---|---|");
    for (int k = 0; k <= QD_MEM_COUNT; k++)
        printf("---:|");
    printf("\n");
    for (int i = 0; i < a->nrecipes; i++) {
        if (a->use_op[OP_TRAIN] || a->use_op[OP_SYNC])
            print_plan(a, cfg, a->recipes[i], QD_ROLE_TRAINER);
        if (a->use_op[OP_FORWARD] || a->use_op[OP_ROLLOUT] || a->use_op[OP_SYNC])
            print_plan(a, cfg, a->recipes[i], QD_ROLE_ROLLOUT);
    }
}

/* ---- the baseline file (--vs) */

/* tokens/s of the first ok row of FILE with this model, layers, op and sizes; 0 if none. */
static double vs_rate(const bench_args *a, json_t *lines, bench_op op)
{
    size_t i;
    json_t *o;
    json_array_foreach(lines, i, o) {
        const char *m = json_string_value(json_object_get(o, "model"));
        const char *p = json_string_value(json_object_get(o, "op"));
        const char *s = json_string_value(json_object_get(o, "status"));
        int sizes = json_integer_value(json_object_get(o, "batch")) == a->B &&
                    json_integer_value(json_object_get(o, "layers")) == a->layers &&
                    (op == OP_ROLLOUT ? json_integer_value(json_object_get(o, "prompt")) == a->P &&
                                            json_integer_value(json_object_get(o, "new_tokens")) == a->M
                                      : json_integer_value(json_object_get(o, "seq")) == a->T);
        if (m && p && s && !strcmp(m, a->model) && !strcmp(p, op_name[op]) && !strcmp(s, "ok") && sizes)
            return json_number_value(json_object_get(o, "tokens_per_s"));
    }
    return 0.0;
}

/* The JSON lines of path as an array; dies naming the line when one is bad. */
static json_t *read_json_lines(const char *path)
{
    FILE *f = fopen(path, "r");
    if (!f)
        die(path, strerror(errno));
    json_t *arr = json_array();
    char line[8192];
    for (int no = 1; fgets(line, sizeof line, f); no++) {
        json_error_t e;
        if (strspn(line, " \t\r\n") == strlen(line))
            continue;
        json_t *o = json_loads(line, 0, &e);
        if (!json_is_object(o)) {
            fprintf(stderr, "bench_backend: %s: line %d: not a JSON object (%s)\n", path, no, e.text);
            exit(1);
        }
        json_array_append_new(arr, o);
    }
    fclose(f);
    return arr;
}

/* ---- output */

/* Floats a token multiplies in a forward (active parameters): every matrix
 * but the embedding (a lookup; counted once as the lm_head where tied), an
 * expert's at top-k over the experts (its rows are a fraction of the tokens). */
static double active_params(const qd_model_config *cfg, const qd_model_layout *m)
{
    double n = 0;
    int head = 0;
    for (int t = 0; t < m->ninfo; t++) {
        const qd_param_info *p = &m->info[t];
        double f = (double)p->rows * (double)p->cols;
        head |= strstr(p->name, "lm_head") != NULL;
        if (strstr(p->name, "embed_tokens"))
            continue;
        n += strstr(p->name, ".experts.") ? f * cfg->num_experts_per_tok / cfg->num_experts : f;
    }
    return head ? n : n + (double)cfg->vocab_size * cfg->hidden_size;
}

/* A train step's FLOPs at B x T tokens: PaLM's 6N + 12 L H Q T a token
 * (Chowdhery et al. 2022, appendix B; attention without the causal half). */
static double train_flops(const bench_args *a, const qd_model_config *cfg, const qd_model_layout *m)
{
    double per_tok = 6.0 * active_params(cfg, m) + 12.0 * cfg->num_hidden_layers * cfg->num_attention_heads *
                                                        (double)cfg->head_dim * a->T;
    return per_tok * a->B * (double)a->T;
}

/* TB/s of the sync row r; 0 when not ok. */
static double sync_tbs(const bench_row *r)
{
    return r->status == ROW_OK && r->ms > 0 ? r->bytes / (r->ms * 1e9) : 0.0;
}

/* The copy bandwidth the sync is compared with: --copy-tb-per-s, else the
 * fp32 sync of this run (a copy of the master), else 0. */
static double copy_tbs(const bench_args *a, const bench_row *rows)
{
    if (a->copy_tbs > 0)
        return a->copy_tbs;
    for (int i = 0; i < a->nrecipes; i++)
        if (a->recipes[i] == QD_RECIPE_FP32)
            return sync_tbs(&rows[(size_t)i * OP_COUNT + OP_SYNC]);
    return 0.0;
}

static double rate(const bench_row *r)
{
    return r->status == ROW_OK && r->ms > 0 ? 1e3 * (double)r->tokens / r->ms : 0.0;
}

/* tokens/s of the bf16 row of the same op; 0 when absent. */
static double bf16_rate(const bench_args *a, const bench_row *rows, bench_op op)
{
    for (int i = 0; i < a->nrecipes; i++)
        if (a->recipes[i] == QD_RECIPE_BF16)
            return rate(&rows[(size_t)i * OP_COUNT + op]);
    return 0.0;
}

static void fmt_ratio(char *out, size_t n, double x, double ref)
{
    if (x > 0 && ref > 0)
        snprintf(out, n, "%.3f", x / ref);
    else
        snprintf(out, n, "-");
}

static const char *status_name(row_status s)
{
    return s == ROW_OK ? "ok" : s == ROW_NA ? "n/a" : "error";
}

/* This process's rows (pid and start time): bench/decode_rows.py compares
 * recipes measured in one process (batch 1 tracks the host's speed, which
 * moves between processes). */
static const char *process_id(void)
{
    static char id[48];
    if (!id[0])
        snprintf(id, sizeof id, "%ld-%lld", (long)getpid(), (long long)time(NULL));
    return id;
}

static json_t *row_json(const bench_args *a, const bench_row *r, double vs_bf16, double vs, double copy,
                        double flops)
{
    json_t *o = json_pack("{s:s, s:s, s:s, s:s, s:s, s:s, s:s, s:i, s:i, s:i, s:i, s:i, s:i, s:i, s:i}",
                          "program", "bench_backend", "model", a->model, "backend", r->backend, "mode",
                          qd_mode_name(a->mode), "recipe", qd_recipe_name(r->recipe), "op", op_json[r->op],
                          "status", status_name(r->status), "batch", a->B, "seq", a->T, "prompt", a->P,
                          "new_tokens", a->M, "layers", a->layers, "iters", a->iters, "warmup", a->warmup, "threads", a->threads);
    json_object_set_new(o, "process", json_string(process_id()));
    json_object_set_new(o, "engine", json_string("quads"));
    json_object_set_new(o, "commit", json_string(a->commit));
    if (a->recompute && r->op == OP_TRAIN)
        json_object_set_new(o, "recompute", json_true());
    if (a->diagnostics)
        json_object_set_new(o, "diagnostics", json_true());
    if (r->status == ROW_OK && r->op == OP_SYNC) {
        json_object_set_new(o, "ms", json_real(r->ms));
        json_object_set_new(o, "ms_min", json_real(r->ms_min));
        json_object_set_new(o, "bytes", json_real(r->bytes));
        json_object_set_new(o, "tb_per_s", json_real(sync_tbs(r)));
        json_object_set_new(o, "device_to_device", json_boolean(r->direct));
        if (copy > 0) {
            json_object_set_new(o, "copy_tb_per_s", json_real(copy));
            json_object_set_new(o, "bandwidth_fraction", json_real(sync_tbs(r) / copy));
        }
    } else if (r->status == ROW_OK) {
        json_object_set_new(o, "ms", json_real(r->ms));
        if (r->op == OP_TRAIN) {
            json_object_set_new(o, "flops_per_iter", json_real(flops));
            if (a->peak_tflops > 0)
                json_object_set_new(o, "mfu", json_real(flops / (r->ms * 1e-3) / (a->peak_tflops * 1e12)));
        }
        json_object_set_new(o, "tokens_per_iter", json_integer(r->tokens));
        json_object_set_new(o, "ms_per_iter", json_real(r->ms));
        json_object_set_new(o, "ms_min", json_real(r->ms_min));
        json_object_set_new(o, "tokens_per_s", json_real(rate(r)));
        if (vs_bf16 > 0)
            json_object_set_new(o, "vs_bf16", json_real(rate(r) / vs_bf16));
        if (vs > 0)
            json_object_set_new(o, "vs_baseline", json_real(rate(r) / vs));
    } else {
        json_object_set_new(o, "reason", json_string(r->why));
    }
    return o;
}

static void print_header(const bench_args *a, const qd_model_config *cfg, size_t n)
{
    printf("model %s: hidden %d, %d layers, %d experts top-%d (width %d), %d heads / %d kv x %d, vocab %d, "
           "%zu parameters\n",
           a->model, cfg->hidden_size, cfg->num_hidden_layers, cfg->num_experts, cfg->num_experts_per_tok,
           cfg->moe_intermediate_size, cfg->num_attention_heads, cfg->num_key_value_heads, cfg->head_dim,
           cfg->vocab_size, n);
    printf("batch %d; train/forward seq %d; rollout prompt %d + %d new (temperature %g); warmup %d, iters %d; "
           "threads %d; seed %llu%s%s\n\n",
           a->B, a->T, a->P, a->M, a->temperature, a->warmup, a->iters, a->threads, (unsigned long long)a->seed,
           a->recompute ? "; the trainer recomputes activations (--recompute)" : "",
           a->diagnostics ? "; diagnostics on, as in quads rl (--diagnostics)" : "");
    if (a->vs)
        printf("vs baseline: tokens/s over the row of %s with the same model, layers, op and sizes\n\n", a->vs);
    printf("| model | backend | mode | recipe | op | tokens/iter | ms/iter (median) | ms (min) | tokens/s | vs bf16 |%s"
           " note |\n", a->vs ? " vs baseline |" : "");
    printf("|---|---|---|---|---|---:|---:|---:|---:|---:|%s---|\n", a->vs ? "---:|" : "");
}

/* A sync row of the table: no tokens; the bytes, TB/s and copy fraction in the note. */
static void print_sync_row(const bench_args *a, const bench_row *r, double copy)
{
    char frac[48] = "", b[32];
    if (copy > 0)
        snprintf(frac, sizeof frac, ", %.1f%% of copy (%.3f TB/s)", 100 * sync_tbs(r) / copy, copy);
    qd_format_bytes((size_t)r->bytes, b, sizeof b);
    printf("- | %.3f | %.3f | - | - |%s %s read+written, %.3f TB/s%s%s |\n", r->ms, r->ms_min, a->vs ? " - |" : "",
           b, sync_tbs(r), frac, r->direct ? "" : ", through the host");
}

/* The table on stdout, the JSON lines to f (when not NULL). */
static void report(const bench_args *a, const bench_row *rows, json_t *vs_lines, FILE *f, double flops)
{
    double copy = copy_tbs(a, rows);
    for (int i = 0; i < a->nrecipes * OP_COUNT; i++) {
        const bench_row *r = &rows[i];
        if (r->status == ROW_SKIP)
            continue;
        double ref = bf16_rate(a, rows, r->op), vs = vs_lines ? vs_rate(a, vs_lines, r->op) : 0.0;
        char rb[32], rv[40];
        fmt_ratio(rb, sizeof rb, rate(r), ref);
        fmt_ratio(rv, sizeof rv, rate(r), vs);
        printf("| %s | %s | %s | %s | %s | ", a->model, r->backend, qd_mode_name(a->mode), qd_recipe_name(r->recipe),
               op_name[r->op]);
        if (r->status == ROW_OK && r->op == OP_SYNC)
            print_sync_row(a, r, copy);
        else if (r->status == ROW_OK)
            printf("%ld | %.3f | %.3f | %.1f | %s |%s%s%s |\n", r->tokens, r->ms, r->ms_min, rate(r), rb,
                   a->vs ? " " : "", a->vs ? rv : "", a->vs ? " |" : "");
        else
            printf("- | %s | - | %s | - |%s %s: %s |\n", status_name(r->status), status_name(r->status),
                   a->vs ? " - |" : "", status_name(r->status), r->why);
        if (f) {
            json_t *o = row_json(a, r, ref, vs, copy, flops);
            json_dumpf(o, f, JSON_COMPACT);
            fputc('\n', f);
            json_decref(o);
        }
    }
}

/* ---- arguments */

static void usage(FILE *f)
{
    fprintf(f,
        "usage: bench/bench_backend [--backend auto|cpu|cuda] [--mode exact|fast] [--recipe a,b,...]\n"
        "         [--model tiny|moe8|a3b] [--tiny-dir DIR] [--layers L] [--batch B] [--seq T] [--prompt P]\n"
        "         [--new-tokens M] [--iters N] [--warmup W] [--threads N] [--temperature X]\n"
        "         [--ops 'train step,forward,rollout,weight sync']\n"
        "         [--rac-ratio X] [--seed S] [--json FILE] [--vs FILE] [--plan-only] [--recompute] [--diagnostics]\n"
        "         [--copy-tb-per-s X] [--peak-tflops X] [--commit ID]\n"
        "  defaults: auto, exact, bf16,fp8,nvfp4,quads, tiny (models/tiny), moe8 8 layers, B 8, T 128,\n"
        "  P 32, M 64, iters 5, warmup 1, all cores, temperature 1, rac-ratio 0.25, seed 1,\n"
        "  ops: all but weight sync\n"
        "  --copy-tb-per-s X  the sync's bandwidth fraction over X (default: the fp32 sync's TB/s)\n"
        "  --peak-tflops X    a train step's mfu over X TFLOP/s (H200 BF16 dense: 989)\n"
        "  --commit ID        the commit named in the JSON rows (default unknown)\n"
        "  --json FILE  also write the rows as JSON lines;  --vs FILE  add a column: tokens/s over the\n"
        "               first ok row of FILE (JSON lines, e.g. bench_torch.py's) of the same model, op, sizes\n"
        "  --plan-only  print the memory plan of each instance (recipe, role) the ops would make, by kind,\n"
        "               and make none (no weights, no device)\n"
        "  --recompute  the trainer recomputes each layer's activations in the backward (options.recompute)\n"
        "  --diagnostics  every instance gathers diagnostics (options.diagnostics), as quads rl's do\n");
}

static int int_arg(const char *name, const char *v, int lo)
{
    char *end;
    long x = strtol(v, &end, 10);
    if (end == v || *end || x < lo || x > 1000000) {
        fprintf(stderr, "bench_backend: %s needs an integer >= %d, got '%s'\n", name, lo, v);
        exit(2);
    }
    return (int)x;
}

static double num_arg(const char *name, const char *v, double lo, double hi)
{
    char *end;
    double x = strtod(v, &end);
    if (end == v || *end || !(x >= lo && x <= hi)) {
        fprintf(stderr, "bench_backend: %s needs a number in [%g, %g], got '%s'\n", name, lo, hi, v);
        exit(2);
    }
    return x;
}

static void parse_ops(bench_args *a, char *list)
{
    memset(a->use_op, 0, sizeof a->use_op);
    for (char *s = strtok(list, ","); s; s = strtok(NULL, ",")) {
        int op = 0;
        while (op < OP_COUNT && strcmp(s, op_name[op]))
            op++;
        if (op == OP_COUNT) {
            fprintf(stderr, "bench_backend: --ops: unknown op '%s' (train step, forward, rollout, weight sync)\n",
                    s);
            exit(2);
        }
        a->use_op[op] = 1;
    }
}

static void parse_recipes(bench_args *a, char *list)
{
    a->nrecipes = 0;
    for (char *s = strtok(list, ","); s; s = strtok(NULL, ",")) {
        if (a->nrecipes == MAX_RECIPES || qd_recipe_parse(&a->recipes[a->nrecipes++], s) != QD_OK) {
            fprintf(stderr, "bench_backend: --recipe: %s\n",
                    a->nrecipes == MAX_RECIPES ? "too many recipes" : qd_last_error());
            exit(2);
        }
    }
    if (a->nrecipes == 0) {
        fprintf(stderr, "bench_backend: --recipe: empty list\n");
        exit(2);
    }
}

/* One option and its value; 0 when the option is unknown. */
static int set_option(bench_args *a, const char *o, const char *v)
{
    if (!strcmp(o, "--backend")) a->backend = v;
    else if (!strcmp(o, "--mode")) {
        if (qd_mode_parse(&a->mode, v) != QD_OK) {
            fprintf(stderr, "bench_backend: --mode: %s\n", qd_last_error());
            exit(2);
        }
    }
    else if (!strcmp(o, "--recipe") || !strcmp(o, "--recipes")) parse_recipes(a, (char *)v);
    else if (!strcmp(o, "--ops")) parse_ops(a, (char *)v);
    else if (!strcmp(o, "--model")) a->model = v;
    else if (!strcmp(o, "--tiny-dir")) a->tiny_dir = v;
    else if (!strcmp(o, "--layers")) a->layers = int_arg(o, v, 1);
    else if (!strcmp(o, "--batch")) a->B = int_arg(o, v, 1);
    else if (!strcmp(o, "--seq")) a->T = int_arg(o, v, 2);
    else if (!strcmp(o, "--prompt")) a->P = int_arg(o, v, 1);
    else if (!strcmp(o, "--new-tokens")) a->M = int_arg(o, v, 1);
    else if (!strcmp(o, "--iters")) a->iters = int_arg(o, v, 1);
    else if (!strcmp(o, "--warmup")) a->warmup = int_arg(o, v, 0);
    else if (!strcmp(o, "--threads")) a->threads = int_arg(o, v, 1);
    else if (!strcmp(o, "--seed")) a->seed = (uint64_t)int_arg(o, v, 0);
    else if (!strcmp(o, "--temperature")) a->temperature = num_arg(o, v, 0.0, 100.0);
    else if (!strcmp(o, "--rac-ratio")) a->rac_ratio = num_arg(o, v, 0.0, 1.0);
    else if (!strcmp(o, "--json")) a->json = v;
    else if (!strcmp(o, "--vs")) a->vs = v;
    else if (!strcmp(o, "--copy-tb-per-s")) a->copy_tbs = num_arg(o, v, 0.0, 1e6);
    else if (!strcmp(o, "--peak-tflops")) a->peak_tflops = num_arg(o, v, 0.0, 1e9);
    else if (!strcmp(o, "--commit")) a->commit = v;
    else return 0;
    return 1;
}

static bench_args parse_args(int argc, char **argv)
{
    static char default_recipes[] = "bf16,fp8,nvfp4,quads";
    bench_args a = {.backend = "auto", .model = "tiny", .tiny_dir = "models/tiny", .mode = QD_MODE_EXACT, .B = 8,
                    .T = 128, .P = 32, .M = 64, .iters = 5, .warmup = 1, .layers = 8, .rac_ratio = 0.25,
                    .temperature = 1.0, .seed = 1, .commit = "unknown"};
#ifdef _OPENMP
    a.threads = omp_get_num_procs();
#else
    a.threads = 1;
#endif
    parse_recipes(&a, default_recipes);
    for (int op = 0; op < OP_COUNT; op++)
        a.use_op[op] = op != OP_SYNC;
    for (int i = 1; i < argc; i += 2) {
        if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) {
            usage(stdout);
            exit(0);
        }
        if (!strcmp(argv[i], "--plan-only")) {
            a.plan_only = 1;
            i--;
            continue;
        }
        if (!strcmp(argv[i], "--recompute")) {
            a.recompute = 1;
            i--;
            continue;
        }
        if (!strcmp(argv[i], "--diagnostics")) {
            a.diagnostics = 1;
            i--;
            continue;
        }
        if (i + 1 >= argc || !set_option(&a, argv[i], argv[i + 1])) {
            usage(stderr);
            exit(2);
        }
    }
    if (strcmp(a.model, "tiny") && strcmp(a.model, "moe8") && strcmp(a.model, "a3b")) {
        fprintf(stderr, "bench_backend: --model: '%s' (tiny, moe8, a3b)\n", a.model);
        exit(2);
    }
    return a;
}

int main(int argc, char **argv)
{
    bench_args a = parse_args(argc, argv);
    qd_model_config cfg;
    model_config(&a, &cfg);
    a.layers = cfg.num_hidden_layers;  /* the tiny model's too, for --json and --vs */
    if (a.P + a.M > cfg.max_position_embeddings || a.T > cfg.max_position_embeddings) {
        fprintf(stderr, "bench_backend: prompt + new tokens (%d) or seq (%d) > max_position_embeddings %d\n",
                a.P + a.M, a.T, cfg.max_position_embeddings);
        return 2;
    }
    if (a.plan_only) {
        plan_only(&a, &cfg);
        return 0;
    }
    qd_model_layout m;
    float *w = load_model(&a, &cfg, &m);
    bench_weights bw = {.w = w, .info = m.info, .ninfo = m.ninfo, .seed = a.seed};
    json_t *vs_lines = a.vs ? read_json_lines(a.vs) : NULL;
    FILE *jf = a.json ? fopen(a.json, "w") : NULL;
    if (a.json && !jf)
        die(a.json, strerror(errno));
    bench_row *rows = calloc((size_t)a.nrecipes * OP_COUNT, sizeof *rows);
    if (!rows)
        die("out of memory", "rows");
    run_all(&a, &cfg, &bw, rows);
    print_header(&a, &cfg, m.nfloats);
    report(&a, rows, vs_lines, jf, train_flops(&a, &cfg, &m));
    if (jf && fclose(jf) != 0)
        die(a.json, strerror(errno));
    int bad = 0;
    for (int i = 0; i < a.nrecipes * OP_COUNT; i++)
        bad |= rows[i].status == ROW_ERROR;
    json_decref(vs_lines);
    free(rows);
    free(w);
    qd_model_layout_free(&m);
    return bad;
}
