/* quads forward: one token sequence through a Hugging Face checkpoint in one
 * precision recipe; prints the per-token log-probs as JSON and optionally
 * dumps the logits as raw little-endian float32 [T, V]. */
#include <errno.h>
#include <getopt.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "backends/backend.h"
#include "models/checkpoint.h"
#include "orchestrator/commands.h"
#include "quant/fileio.h"

typedef struct {
    const char *model, *ids, *dump, *backend, *mode;
    qd_backend_options opt;
} forward_opts;

static void usage(FILE *f)
{
    fprintf(f,
            "usage: quads forward --model DIR --ids 1,2,3,... [OPTIONS]\n\n"
            "Runs the token ids through the model and prints a JSON object with\n"
            "\"logprobs\": log p(ids[t+1] | ids[..t]) for t = 0 .. T-2, and their sum.\n\n"
            "  --model DIR           Hugging Face folder: config.json, model.safetensors\n"
            "                        (or model.safetensors.index.json and its shards)\n"
            "  --ids LIST            comma-separated token ids (at least one)\n"
            "  --precision P         fp32 (default), bf16, fp8, nvfp4, nvfp4-aqat, nvfp4-rac,\n"
            "                        quads, nvfp4-sym-qat, nvfp4-replay, quads-replay\n"
            "  --role R              rollout (default) or trainer: which side of the recipe\n"
            "  --rac-ratio R         fraction of channels RAC compensates (default 0.1)\n"
            "  --backend B           auto (default: CUDA if present, else the CPU), cpu or cuda\n"
            "  --mode M              exact (default: the CPU's bits) or fast (CUDA only)\n"
            "  --threads N           OpenMP threads (default: the runtime's)\n"
            "  --dump-logits FILE    write the logits, raw little-endian float32 [T, V]\n");
}

static int fail(int rc, const char *msg)
{
    fprintf(stderr, "quads forward: %s\n", msg);
    return rc;
}

static int parse_args(int argc, char **argv, forward_opts *o)
{
    static const struct option longs[] = {
        {"model", required_argument, 0, 'm'},     {"ids", required_argument, 0, 'i'},
        {"precision", required_argument, 0, 'p'}, {"role", required_argument, 0, 'r'},
        {"rac-ratio", required_argument, 0, 'a'}, {"backend", required_argument, 0, 'b'},
        {"threads", required_argument, 0, 't'},   {"dump-logits", required_argument, 0, 'd'},
        {"mode", required_argument, 0, 'M'},      {"help", no_argument, 0, 'h'},
        {0, 0, 0, 0},
    };
    double x;
    int c;
    optind = 1;
    while ((c = getopt_long(argc, argv, "h", longs, NULL)) != -1) {
        switch (c) {
        case 'm': o->model = optarg; break;
        case 'i': o->ids = optarg; break;
        case 'p':
            if (qd_recipe_parse(&o->opt.recipe, optarg))
                return fail(2, qd_last_error());
            break;
        case 'r':
            if (strcmp(optarg, "rollout") && strcmp(optarg, "trainer"))
                return fail(2, "--role: expected rollout or trainer");
            o->opt.role = strcmp(optarg, "rollout") ? QD_ROLE_TRAINER : QD_ROLE_ROLLOUT;
            break;
        case 'a':
            if (!qd_cli_real(optarg, 0, 1, &o->opt.rac_ratio))
                return fail(2, "--rac-ratio: expected a number in [0, 1]");
            break;
        case 'b': o->backend = optarg; break;
        case 'M': o->mode = optarg; break;
        case 't':
            if (!qd_cli_real(optarg, 1, 4096, &x) || x != floor(x))
                return fail(2, "--threads: expected an integer in [1, 4096]");
            o->opt.num_threads = (int)x;
            break;
        case 'd': o->dump = optarg; break;
        case 'h': usage(stdout); return 0;
        default: usage(stderr); return 2;
        }
    }
    if (!o->model || !o->ids || optind != argc) {
        usage(stderr);
        return 2;
    }
    return qd_cli_backend_mode(o->backend, o->mode, &o->opt.mode) ? fail(2, qd_last_error()) : -1;
}

