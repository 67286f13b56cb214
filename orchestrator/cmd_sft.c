/* quads sft: train a Qwen3-MoE from a seeded random init on the synthetic task
 * with cross-entropy, write it as a Hugging Face folder (config.json,
 * model.safetensors, tokenizer.json) and print its held-out pass@1. With the
 * defaults this makes the embedded tiny model (make tiny-model). */
#include <errno.h>
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include "models/checkpoint.h"
#include "orchestrator/commands.h"
#include "orchestrator/sft.h"
#include "orchestrator/task.h"
#include "quant/fileio.h"

typedef struct {
    const char *out, *write_tokenizer;
    qd_sft_options sft;
    qd_sft_dims dims;
    int threads, eval_problems, eval_samples;
    float eval_temperature;
} sft_args;

static void usage(FILE *f)
{
    qd_sft_options d;
    qd_sft_default_options(&d);
    const qd_sft_dims *m = &qd_sft_default_dims;
    fprintf(f,
            "usage: quads sft --out DIR [OPTIONS]\n"
            "       quads sft --write-tokenizer FILE\n\n"
            "Trains a Qwen3-MoE from a seeded random init on a synthetic task (prompt\n"
            "\"Q: {problem}\\nA: \", target \"{answer}<|endoftext|>\") with cross-entropy, writes\n"
            "DIR/config.json, DIR/model.safetensors (F32) and DIR/tokenizer.json, then prints\n"
            "the held-out pass@1. The result depends only on the options (not on threads).\n\n"
            "  --out DIR              output folder (made if missing)\n"
            "  --write-tokenizer FILE only write the tiny tokenizer.json to FILE\n"
            "  --task NAME            arith, arith1..arith4, optionally :MAX_OPERAND (%s)\n"
            "  --max-operand N        largest operand (overrides the task's)\n"
            "  --steps N              optimizer steps (%d)\n"
            "  --batch N              sequences a step (%d)\n"
            "  --lr X                 peak learning rate, warmup then cosine (%g)\n"
            "  --warmup N             warmup steps (%d)\n"
            "  --min-lr-ratio X       final lr / peak lr (%g)\n"
            "  --weight-decay X       AdamW weight decay (%g)\n"
            "  --train-problems N     train pool size (%d)\n"
            "  --seed N               init and data order (%llu)\n"
            "  --threads N            OpenMP threads; 0 = all cores (0)\n"
            "  --hidden N --layers N --heads N --kv-heads N --head-dim N --experts N --top-k N\n"
            "  --moe-intermediate N   model dims (%d %d %d %d %d %d %d %d)\n"
            "  --eval N               held-out problems graded at the end; 0 = none (200)\n"
            "  --eval-samples N       completions per problem (4)\n"
            "  --eval-temperature X   sampling temperature of the eval (1.0, the rollout's)\n",
            d.task, d.steps, d.batch, d.lr, d.warmup, d.min_lr_ratio, d.weight_decay, d.train_problems,
            (unsigned long long)d.seed, m->hidden, m->layers, m->heads, m->kv_heads, m->head_dim, m->experts,
            m->top_k, m->moe_intermediate);
}

static int parse_long(const char *s, const char *name, long lo, long hi, long *v)
{
    char *end;
    errno = 0;
    *v = strtol(s, &end, 10);
    if (errno || end == s || *end || *v < lo || *v > hi) {
        fprintf(stderr, "quads sft: --%s: '%s' is not an integer in %ld..%ld\n", name, s, lo, hi);
        return 0;
    }
    return 1;
}

static int parse_float(const char *s, const char *name, float *v)
{
    char *end;
    errno = 0;
    double d = strtod(s, &end);
    if (errno || end == s || *end || !(d >= 0 && d < 1e6)) {
        fprintf(stderr, "quads sft: --%s: '%s' is not a number >= 0\n", name, s);
        return 0;
    }
    *v = (float)d;
    return 1;
}

