/* quads sft: train a Qwen3-MoE from a seeded random init on the synthetic task
 * with cross-entropy, write it as a Hugging Face folder (config.json,
 * model.safetensors, tokenizer.json) and print its held-out pass@1, at the
 * end and every --eval-every steps, optionally stopping at the first eval that
 * reaches --stop-at (how the study's model is made: trained until its greedy
 * bf16 pass@1 is where the study wants it). With the defaults this makes the
 * embedded tiny model (make tiny-model). */
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
    const char *out, *write_tokenizer, *backend, *mode, *eval_precision;
    qd_sft_options sft;
    qd_sft_dims dims;
    int threads, eval_problems, eval_samples, eval_every, recompute;
    float eval_temperature, stop_at; /* stop_at < 0: no early stop */
    qd_exec_mode exec;
    qd_recipe eval_recipe;
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
            "  --eval-temperature X   sampling temperature of the eval (1.0, the rollout's; 0 greedy)\n"
            "  --eval-precision R     the eval's forward: fp32 (the trained instance itself, default) or a\n"
            "                         recipe's rollout (bf16, nvfp4, quads, ...) holding the trained weights\n"
            "  --eval-every N         also grade the held-out problems every N steps (0 = only at the end)\n"
            "  --stop-at X            stop after the first of those evals with pass@1 >= X and save the\n"
            "                         weights of that step (needs --eval-every)\n"
            "  --backend B            cpu (default), cuda or auto (CUDA if present)\n"
            "  --mode M               exact (default: the CPU's bits) or fast (CUDA only)\n"
            "  --recompute            hold one layer's activations, recomputed in the backward (less\n"
            "                         memory, more forward work, the same bits)\n",
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
    case 'e': return &a->eval_every;
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

/* The options that depend on each other; 0 (with a message) when they do not fit. */
static int check_args(sft_args *a)
{
    const char *why = NULL;
    if (qd_cli_backend_mode(a->backend, a->mode, &a->exec))
        why = qd_last_error();
    else if (a->eval_precision && qd_recipe_parse(&a->eval_recipe, a->eval_precision))
        why = "--eval-precision: expected fp32, bf16, fp8, nvfp4, nvfp4-aqat, nvfp4-rac, quads, nvfp4-sym-qat, "
              "nvfp4-replay, quads-replay, nvfp4-w16a4 or nvfp4-w4a16";
    else if (a->stop_at >= 0 && (a->eval_every == 0 || a->eval_problems == 0))
        why = "--stop-at needs --eval-every N and --eval N above 0";
    else if (a->stop_at > 1)
        why = "--stop-at: a pass@1 in 0..1";
    if (why)
        fprintf(stderr, "quads sft: %s\n", why);
    return why == NULL;
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
        {"eval-every", required_argument, 0, 'e'}, {"eval-precision", required_argument, 0, 'p'},
        {"stop-at", required_argument, 0, 'z'}, {"backend", required_argument, 0, 'B'},
        {"mode", required_argument, 0, 'D'}, {"recompute", no_argument, 0, 'r'},
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
        case 'z': ok = parse_float(optarg, "stop-at", &a->stop_at); break;
        case 'p': a->eval_precision = optarg; break;
        case 'B': a->backend = optarg; break;
        case 'D': a->mode = optarg; break;
        case 'r': a->recompute = 1; break;
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
    return check_args(a) ? 0 : 3;
}

/* A training run: its instances, the held-out problems and the evals. */
typedef struct {
    const sft_args *a;
    qd_backend *train, *eval; /* eval: the --eval-precision instance (NULL: train itself) */
    const qd_tokenizer *tok;
    qd_bench_set set;         /* the held-out problems */
    time_t start;
    int tty, stopped_at;      /* stopped_at: the step of an early stop (0: none) */
    double last_pass1;
} sft_run;

static void progress(int step, int steps, double loss, double lr, void *ctx)
{
    const sft_run *r = ctx;
    double el = difftime(time(NULL), r->start), eta = el / step * (steps - step);
    fprintf(stderr, "\rstep %d/%d  loss %.4f  lr %.2e  %.0fs  ETA %.0fs   ", step, steps, loss, lr, el, eta);
    if (step == steps)
        fputc('\n', stderr);
}

static qd_status load_held_out(sft_run *r)
{
    qd_synth_opts so;
    QD_TRY(qd_task_parse(r->a->sft.task, &so));
    so.seed = r->a->sft.seed;
    return qd_synth_generate(&so, QD_SPLIT_TEST, (size_t)r->a->eval_problems, &r->set);
}

/* Grades the held-out problems with the current weights (on the eval
 * instance, synced from the trained one first) and prints the line. */
