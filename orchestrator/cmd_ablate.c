/* quads ablate: where the rollout-trainer gap comes from (issue 17; the
 * paper names activation quantization error, not weight error, as its cause).
 * One reference policy, BF16 on both sides (the trainer's numerics), samples
 * completions of held-out synthetic problems; each variant then scores the
 * same tokens as a rollout would: NVFP4 activations only (nvfp4-w16a4), NVFP4
 * weights only (nvfp4-w4a16) and both (nvfp4, the W4A4 product), over the
 * whole model and one decoder layer at a time (qd_backend_options.quant_layers).
 * The gap to the reference log-probs is measured as `quads rl` measures it
 * (orchestrator/metrics.c): mean and max |dlogp| and the k3 estimate of the
 * KL from the sampling (reference) policy. */
#include <getopt.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <jansson.h>
#include "models/checkpoint.h"
#include "orchestrator/commands.h"
#include "orchestrator/metrics.h"
#include "orchestrator/task.h"
#include "quant/fileio.h"

/* The variants, in table order: what each quantizes of a rollout's linears. */
static const qd_recipe variants[] = {QD_RECIPE_NVFP4_W16A4, QD_RECIPE_NVFP4_W4A16, QD_RECIPE_NVFP4};
enum { NVAR = sizeof variants / sizeof *variants };

typedef struct {
    const char *model, *task, *backend, *mode, *out;
    int problems, samples, max_tokens, batch;
    double temperature;
    uint64_t seed;
    qd_backend_options opt; /* threads and mode; recipe and layers per variant */
} ablate_opts;

/* The sampled sequences: row s holds prompt + completion, right-padded to T. */
typedef struct {
    int S, M, T;
    int32_t *seq;  /* (S, T) */
    int32_t *len;  /* (S) prompt + completion */
    int *plen;     /* (S) prompt */
    int *rlen;     /* (S) completion */
    float *ref;    /* (S, M) the reference's log-probs of the completion tokens */
} sample_set;

static void usage(FILE *f)
{
    fprintf(f, "usage: quads ablate --model DIR [--task NAME] [--problems N] [--samples G] [--max-tokens M]\n"
               "                    [--temperature T] [--seed S] [--batch B] [--backend B] [--mode M]\n"
               "                    [--threads N] [--out FILE.json]\n\n"
               "Where the rollout-trainer gap comes from. A BF16 policy samples G completions of N held-out\n"
               "problems of the synthetic task; the same tokens are then scored with NVFP4 activations only\n"
               "(nvfp4-w16a4), NVFP4 weights only (nvfp4-w4a16) and both (nvfp4, W4A4), in every decoder\n"
               "layer at once and in one layer at a time (the others BF16). Prints a markdown table of\n"
               "the gap to the BF16 log-probs (mean and max |dlogp|, k3 KL), as quads rl measures it.\n\n"
               "  --model DIR         Hugging Face folder with tokenizer.json\n"
               "  --task NAME         synthetic task (default arith; arith1..arith4[:N])\n"
               "  --problems N        held-out problems (default 64)\n"
               "  --samples G         completions per problem (default 4)\n"
               "  --max-tokens M      tokens per completion (default %d)\n"
               "  --temperature T     sampling temperature, also of the log-probs (default 1; 0 greedy)\n"
               "  --seed S            sampling seed (default 1)\n"
               "  --batch B           sequences per backend call (default 64)\n"
               "  --backend B         auto (default), cpu or cuda\n"
               "  --mode M            exact (default) or fast (CUDA only)\n"
               "  --threads N         OpenMP threads (default: the runtime's)\n"
               "  --out FILE.json     also write the table as JSON\n",
            QD_TASK_MAX_NEW_TOKENS);
}

static int fail(int rc, const char *msg)
{
    fprintf(stderr, "quads ablate: %s\n", msg);
    return rc;
}

