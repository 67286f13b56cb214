/* Timing helpers of the benchmark programs (bench/): a monotonic clock and
 * the median of repeated measurements. Header only. */
#ifndef QD_BENCH_UTIL_H
#define QD_BENCH_UTIL_H

#include <stdlib.h>
#include <time.h>

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

#endif
