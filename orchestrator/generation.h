/* orchestrator/generation: text in, sampled completions out, for the programs
 * that generate from a Hugging Face checkpoint (quads generate, quads eval).
 * It owns the model's backend, its tokenizer and the stop tokens, formats each
 * prompt (raw, or as the user message of a ChatML conversation), runs P
 * prompts x K samples through one qd_backend_generate call and decodes the
 * completions.
 *
 * Sampling streams (NUMERICS.md §6): sample k of the prompt with index i is
 * drawn from stream seq_id = i*K + k, where i counts from the `first` given to
 * qd_generation_run. A sample therefore depends on (seed, prompt, i, K, k)
 * alone, never on the batch it ran in or the thread count: sample k of
 * `quads generate --samples K` (one prompt, index 0) is stream k, and
 * problem i of a `quads eval` benchmark with --samples K uses streams
 * i*K .. i*K + K-1 whatever --batch is. */
#ifndef QD_GENERATION_H
#define QD_GENERATION_H

#include <stddef.h>
#include <stdint.h>
#include "backends/backend.h"
#include "quant/status.h"

typedef struct {
    const char *model;      /* Hugging Face folder: config.json, model.safetensors (borrowed) */
    const char *tokenizer;  /* tokenizer.json; NULL: model/tokenizer.json (borrowed) */
    const char *backend;    /* "auto", "cpu" or "cuda" */
    qd_backend_options opt; /* recipe and role, RAC ratio, threads */
    int chat;               /* 1: each prompt is the user message of a ChatML conversation */
    const char *system;     /* with chat: a system message first; NULL: none (borrowed) */
    uint64_t seed;
    double temperature;     /* 0: greedy */
    double top_p;           /* in (0, 1]; 1: off */
    int top_k;              /* 0: off */
    int max_tokens;         /* new tokens per sample at most, >= 1 */
} qd_generation_opts;

/* quads generate's defaults: backend auto, fp32 recipe, rollout role, RAC
 * ratio 0.1, raw prompts, seed 0, temperature 1, no top-k/top-p, 64 tokens. */
void qd_generation_opts_default(qd_generation_opts *o);

typedef struct qd_generation qd_generation;

/* Reads o->model's config.json, loads the tokenizer (checked before the
 * weights, so a missing one fails fast), collects the stop tokens and opens
 * the backend with the weights. Stop tokens: the tokenizer's <|im_end|> and
 * <|endoftext|>, the eos_token of tokenizer_config.json beside the tokenizer
 * (a string or {"content": ...}), and eos_token_id (an integer or a list) of
 * model/generation_config.json. o is copied; its strings are borrowed and
 * must outlive *out. On failure *out is NULL and the message names the file. */
qd_status qd_generation_open(const qd_generation_opts *o, qd_generation **out);
void qd_generation_free(qd_generation *g);

/* One completion. */
typedef struct {
    int32_t *tokens; /* (n) generated ids, the stop token included (malloc'd) */
    float *logp;     /* (n) log_softmax(logits / T)[token] (T = 1 when greedy) (malloc'd) */
    int n;           /* tokens generated, the stop token included */
    int stopped;     /* 1: ended at a stop token; 0: at max_tokens */
    char *text;      /* UTF-8, without the final stop token and without ids the
                        tokenizer cannot decode (model padding ids) (malloc'd) */
} qd_generation_sample;

/* Samples K completions of each of the P prompts into out[i*K + k] (P*K
 * slots, owned by the caller afterwards: qd_generation_samples_free), from
 * streams (first + i)*K + k. Prompts are UTF-8 text; a prompt that encodes to
 * no tokens or to an id outside the model's vocabulary is refused (the message
 * names its index). On failure every slot is zeroed. */
qd_status qd_generation_run(qd_generation *g, const char *const *prompts, int P, int K, uint64_t first,
                            qd_generation_sample *out);
/* Frees the arrays and texts of n samples (the slots themselves are the caller's). */
void qd_generation_samples_free(qd_generation_sample *s, size_t n);

#endif