/* An integer option in [lo, hi] into *out; 0 when s is not one. */
static int int_arg(const char *s, double lo, double hi, int *out)
{
    double x;
    if (!qd_cli_real(s, lo, hi, &x) || x != floor(x))
        return 0;
    *out = (int)x;
    return 1;
}

static int parse_args(int argc, char **argv, ablate_opts *o)
{
    static const struct option longs[] = {
        {"model", required_argument, 0, 'm'},       {"task", required_argument, 0, 'k'},
        {"problems", required_argument, 0, 'n'},    {"samples", required_argument, 0, 'g'},
        {"max-tokens", required_argument, 0, 'x'},  {"temperature", required_argument, 0, 'T'},
        {"seed", required_argument, 0, 's'},        {"batch", required_argument, 0, 'B'},
        {"backend", required_argument, 0, 'b'},     {"mode", required_argument, 0, 'M'},
        {"threads", required_argument, 0, 't'},     {"out", required_argument, 0, 'o'},
        {"help", no_argument, 0, 'h'},              {0, 0, 0, 0},
    };
    int c;
    optind = 1;
    while ((c = getopt_long(argc, argv, "h", longs, NULL)) != -1) {
        switch (c) {
        case 'm': o->model = optarg; break;
        case 'k': o->task = optarg; break;
        case 'n':
            if (!int_arg(optarg, 1, 1 << 20, &o->problems))
                return fail(2, "--problems: expected an integer in [1, 1048576]");
            break;
        case 'g':
            if (!int_arg(optarg, 1, 1024, &o->samples))
                return fail(2, "--samples: expected an integer in [1, 1024]");
            break;
        case 'x':
            if (!int_arg(optarg, 1, 1 << 16, &o->max_tokens))
                return fail(2, "--max-tokens: expected an integer in [1, 65536]");
            break;
        case 'T':
            if (!qd_cli_real(optarg, 0, 100, &o->temperature))
                return fail(2, "--temperature: expected a number in [0, 100]");
            break;
        case 's':
            if (!qd_cli_uint(optarg, UINT64_MAX, &o->seed))
                return fail(2, "--seed: expected an unsigned integer");
            break;
        case 'B':
            if (!int_arg(optarg, 1, 1 << 20, &o->batch))
                return fail(2, "--batch: expected an integer in [1, 1048576]");
            break;
        case 'b': o->backend = optarg; break;
        case 'M': o->mode = optarg; break;
        case 't':
            if (!int_arg(optarg, 1, 4096, &o->opt.num_threads))
                return fail(2, "--threads: expected an integer in [1, 4096]");
            break;
        case 'o': o->out = optarg; break;
        case 'h': usage(stdout); return 0;
        default: usage(stderr); return 2;
        }
    }
    if (!o->model || optind != argc) {
        usage(stderr);
        return 2;
    }
    if ((int64_t)o->problems * o->samples > INT32_MAX / 2)
        return fail(2, "--problems x --samples: too many sequences");
    return qd_cli_backend_mode(o->backend, o->mode, &o->opt.mode) ? fail(2, qd_last_error()) : -1;
}

static void samples_free(sample_set *s)
{
    free(s->seq), free(s->len), free(s->plen), free(s->rlen), free(s->ref);
}

/* The prompts of the held-out problems, sample s of problem i at row
 * i * G + s: seq holds the prompt, plen its length (T set to fit M more). */
