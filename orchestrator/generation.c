/* Batched sampling from a checkpoint with its tokenizer (generation.h). */
#include <errno.h>
#include <jansson.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include "models/checkpoint.h"
#include "models/tokenizer.h"
#include "orchestrator/generation.h"
#include "quant/fileio.h"

#define MAX_STOP 16

struct qd_generation {
    qd_generation_opts o;
    qd_tokenizer *tok;
    qd_backend *b;
    int vocab;              /* the model's vocab_size */
    int32_t stop[MAX_STOP]; /* (nstop) ids that end a sample */
    int nstop;
};

void qd_generation_opts_default(qd_generation_opts *o)
{
    *o = (qd_generation_opts){.backend = "auto", .temperature = 1.0, .top_p = 1.0, .max_tokens = 64,
                              .opt = {.recipe = QD_RECIPE_FP32, .role = QD_ROLE_ROLLOUT, .rac_ratio = 0.1}};
}

/* ---- opening */

static qd_status load_tokenizer(const qd_generation_opts *o, qd_tokenizer **tok)
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

/* An optional JSON file of the model's folder: *out NULL when there is
 * none; one that is not a regular file (a FIFO is refused, not waited on)
 * or not JSON is an error naming it. */
static qd_status optional_json(const char *path, json_t **out)
{
    struct stat sb;
    char *text;
    size_t len;
    *out = NULL;
    if (stat(path, &sb) && errno == ENOENT)
        return QD_OK;
    QD_TRY(qd_read_file(path, &text, &len));
    json_error_t err;
    *out = json_loadb(text, len, 0, &err);
    free(text);
    return *out ? QD_OK : qd_error(QD_ERR_FORMAT, "%s: line %d: invalid JSON: %s", path, err.line, err.text);
}

/* tokenizer_config.json's eos_token beside the tokenizer: a string or
 * {"content": ...}; *id -1 when none. */
static qd_status config_eos(const qd_generation_opts *o, const qd_tokenizer *tok, int32_t *id)
{
    char path[4096], *dir = o->tokenizer ? qd_path_dir(o->tokenizer) : NULL;
    snprintf(path, sizeof path, "%s/tokenizer_config.json", dir ? dir : o->model);
    free(dir);
    json_t *tc;
    *id = -1;
    QD_TRY(optional_json(path, &tc));
    json_t *eos = json_object_get(tc, "eos_token");
    const char *name = json_is_string(eos) ? json_string_value(eos)
                                           : json_string_value(json_object_get(eos, "content"));
    *id = name ? qd_tokenizer_token_id(tok, name) : -1;
    json_decref(tc);
    return QD_OK;
}

static void add_stop(qd_generation *g, json_int_t id)
{
    if (g->nstop < MAX_STOP && id >= 0 && id <= INT32_MAX)
        g->stop[g->nstop++] = (int32_t)id;
}

/* The stop ids of generation.h's list. */
static qd_status find_stop_tokens(qd_generation *g)
{
    int32_t id;
    add_stop(g, qd_tokenizer_token_id(g->tok, "<|im_end|>"));
    add_stop(g, qd_tokenizer_token_id(g->tok, "<|endoftext|>"));
    QD_TRY(config_eos(&g->o, g->tok, &id));
    add_stop(g, id);
    char path[4096];
    snprintf(path, sizeof path, "%s/generation_config.json", g->o.model);
    json_t *gc;
    QD_TRY(optional_json(path, &gc));
    json_t *eos = json_object_get(gc, "eos_token_id");
    if (json_is_integer(eos))
        add_stop(g, json_integer_value(eos));
    for (size_t i = 0; i < json_array_size(eos); i++)
        if (json_is_integer(json_array_get(eos, i)))
            add_stop(g, json_integer_value(json_array_get(eos, i)));
    json_decref(gc);
    return QD_OK;
}

