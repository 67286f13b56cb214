/* rewards/: answer extraction, answer equivalence, reward functions and
 * pass@k-style metrics for math RL. Pure computation: no I/O of any kind.
 *
 * Ownership: every returned char * is malloc'd and owned by the caller
 * (free()); NULL means "no answer" unless said otherwise. */
#ifndef QD_REWARDS_H
#define QD_REWARDS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include "quant/status.h"

typedef enum {
    QD_GRADE_MATH,  /* \boxed / "answer is" / LaTeX / number extraction, semantic equivalence */
    QD_GRADE_GSM8K, /* "#### N" / "A: N" / "Answer: N" / last number, numeric compare */
    QD_GRADE_DAPO,  /* DAPO: "Answer: X" line, Minerva normalization, string compare */
} qd_grade_style;

/* ---- extraction (extract.c) */
/* Text after the last "</think>" (the whole text when absent). Not a copy. */
const char *qd_rewards_after_think(const char *text);
/* Content of the last \boxed{...} / \fbox{...} / "\boxed X" (nested braces
 * kept); NULL when none or unterminated. */
char *qd_rewards_last_boxed(const char *text);
/* The final answer of a model output (or of a gold solution) for a style;
 * NULL also when memory ran out. */
char *qd_rewards_extract(const char *text, qd_grade_style style);

/* ---- normalization (normalize.c) */
/* Hendrycks MATH _strip_string (hendrycks/math modeling/math_equivalence.py);
 * NULL where the reference raises (it then falls back to raw equality). */
char *qd_rewards_strip_hendrycks(const char *s);
/* Hendrycks is_equiv: normalized string equality. */
bool qd_rewards_equiv_hendrycks(const char *a, const char *b);
/* Minerva normalize_final_answer (Lewkowycz et al. 2022, App. D), as used by
 * DAPO's reward. */
char *qd_rewards_normalize_minerva(const char *s);

/* ---- equivalence (equiv.c, mathparse.c) */
/* Are two extracted answers the same mathematical object? Tries string
 * equality (spaces and $ ignored), then parses both (numbers, fractions,
 * roots, simple expressions with variables, tuples, intervals, sets,
 * matrices, relations) and compares exactly where possible, numerically
 * otherwise; answers it cannot parse fall back to Hendrycks equality.
 * gold and pred are not symmetric: a predicted "1/2 + 1/3 = 5/6" stands for
 * 5/6, a gold "7 = 11a+c" stays an equation. false when memory ran out. */
bool qd_rewards_equiv(const char *gold, const char *pred);

/* ---- grading (grade.c) */
typedef struct {
    bool correct;
    char *extracted; /* owned; NULL when no answer could be extracted */
} qd_rewards_result;

/* QD_ERR_NOMEM when memory ran out while grading this output: res is then
 * {false, NULL} and nothing else is affected (model output is hostile input;
 * one answer never ends the run). */
qd_status qd_rewards_grade(const char *output, const char *gold, qd_grade_style style,
                           qd_rewards_result *res);
void qd_rewards_result_free(qd_rewards_result *res);
qd_status qd_rewards_style_parse(const char *name, qd_grade_style *style);

/* ---- rewards and metrics (metrics.c) */
typedef struct {
    double correct;        /* reward of a correct answer (1) */
    double incorrect;      /* reward of a wrong answer (0) */
    double format_penalty; /* reward when no answer is extractable (0; DAPO uses -1) */
    int overlong_max;      /* L_max in tokens; 0 disables the overlong penalty */
    int overlong_cache;    /* L_cache: width of the soft penalty zone */
} qd_rewards_config;

qd_rewards_config qd_rewards_config_default(void);
/* DAPO soft overlong punishment (Yu et al. 2025, eq. 13): 0 up to
 * L_max - L_cache, then linear down to -1 at L_max, -1 beyond. */
double qd_rewards_overlong(int len, int l_max, int l_cache);
/* Outcome reward plus overlong penalty for one graded sample. */
double qd_rewards_score(const qd_rewards_config *cfg, bool has_answer, bool correct, int len);

/* Unbiased pass@k of Chen et al. 2021: 1 - prod_{i=n-c+1}^{n} (1 - k/i). */
qd_status qd_rewards_pass_at_k(int n, int c, int k, double *out);
/* The same as an exact fraction num/den = 1 - C(n-c,k)/C(n,k), reduced. */
qd_status qd_rewards_pass_at_k_exact(int n, int c, int k, uint64_t *num, uint64_t *den);
/* Mean of the first k correctness flags (mean@k; pass@1 when averaged). */
double qd_rewards_mean_at_k(const bool *correct, int k);
/* Majority vote over the first k extracted answers (NULL = no answer),
 * clustering by qd_rewards_equiv; ties go to the earliest cluster. Returns
 * the index of a representative answer of the winning cluster, -1 if none. */
int qd_rewards_majority(char *const *answers, int k);
/* maj@k: is the majority answer equivalent to gold? */
bool qd_rewards_maj_at_k(char *const *answers, int k, const char *gold);
/* Percentile bootstrap CI of the mean of x[0..n) with `reps` resamples and a
 * fixed seed (deterministic: same inputs, same interval). */
qd_status qd_rewards_bootstrap_ci(const double *x, int n, int reps, double level,
                                  uint64_t seed, double *lo, double *hi);

#endif