static qd_status build_prompts(const ablate_opts *o, const qd_tokenizer *tok, sample_set *sm)
{
    qd_synth_opts so = {0};
    qd_bench_set set = {0};
    qd_status st = qd_task_parse(o->task, &so);
    so.seed = o->seed;
    if (!st)
        st = qd_synth_generate(&so, QD_SPLIT_TEST, (size_t)o->problems, &set);
    int32_t **ids = st ? NULL : calloc(set.n, sizeof *ids);
    size_t *n = st ? NULL : calloc(set.n, sizeof *n), maxp = 1;
    if (!st && (!ids || !n))
        st = qd_error(QD_ERR_NOMEM, "prompts");
    for (size_t i = 0; i < set.n && !st; i++) {
        st = qd_task_encode(tok, set.rec[i].problem, NULL, &ids[i], &n[i], NULL);
        maxp = n[i] > maxp ? n[i] : maxp;
    }
    int G = o->samples;
    sm->S = (int)set.n * G;
    sm->M = o->max_tokens;
    sm->T = (int)maxp + sm->M;
    if (!st) {
        sm->seq = calloc((size_t)sm->S * sm->T, sizeof *sm->seq);
        sm->len = calloc((size_t)sm->S, sizeof *sm->len);
        sm->plen = calloc((size_t)sm->S, sizeof *sm->plen);
        sm->rlen = calloc((size_t)sm->S, sizeof *sm->rlen);
        sm->ref = calloc((size_t)sm->S * sm->M, sizeof *sm->ref);
        if (!sm->seq || !sm->len || !sm->plen || !sm->rlen || !sm->ref)
            st = qd_error(QD_ERR_NOMEM, "%d sequences", sm->S);
    }
    for (int r = 0; r < sm->S && !st; r++) {
        size_t i = (size_t)(r / G);
        memcpy(sm->seq + (size_t)r * sm->T, ids[i], sizeof(int32_t) * n[i]);
        sm->plen[r] = sm->len[r] = (int)n[i];
    }
    for (size_t i = 0; ids && i < set.n; i++)
        free(ids[i]);
    free(ids), free(n);
    qd_bench_set_free(&set);
    return st;
}

/* Samples rows [a, a + B) of the completions from the reference policy. */
static qd_status sample_rows(qd_backend *b, const ablate_opts *o, int32_t end, sample_set *sm, int a, int B)
{
    int M = sm->M, Tp = 1;
    for (int r = a; r < a + B; r++)
        Tp = sm->plen[r] > Tp ? sm->plen[r] : Tp;
    int32_t *prompt = calloc((size_t)B * Tp, sizeof *prompt), *tok = malloc(sizeof *tok * (size_t)B * M);
    int32_t *plen = malloc(sizeof *plen * B), *glen = malloc(sizeof *glen * B);
    float *lp = malloc(sizeof *lp * (size_t)B * M);
    uint64_t *sid = malloc(sizeof *sid * B);
    qd_status st = prompt && tok && plen && glen && lp && sid ? QD_OK : qd_error(QD_ERR_NOMEM, "sampling");
    for (int i = 0; i < B && !st; i++) {
        plen[i] = sm->plen[a + i];
        sid[i] = (uint64_t)(a + i);
        memcpy(prompt + (size_t)i * Tp, sm->seq + (size_t)(a + i) * sm->T, sizeof(int32_t) * plen[i]);
    }
    qd_generate_request rq = {.B = B, .Tp = Tp, .prompt = prompt, .prompt_len = plen, .seq_id = sid,
                              .seed = o->seed, .max_new_tokens = M, .temperature = (float)o->temperature,
                              .top_p = 1.0f, .stop = &end, .num_stop = 1};
    qd_generate_result res = {.tokens = tok, .logp = lp, .lengths = glen};
    if (!st)
        st = qd_backend_generate(b, &rq, &res);
    for (int i = 0; i < B && !st; i++) {
        int r = a + i;
        memcpy(sm->seq + (size_t)r * sm->T + sm->plen[r], tok + (size_t)i * M, sizeof(int32_t) * glen[i]);
        sm->rlen[r] = glen[i];
        sm->len[r] = sm->plen[r] + glen[i];
    }
    free(prompt), free(tok), free(plen), free(glen), free(lp), free(sid);
    return st;
}

