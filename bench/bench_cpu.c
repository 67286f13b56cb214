/* bench/bench_cpu: CPU throughput of one model under every precision recipe.
 *
 * Three phases, each timed as the median of R repeats after one untimed
 * warm-up run (repeats interleaved over all rows, see run_all):
 *   prefill  rollout role: forward of B prompts of length P (log-probs only);
 *   decode   rollout role: generate B sequences of M new tokens after those
 *            prompts (KV cache, temperature 1, no stop token). The time of a
 *            generate of 1 new token (the prompt's prefill and the first
 *            sample) is subtracted in each repeat, so the row counts the
 *            B x (M - 1) tokens of the decode steps only;
 *   train    trainer role: zero_grad + forward + backward + one AdamW step
 *            (which includes the weight sync) on B sequences of length T.
 * A combination the backend refuses with QD_ERR_UNSUPPORTED is listed as
 * refused; any other error ends the program.
 *
 * The model is an HF checkpoint folder (--model DIR) or, by default, a
 * built-in Qwen3-MoE of the tiny model's shape with seeded random weights.
 * Inputs are seeded too, so two runs do the same arithmetic. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <math.h>
#include <time.h>
#ifdef _OPENMP
#include <omp.h>
#endif
#include "bench/bench_util.h"
#include "backends/backend.h"
#include "models/checkpoint.h"
#include "models/model_config.h"
#include "orchestrator/sft.h"
#include "quant/splitmix64.h"

typedef enum { PH_PREFILL = 0, PH_DECODE, PH_TRAIN, PH_COUNT } phase;
static const char *const phase_name[PH_COUNT] = {"prefill", "decode", "train"};

typedef struct {
    const char *model;  /* NULL: built-in config */
    int threads, B, P, M, T, R;
    double rac_ratio;
    uint64_t seed;
    int use[QD_RECIPE_COUNT];
} bench_args;

typedef struct {
    int done;           /* 0: not run, 1: measured, -1: refused */
    long tokens;
    double seconds;     /* median over repeats */
    double best;        /* fastest repeat: the least disturbed by other load */
    char why[120];
} bench_row;

static uint64_t rng_state;

static double urand(void) { return qd_splitmix64_unit(&rng_state); } /* [0, 1) */

/* Norms 1 +- 0.2, embedding +-1, matrices uniform with unit-variance outputs. */
static void random_weights(const qd_param_info *p, int np, float *w, uint64_t seed)
{
    rng_state = seed;
    for (int i = 0; i < np; i++) {
        int norm = p[i].rows == 1, emb = strstr(p[i].name, "embed") != NULL;
        double a = norm ? 0.2 : emb ? 1.0 : sqrt(3.0 / (double)p[i].cols);
        for (int64_t k = 0; k < p[i].rows * p[i].cols; k++)
            w[p[i].offset + k] = (float)((norm ? 1.0 : 0.0) + a * (2.0 * urand() - 1.0));
    }
}

static void die(const char *what)
{
    fprintf(stderr, "bench_cpu: %s: %s\n", what, qd_last_error());
    exit(1);
}

/* Float32 master weights of the model: the checkpoint's or seeded random ones. */
static float *load_model(const bench_args *a, qd_model_config *cfg, size_t *n)
{
    qd_backend *b;
    if (a->model) {
        if (qd_checkpoint_read_config(a->model, cfg) != QD_OK)
            die(a->model);
        b = qd_checkpoint_open_backend(a->model, "cpu", NULL);
    } else {
        /* the tiny model's shape */
        if (qd_sft_make_config(&qd_sft_default_dims, cfg) != QD_OK)
            die("built-in model config");
        b = qd_backend_cpu_init(cfg, &(qd_backend_options){0});
    }
    if (!b)
        die(a->model ? a->model : "built-in model");
    *n = qd_backend_num_floats(b);
    float *w = malloc(sizeof(float) * *n);
    if (!w) {
        fprintf(stderr, "bench_cpu: out of memory\n");
        exit(1);
    }
    if (a->model) {
        if (qd_backend_get_weights(b, w, *n) != QD_OK)
            die("get_weights");
    } else {
        int np;
        const qd_param_info *p = qd_backend_params(b, &np);
        random_weights(p, np, w, a->seed);
    }
    qd_backend_free(b);
    return w;
}

static void *xmalloc(size_t n) { return qd_bench_alloc("bench_cpu", n); }