qd_status qd_generation_open(const qd_generation_opts *o, qd_generation **out)
{
    qd_model_config cfg;
    qd_generation *g = calloc(1, sizeof *g);
    *out = NULL;
    if (!g)
        return qd_error(QD_ERR_NOMEM, "generation: out of memory");
    g->o = *o;
    qd_status st = qd_checkpoint_read_config(o->model, &cfg);
    if (!st)
        st = load_tokenizer(o, &g->tok);
    if (!st) {
        g->vocab = cfg.vocab_size;
        st = find_stop_tokens(g);
    }
    if (!st && !(g->b = qd_checkpoint_open_backend(o->model, o->backend, &o->opt)))
        st = QD_ERR_ARG; /* the message is set */
    if (st)
        qd_generation_free(g);
    else
        *out = g;
    return st;
}

void qd_generation_free(qd_generation *g)
{
    if (!g)
        return;
    qd_backend_free(g->b);
    qd_tokenizer_free(g->tok);
    free(g);
}

/* ---- prompts */

/* Prompt i's ids, each checked against the model's vocabulary. */
static qd_status encode_prompt(const qd_generation *g, const char *prompt, int i, int32_t **ids, size_t *n)
{
    char *chat = NULL;
    qd_chat_message msgs[2] = {{"system", g->o.system}, {"user", prompt}};
    qd_status st = QD_OK;
    *ids = NULL;
    *n = 0;
    if (g->o.chat)
        st = qd_tokenizer_chat_format(&qd_chat_chatml, g->o.system ? msgs : msgs + 1, g->o.system ? 2 : 1, 1,
                                      &chat);
    const char *text = chat ? chat : prompt;
    if (!st)
        st = qd_tokenizer_encode(g->tok, text, strlen(text), ids, n);
    free(chat);
    if (!st && *n == 0)
        st = qd_error(QD_ERR_ARG, "prompt %d: encodes to no tokens", i);
    for (size_t t = 0; !st && t < *n; t++)
        if ((*ids)[t] >= g->vocab)
            st = qd_error(QD_ERR_ARG, "prompt %d: token %zu (id %d) is outside the model's vocab_size %d", i, t,
                          (*ids)[t], g->vocab);
    return st;
}

/* The completion's text: ids the tokenizer cannot decode (the model's padding
 * ids past the tokenizer's vocabulary) are left out, and so is a final stop token. */