/* out (S, M): log-probs of every completion token under b, o->batch rows a call. */
static qd_status score(qd_backend *b, const ablate_opts *o, const sample_set *sm, float *out)
{
    int T = sm->T, M = sm->M;
    float *lp = malloc(sizeof(float) * (size_t)o->batch * T);
    if (!lp)
        return qd_error(QD_ERR_NOMEM, "log-probs");
    qd_status st = QD_OK;
    for (int a = 0; a < sm->S && !st; a += o->batch) {
        int B = sm->S - a < o->batch ? sm->S - a : o->batch;
        qd_batch bt = {.B = B, .T = T, .tokens = sm->seq + (size_t)a * T, .lengths = sm->len + a,
                       .temperature = (float)o->temperature};
        st = qd_backend_forward(b, &bt, lp, NULL);
        for (int i = 0; i < B && !st; i++) {
            float *row = out + (size_t)(a + i) * M;
            memset(row, 0, sizeof(float) * M);
            for (int k = 0; k < sm->rlen[a + i]; k++)
                row[k] = lp[(size_t)i * T + sm->plen[a + i] - 1 + k];
        }
    }
    free(lp);
    return st;
}

static qd_backend *new_backend(const ablate_opts *o, const qd_model_config *cfg, qd_recipe r, uint64_t layers)
{
    qd_backend_options opt = o->opt;
    opt.recipe = r;
    opt.role = QD_ROLE_ROLLOUT;
    opt.quant_layers = layers;
    return qd_backend_init_by_name(o->backend, cfg, &opt);
}

/* The gap of variant r over layers (0: all) against the reference. */
static qd_status variant_gap(const ablate_opts *o, const qd_model_config *cfg, const float *w, size_t nf,
                             const sample_set *sm, qd_recipe r, uint64_t layers, float *lp, qd_gap_stats *g)
{
    qd_backend *b = new_backend(o, cfg, r, layers);
    if (!b)
        return QD_ERR_ARG; /* the message is the backend's */
    qd_status st = qd_backend_set_weights(b, w, nf);
    if (!st)
        st = score(b, o, sm, lp);
    qd_backend_free(b);
    /* the samples are the reference's: it is the sampling policy of the k3 estimate */
    return st ? st : qd_metrics_gap(g, lp, sm->ref, sm->rlen, sm->S, sm->M);
}

static void print_row(const char *scope, const qd_gap_stats *g)
{
    printf("| %s |", scope);
    for (int v = 0; v < NVAR; v++)
        printf(" %.3g | %.3g | %.3g |", g[v].mean_abs, g[v].max_abs, g[v].k3_kl);
    printf(" %.2f |\n", g[1].mean_abs > 0 ? g[0].mean_abs / g[1].mean_abs : NAN);
}

static json_t *row_json(int layer, const qd_gap_stats *g)
{
    json_t *o = json_object();
    json_object_set_new(o, "layer", layer < 0 ? json_string("all") : json_integer(layer));
    for (int v = 0; v < NVAR; v++)
        json_object_set_new(o, qd_recipe_name(variants[v]),
                            json_pack("{s:f,s:f,s:f}", "mean_abs", g[v].mean_abs, "max_abs", g[v].max_abs,
                                      "k3_kl", g[v].k3_kl));
    return o;
}

/* Every scope (all layers, then each of the first 64 alone) and variant. */
static qd_status ablate_all(const ablate_opts *o, const qd_model_config *cfg, const float *w, size_t nf,
                            const sample_set *sm, json_t *rows)
{
    float *lp = malloc(sizeof(float) * (size_t)sm->S * sm->M + 1);
    if (!lp)
        return qd_error(QD_ERR_NOMEM, "log-probs");
    int L = cfg->num_hidden_layers < 64 ? cfg->num_hidden_layers : 64;
    printf("| layers | W16A4 mean | max | k3 | W4A16 mean | max | k3 | W4A4 mean | max | k3 | A/W mean |\n"
           "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n");
    qd_status st = QD_OK;
    for (int l = -1; l < L && !st; l++) {
        qd_gap_stats g[NVAR];
        for (int v = 0; v < NVAR && !st; v++)
            st = variant_gap(o, cfg, w, nf, sm, variants[v], l < 0 ? 0 : (uint64_t)1 << l, lp, &g[v]);
        if (st)
            break;
        char scope[32];
        snprintf(scope, sizeof scope, l < 0 ? "all" : "%d", l);
        print_row(scope, g);
        fflush(stdout);
        json_array_append_new(rows, row_json(l, g));
    }
    free(lp);
    return st;
}

