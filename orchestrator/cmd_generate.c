/* quads generate: sample completions of one prompt from a Hugging Face
 * checkpoint with its tokenizer.json. Sample i uses sampling stream (sequence
 * id) i, so sample 0 of --samples K equals the single sample of --samples 1
 * with the same seed (NUMERICS.md §6). */
#include <errno.h>
#include <getopt.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include "backends/backend.h"
#include "models/checkpoint.h"
#include "models/tokenizer.h"
#include "orchestrator/commands.h"
#include "quant/fileio.h"

#define MAX_STOP 16

typedef struct {
    const char *model, *prompt, *system, *tokenizer, *backend;
    int chat, json, samples, max_tokens, top_k;
    double temperature, top_p;
    uint64_t seed;
    qd_backend_options opt;
} generate_opts;

static void usage(FILE *f)
{
    fprintf(f,
            "usage: quads generate --model DIR --prompt TEXT [OPTIONS]\n\n"
            "Samples completions of the prompt and prints them (one JSON line each with --json).\n"
            "Generation stops at the tokenizer's <|im_end|> and <|endoftext|>, at the eos_token\n"
            "of tokenizer_config.json (beside the tokenizer) and the eos_token_id of\n"
            "DIR/generation_config.json, or after --max-tokens.\n\n"
            "  --model DIR           Hugging Face folder (config.json, model.safetensors)\n"
            "  --prompt TEXT         the prompt (with --chat: the user message)\n"
            "  --chat                format as a ChatML conversation with the generation prompt\n"
            "  --system TEXT         with --chat, a system message first\n"
            "  --tokenizer FILE      tokenizer.json (default DIR/tokenizer.json)\n"
            "  --precision P         fp32 (default), bf16, fp8, nvfp4, nvfp4-aqat, nvfp4-rac,\n"
            "                        quads, nvfp4-sym-qat (the rollout side of the recipe)\n"
            "  --rac-ratio R         fraction of channels RAC compensates (default 0.1)\n"
            "  --seed N              sampling seed (default 0)\n"
            "  --temperature T       default 1; 0 is greedy\n"
            "  --top-k K             keep the K most likely tokens (default 0: off)\n"
            "  --top-p P             nucleus sampling, P in (0, 1] (default 1: off)\n"
            "  --max-tokens N        new tokens at most (default 64)\n"
            "  --samples K           completions, sampling streams 0 .. K-1 (default 1)\n"
            "  --backend B           auto (default), cpu or cuda\n"
            "  --threads N           OpenMP threads (default: the runtime's)\n"
            "  --json                one JSON line per sample: tokens, text, sum_logprob, finish\n");
}

static int fail(int rc, const char *msg)
{
    fprintf(stderr, "quads generate: %s\n", msg);
    return rc;
}

/* A number in [lo, hi] from the whole of s (integral when integer). */
static int parse_num(const char *s, double lo, double hi, int integer, double *out)
{
    char *end;
    errno = 0;
    *out = strtod(s, &end);
    return *s && !*end && !errno && *out >= lo && *out <= hi && (!integer || *out == floor(*out));
}

/* A decimal uint64 from the whole of s (strtod would round seeds above 2^53). */
static int parse_u64(const char *s, uint64_t *out)
{
    char *end;
    errno = 0;
    *out = (uint64_t)strtoull(s, &end, 10);
    return *s >= '0' && *s <= '9' && !*end && !errno;
}

