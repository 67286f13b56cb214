/* dist/nccl_comm.cu's watchdog on the CPU: the real wrapper linked against
 * tests/mock_nccl.c (no GPU, no NCCL) and the real rendezvous between fork()ed
 * ranks. Asserts: the unique id made by rank 0 reaches every rank's
 * ncclCommInitRankConfig with blocking = 0; the calls and byte counts of
 * all-reduce, broadcast and all-to-all-v (sends and receives per peer in one
 * group, the self part copied); finalize then destroy at the end; and the
 * failures: a collective that never finishes times out, aborts the
 * communicator and tells the other ranks; a rank that dies during a collective
 * is named by every other rank within a second; an NCCL error is blamed on
 * the rank that died; world size 1 needs no NCCL. Built with CUDA and NCCL
 * only (it needs their headers), run by make check. */
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <nccl.h>
#include "dist/nccl_comm.h"
#include "tests/dist_ranks.h"
#include "tests/mock_nccl.h"

_Static_assert(sizeof(mock_nccl_state) <= sizeof(((qd_rank_result *)0)->data), "mock state fits a report");

#define CONNECT_S 2.0
#define OP_S 1.0
#define W 3

static void sleep_s(double s)
{
    nanosleep(&(struct timespec){.tv_sec = (time_t)s, .tv_nsec = (long)((s - (double)(time_t)s) * 1e9)}, NULL);
}

static const mock_nccl_state *state_of(const qd_rank_result *res) { return (const mock_nccl_state *)res->data; }
static void keep_state(qd_rank_result *res) { memcpy(res->data, &mock_nccl, sizeof mock_nccl); }

/* Opens the rendezvous and the communicator (device = rank + 10, timeout_s). */
static int open_both(qd_rdzv_opts *o, qd_rank_result *res, double timeout_s, qd_rdzv **rz, qd_nccl **c)
{
    if (qd_test_note(res, qd_rdzv_open(o, rz), qd_test_now()))
        return 1;
    if (qd_test_note(res, qd_nccl_init(*rz, o->rank + 10, timeout_s, c), qd_test_now())) {
        qd_rdzv_close(*rz);
        return 1;
    }
    return 0;
}

/* ---- the normal path */

/* a failed expectation inside a rank: status -3 and a message */
static int wrong(qd_rank_result *res, const char *fmt, size_t got, size_t want)
{
    res->st = -3;
    snprintf(res->msg, sizeof res->msg, fmt, got, want);
    return 1;
}

/* Rank s sends rank p (s + 2p + 1) floats; checks the recorded calls. */
static int all_to_all(qd_nccl *c, int rank, qd_rank_result *res)
{
    float send[64], recv[64];
    size_t sc[W], sd[W], rc[W], rd[W], ns = 0, nr = 0;
    for (int p = 0; p < W; p++) {
        sc[p] = (size_t)(rank + 2 * p + 1), rc[p] = (size_t)(p + 2 * rank + 1);
        sd[p] = ns, rd[p] = nr;
        ns += sc[p], nr += rc[p];
    }
    for (size_t j = 0; j < ns; j++)
        send[j] = (float)(100 * rank + (int)j);
    memset(recv, 0, sizeof recv);
    if (qd_test_note(res, qd_nccl_all_to_all_v(c, send, sc, sd, recv, rc, rd, sizeof(float), NULL), qd_test_now()))
        return 1;
    if (mock_nccl.nsend != W - 1 || mock_nccl.nrecv != W - 1 || mock_nccl.groups != 1)
        return wrong(res, "%zu sends, %zu groups", (size_t)mock_nccl.nsend, (size_t)mock_nccl.groups);
    for (int k = 0; k < W - 1; k++) {
        const mock_p2p *s = &mock_nccl.sends[k], *r = &mock_nccl.recvs[k];
        if ((const float *)s->buf != send + sd[s->peer] || s->bytes != sc[s->peer] * sizeof(float) || s->peer == rank)
            return wrong(res, "send to a peer: %zu bytes, expected %zu", s->bytes, sc[s->peer] * sizeof(float));
        if ((const float *)r->buf != recv + rd[r->peer] || r->bytes != rc[r->peer] * sizeof(float) || r->peer == rank)
            return wrong(res, "receive from a peer: %zu bytes, expected %zu", r->bytes, rc[r->peer] * sizeof(float));
    }
    for (size_t j = 0; j < sc[rank]; j++) /* this rank's own part: a device copy */
        if (recv[rd[rank] + j] != send[sd[rank] + j])
            return wrong(res, "self part element %zu of %zu", j, sc[rank]);
    return 0;
}