static qd_status decode_completion(const qd_tokenizer *tok, const int32_t *ids, int n, int stopped, char **text)
{
    int32_t *keep = malloc(sizeof(int32_t) * (size_t)(n + 1));
    int k = 0;
    size_t len;
    if (!keep)
        return qd_error(QD_ERR_NOMEM, "generation: out of memory");
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

static int is_stop(const qd_generation *g, int32_t id)
{
    for (int i = 0; i < g->nstop; i++)
        if (g->stop[i] == id)
            return 1;
    return 0;
}

/* ---- one batch: B = P*K rows */

typedef struct {
    int B, Tp, M;
    int32_t *prompt;  /* (B, Tp) right-padded */
    int32_t *plen;    /* (B) */
    uint64_t *sid;    /* (B) */
    int32_t *out;     /* (B, M) */
    float *logp;      /* (B, M) */
    int32_t *olen;    /* (B) */
} batch_bufs;

static void batch_free(batch_bufs *r)
{
    free(r->prompt);
    free(r->plen);
    free(r->sid);
    free(r->out);
    free(r->logp);
    free(r->olen);
}

static qd_status batch_alloc(batch_bufs *r, int B, int Tp, int M)
{
    *r = (batch_bufs){.B = B, .Tp = Tp, .M = M};
    r->prompt = calloc((size_t)B * (size_t)Tp, sizeof(int32_t));
    r->plen = malloc(sizeof(int32_t) * (size_t)B);
    r->sid = malloc(sizeof(uint64_t) * (size_t)B);
    r->out = malloc(sizeof(int32_t) * (size_t)B * (size_t)M);
    r->logp = malloc(sizeof(float) * (size_t)B * (size_t)M);
    r->olen = malloc(sizeof(int32_t) * (size_t)B);
    if (r->prompt && r->plen && r->sid && r->out && r->logp && r->olen)
        return QD_OK;
    batch_free(r);
    return qd_error(QD_ERR_NOMEM, "generation: %d sequences of %d + %d tokens: out of memory", B, Tp, M);
}

/* Row i*K + k: prompt i, stream (first + i)*K + k. */
static void fill_rows(batch_bufs *r, int32_t *const *ids, const size_t *n, int P, int K, uint64_t first)
{
    for (int i = 0; i < P; i++)
        for (int k = 0; k < K; k++) {
            int row = i * K + k;
            memcpy(r->prompt + (size_t)row * (size_t)r->Tp, ids[i], sizeof(int32_t) * n[i]);
            r->plen[row] = (int32_t)n[i];
            r->sid[row] = (first + (uint64_t)i) * (uint64_t)K + (uint64_t)k;
        }
}

static qd_status take_sample(const qd_generation *g, const batch_bufs *r, int row, qd_generation_sample *s)
{
    int n = r->olen[row];
    const int32_t *ids = r->out + (size_t)row * (size_t)r->M;
    s->n = n;
    s->stopped = n > 0 && is_stop(g, ids[n - 1]);
    s->tokens = malloc(sizeof(int32_t) * (size_t)(n + 1));
    s->logp = malloc(sizeof(float) * (size_t)(n + 1));
    if (!s->tokens || !s->logp)
        return qd_error(QD_ERR_NOMEM, "generation: out of memory");
    memcpy(s->tokens, ids, sizeof(int32_t) * (size_t)n);
    memcpy(s->logp, r->logp + (size_t)row * (size_t)r->M, sizeof(float) * (size_t)n);
    return decode_completion(g->tok, ids, n, s->stopped, &s->text);
}

static qd_status generate_rows(qd_generation *g, int32_t *const *ids, const size_t *n, int P, int K,
                               uint64_t first, qd_generation_sample *out)
{
    size_t Tp = 0;
    for (int i = 0; i < P; i++)
        Tp = n[i] > Tp ? n[i] : Tp;
    if ((size_t)P * (size_t)K > INT32_MAX || Tp > INT32_MAX)
        return qd_error(QD_ERR_ARG, "generation: %d prompts x %d samples of up to %zu tokens: too large", P, K, Tp);
    batch_bufs r;
    int B = P * K;
    qd_status st = batch_alloc(&r, B, (int)Tp, g->o.max_tokens);
    if (st)
        return st;
    fill_rows(&r, ids, n, P, K, first);
    qd_generate_request rq = {.B = B, .Tp = (int)Tp, .prompt = r.prompt, .prompt_len = r.plen, .seq_id = r.sid,
                              .seed = g->o.seed, .max_new_tokens = r.M, .temperature = (float)g->o.temperature,
                              .top_k = g->o.top_k, .top_p = (float)g->o.top_p, .stop = g->stop, .num_stop = g->nstop};
    qd_generate_result res = {.tokens = r.out, .logp = r.logp, .lengths = r.olen};
    st = qd_backend_generate(g->b, &rq, &res);
    for (int row = 0; !st && row < B; row++)
        st = take_sample(g, &r, row, &out[row]);
    batch_free(&r);
    return st;
}

qd_status qd_generation_run(qd_generation *g, const char *const *prompts, int P, int K, uint64_t first,
                            qd_generation_sample *out)
{
    if (P < 1 || K < 1)
        return qd_error(QD_ERR_ARG, "generation: %d prompts x %d samples: expected at least 1 x 1", P, K);
    memset(out, 0, sizeof *out * (size_t)P * (size_t)K);
    int32_t **ids = calloc((size_t)P, sizeof *ids);
    size_t *n = calloc((size_t)P, sizeof *n);
    qd_status st = ids && n ? QD_OK : qd_error(QD_ERR_NOMEM, "generation: out of memory");
    for (int i = 0; !st && i < P; i++)
        st = encode_prompt(g, prompts[i], i, &ids[i], &n[i]);
    if (!st)
        st = generate_rows(g, ids, n, P, K, first, out);
    for (int i = 0; ids && i < P; i++)
        free(ids[i]);
    free(ids);
    free(n);
    if (st) {
        qd_generation_samples_free(out, (size_t)P * (size_t)K);
        memset(out, 0, sizeof *out * (size_t)P * (size_t)K);
    }
    return st;
}

void qd_generation_samples_free(qd_generation_sample *s, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        free(s[i].tokens);
        free(s[i].logp);
        free(s[i].text);
    }
}