/* The inputs of the three phases, the same for every recipe. */
typedef qd_bench_inputs bench_inputs;

static bench_inputs make_inputs(const bench_args *a, int vocab)
{
    return qd_bench_inputs_make("bench_cpu", a->B, a->P, a->T, a->M, vocab, a->seed + 1, a->seed + 2, a->seed + 3);
}

/* Records a refusal in row; any other error ends the program. */
static int refused(qd_status st, bench_row *row, const char *what)
{
    if (st == QD_OK)
        return 0;
    if (st != QD_ERR_UNSUPPORTED)
        die(what);
    row->done = -1;
    snprintf(row->why, sizeof row->why, "%s", qd_last_error());
    return 1;
}

static qd_backend *make_backend(const qd_model_config *cfg, qd_recipe r, qd_role role, const bench_args *a,
                                const float *w, size_t n)
{
    qd_backend_options o = {.recipe = r, .role = role, .rac_ratio = a->rac_ratio, .num_threads = a->threads};
    qd_backend *b = qd_backend_cpu_init(cfg, &o);
    if (!b)
        die(qd_recipe_name(r));
    if (qd_backend_set_weights(b, w, n) != QD_OK)
        die("set_weights");
    return b;
}

static qd_status generate(qd_backend *b, const bench_args *a, const bench_inputs *in, int m)
{
    qd_generate_request rq = {.B = a->B, .Tp = a->P, .prompt = in->prompt, .prompt_len = in->len_p,
                              .seq_id = in->seq_id, .seed = a->seed, .max_new_tokens = m, .temperature = 1.0f,
                              .top_k = 0, .top_p = 1.0f, .stop = NULL, .num_stop = 0};
    qd_generate_result res = {.tokens = in->gen_tok, .logp = in->logp, .lengths = in->gen_len};
    return qd_backend_generate(b, &rq, &res);
}

/* One run of phase p (see the top of the file): *sec its seconds, *base the
 * seconds to subtract (decode: the 1-token generate; else 0). 0 when refused. */
static int run_phase(phase p, qd_backend *b, const bench_args *a, const bench_inputs *in, int step,
                     bench_row *row, double *sec, double *base)
{
    qd_batch bt = {.B = a->B, .T = a->P, .tokens = in->prefill_tok, .lengths = in->len_p, .temperature = 1.0f};
    double t0 = qd_bench_now();
    *base = 0.0;
    switch (p) {
    case PH_PREFILL:
        if (refused(qd_backend_forward(b, &bt, in->logp, NULL), row, "forward"))
            return 0;
        break;
    case PH_DECODE:
        if (refused(generate(b, a, in, 1), row, "generate"))
            return 0;
        *base = qd_bench_now() - t0;
        t0 = qd_bench_now();
        if (refused(generate(b, a, in, a->M), row, "generate"))
            return 0;
        break;
    default:
        if (refused(qd_bench_train_step(b, in, a->B, a->T, 1e-4f, step), row, "train step"))
            return 0;
    }
    *sec = qd_bench_now() - t0;
    return 1;
}

static double min_of(const double *v, int n)
{
    double m = v[0];
    for (int i = 1; i < n; i++)
        m = v[i] < m ? v[i] : m;
    return m;
}

static long phase_tokens(phase p, const bench_args *a)
{
    return (long)a->B * (p == PH_PREFILL ? a->P : p == PH_DECODE ? a->M - 1 : a->T);
}

/* Repeat k of every recipe and phase before repeat k + 1, so that a change in
 * the machine's load during the run falls on all rows alike; k = -1 warms up.
 * seconds: the median of (sec - base) over repeats; best: min sec - min base. */