/* "1,2,3" -> ids (malloc'd); each in [0, vocab). */
static qd_status parse_ids(const char *s, int vocab, int32_t **ids, int *n)
{
    size_t cap = 1;
    for (const char *p = s; *p; p++)
        cap += *p == ',';
    *ids = malloc(cap * sizeof **ids);
    *n = 0;
    if (!*ids)
        return qd_error(QD_ERR_NOMEM, "--ids: out of memory");
    for (const char *p = s;; p++) {
        char *end;
        errno = 0;
        long v = strtol(p, &end, 10);
        if (end == p || (*end && *end != ',') || errno || *p == '+' || *p == ' ')
            return qd_error(QD_ERR_ARG, "--ids: element %d: expected an integer token id", *n);
        if (v < 0 || v >= vocab)
            return qd_error(QD_ERR_ARG, "--ids: element %d: id %ld out of range [0, %d) (the model's vocab_size)",
                            *n, v, vocab);
        (*ids)[(*n)++] = (int32_t)v;
        if (!*end)
            return QD_OK;
        p = end;
    }
}

static qd_status print_json(const char *model, const qd_backend_options *o, const int32_t *ids, int T,
                            const float *logp)
{
    double sum = 0;
    json_t *jids = json_array(), *jlogp = json_array();
    for (int t = 0; t < T; t++)
        json_array_append_new(jids, json_integer(ids[t]));
    for (int t = 0; t + 1 < T; t++) {
        json_array_append_new(jlogp, json_real(logp[t]));
        sum += logp[t];
    }
    json_t *out = json_pack("{s:s,s:s,s:s,s:o,s:o,s:f}", "model", model, "precision", qd_recipe_name(o->recipe),
                            "role", o->role == QD_ROLE_TRAINER ? "trainer" : "rollout", "ids", jids,
                            "logprobs", jlogp, "sum_logprob", sum);
    int bad = !out || json_dumpf(out, stdout, JSON_REAL_PRECISION(9)) || putchar('\n') == EOF || fflush(stdout);
    json_decref(out);
    return bad ? qd_error(QD_ERR_IO, "stdout: write failed") : QD_OK;
}

static int run(const forward_opts *o)
{
    qd_backend *b = qd_checkpoint_open_backend(o->model, o->backend, &o->opt);
    if (!b)
        return fail(1, qd_last_error());
    qd_model_config cfg;
    qd_checkpoint_read_config(o->model, &cfg);
    int32_t *ids = NULL;
    int T = 0;
    float *logp = NULL, *logits = NULL;
    qd_status st = parse_ids(o->ids, cfg.vocab_size, &ids, &T);
    size_t nlogits = (size_t)T * (size_t)cfg.vocab_size;
    if (!st) {
        logp = malloc(sizeof(float) * (size_t)T);
        logits = malloc(sizeof(float) * nlogits);
        st = logp && logits ? QD_OK : qd_error(QD_ERR_NOMEM, "out of memory for %zu logits", nlogits);
    }
    int32_t len = T;
    qd_batch batch = {.B = 1, .T = T, .tokens = ids, .lengths = &len, .temperature = 1.0f};
    if (!st)
        st = qd_backend_forward(b, &batch, logp, logits);
    if (!st && o->dump) /* float32 in host order: little-endian on every supported host */
        st = qd_atomic_write(o->dump, logits, nlogits * sizeof(float));
    if (!st)
        st = print_json(o->model, &o->opt, ids, T, logp);
    int rc = st ? fail(1, qd_last_error()) : 0;
    free(ids);
    free(logp);
    free(logits);
    qd_backend_free(b);
    return rc;
}

int qd_cmd_forward(int argc, char **argv)
{
    forward_opts o = {.backend = "auto", .opt = {.recipe = QD_RECIPE_FP32, .role = QD_ROLE_ROLLOUT,
                      .rac_ratio = 0.1}};
    int rc = parse_args(argc, argv, &o);
    return rc >= 0 ? rc : run(&o);
}