static int set_option(generate_opts *o, int c, const char *arg)
{
    double x = 0;
    int ok = 1;
    switch (c) {
    case 'm': o->model = arg; break;
    case 'p': o->prompt = arg; break;
    case 'c': o->chat = 1; break;
    case 'y': o->system = arg; break;
    case 'k': o->tokenizer = arg; break;
    case 'j': o->json = 1; break;
    case 'b': o->backend = arg; break;
    case 'P':
        if (qd_recipe_parse(&o->opt.recipe, arg))
            return fail(2, qd_last_error());
        break;
    case 'a': ok = parse_num(arg, 0, 1, 0, &o->opt.rac_ratio); break;
    case 's': ok = parse_u64(arg, &o->seed); break;
    case 'T': ok = parse_num(arg, 0, 1e6, 0, &o->temperature); break;
    case 'K': ok = parse_num(arg, 0, 1 << 30, 1, &x); o->top_k = (int)x; break;
    case 'N': ok = parse_num(arg, 1e-9, 1, 0, &o->top_p); break;
    case 'M': ok = parse_num(arg, 1, 1 << 20, 1, &x); o->max_tokens = (int)x; break;
    case 'S': ok = parse_num(arg, 1, 4096, 1, &x); o->samples = (int)x; break;
    case 't': ok = parse_num(arg, 1, 4096, 1, &x); o->opt.num_threads = (int)x; break;
    default: usage(stderr); return 2;
    }
    if (!ok) {
        fprintf(stderr, "quads generate: bad value '%s' (see --help for the range)\n", arg);
        return 2;
    }
    return -1;
}

static int parse_args(int argc, char **argv, generate_opts *o)
{
    static const struct option longs[] = {
        {"model", required_argument, 0, 'm'},       {"prompt", required_argument, 0, 'p'},
        {"chat", no_argument, 0, 'c'},              {"system", required_argument, 0, 'y'},
        {"tokenizer", required_argument, 0, 'k'},   {"precision", required_argument, 0, 'P'},
        {"rac-ratio", required_argument, 0, 'a'},   {"seed", required_argument, 0, 's'},
        {"temperature", required_argument, 0, 'T'}, {"top-k", required_argument, 0, 'K'},
        {"top-p", required_argument, 0, 'N'},       {"max-tokens", required_argument, 0, 'M'},
        {"samples", required_argument, 0, 'S'},     {"backend", required_argument, 0, 'b'},
        {"threads", required_argument, 0, 't'},     {"json", no_argument, 0, 'j'},
        {"help", no_argument, 0, 'h'},              {0, 0, 0, 0},
    };
    int c, rc;
    optind = 1;
    while ((c = getopt_long(argc, argv, "h", longs, NULL)) != -1) {
        if (c == 'h') {
            usage(stdout);
            return 0;
        }
        if ((rc = set_option(o, c, optarg)) >= 0)
            return rc;
    }
    if (!o->model || !o->prompt || optind != argc) {
        usage(stderr);
        return 2;
    }
    return -1;
}

/* ---- the tokenizer side */

static qd_status load_tokenizer(const generate_opts *o, qd_tokenizer **tok)
{
    char path[4096];
    struct stat sb;
    if (o->tokenizer)
        return qd_tokenizer_load(o->tokenizer, tok);
    snprintf(path, sizeof path, "%s/tokenizer.json", o->model);
    if (stat(path, &sb))
        return qd_error(QD_ERR_IO, "%s: %s (pass --tokenizer FILE)", path, strerror(errno));
    return qd_tokenizer_load(path, tok);
}

/* The prompt's ids, each checked against the model's vocabulary. */
static qd_status encode_prompt(const generate_opts *o, const qd_tokenizer *tok, int vocab, int32_t **ids,
                               size_t *n)
{
    char *chat = NULL;
    qd_chat_message msgs[2] = {{"system", o->system}, {"user", o->prompt}};
    qd_status st = QD_OK;
    *ids = NULL;
    if (o->chat)
        st = qd_tokenizer_chat_format(&qd_chat_chatml, o->system ? msgs : msgs + 1, o->system ? 2 : 1, 1, &chat);
    const char *text = chat ? chat : o->prompt;
    if (!st)
        st = qd_tokenizer_encode(tok, text, strlen(text), ids, n);
    free(chat);
    if (!st && *n == 0)
        st = qd_error(QD_ERR_ARG, "--prompt: encodes to no tokens");
    for (size_t i = 0; !st && i < *n; i++)
        if ((*ids)[i] >= vocab)
            st = qd_error(QD_ERR_ARG, "--prompt: token %zu (id %d) is outside the model's vocab_size %d", i,
                          (*ids)[i], vocab);
    return st;
}