static void body_normal(qd_rdzv_opts *o, qd_rank_result *res)
{
    qd_rdzv *rz;
    qd_nccl *c;
    mock_nccl.init_polls = 5; /* the non-blocking init takes a few polls */
    mock_nccl.op_s = 0.05;
    if (open_both(o, res, 2.0, &rz, &c))
        return;
    float buf[100] = {0};
    unsigned char blob[300] = {0};
    double t0 = qd_test_now();
    if (!qd_test_note(res, qd_nccl_all_reduce_sum_f32(c, buf, 100, NULL), t0) && res->elapsed < 0.05)
        wrong(res, "all-reduce returned before its work finished (%zu ms of %zu)", (size_t)(res->elapsed * 1e3), 50);
    if (!res->st && !qd_test_note(res, qd_nccl_broadcast(c, blob, sizeof blob, 2, NULL), t0) &&
        !all_to_all(c, o->rank, res))
        qd_test_note(res, qd_rdzv_barrier(rz, "end"), t0);
    qd_nccl_free(c);
    qd_rdzv_close(rz);
    keep_state(res);
}

START_TEST(test_normal_path)
{
    qd_rank_result res[W];
    qd_test_run_ranks(W, body_normal, res, CONNECT_S, OP_S);
    for (int r = 0; r < W; r++) {
        const mock_nccl_state *m = state_of(&res[r]);
        ck_assert_msg(res[r].st == QD_OK, "rank %d: %s", r, res[r].msg);
        for (int i = 0; i < 128; i++) /* the id ncclGetUniqueId made on rank 0 */
            ck_assert_msg(m->id[i] == (unsigned char)(i * 3 + 1), "rank %d: id byte %d", r, i);
        ck_assert_int_eq(m->inits, 1);
        ck_assert_int_eq(m->nranks, W);
        ck_assert_int_eq(m->rank, r);
        ck_assert_int_eq(m->blocking, 0);
        ck_assert_int_eq(m->device, r + 10);
        ck_assert_int_eq(m->all_reduces, 1);
        ck_assert_int_eq(m->broadcasts, 1);
        ck_assert_int_eq(m->last_root, 2);
        ck_assert_uint_eq(m->last_count, 300);
        ck_assert_int_eq(m->memcpys, 1);
        ck_assert_int_eq(m->finalizes, 1);
        ck_assert_int_eq(m->destroys, 1);
        ck_assert_int_eq(m->aborts, 0);
    }
}
END_TEST

/* ---- failures */

/* rank 0's all-reduce never finishes (timeout 0.5 s); rank 1's does, and it
 * then waits in a barrier */
static void body_timeout(qd_rdzv_opts *o, qd_rank_result *res)
{
    qd_rdzv *rz;
    qd_nccl *c;
    mock_nccl.op_s = o->rank == 0 ? -1 : 0;
    if (open_both(o, res, 0.5, &rz, &c))
        return;
    float buf[100] = {0};
    double t0 = qd_test_now();
    qd_status st = qd_nccl_all_reduce_sum_f32(c, buf, 100, NULL);
    if (o->rank == 0)
        qd_test_note(res, st, t0);
    else
        qd_test_note(res, st ? st : qd_rdzv_barrier(rz, "after the all-reduce"), t0);
    /* a dead handle answers at once, the same way, without calling NCCL */
    if (o->rank == 0 && (qd_nccl_all_reduce_sum_f32(c, buf, 100, NULL) != QD_ERR_IO || mock_nccl.all_reduces != 1 ||
                         strcmp(qd_last_error(), res->msg) != 0))
        wrong(res, "dead handle: %zu all-reduces (expected %zu)", (size_t)mock_nccl.all_reduces, 1);
    qd_nccl_free(c);
    qd_rdzv_close(rz);
    keep_state(res);
}

START_TEST(test_timeout)
{
    qd_rank_result res[W];
    qd_test_run_ranks(2, body_timeout, res, CONNECT_S, OP_S);
    const char *what = "nccl all_reduce_sum_f32 of 400 bytes on rank 0 of 2 (device 10): timed out after 0.5 s";
    qd_test_expect_failure(res, 2, -1, QD_ERR_IO, what, "communicator aborted", 1.0);
    ck_assert_msg(res[0].elapsed >= 0.5, "rank 0 gave up after %.2f s", res[0].elapsed);
    ck_assert_msg(strstr(res[1].msg, "rank 0 aborted"), "%s", res[1].msg);
    ck_assert_int_eq(state_of(&res[0])->aborts, 1);
    ck_assert_int_eq(state_of(&res[0])->destroys, 0);
    ck_assert_int_eq(state_of(&res[1])->aborts, 0);
}
END_TEST