/* The option's int target (NULL for the non-int ones) and its range. */
static int *int_target(sft_args *a, int c, long *hi)
{
    *hi = 1 << 20;
    switch (c) {
    case 's': return &a->sft.steps;
    case 'b': return &a->sft.batch;
    case 'w': return &a->sft.warmup;
    case 'P': return &a->sft.train_problems;
    case 'T': *hi = 4096; return &a->threads;
    case 'E': return &a->eval_problems;
    case 'S': return &a->eval_samples;
    case 1: return &a->dims.hidden;
    case 2: return &a->dims.layers;
    case 3: return &a->dims.heads;
    case 4: return &a->dims.kv_heads;
    case 5: return &a->dims.head_dim;
    case 6: return &a->dims.experts;
    case 7: return &a->dims.top_k;
    case 8: return &a->dims.moe_intermediate;
    default: return NULL;
    }
}

/* 0: proceed; otherwise the exit status + 1 (1 = exit 0 after --help). */
static int parse_args(int argc, char **argv, sft_args *a, char *task, size_t task_n)
{
    static const struct option longs[] = {
        {"out", required_argument, 0, 'o'}, {"write-tokenizer", required_argument, 0, 'W'},
        {"task", required_argument, 0, 't'}, {"max-operand", required_argument, 0, 'M'},
        {"steps", required_argument, 0, 's'}, {"batch", required_argument, 0, 'b'},
        {"lr", required_argument, 0, 'l'}, {"warmup", required_argument, 0, 'w'},
        {"min-lr-ratio", required_argument, 0, 'm'}, {"weight-decay", required_argument, 0, 'd'},
        {"train-problems", required_argument, 0, 'P'}, {"seed", required_argument, 0, 'R'},
        {"threads", required_argument, 0, 'T'}, {"eval", required_argument, 0, 'E'},
        {"eval-samples", required_argument, 0, 'S'}, {"eval-temperature", required_argument, 0, 'x'},
        {"hidden", required_argument, 0, 1}, {"layers", required_argument, 0, 2},
        {"heads", required_argument, 0, 3}, {"kv-heads", required_argument, 0, 4},
        {"head-dim", required_argument, 0, 5}, {"experts", required_argument, 0, 6},
        {"top-k", required_argument, 0, 7}, {"moe-intermediate", required_argument, 0, 8},
        {"help", no_argument, 0, 'h'}, {0, 0, 0, 0},
    };
    int c, li = 0;
    long v, hi, max_operand = 0;
    optind = 1;
    while ((c = getopt_long(argc, argv, "h", longs, &li)) != -1) {
        int *target = int_target(a, c, &hi);
        if (target) {
            if (!parse_long(optarg, longs[li].name, 0, hi, &v))
                return 3;
            *target = (int)v;
            continue;
        }
        int ok = 1;
        switch (c) {
        case 'o': a->out = optarg; break;
        case 'W': a->write_tokenizer = optarg; break;
        case 't': snprintf(task, task_n, "%s", optarg); break;
        case 'M': ok = parse_long(optarg, "max-operand", 1, 1000, &max_operand); break;
        case 'R': ok = parse_long(optarg, "seed", 0, 2147483647L, &v); a->sft.seed = (uint64_t)v; break;
        case 'l': ok = parse_float(optarg, "lr", &a->sft.lr); break;
        case 'm': ok = parse_float(optarg, "min-lr-ratio", &a->sft.min_lr_ratio); break;
        case 'd': ok = parse_float(optarg, "weight-decay", &a->sft.weight_decay); break;
        case 'x': ok = parse_float(optarg, "eval-temperature", &a->eval_temperature); break;
        case 'h': usage(stdout); return 1;
        default: usage(stderr); return 3;
        }
        if (!ok)
            return 3;
    }
    if (optind != argc || (!a->out && !a->write_tokenizer)) {
        usage(stderr);
        return 3;
    }
    if (max_operand) { /* "arith1:50" style: replace any bound the name carried */
        char *colon = strchr(task, ':');
        if (colon)
            *colon = 0;
        size_t k = strlen(task);
        snprintf(task + k, task_n - k, ":%ld", max_operand);
    }
    return 0;
}

static void progress(int step, int steps, double loss, double lr, void *ctx)
{
    const time_t *start = ctx;
    double el = difftime(time(NULL), *start), eta = el / step * (steps - step);
    fprintf(stderr, "\rstep %d/%d  loss %.4f  lr %.2e  %.0fs  ETA %.0fs   ", step, steps, loss, lr, el, eta);
    if (step == steps)
        fputc('\n', stderr);
}