/* tokenizer_config.json's eos_token beside the tokenizer: a string or {"content": ...}. */
static int32_t config_eos(const generate_opts *o, const qd_tokenizer *tok)
{
    char path[4096], *dir = o->tokenizer ? qd_path_dir(o->tokenizer) : NULL;
    snprintf(path, sizeof path, "%s/tokenizer_config.json", dir ? dir : o->model);
    free(dir);
    json_t *tc = json_load_file(path, 0, NULL), *eos = json_object_get(tc, "eos_token");
    const char *name = json_is_string(eos) ? json_string_value(eos)
                                           : json_string_value(json_object_get(eos, "content"));
    int32_t id = name ? qd_tokenizer_token_id(tok, name) : -1;
    json_decref(tc);
    return id;
}

/* Stop ids: <|im_end|>, <|endoftext|>, the eos_token of tokenizer_config.json
 * and generation_config.json's eos_token_id (int or list). */
static int stop_tokens(const generate_opts *o, const qd_tokenizer *tok, int32_t *stop)
{
    int n = 0;
    int32_t named[3] = {qd_tokenizer_token_id(tok, "<|im_end|>"), qd_tokenizer_token_id(tok, "<|endoftext|>"),
                        config_eos(o, tok)};
    for (int i = 0; i < 3; i++)
        if (named[i] >= 0)
            stop[n++] = named[i];
    char path[4096];
    snprintf(path, sizeof path, "%s/generation_config.json", o->model);
    json_t *gc = json_load_file(path, 0, NULL), *eos = json_object_get(gc, "eos_token_id");
    if (json_is_integer(eos))
        stop[n++] = (int32_t)json_integer_value(eos);
    for (size_t i = 0; i < json_array_size(eos) && n < MAX_STOP; i++)
        if (json_is_integer(json_array_get(eos, i)))
            stop[n++] = (int32_t)json_integer_value(json_array_get(eos, i));
    json_decref(gc);
    return n;
}

/* The completion's text: ids the tokenizer cannot decode (the model's padding
 * ids past the tokenizer's vocabulary) are left out, and so is a final stop token. */
static qd_status decode_completion(const qd_tokenizer *tok, const int32_t *ids, int n, int stopped,
                                   char **text)
{
    int32_t *keep = malloc(sizeof(int32_t) * (size_t)(n + 1));
    int k = 0;
    size_t len;
    if (!keep)
        return qd_error(QD_ERR_NOMEM, "out of memory");
    for (int i = 0; i < n - stopped; i++) {
        char *one = NULL;
        if (!qd_tokenizer_decode(tok, &ids[i], 1, 0, &one, &len))
            keep[k++] = ids[i];
        free(one);
    }
    qd_status st = qd_tokenizer_decode(tok, keep, (size_t)k, 0, text, &len);
    free(keep);
    return st;
}

/* ---- generating */

static int is_stop(int32_t id, const int32_t *stop, int nstop)
{
    for (int i = 0; i < nstop; i++)
        if (stop[i] == id)
            return 1;
    return 0;
}