static qd_status write_json(const ablate_opts *o, const sample_set *sm, json_t *rows)
{
    int tokens = 0;
    for (int r = 0; r < sm->S; r++)
        tokens += sm->rlen[r];
    json_t *doc = json_pack("{s:s,s:s,s:i,s:i,s:i,s:f,s:I,s:i,s:O}", "model", o->model, "task", o->task,
                            "problems", o->problems, "samples", o->samples, "max_tokens", o->max_tokens,
                            "temperature", o->temperature, "seed", (json_int_t)o->seed, "tokens", tokens,
                            "rows", rows);
    char *text = doc ? json_dumps(doc, JSON_INDENT(1) | JSON_REAL_PRECISION(6)) : NULL;
    json_decref(doc);
    qd_status st = text ? qd_atomic_write(o->out, text, strlen(text)) : qd_error(QD_ERR_NOMEM, "%s", o->out);
    free(text);
    return st;
}

/* The reference: samples and its log-probs of them. */
static qd_status reference(const ablate_opts *o, qd_backend *ref, const qd_tokenizer *tok, sample_set *sm)
{
    int32_t end;
    qd_status st = qd_task_end_id(tok, &end);
    if (!st)
        st = build_prompts(o, tok, sm);
    for (int a = 0; a < sm->S && !st; a += o->batch)
        st = sample_rows(ref, o, end, sm, a, sm->S - a < o->batch ? sm->S - a : o->batch);
    return st ? st : score(ref, o, sm, sm->ref);
}

static qd_status run(const ablate_opts *o)
{
    char p[4200];
    qd_model_config cfg;
    qd_tokenizer *tok = NULL;
    qd_status st = qd_checkpoint_read_config(o->model, &cfg);
    snprintf(p, sizeof p, "%s/tokenizer.json", o->model);
    if (!st)
        st = qd_tokenizer_load(p, &tok);
    qd_backend *ref = st ? NULL : new_backend(o, &cfg, QD_RECIPE_BF16, 0);
    if (!st && !ref)
        st = QD_ERR_ARG;
    size_t nf = ref ? qd_backend_num_floats(ref) : 0;
    float *w = ref ? malloc(sizeof(float) * nf) : NULL;
    if (ref && !w)
        st = qd_error(QD_ERR_NOMEM, "weights");
    int np = 0;
    const qd_param_info *pi = ref ? qd_backend_params(ref, &np) : NULL;
    if (!st)
        st = qd_checkpoint_load(o->model, pi, np, w);
    if (!st)
        st = qd_backend_set_weights(ref, w, nf);
    sample_set sm = {0};
    if (!st)
        st = reference(o, ref, tok, &sm);
    qd_backend_free(ref);
    json_t *rows = json_array();
    if (!st && !rows)
        st = qd_error(QD_ERR_NOMEM, "rows");
    if (!st)
        st = ablate_all(o, &cfg, w, nf, &sm, rows);
    if (!st && o->out)
        st = write_json(o, &sm, rows);
    json_decref(rows);
    samples_free(&sm);
    free(w);
    qd_tokenizer_free(tok);
    return st;
}

int qd_cmd_ablate(int argc, char **argv)
{
    ablate_opts o = {.backend = "auto", .task = "arith", .problems = 64, .samples = 4,
                     .max_tokens = QD_TASK_MAX_NEW_TOKENS, .temperature = 1.0, .seed = 1, .batch = 64};
    int rc = parse_args(argc, argv, &o);
    if (rc >= 0)
        return rc;
    return run(&o) ? fail(1, qd_last_error()) : 0;
}
