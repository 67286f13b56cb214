/* Cross-entropy training on the synthetic task, the tiny model's tokenizer and
 * initialization (sft.h). */
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "orchestrator/sft.h"
#include "orchestrator/task.h"
#include "benchmarks/synth.h"
#include "quant/fileio.h"
#include "quant/splitmix64.h"

/* ---- tokenizer */

/* The merges, as text pieces: " What", " is", the operators with their
 * leading space, and " the". Digits stay single bytes so that numbers are
 * read digit by digit. */
static const char *const merges[QD_SFT_TOK_MERGES][2] = {
    {" ", "W"}, {"h", "a"}, {" W", "ha"}, {" Wha", "t"}, {" ", "i"}, {" i", "s"},
    {" ", "+"}, {" ", "-"}, {" ", "*"}, {" ", "("}, {" ", "t"}, {"h", "e"}, {" t", "he"},
};
static const char *const specials[] = {QD_TASK_END_TOKEN, "<|im_start|>", "<|im_end|>"};

/* GPT-2's bytes_to_unicode: printable bytes map to themselves, the others (in
 * byte order) to U+0100 onwards. */
static int keeps_itself(unsigned b) { return (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || b >= 174; }

static unsigned byte_code_point(unsigned char b)
{
    if (keeps_itself(b))
        return b;
    unsigned n = 0;
    for (unsigned c = 0; c < b; c++)
        n += !keeps_itself(c);
    return 256 + n;
}

/* The UTF-8 of byte b's symbol (U+0021..U+0144) into out; returns its length, 1 or 2. */
static size_t put_symbol(unsigned char b, char *out)
{
    unsigned cp = byte_code_point(b);
    if (cp < 0x80) {
        out[0] = (char)cp;
        return 1;
    }
    out[0] = (char)(0xC0 | (cp >> 6));
    out[1] = (char)(0x80 | (cp & 0x3F));
    return 2;
}

/* The byte-level form of text (each byte's symbol) in out, NUL-terminated. */
static void byte_level(const char *text, char *out, size_t n)
{
    size_t k = 0;
    for (const unsigned char *p = (const unsigned char *)text; *p && k + 3 < n; p++)
        k += put_symbol(*p, out + k);
    out[k] = 0;
}

static json_t *vocab_json(void)
{
    json_t *vocab = json_object();
    char key[64];
    for (int b = 0; b < 256; b++) {
        key[put_symbol((unsigned char)b, key)] = 0;
        json_object_set_new(vocab, key, json_integer(b));
    }
    for (int m = 0; m < QD_SFT_TOK_MERGES; m++) {
        char text[32];
        snprintf(text, sizeof text, "%s%s", merges[m][0], merges[m][1]);
        byte_level(text, key, sizeof key);
        json_object_set_new(vocab, key, json_integer(256 + m));
    }
    return vocab;
}

static json_t *merges_json(void)
{
    json_t *list = json_array();
    for (int m = 0; m < QD_SFT_TOK_MERGES; m++) {
        char a[32], b[32], pair[72];
        byte_level(merges[m][0], a, sizeof a);
        byte_level(merges[m][1], b, sizeof b);
        snprintf(pair, sizeof pair, "%s %s", a, b); /* the legacy form every tokenizers version reads */
        json_array_append_new(list, json_string(pair));
    }
    return list;
}

static json_t *byte_level_json(int prefix_space, int trim_offsets)
{
    return json_pack("{s:s, s:b, s:b, s:b}", "type", "ByteLevel", "add_prefix_space", prefix_space,
                     "trim_offsets", trim_offsets, "use_regex", 1);
}

static json_t *tokenizer_json(void)
{
    json_t *added = json_array();
    for (size_t i = 0; i < sizeof specials / sizeof specials[0]; i++)
        json_array_append_new(added, json_pack("{s:i, s:s, s:b, s:b, s:b, s:b, s:b}", "id",
                                               256 + QD_SFT_TOK_MERGES + (int)i, "content", specials[i],
                                               "single_word", 0, "lstrip", 0, "rstrip", 0, "normalized", 0,
                                               "special", 1));
    json_t *model = json_pack("{s:s, s:n, s:n, s:n, s:n, s:b, s:b, s:b, s:o, s:o}", "type", "BPE", "dropout",
                              "unk_token", "continuing_subword_prefix", "end_of_word_suffix", "fuse_unk", 0,
                              "byte_fallback", 0, "ignore_merges", 0, "vocab", vocab_json(), "merges",
                              merges_json());
    return json_pack("{s:s, s:n, s:n, s:o, s:n, s:o, s:o, s:o, s:o}", "version", "1.0", "truncation", "padding",
                     "added_tokens", added, "normalizer", "pre_tokenizer", byte_level_json(0, 1),
                     "post_processor", byte_level_json(1, 0), "decoder", byte_level_json(1, 1), "model", model);
}

qd_status qd_sft_tokenizer_json(char **json, size_t *len)
{
    json_t *root = tokenizer_json();
    *json = root ? json_dumps(root, JSON_INDENT(2) | JSON_ENSURE_ASCII) : NULL;
    json_decref(root);
    if (!*json)
        return qd_error(QD_ERR_NOMEM, "tokenizer.json: out of memory");
    *len = strlen(*json);
    return QD_OK;
}

qd_status qd_sft_write_tokenizer(const char *path)
{
    char *text;
    size_t len;
    qd_status st = qd_sft_tokenizer_json(&text, &len);
    if (st)
        return st;
    text[len] = '\n'; /* the NUL's byte becomes the trailing newline */
    st = qd_atomic_write(path, text, len + 1);
    free(text);
    return st;
}

/* ---- model */

const qd_sft_dims qd_sft_default_dims = {
    .hidden = 64, .layers = 2, .heads = 4, .kv_heads = 2, .head_dim = 16,
    .experts = 8, .top_k = 2, .moe_intermediate = 64, .vocab = QD_SFT_TOK_VOCAB,
};

qd_status qd_sft_make_config(const qd_sft_dims *d, qd_model_config *cfg)
{
    memset(cfg, 0, sizeof *cfg);
    cfg->arch = QD_ARCH_QWEN3_MOE;
    cfg->vocab_size = d->vocab;
    cfg->hidden_size = d->hidden;
    cfg->intermediate_size = 2 * d->moe_intermediate; /* unused: every layer is MoE */
    cfg->moe_intermediate_size = d->moe_intermediate;
    cfg->num_hidden_layers = d->layers;
    cfg->num_attention_heads = d->heads;
    cfg->num_key_value_heads = d->kv_heads;
    cfg->head_dim = d->head_dim;
    cfg->rope_theta = 10000.0;
    cfg->rms_norm_eps = 1e-6;
    cfg->num_experts = d->experts;
    cfg->num_experts_per_tok = d->top_k;
    cfg->norm_topk_prob = 1;
    cfg->decoder_sparse_step = 1;
    cfg->max_position_embeddings = 512;
    snprintf(cfg->torch_dtype, sizeof cfg->torch_dtype, "float32");
    return qd_model_config_check(cfg);
}

/* A uniform in [0, 1) from (seed, tensor, draw): 53 bits, exact in double. */
static double hash_uniform(uint64_t seed, uint64_t tensor, uint64_t draw)
{
    uint64_t h = qd_splitmix64_mix(seed + QD_SPLITMIX64_GAMMA * (tensor + 1));
    h = qd_splitmix64_mix(h ^ qd_splitmix64_mix(draw + 0x632be59bd9b4e019ULL));
    return (double)(h >> 11) * 0x1.0p-53;
}

void qd_sft_init_weights(const qd_param_info *info, int n, uint64_t seed, float *params)
{
    for (int t = 0; t < n; t++) {
        size_t numel = (size_t)(info[t].rows * info[t].cols);
        float *w = params + info[t].offset;
        if (info[t].rows == 1) { /* the only vectors are RMSNorm weights */
            for (size_t i = 0; i < numel; i++)
                w[i] = 1.0f;
            continue;
        }
        /* Irwin-Hall: four uniforms sum to mean 2, variance 1/3. */
        double scale = sqrt(3.0 / (double)info[t].cols);
        for (size_t i = 0; i < numel; i++) {
            double s = 0.0;
            for (int k = 0; k < 4; k++)
                s += hash_uniform(seed, (uint64_t)t, 4 * (uint64_t)i + (uint64_t)k);
            w[i] = (float)((s - 2.0) * scale);
        }
    }
}

/* ---- training */

void qd_sft_default_options(qd_sft_options *o)
{
    memset(o, 0, sizeof *o);
    o->task = "arith";
    o->seed = 1;
    o->steps = 2000;
    o->batch = 32;
    o->lr = 3e-3f;
    o->warmup = 50;
    o->min_lr_ratio = 0.1f;
    o->weight_decay = 0.01f;
    o->grad_clip = 1.0f;
    o->train_problems = 20000;
}

typedef struct {
    int32_t *ids;
    int len, n_prompt;
} sequence;

typedef struct {
    sequence *seq;
    int n;
    int *order;   /* (n) the current epoch's permutation */
    int next;     /* position in order */
    uint64_t rng; /* splitmix64 state of the shuffles */
} pool;

static void shuffle(pool *p)
{
    for (int i = 0; i < p->n; i++)
        p->order[i] = i;
    for (int i = p->n - 1; i > 0; i--) {
        int j = (int)(qd_splitmix64_next(&p->rng) % (uint64_t)(i + 1));
        int t = p->order[i];
        p->order[i] = p->order[j];
        p->order[j] = t;
    }
    p->next = 0;
}

static const sequence *pool_next(pool *p)
{
    if (p->next == p->n)
        shuffle(p);
    return &p->seq[p->order[p->next++]];
}

static void pool_free(pool *p)
{
    for (int i = 0; p->seq && i < p->n; i++)
        free(p->seq[i].ids);
    free(p->seq);
    free(p->order);
}

/* How many distinct problems the task has at most (capped): n0 * (3 n0)^steps
 * with n0 = max_operand + 1. */
static double task_size(const qd_synth_opts *o)
{
    double n0 = o->max_operand + 1.0, n = n0;
    for (int i = 0; i < o->steps && n < 1e9; i++)
        n *= 3.0 * n0;
    return n;
}

/* The train pool: up to o->train_problems problems of the train split (at
 * most 80% of the task's problems, so that the draw does not stall), encoded. */
static qd_status pool_make(pool *p, const qd_tokenizer *tok, const qd_sft_options *o)
{
    memset(p, 0, sizeof *p);
    qd_synth_opts so;
    qd_status st = qd_task_parse(o->task, &so);
    if (st)
        return st;
    so.seed = o->seed;
    double cap = 0.8 * task_size(&so);
    size_t n = (double)o->train_problems < cap ? (size_t)o->train_problems : (size_t)cap;
    qd_bench_set set;
    st = qd_synth_generate(&so, QD_SPLIT_TRAIN, n, &set);
    if (st)
        return st;
    p->seq = calloc(set.n, sizeof *p->seq);
    p->order = calloc(set.n, sizeof *p->order);
    p->rng = o->seed ^ 0x7f4a7c159e3779b9ULL;
    if (!p->seq || !p->order)
        st = qd_error(QD_ERR_NOMEM, "sft: out of memory");
    for (size_t i = 0; !st && i < set.n; i++, p->n++) {
        size_t len, np;
        st = qd_task_encode(tok, set.rec[i].problem, set.rec[i].answer, &p->seq[i].ids, &len, &np);
        p->seq[i].len = (int)len;
        p->seq[i].n_prompt = (int)np;
    }
    qd_bench_set_free(&set);
    if (!st && p->n == 0)
        st = qd_error(QD_ERR_ARG, "sft: task '%s' gave no train problems", o->task);
    if (!st)
        shuffle(p);
    return st;
}

/* Linear warmup, then cosine from lr to lr * min_lr_ratio at the last step. */
static double lr_at(const qd_sft_options *o, int step)
{
    if (step <= o->warmup)
        return (double)o->lr * step / o->warmup;
    double span = o->steps - o->warmup, t = span > 0 ? (step - o->warmup) / span : 1.0;
    double m = o->min_lr_ratio;
    return o->lr * (m + (1.0 - m) * 0.5 * (1.0 + cos(M_PI * t)));
}

/* One step's batch: tokens (B, T) right-padded, and dL/dlogp = -1/ntok at
 * the positions that predict a target token (answer and end token). */
typedef struct {
    int32_t *tokens, *lengths;
    float *logp, *dlogp;
    int T;
} step_buf;

static qd_status run_step(qd_backend *b, pool *p, const qd_sft_options *o, step_buf *s, int step, double *loss)
{
    const sequence *seq[o->batch];
    int T = 1;
    for (int i = 0; i < o->batch; i++) {
        seq[i] = pool_next(p);
        T = seq[i]->len > T ? seq[i]->len : T;
    }
    size_t ntok = 0;
    memset(s->dlogp, 0, (size_t)o->batch * T * sizeof *s->dlogp);
    for (int i = 0; i < o->batch; i++) {
        memset(s->tokens + (size_t)i * T, 0, (size_t)T * sizeof *s->tokens);
        memcpy(s->tokens + (size_t)i * T, seq[i]->ids, (size_t)seq[i]->len * sizeof *s->tokens);
        s->lengths[i] = seq[i]->len;
        ntok += (size_t)(seq[i]->len - seq[i]->n_prompt);
    }
    /* logp[t] scores token t + 1: targets t + 1 in [n_prompt, len) */
    for (int i = 0; i < o->batch; i++)
        for (int t = seq[i]->n_prompt - 1; t < seq[i]->len - 1; t++)
            s->dlogp[(size_t)i * T + t] = -1.0f / (float)ntok;
    qd_batch batch = {.B = o->batch, .T = T, .tokens = s->tokens, .lengths = s->lengths};
    qd_backend_zero_grad(b);
    qd_status st = qd_backend_forward(b, &batch, s->logp, NULL);
    if (st)
        return st;
    double sum = 0.0;
    for (int i = 0; i < o->batch; i++)
        for (int t = seq[i]->n_prompt - 1; t < seq[i]->len - 1; t++)
            sum -= s->logp[(size_t)i * T + t];
    *loss = sum / (double)ntok;
    if (!isfinite(*loss))
        return qd_error(QD_ERR_NONFINITE, "sft: step %d: the loss is not finite", step);
    st = qd_backend_backward(b, s->dlogp);
    if (st)
        return st;
    qd_adamw opt = {.lr = (float)lr_at(o, step), .beta1 = 0.9f, .beta2 = 0.95f, .eps = 1e-8f,
                    .weight_decay = o->weight_decay, .grad_clip = o->grad_clip};
    float gn;
    return qd_backend_optimizer_step(b, &opt, step, &gn);
}

static qd_status check_options(const qd_sft_options *o)
{
    if (o->steps < 1 || o->batch < 1 || o->batch > 4096 || !(o->lr > 0) || o->warmup < 0 ||
        !(o->min_lr_ratio >= 0 && o->min_lr_ratio <= 1) || !(o->weight_decay >= 0) || !(o->grad_clip >= 0) ||
        o->train_problems < 1)
        return qd_error(QD_ERR_ARG, "sft: options out of range (steps %d, batch %d, lr %g, warmup %d, "
                        "min_lr_ratio %g, weight_decay %g, grad_clip %g, train_problems %d)", o->steps,
                        o->batch, o->lr, o->warmup, o->min_lr_ratio, o->weight_decay, o->grad_clip,
                        o->train_problems);
    return QD_OK;
}

qd_status qd_sft_train(qd_backend *b, const qd_tokenizer *tok, const qd_sft_options *o, double *final_loss)
{
    qd_status st = check_options(o);
    pool p = {0};
    if (!st)
        st = pool_make(&p, tok, o);
    int maxlen = 1;
    for (int i = 0; !st && i < p.n; i++)
        maxlen = p.seq[i].len > maxlen ? p.seq[i].len : maxlen;
    size_t cells = (size_t)o->batch * (size_t)maxlen;
    step_buf s = {calloc(cells, sizeof(int32_t)), calloc((size_t)o->batch, sizeof(int32_t)),
                  calloc(cells, sizeof(float)), calloc(cells, sizeof(float)), maxlen};
    if (!st && (!s.tokens || !s.lengths || !s.logp || !s.dlogp))
        st = qd_error(QD_ERR_NOMEM, "sft: out of memory");
    double loss = 0.0;
    int stop = 0;
    for (int step = 1; !st && !stop && step <= o->steps; step++) {
        st = run_step(b, &p, o, &s, step, &loss);
        if (!st && o->progress)
            o->progress(step, o->steps, loss, lr_at(o, step), o->ctx);
        if (!st && o->after_step)
            st = o->after_step(step, o->ctx, &stop);
    }
    if (!st && final_loss)
        *final_loss = loss;
    free(s.tokens);
    free(s.lengths);
    free(s.logp);
    free(s.dlogp);
    pool_free(&p);
    return st;
}
