/* Test helper of dist/: runs one function as every rank of a job, each rank a
 * fork()ed process meeting the others on 127.0.0.1 (tests/test_dist.c and
 * tests/test_nccl_mock.c). */
#ifndef QD_TEST_DIST_RANKS_H
#define QD_TEST_DIST_RANKS_H

#include <stdint.h>
#include "dist/rendezvous.h"

#define QD_TEST_MAX_WORLD 4

/* What a rank reports: the status and message of the call that ended its
 * scenario, how long that call took, and bytes for the test to check. */
typedef struct {
    int st;         /* -100: the rank exited (or hung) without reporting */
    double elapsed; /* seconds */
    char msg[640];
    uint8_t data[1024];
} qd_rank_result;

/* One rank's scenario: o is filled in (rank, world size, 127.0.0.1, a free
 * port, one run id, the timeouts); it may change o before qd_rdzv_open. */
typedef void (*qd_rank_body)(qd_rdzv_opts *o, qd_rank_result *res);

/* Runs body as ranks 0..world-1 and collects res[0..world-1]; a rank that does
 * not report within 15 s is killed. */
void qd_test_run_ranks(int world, qd_rank_body body, qd_rank_result *res, double connect_s, double op_s);
/* Records st (and its message) and the seconds since t0 in res; returns st. */
int qd_test_note(qd_rank_result *res, int st, double t0);
double qd_test_now(void);
/* Every rank but `except` (-1: none) got status st with both strings (b may be
 * NULL) in its message, within `within` seconds. */
void qd_test_expect_failure(const qd_rank_result *res, int world, int except, int st, const char *a,
                            const char *b, double within);

#endif