/* rank 2 exits after init; ranks 0 and 1 wait on an all-reduce that never ends */
static void body_rank_dies(qd_rdzv_opts *o, qd_rank_result *res)
{
    qd_rdzv *rz;
    qd_nccl *c;
    mock_nccl.op_s = -1;
    if (open_both(o, res, 5.0, &rz, &c))
        return;
    if (o->rank == 2)
        _exit(0);
    float buf[4] = {0};
    qd_test_note(res, qd_nccl_all_reduce_sum_f32(c, buf, 4, NULL), qd_test_now());
    qd_nccl_free(c);
    qd_rdzv_close(rz);
    keep_state(res);
}

START_TEST(test_rank_dies)
{
    qd_rank_result res[W];
    qd_test_run_ranks(W, body_rank_dies, res, CONNECT_S, OP_S);
    /* the rendezvous names it long before the 5 s timeout */
    qd_test_expect_failure(res, W, 2, QD_ERR_IO, "rank 2 closed its connection during nccl all_reduce_sum_f32",
                           "communicator aborted", 1.0);
    ck_assert_int_eq(state_of(&res[0])->aborts, 1);
    ck_assert_int_eq(state_of(&res[1])->aborts, 1);
}
END_TEST

/* NCCL reports a remote error 50 ms into the all-reduce; rank 2 exits at 200 ms */
static void body_nccl_error(qd_rdzv_opts *o, qd_rank_result *res)
{
    qd_rdzv *rz;
    qd_nccl *c;
    mock_nccl.op_s = -1;
    mock_nccl.error_s = 0.05;
    mock_nccl.error = ncclRemoteError;
    if (open_both(o, res, 5.0, &rz, &c))
        return;
    if (o->rank == 2) {
        sleep_s(0.2);
        _exit(0);
    }
    float buf[4] = {0};
    qd_test_note(res, qd_nccl_all_reduce_sum_f32(c, buf, 4, NULL), qd_test_now());
    qd_nccl_free(c);
    qd_rdzv_close(rz);
    keep_state(res);
}

START_TEST(test_nccl_error_blamed)
{
    qd_rank_result res[W];
    qd_test_run_ranks(W, body_nccl_error, res, CONNECT_S, OP_S);
    /* NCCL's words, then the rendezvous's verdict on who died */
    qd_test_expect_failure(res, W, 2, QD_ERR_IO, "remote process exited", "rank 2 closed its connection", 1.0);
}
END_TEST

START_TEST(test_world_1)
{
    qd_rdzv_opts o = {.rank = 0, .world_size = 1};
    qd_rdzv *rz;
    qd_nccl *c;
    ck_assert_int_eq(qd_rdzv_open(&o, &rz), QD_OK);
    ck_assert_int_eq(qd_nccl_init(rz, 3, 1.0, &c), QD_OK);
    float x[4] = {1, 2, 3, 4}, y[4] = {0};
    size_t n = 4, zero = 0;
    ck_assert_int_eq(qd_nccl_all_reduce_sum_f32(c, x, 4, NULL), QD_OK);
    ck_assert_int_eq(qd_nccl_broadcast(c, x, sizeof x, 0, NULL), QD_OK);
    ck_assert_int_eq(qd_nccl_all_to_all_v(c, x, &n, &zero, y, &n, &zero, sizeof(float), NULL), QD_OK);
    ck_assert_mem_eq(x, y, sizeof x);
    ck_assert_int_eq(mock_nccl.inits + mock_nccl.all_reduces + mock_nccl.broadcasts + mock_nccl.groups, 0);
    ck_assert_int_eq(mock_nccl.device, 3);
    /* a root outside the world is refused by name */
    ck_assert_int_eq(qd_nccl_broadcast(c, x, sizeof x, 1, NULL), QD_ERR_ARG);
    ck_assert_ptr_nonnull(strstr(qd_last_error(), "root 1 is outside 0..0"));
    qd_nccl_free(c);
    qd_rdzv_close(rz);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("nccl_mock");
    TCase *tc = tcase_create("watchdog");
    tcase_set_timeout(tc, 30);
    tcase_add_test(tc, test_world_1);
    tcase_add_test(tc, test_normal_path);
    tcase_add_test(tc, test_timeout);
    tcase_add_test(tc, test_rank_dies);
    tcase_add_test(tc, test_nccl_error_blamed);
    suite_add_tcase(s, tc);
    SRunner *sr = srunner_create(s);
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