static qd_status print_sample(const generate_opts *o, const qd_tokenizer *tok, int i, const int32_t *ids,
                              const float *logp, int n, int stopped)
{
    char *text = NULL;
    qd_status st = decode_completion(tok, ids, n, stopped, &text);
    if (st)
        return st;
    int bad;
    if (o->json) {
        json_t *jt = json_array();
        double sum = 0;
        for (int t = 0; t < n; t++) {
            json_array_append_new(jt, json_integer(ids[t]));
            sum += logp[t];
        }
        json_t *out = json_pack("{s:i,s:o,s:s,s:f,s:s}", "sample", i, "tokens", jt, "text", text,
                                "sum_logprob", sum, "finish", stopped ? "stop" : "length");
        bad = !out || json_dumpf(out, stdout, JSON_REAL_PRECISION(9) | JSON_COMPACT) || putchar('\n') == EOF;
        json_decref(out);
    } else {
        if (o->samples > 1)
            printf("--- sample %d\n", i);
        bad = printf("%s\n", text) < 0;
    }
    free(text);
    return bad ? qd_error(QD_ERR_IO, "stdout: write failed") : QD_OK;
}

static qd_status generate(const generate_opts *o, qd_backend *b, const qd_tokenizer *tok, const int32_t *ids,
                          int Tp)
{
    int K = o->samples, M = o->max_tokens;
    int32_t stop[MAX_STOP], *prompt = malloc(sizeof(int32_t) * (size_t)K * (size_t)Tp);
    int32_t *plen = malloc(sizeof(int32_t) * (size_t)K), *out = malloc(sizeof(int32_t) * (size_t)K * (size_t)M);
    int32_t *olen = malloc(sizeof(int32_t) * (size_t)K);
    uint64_t *sid = malloc(sizeof(uint64_t) * (size_t)K);
    float *logp = malloc(sizeof(float) * (size_t)K * (size_t)M);
    qd_status st = prompt && plen && out && olen && sid && logp ? QD_OK : qd_error(QD_ERR_NOMEM, "out of memory");
    for (int i = 0; !st && i < K; i++) {
        memcpy(prompt + (size_t)i * Tp, ids, sizeof(int32_t) * (size_t)Tp);
        plen[i] = Tp;
        sid[i] = (uint64_t)i;
    }
    int nstop = stop_tokens(o, tok, stop);
    qd_generate_request rq = {K, Tp, prompt, plen, sid, o->seed, M, (float)o->temperature,
                              o->top_k, (float)o->top_p, stop, nstop};
    qd_generate_result res = {out, logp, olen};
    if (!st)
        st = qd_backend_generate(b, &rq, &res);
    for (int i = 0; !st && i < K; i++) {
        const int32_t *row = out + (size_t)i * M;
        int stopped = olen[i] > 0 && is_stop(row[olen[i] - 1], stop, nstop);
        st = print_sample(o, tok, i, row, logp + (size_t)i * M, olen[i], stopped);
    }
    if (!st && fflush(stdout))
        st = qd_error(QD_ERR_IO, "stdout: write failed");
    free(prompt);
    free(plen);
    free(out);
    free(olen);
    free(sid);
    free(logp);
    return st;
}

static int run(generate_opts *o)
{
    qd_tokenizer *tok = NULL;
    qd_backend *b = NULL;
    qd_model_config cfg;
    int32_t *ids = NULL;
    size_t n = 0;
    qd_status st = qd_checkpoint_read_config(o->model, &cfg);
    if (!st)
        st = load_tokenizer(o, &tok);
    if (!st)
        st = encode_prompt(o, tok, cfg.vocab_size, &ids, &n);
    if (!st && !(b = qd_checkpoint_open_backend(o->model, o->backend, &o->opt)))
        st = QD_ERR_ARG;
    if (!st)
        st = generate(o, b, tok, ids, (int)n);
    int rc = st ? fail(1, qd_last_error()) : 0;
    free(ids);
    qd_backend_free(b);
    qd_tokenizer_free(tok);
    return rc;
}

int qd_cmd_generate(int argc, char **argv)
{
    generate_opts o = {.backend = "auto", .samples = 1, .max_tokens = 64, .temperature = 1.0, .top_p = 1.0,
                       .opt = {.recipe = QD_RECIPE_FP32, .role = QD_ROLE_ROLLOUT, .rac_ratio = 0.1}};
    int rc = parse_args(argc, argv, &o);
    return rc >= 0 ? rc : run(&o);
}