static void run_all(const bench_args *a, const qd_model_config *cfg, const float *w, size_t n,
                    bench_row rows[][PH_COUNT])
{
    qd_backend *be[QD_RECIPE_COUNT][PH_COUNT] = {{NULL}};
    size_t R = (size_t)a->R, cells = QD_RECIPE_COUNT * PH_COUNT * R;
    double *sec = xmalloc(sizeof(double) * cells), *base = xmalloc(sizeof(double) * cells);
    double *diff = xmalloc(sizeof(double) * R);
    bench_inputs in = make_inputs(a, cfg->vocab_size);
    for (int r = 0; r < QD_RECIPE_COUNT; r++)
        for (int p = 0; a->use[r] && p < PH_COUNT; p++)
            be[r][p] = make_backend(cfg, (qd_recipe)r, p == PH_TRAIN ? QD_ROLE_TRAINER : QD_ROLE_ROLLOUT, a, w, n);
    for (int k = -1; k < a->R; k++)
        for (int r = 0; r < QD_RECIPE_COUNT; r++)
            for (int p = 0; a->use[r] && p < PH_COUNT; p++) {
                size_t at = ((size_t)r * PH_COUNT + (size_t)p) * R + (size_t)(k < 0 ? 0 : k);
                if (rows[r][p].done == 0)
                    run_phase((phase)p, be[r][p], a, &in, k + 2, &rows[r][p], sec + at, base + at);
            }
    for (int r = 0; r < QD_RECIPE_COUNT; r++)
        for (int p = 0; a->use[r] && p < PH_COUNT; p++) {
            const double *s = sec + ((size_t)r * PH_COUNT + (size_t)p) * R, *b0 = base + (s - sec);
            if (rows[r][p].done == 0) {
                for (size_t k = 0; k < R; k++)
                    diff[k] = s[k] - b0[k];
                rows[r][p].done = 1;
                rows[r][p].tokens = phase_tokens((phase)p, a);
                rows[r][p].seconds = qd_bench_median(diff, a->R);
                rows[r][p].best = min_of(s, a->R) - min_of(b0, a->R);
            }
            qd_backend_free(be[r][p]);
        }
    qd_bench_inputs_free(&in);
    free(diff);
    free(base);
    free(sec);
}

static void load_average(char *out, size_t n)
{
    FILE *f = fopen("/proc/loadavg", "r");
    double l1 = 0, l5 = 0, l15 = 0;
    if (!f || fscanf(f, "%lf %lf %lf", &l1, &l5, &l15) != 3)
        snprintf(out, n, "unknown");
    else
        snprintf(out, n, "%.2f %.2f %.2f", l1, l5, l15);
    if (f)
        fclose(f);
}

/* "x 1.23" of row against ref, "-" when either is missing. */
static void ratio(char *out, size_t n, const bench_row *row, const bench_row *ref)
{
    if (row->done != 1 || ref->done != 1 || row->seconds <= 0 || ref->seconds <= 0)
        snprintf(out, n, "-");
    else
        snprintf(out, n, "%.3f", ((double)row->tokens / row->seconds) / ((double)ref->tokens / ref->seconds));
}

static void print_table(const bench_args *a, bench_row rows[][PH_COUNT])
{
    printf("| recipe | role | phase | tokens | seconds (median of %d) | tokens/s | vs fp32 | vs bf16 | best s |\n",
           a->R);
    printf("|---|---|---|---:|---:|---:|---:|---:|---:|\n");
    for (int r = 0; r < QD_RECIPE_COUNT; r++)
        for (int p = 0; p < PH_COUNT; p++) {
            const bench_row *w = &rows[r][p];
            const char *role = p == PH_TRAIN ? "trainer" : "rollout";
            if (!a->use[r])
                continue;
            if (w->done == -1) {
                printf("| %s | %s | %s | - | - | refused: %s | - | - | - |\n", qd_recipe_name((qd_recipe)r), role,
                       phase_name[p], w->why);
                continue;
            }
            char v32[32], v16[32];
            ratio(v32, sizeof v32, w, &rows[QD_RECIPE_FP32][p]);
            ratio(v16, sizeof v16, w, &rows[QD_RECIPE_BF16][p]);
            printf("| %s | %s | %s | %ld | %.6f | %.0f | %s | %s | %.6f |\n", qd_recipe_name((qd_recipe)r), role,
                   phase_name[p], w->tokens, w->seconds, (double)w->tokens / w->seconds, v32, v16, w->best);
        }
}

static void usage(FILE *f)
{
    fprintf(f,
        "usage: bench/bench_cpu [--model DIR] [--threads N] [--batch B] [--prompt P] [--new M]\n"
        "                       [--seq T] [--repeats R] [--rac-ratio X] [--seed S] [--recipes a,b,...]\n"
        "  --model DIR   HF checkpoint folder (default: built-in tiny Qwen3-MoE, random weights)\n"
        "  --threads N   OpenMP threads (default: all cores)\n"
        "  defaults: B 16, P 64, M 64, T 128, R 5, rac-ratio 0.25, seed 1, every recipe\n");
}