static qd_status held_out_eval(qd_backend *b, const qd_tokenizer *tok, const sft_args *a)
{
    qd_synth_opts so;
    qd_status st = qd_task_parse(a->sft.task, &so);
    qd_bench_set set = {0};
    so.seed = a->sft.seed;
    if (!st)
        st = qd_synth_generate(&so, QD_SPLIT_TEST, (size_t)a->eval_problems, &set);
    qd_task_eval_result r;
    if (!st)
        st = qd_task_eval(b, tok, &set, 0, a->eval_samples, a->eval_temperature, a->sft.seed, 0, NULL, &r);
    if (!st)
        printf("held-out pass@1 %.4f (%d problems x %d samples, temperature %g, seed %llu), "
               "mean length %.2f tokens, ended %.1f%%\n", r.pass1, r.problems, a->eval_samples,
               a->eval_temperature, (unsigned long long)a->sft.seed, r.mean_len, 100.0 * r.format_rate);
    qd_bench_set_free(&set);
    return st;
}

static qd_status make_tokenizer(const char *out, qd_tokenizer **tok)
{
    char path[4096], *json;
    size_t len;
    snprintf(path, sizeof path, "%s/tokenizer.json", out);
    qd_status st = qd_sft_write_tokenizer(path);
    if (!st)
        st = qd_sft_tokenizer_json(&json, &len);
    if (!st) {
        st = qd_tokenizer_load_string(json, len, path, tok);
        free(json);
    }
    return st;
}

static qd_status train_and_save(const sft_args *a)
{
    qd_model_config cfg;
    qd_tokenizer *tok = NULL;
    qd_backend *b = NULL;
    float *w = NULL;
    qd_synth_opts task;
    qd_status st = qd_sft_make_config(&a->dims, &cfg);
    if (!st) /* refuse a bad task before anything is written */
        st = qd_task_parse(a->sft.task, &task);
    if (!st)
        st = qd_mkdirs(a->out);
    if (!st)
        st = make_tokenizer(a->out, &tok);
    if (!st) {
        qd_backend_options bo = {.recipe = QD_RECIPE_FP32, .role = QD_ROLE_TRAINER, .num_threads = a->threads};
        b = qd_backend_cpu_init(&cfg, &bo);
        st = b ? QD_OK : QD_ERR_ARG;
    }
    int n = 0;
    const qd_param_info *info = b ? qd_backend_params(b, &n) : NULL;
    size_t nf = b ? qd_backend_num_floats(b) : 0;
    if (!st && !(w = malloc(nf * sizeof *w)))
        st = qd_error(QD_ERR_NOMEM, "sft: out of memory");
    if (!st) {
        qd_sft_init_weights(info, n, a->sft.seed, w);
        st = qd_backend_set_weights(b, w, nf);
    }
    time_t start = time(NULL);
    qd_sft_options o = a->sft;
    if (isatty(STDERR_FILENO)) {
        o.progress = progress;
        o.ctx = &start;
    }
    double loss = 0;
    if (!st)
        st = qd_sft_train(b, tok, &o, &loss);
    if (!st)
        st = qd_backend_get_weights(b, w, nf);
    if (!st)
        st = qd_checkpoint_save(a->out, &cfg, info, n, w, QD_ST_F32);
    if (!st)
        printf("trained %d steps in %.0f s, final loss %.4f; wrote %s (%zu parameters)\n", o.steps,
               difftime(time(NULL), start), loss, a->out, nf);
    if (!st && a->eval_problems > 0)
        st = held_out_eval(b, tok, a);
    free(w);
    qd_backend_free(b);
    qd_tokenizer_free(tok);
    return st;
}

int qd_cmd_sft(int argc, char **argv)
{
    static char task[64];
    sft_args a = {.dims = qd_sft_default_dims, .eval_problems = 200, .eval_samples = 4, .eval_temperature = 1.0f};
    qd_sft_default_options(&a.sft);
    snprintf(task, sizeof task, "%s", a.sft.task);
    a.sft.task = task;
    int r = parse_args(argc, argv, &a, task, sizeof task);
    if (r)
        return r - 1;
    qd_status st = a.write_tokenizer ? qd_sft_write_tokenizer(a.write_tokenizer) : QD_OK;
    if (!st && a.out)
        st = train_and_save(&a);
    if (st) {
        fprintf(stderr, "quads sft: %s\n", qd_last_error());
        return 1;
    }
    return 0;
}
