/* Built-in synthetic tasks for the tiny model: seeded integer arithmetic with
 * exact answers, and train / held-out splits that can never share a problem. */
#ifndef QD_BENCH_SYNTH_H
#define QD_BENCH_SYNTH_H
#include <stddef.h>
#include <stdint.h>
#include "benchmarks/dataset.h"

typedef enum { QD_SPLIT_TRAIN, QD_SPLIT_TEST } qd_split;

typedef struct {
    uint64_t seed;
    int steps;       /* operations per problem, 1..4 */
    int max_operand; /* operands are drawn from 0..max_operand, 1..1000 */
} qd_synth_opts;

/* The split a problem belongs to, from a hash of its text alone (1 in 10 is
 * held out), so no seed or count can put one problem in both splits. */
qd_split qd_synth_split_of(const char *problem);

/* n distinct problems of the given split, deterministic in (opts, split, n).
 * QD_ERR_ARG when the split has fewer than n distinct problems. */
qd_status qd_synth_generate(const qd_synth_opts *o, qd_split split, size_t n, qd_bench_set *out);

qd_status qd_synth_split_parse(const char *s, qd_split *out);

#endif
