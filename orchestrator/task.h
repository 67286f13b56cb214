/* The built-in synthetic task as the model sees it, shared by `quads sft` and
 * the RL loop: the prompt format, tokenization, the reward of a completion,
 * and held-out pass@1 through the backend's generate.
 *
 * Format (pinned; the shipped tiny model was trained on it, no chat template):
 *   prompt  = "Q: {problem}\nA: "
 *   target  = "{answer}" then the end token <|endoftext|>
 * Prompt and target are tokenized separately and their ids concatenated, so a
 * rollout's prompt ids are exactly the first ids of a training sequence. */
#ifndef QD_TASK_H
#define QD_TASK_H

#include <stddef.h>
#include <stdint.h>
#include "backends/backend.h"
#include "benchmarks/dataset.h"
#include "benchmarks/synth.h"
#include "models/tokenizer.h"
#include "quant/status.h"

#define QD_TASK_PROMPT_PREFIX "Q: "
#define QD_TASK_PROMPT_SUFFIX "\nA: "
#define QD_TASK_END_TOKEN "<|endoftext|>"

/* The task the tiny model was trained on ("arith"): one operation (+, -, *)
 * on operands 0..QD_TASK_DEFAULT_MAX_OPERAND. */
#define QD_TASK_DEFAULT_STEPS 1
#define QD_TASK_DEFAULT_MAX_OPERAND 99

/* Generation budget of an answer: the longest answer of 4 operations on
 * 4-digit operands plus the end token fits. */
#define QD_TASK_MAX_NEW_TOKENS 24

/* Sequences per generate call of qd_task_eval: bounds the backend's work
 * buffers (and sizes the memory plans of the instances that evaluate). */
#define QD_TASK_EVAL_CHUNK 64

/* Parses a task name into synthetic options (seed left as it was):
 * "arith" = the tiny model's task; "arith1".."arith4" = that many operations
 * with operands 0..QD_TASK_DEFAULT_MAX_OPERAND; a ":N" suffix sets the largest
 * operand ("arith1:50"). QD_ERR_ARG naming the value otherwise. */
qd_status qd_task_parse(const char *name, qd_synth_opts *o);

/* "Q: {problem}\nA: " in *out (malloc'd, owned by the caller). */
qd_status qd_task_prompt_text(const char *problem, char **out);

/* The id of QD_TASK_END_TOKEN, or QD_ERR_FORMAT naming the tokenizer when it
 * has none. */
qd_status qd_task_end_id(const qd_tokenizer *tok, int32_t *id);

/* Token ids of the prompt of problem, followed, when answer is not NULL, by
 * the ids of answer and the end token. *ids is malloc'd (owned by the caller);
 * *n_ids counts them all, *n_prompt (may be NULL) the prompt's. */
qd_status qd_task_encode(const qd_tokenizer *tok, const char *problem, const char *answer,
                         int32_t **ids, size_t *n_ids, size_t *n_prompt);

/* The reward of a completion (the n generated ids after the prompt): 1 when
 * its text up to the first end token (or all of it when there is none),
 * trimmed of ASCII whitespace, equals gold exactly, else 0. *format_ok (may
 * be NULL) is 1 when the completion holds the end token. An id the tokenizer
 * cannot decode makes the completion wrong, not an error. */
qd_status qd_task_reward(const qd_tokenizer *tok, const int32_t *completion, size_t n, const char *gold,
                         float *reward, int *format_ok);

typedef struct {
    double pass1;       /* mean over problems of correct / samples */
    double mean_len;    /* mean generated tokens per completion, end token included */
    double format_rate; /* fraction of completions that ended with the end token */
    int problems, completions;
} qd_task_eval_result;

/* Generates `samples` completions of each of the first `limit` problems of set
 * (0 = all) at temperature (0 = greedy), at most max_new_tokens each (0 =
 * QD_TASK_MAX_NEW_TOKENS), and grades them with qd_task_reward. Completion s
 * of problem i samples with stream seq_id = i * samples + s under seed, so the
 * result does not depend on batching or threads. */
qd_status qd_task_eval(qd_backend *b, const qd_tokenizer *tok, const qd_bench_set *set, int limit,
                       int samples, float temperature, uint64_t seed, int max_new_tokens,
                       qd_task_eval_result *out);

#endif