static int int_arg(const char *name, const char *v, int lo)
{
    char *end;
    long x = v ? strtol(v, &end, 10) : 0;
    if (!v || *end || x < lo || x > 1000000) {
        fprintf(stderr, "bench_cpu: %s needs an integer >= %d\n", name, lo);
        exit(2);
    }
    return (int)x;
}

static double ratio_arg(const char *name, const char *v)
{
    char *end;
    double x = strtod(v, &end);
    if (end == v || *end || !(x >= 0.0 && x <= 1.0)) {
        fprintf(stderr, "bench_cpu: %s needs a number in [0, 1]\n", name);
        exit(2);
    }
    return x;
}

static void parse_recipes(bench_args *a, char *list)
{
    memset(a->use, 0, sizeof a->use);
    for (char *s = strtok(list, ","); s; s = strtok(NULL, ",")) {
        qd_recipe r;
        if (qd_recipe_parse(&r, s) != QD_OK) {
            fprintf(stderr, "bench_cpu: --recipes: %s\n", qd_last_error());
            exit(2);
        }
        a->use[r] = 1;
    }
}

static bench_args parse_args(int argc, char **argv)
{
    bench_args a = {NULL, 0, 16, 64, 64, 128, 5, 0.25, 1, {0}};
#ifdef _OPENMP
    a.threads = omp_get_num_procs();
#else
    a.threads = 1;
#endif
    for (int r = 0; r < QD_RECIPE_COUNT; r++)
        a.use[r] = 1;
    for (int i = 1; i < argc; i++) {
        const char *o = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(o, "-h") || !strcmp(o, "--help")) {
            usage(stdout);
            exit(0);
        }
        if (!v) {
            usage(stderr);
            exit(2);
        }
        i++;
        if (!strcmp(o, "--model"))
            a.model = v;
        else if (!strcmp(o, "--threads"))
            a.threads = int_arg(o, v, 1);
        else if (!strcmp(o, "--batch"))
            a.B = int_arg(o, v, 1);
        else if (!strcmp(o, "--prompt"))
            a.P = int_arg(o, v, 1);
        else if (!strcmp(o, "--new"))
            a.M = int_arg(o, v, 2);
        else if (!strcmp(o, "--seq"))
            a.T = int_arg(o, v, 2);
        else if (!strcmp(o, "--repeats"))
            a.R = int_arg(o, v, 1);
        else if (!strcmp(o, "--seed"))
            a.seed = (uint64_t)int_arg(o, v, 0);
        else if (!strcmp(o, "--rac-ratio"))
            a.rac_ratio = ratio_arg(o, v);
        else if (!strcmp(o, "--recipes"))
            parse_recipes(&a, (char *)v);
        else {
            usage(stderr);
            exit(2);
        }
    }
    return a;
}

int main(int argc, char **argv)
{
    bench_args a = parse_args(argc, argv);
    qd_model_config cfg;
    size_t n;
    float *w = load_model(&a, &cfg, &n);
    if (a.P + a.M > cfg.max_position_embeddings || a.T > cfg.max_position_embeddings) {
        fprintf(stderr, "bench_cpu: prompt + new (%d) or seq (%d) > max_position_embeddings %d\n", a.P + a.M,
                a.T, cfg.max_position_embeddings);
        return 2;
    }
    char load0[64], load1[64];
    load_average(load0, sizeof load0);
    static bench_row rows[QD_RECIPE_COUNT][PH_COUNT];
    run_all(&a, &cfg, w, n, rows);
    load_average(load1, sizeof load1);
    printf("model: %s (hidden %d, %d layers, %d experts top-%d, vocab %d, %zu parameters)\n",
           a.model ? a.model : "built-in tiny Qwen3-MoE, random weights", cfg.hidden_size, cfg.num_hidden_layers,
           cfg.num_experts, cfg.num_experts_per_tok, cfg.vocab_size, n);
    printf("threads %d; B %d, prefill P %d, decode M %d after P, train T %d; rac-ratio %.2f; seed %llu\n",
           a.threads, a.B, a.P, a.M, a.T, a.rac_ratio, (unsigned long long)a.seed);
    const char *wait = getenv("OMP_WAIT_POLICY");
    printf("OMP_WAIT_POLICY %s; load average (1/5/15 min): %s at start, %s at end\n\n", wait ? wait : "unset",
           load0, load1);
    print_table(&a, rows);
    free(w);
    return 0;
}
