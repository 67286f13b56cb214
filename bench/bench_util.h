/* Helpers of the benchmark programs (bench/): a monotonic clock, the median
 * of repeated measurements, the token inputs of a backend's phases and its
 * train step on them. Header only. */
#ifndef QD_BENCH_UTIL_H
#define QD_BENCH_UTIL_H

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "backends/backend.h"
#include "quant/splitmix64.h"

/* Seconds on the monotonic clock. */
static inline double qd_bench_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static inline int qd_bench_cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* The median of v (n > 0); sorts v. */
static inline double qd_bench_median(double *v, int n)
{
    qsort(v, (size_t)n, sizeof *v, qd_bench_cmp_double);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

/* malloc that exits with a message naming the program when memory runs out. */
static inline void *qd_bench_alloc(const char *prog, size_t n)
{
    void *p = malloc(n ? n : 1);
    if (!p) {
        fprintf(stderr, "%s: out of memory (%zu bytes)\n", prog, n);
        exit(1);
    }
    return p;
}

/* The inputs of a backend's phases, the same for every recipe: B rows of P
 * prompt tokens (prefill and decode) and T training tokens. */
typedef struct {
    int32_t *prefill_tok;   /* (B, P), or NULL */
    int32_t *prompt;        /* (B, P) decode prompts */
    int32_t *train_tok;     /* (B, T) */
    int32_t *len_p, *len_t; /* (B) all P, all T */
    uint64_t *seq_id;       /* (B) 0 .. B-1 */
    float *logp;            /* (B, max(P, M, T)) scratch */
    float *dlogp;           /* (B, T) mean NLL: -1 / (B T) */
    int32_t *gen_tok;       /* (B, M) */
    int32_t *gen_len;       /* (B) */
} qd_bench_inputs;

/* B rows of len tokens, uniform over the vocabulary (splitmix64 from seed). */
static inline int32_t *qd_bench_tokens(const char *prog, int B, int len, int vocab, uint64_t seed)
{
    int32_t *t = (int32_t *)qd_bench_alloc(prog, sizeof(int32_t) * (size_t)B * (size_t)len);
    uint64_t s = seed;
    for (size_t i = 0; i < (size_t)B * (size_t)len; i++)
        t[i] = (int32_t)(qd_splitmix64_unit(&s) * vocab);
    return t;
}

/* The inputs of B rows: prefill tokens from seed_prefill (none where it is
 * 0), decode prompts from seed_prompt, training tokens from seed_train. */
static inline qd_bench_inputs qd_bench_inputs_make(const char *prog, int B, int P, int T, int M, int vocab,
                                                   uint64_t seed_prefill, uint64_t seed_prompt, uint64_t seed_train)
{
    qd_bench_inputs in;
    size_t b = (size_t)B, w = (size_t)(T > P ? T : P);
    w = w > (size_t)M ? w : (size_t)M;
    in.prefill_tok = seed_prefill ? qd_bench_tokens(prog, B, P, vocab, seed_prefill) : NULL;
    in.prompt = qd_bench_tokens(prog, B, P, vocab, seed_prompt);
    in.train_tok = qd_bench_tokens(prog, B, T, vocab, seed_train);
    in.len_p = (int32_t *)qd_bench_alloc(prog, sizeof(int32_t) * b);
    in.len_t = (int32_t *)qd_bench_alloc(prog, sizeof(int32_t) * b);
    in.seq_id = (uint64_t *)qd_bench_alloc(prog, sizeof(uint64_t) * b);
    in.logp = (float *)qd_bench_alloc(prog, sizeof(float) * b * w);
    in.dlogp = (float *)qd_bench_alloc(prog, sizeof(float) * b * (size_t)T);
    in.gen_tok = (int32_t *)qd_bench_alloc(prog, sizeof(int32_t) * b * (size_t)M);
    in.gen_len = (int32_t *)qd_bench_alloc(prog, sizeof(int32_t) * b);
    for (size_t i = 0; i < b; i++) {
        in.len_p[i] = P;
        in.len_t[i] = T;
        in.seq_id[i] = (uint64_t)i;
    }
    for (size_t i = 0; i < b * (size_t)T; i++)
        in.dlogp[i] = -1.0f / (float)(b * (size_t)T);
    return in;
}

/* One trainer step of in's B x T training tokens (zero_grad, forward,
 * backward, AdamW at learning rate lr); step counts from 1. */
static inline qd_status qd_bench_train_step(qd_backend *b, const qd_bench_inputs *in, int B, int T, float lr,
                                            int step)
{
    const qd_adamw opt = {.lr = lr, .beta1 = 0.9f, .beta2 = 0.999f, .eps = 1e-8f, .weight_decay = 0.01f,
                          .grad_clip = 1.0f};
    qd_batch bt = {.B = B, .T = T, .tokens = in->train_tok, .lengths = in->len_t, .temperature = 1.0f};
    float gnorm;
    qd_backend_zero_grad(b);
    qd_status st = qd_backend_forward(b, &bt, in->logp, NULL);
    if (st == QD_OK)
        st = qd_backend_backward(b, in->dlogp);
    if (st == QD_OK)
        st = qd_backend_optimizer_step(b, &opt, step, &gnorm);
    return st;
}

static inline void qd_bench_inputs_free(qd_bench_inputs *in)
{
    free(in->prefill_tok);
    free(in->prompt);
    free(in->train_tok);
    free(in->len_p);
    free(in->len_t);
    free(in->seq_id);
    free(in->logp);
    free(in->dlogp);
    free(in->gen_tok);
    free(in->gen_len);
}

#endif
