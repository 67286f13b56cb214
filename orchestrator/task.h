/* The built-in synthetic task as the model sees it, shared by `quads sft` and
 * the RL loop: the prompt format, tokenization, the reward of a completion,
 * and held-out pass@1 through the backend's generate. A benchmark as the task
 * takes the same format; its completions are graded by exact match, or, for
 * code problems (LiveCodeBench), by running them against their tests in the
 * sandbox (qd_task_grader).
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
#include "rewards/code.h"
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

/* The text of a completion (the n generated ids after the prompt) up to the
 * first end token, all of it when there is none (*format_ok, may be NULL: 1
 * when it holds the end token). *text (malloc'd; *text_len bytes, may be
 * NULL) is NULL when an id names no token or the ids do not decode: such a
 * completion is wrong, not an error. */
qd_status qd_task_completion_text(const qd_tokenizer *tok, const int32_t *completion, size_t n, char **text,
                                  size_t *text_len, int *format_ok);

/* How completions are graded. */
typedef struct {
    /* NULL: exact match with the record's answer (qd_task_reward); else the
     * records are code problems (qd_bench_record.code) and each completion's
     * last ``` block runs against the problem's tests in the sandbox with
     * these options (rewards/code.h): 1 when every test passes. */
    const qd_code_opts *code;
    /* For tests, may be NULL: sees the text of each code completion before
     * it is graded (id: its problem's) and may replace it (*text malloc'd,
     * freed by the grader; NULL: no text). */
    void (*edit)(void *ctx, const char *id, char **text);
    void *edit_ctx;
} qd_task_grader;

/* Grades n completions: completion i is ids + i * stride, len[i] ids long,
 * answering recs[i]. score[i] gets 1 or 0, format_ok[i] (may be NULL) 1 when
 * it ended with the end token; code: verdicts (may be NULL) counts the
 * completions by verdict (QD_CODE_N_VERDICTS entries, added to). The tests of
 * each distinct record are decoded once; all the code completions run
 * together on g->code->jobs workers. g NULL: exact match. */
qd_status qd_task_grade(const qd_task_grader *g, const qd_tokenizer *tok, const int32_t *ids, size_t stride,
                        const int32_t *len, const qd_bench_record *const *recs, int n, float *score, int *format_ok,
                        int64_t *verdicts);

typedef struct {
    double pass1;       /* mean over problems of correct / samples */
    double mean_len;    /* mean generated tokens per completion, end token included */
    double format_rate; /* fraction of completions that ended with the end token */
    int problems, completions;
    int64_t verdicts[QD_CODE_N_VERDICTS]; /* code: completions by verdict; zeros otherwise */
} qd_task_eval_result;

/* Generates `samples` completions of each of the first `limit` problems of set
 * (0 = all) at temperature (0 = greedy), at most max_new_tokens each (0 =
 * QD_TASK_MAX_NEW_TOKENS), and grades them with g (NULL: exact match,
 * qd_task_reward). Completion s of problem i samples with stream seq_id =
 * i * samples + s under seed, so the result does not depend on batching or
 * threads. */
qd_status qd_task_eval(qd_backend *b, const qd_tokenizer *tok, const qd_bench_set *set, int limit,
                       int samples, float temperature, uint64_t seed, int max_new_tokens,
                       const qd_task_grader *g, qd_task_eval_result *out);

#endif