static qd_status held_out_eval(sft_run *r, const char *when)
{
    const sft_args *a = r->a;
    qd_backend *b = r->eval ? r->eval : r->train;
    qd_task_eval_result ev;
    if (r->eval)
        QD_TRY(qd_backend_sync_from(r->eval, r->train, NULL));
    QD_TRY(qd_task_eval(b, r->tok, &r->set, 0, a->eval_samples, a->eval_temperature, a->sft.seed, 0, NULL, &ev));
    if (r->tty)
        fputs("\r\033[K", stderr);
    printf("%sheld-out pass@1 %.4f (%d problems x %d samples, temperature %g, %s, seed %llu), "
           "mean length %.2f tokens, ended %.1f%%\n", when, ev.pass1, ev.problems, a->eval_samples,
           a->eval_temperature, qd_recipe_name(a->eval_recipe), (unsigned long long)a->sft.seed, ev.mean_len,
           100.0 * ev.format_rate);
    fflush(stdout);
    r->last_pass1 = ev.pass1;
    return QD_OK;
}

/* --eval-every and --stop-at. */
static qd_status after_step(int step, void *ctx, int *stop)
{
    sft_run *r = ctx;
    const sft_args *a = r->a;
    if (a->eval_every == 0 || step % a->eval_every != 0 || step == a->sft.steps)
        return QD_OK; /* the last step's eval comes after the save */
    char when[64];
    snprintf(when, sizeof when, "step %d: ", step);
    qd_status st = held_out_eval(r, when);
    if (!st && a->stop_at >= 0 && r->last_pass1 >= a->stop_at)
        *stop = 1, r->stopped_at = step;
    return st;
}

/* The trained instance and, for --eval-precision other than fp32, the eval's. */
static qd_status make_backends(sft_run *r, const qd_model_config *cfg)
{
    const sft_args *a = r->a;
    const char *name = a->backend ? a->backend : "cpu";
    qd_backend_options bo = {.recipe = QD_RECIPE_FP32, .role = QD_ROLE_TRAINER, .num_threads = a->threads,
                             .mode = a->exec, .recompute = a->recompute};
    r->train = qd_backend_init_by_name(name, cfg, &bo);
    if (r->train && a->eval_problems > 0 && a->eval_recipe != QD_RECIPE_FP32) {
        qd_backend_options eo = {.recipe = a->eval_recipe, .role = QD_ROLE_ROLLOUT, .num_threads = a->threads,
                                 .mode = a->exec};
        r->eval = qd_backend_init_by_name(name, cfg, &eo);
    }
    if (!r->train || (a->eval_problems > 0 && a->eval_recipe != QD_RECIPE_FP32 && !r->eval))
        return qd_error(QD_ERR_ARG, "--backend %s: %s", name, qd_last_error());
    return QD_OK;
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
    sft_run r = {.a = a, .start = time(NULL), .tty = isatty(STDERR_FILENO)};
    float *w = NULL;
    qd_synth_opts task;
    qd_status st = qd_sft_make_config(&a->dims, &cfg);
    if (!st) /* refuse a bad task before anything is written */
        st = qd_task_parse(a->sft.task, &task);
    if (!st && a->eval_problems > 0)
        st = load_held_out(&r);
    if (!st)
        st = qd_mkdirs(a->out);
    if (!st)
        st = make_tokenizer(a->out, &tok);
    r.tok = tok;
    if (!st)
        st = make_backends(&r, &cfg);
    int n = 0;
    const qd_param_info *info = r.train ? qd_backend_params(r.train, &n) : NULL;
    size_t nf = r.train ? qd_backend_num_floats(r.train) : 0;
    if (!st && !(w = malloc(nf * sizeof *w)))
        st = qd_error(QD_ERR_NOMEM, "sft: out of memory");
    if (!st) {
        qd_sft_init_weights(info, n, a->sft.seed, w);
        st = qd_backend_set_weights(r.train, w, nf);
    }
    qd_sft_options o = a->sft;
    o.ctx = &r;
    o.progress = r.tty ? progress : NULL;
    o.after_step = a->eval_problems > 0 ? after_step : NULL;
    double loss = 0;
    if (!st)
        st = qd_sft_train(r.train, tok, &o, &loss);
    if (!st)
        st = qd_backend_get_weights(r.train, w, nf);
    if (!st)
        st = qd_checkpoint_save(a->out, &cfg, info, n, w, QD_ST_F32);
    if (!st && r.tty && r.stopped_at)
        fputc('\n', stderr);
    if (!st)
        printf("trained %d steps in %.0f s%s, final loss %.4f; wrote %s (%zu parameters)\n",
               r.stopped_at ? r.stopped_at : o.steps, difftime(time(NULL), r.start),
               r.stopped_at ? " (stopped early: --stop-at reached)" : "", loss, a->out, nf);
    if (!st && a->eval_problems > 0 && !r.stopped_at) /* an early stop's eval was the last one */
        st = held_out_eval(&r, "");
    free(w);
    qd_backend_free(r.eval);
    qd_backend_free(r.train);
    qd_tokenizer_free(tok);
    qd_bench_set_free(&r.set);
    return st;
}

int qd_cmd_sft(int argc, char **argv)
{
    static char task[64];
    sft_args a = {.dims = qd_sft_default_dims, .eval_problems = 200, .eval_samples = 4, .eval_temperature = 1.0f,
                  .stop_at = -1, .eval_recipe = QD_RECIPE_FP32};
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
