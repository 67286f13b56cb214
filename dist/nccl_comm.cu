/* dist/nccl_comm: NCCL through its C API behind a watchdog (nccl_comm.h). Host
 * code only; it is a .cu so that nvcc, which knows the CUDA include path,
 * compiles it like the rest of the CUDA sources. */
#include <cuda_runtime.h>
#include <nccl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include "dist/nccl_comm.h"

static_assert(sizeof(ncclUniqueId) == 128, "the rendezvous carries a 128-byte NCCL unique id");

/* how often the watchdog asks the rendezvous whether a rank failed */
#define RDZV_CHECK_S 0.01
#define WHAT_MAX 192
/* after an NCCL error, how long to wait for the rendezvous to name the failed rank */
#define BLAME_S 0.5

struct qd_nccl {
    ncclComm_t comm; /* NULL at world size 1, and after an abort */
    qd_rdzv *rz;     /* borrowed; NULL while finalizing (no verdicts then) */
    int rank, world, device;
    double timeout;
    int dead;        /* after the first failure */
    qd_status dead_status;
    char why[1024];
};

static double now_s(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

/* The first polls spin; then pauses of 20 us, then 1 ms (the added latency of a
 * long collective stays below 1 ms). */
static void pause_for(unsigned spin)
{
    if (spin < 64)
        return;
    struct timespec t = {0, spin < 1024 ? 20000L : 1000000L};
    nanosleep(&t, NULL);
}

static const char *describe(const qd_nccl *c, const char *op, size_t bytes, char *buf)
{
    snprintf(buf, WHAT_MAX, "nccl %s of %zu bytes on rank %d of %d (device %d)", op, bytes, c->rank, c->world,
             c->device);
    return buf;
}

static qd_status dead_error(const qd_nccl *c) { return qd_error(c->dead_status, "%s", c->why); }

/* Ends the communicator: abort it, tell the other ranks why, keep the message. */
static qd_status fail(qd_nccl *c, qd_status st, const char *what, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static qd_status fail(qd_nccl *c, qd_status st, const char *what, const char *fmt, ...)
{
    char reason[768];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(reason, sizeof reason, fmt, ap);
    va_end(ap);
    snprintf(c->why, sizeof c->why, "%s: %s; communicator aborted", what, reason);
    if (c->comm)
        ncclCommAbort(c->comm);
    c->comm = NULL;
    c->dead = 1;
    c->dead_status = st;
    if (c->rz)
        qd_rdzv_abort(c->rz, c->why);
    return dead_error(c);
}

/* The immediate result of an NCCL call: ncclInProgress is fine on a
 * non-blocking communicator (watch() waits for it). */
static qd_status issued(qd_nccl *c, const char *what, const char *call, ncclResult_t r)
{
    if (r == ncclSuccess || r == ncclInProgress)
        return QD_OK;
    return fail(c, QD_ERR_IO, what, "%s: %s (%s)", call, ncclGetErrorString(r), ncclGetLastError(c->comm));
}

/* After an NCCL error: a rank that died closed its rendezvous connection, so
 * the rendezvous can name it where NCCL ("remote process exited") cannot.
 * "; " + its verdict, or "" when it has none within BLAME_S. */
static const char *blame(qd_nccl *c, const char *what, char *buf, size_t n)
{
    buf[0] = '\0';
    for (double end = now_s() + BLAME_S; c->rz && now_s() < end;) {
        if (qd_rdzv_check(c->rz, what) != QD_OK) {
            snprintf(buf, n, "; %s", qd_last_error());
            break;
        }
        struct timespec t = {0, 5000000L};
        nanosleep(&t, NULL);
    }
    return buf;
}

/* The watchdog: returns when the communicator is ready and, with on_stream,
 * the work on s has finished; fails on an NCCL or CUDA error, a failed rank, or
 * after c->timeout seconds. */
static qd_status watch(qd_nccl *c, const char *what, cudaStream_t s, int on_stream)
{
    double t0 = now_s(), next_check = t0;
    for (unsigned spin = 0;; spin++) {
        ncclResult_t state = ncclSuccess;
        if (c->comm) {
            ncclResult_t r = ncclCommGetAsyncError(c->comm, &state);
            if (r != ncclSuccess)
                state = r;
        }
        if (state != ncclSuccess && state != ncclInProgress) {
            char verdict[640];
            const char *last = ncclGetLastError(c->comm);
            return fail(c, QD_ERR_IO, what, "%s (%s)%s", ncclGetErrorString(state), last,
                        blame(c, what, verdict, sizeof verdict));
        }
        if (state == ncclSuccess) {
            cudaError_t e = on_stream ? cudaStreamQuery(s) : cudaSuccess;
            if (e == cudaSuccess)
                return QD_OK;
            if (e != cudaErrorNotReady)
                return fail(c, QD_ERR_DEVICE, what, "CUDA: %s", cudaGetErrorString(e));
        }
        double t = now_s();
        if (t - t0 > c->timeout)
            return fail(c, QD_ERR_IO, what, "timed out after %.1f s (a rank that did not enter it, or a hung link)",
                        c->timeout);
        if (c->rz && t >= next_check) {
            if (qd_rdzv_check(c->rz, what) != QD_OK)
                return fail(c, QD_ERR_IO, what, "%s", qd_last_error());
            next_check = t + RDZV_CHECK_S;
        }
        pause_for(spin);
    }
}

/* Rank 0's unique id to every rank, then the non-blocking communicator. */
static qd_status create(qd_nccl *c, const char *what)
{
    cudaError_t e = cudaSetDevice(c->device);
    if (e != cudaSuccess)
        return fail(c, QD_ERR_DEVICE, what, "cudaSetDevice(%d): %s", c->device, cudaGetErrorString(e));
    if (c->world == 1)
        return QD_OK;
    ncclUniqueId id;
    memset(&id, 0, sizeof id);
    if (c->rank == 0) {
        ncclResult_t r = ncclGetUniqueId(&id);
        if (r != ncclSuccess)
            return fail(c, QD_ERR_IO, what, "ncclGetUniqueId: %s (%s)", ncclGetErrorString(r), ncclGetLastError(NULL));
    }
    if (qd_rdzv_bcast(c->rz, &id, sizeof id) != QD_OK)
        return fail(c, QD_ERR_IO, what, "%s", qd_last_error());
    ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
    cfg.blocking = 0;
    qd_status st = issued(c, what, "ncclCommInitRankConfig",
                          ncclCommInitRankConfig(&c->comm, c->world, id, c->rank, &cfg));
    return st ? st : watch(c, what, NULL, 0);
}

qd_status qd_nccl_init(qd_rdzv *rz, int device, double timeout_s, qd_nccl **out)
{
    *out = NULL;
    if (!(timeout_s > 0))
        return qd_error(QD_ERR_ARG, "nccl: the timeout (%g s) must be positive", timeout_s);
    qd_nccl *c = (qd_nccl *)calloc(1, sizeof *c);
    if (!c)
        return qd_error(QD_ERR_NOMEM, "nccl: out of memory");
    c->rz = rz;
    c->rank = qd_rdzv_rank(rz);
    c->world = qd_rdzv_world_size(rz);
    c->device = device;
    c->timeout = timeout_s;
    char what[WHAT_MAX];
    qd_status st = create(c, describe(c, "init", sizeof(ncclUniqueId), what));
    if (st) {
        free(c); /* create's failure aborted the communicator */
        return st;
    }
    *out = c;
    return QD_OK;
}

void qd_nccl_free(qd_nccl *c)
{
    if (!c)
        return;
    if (c->comm && !c->dead) {
        /* ranks leave at different times: a closed rendezvous is no failure here */
        c->rz = NULL;
        char what[WHAT_MAX];
        describe(c, "finalize", 0, what);
        if (issued(c, what, "ncclCommFinalize", ncclCommFinalize(c->comm)) == QD_OK &&
            watch(c, what, NULL, 0) == QD_OK)
            ncclCommDestroy(c->comm);
    }
    free(c);
}

/* The stream a collective runs on: the caller's, or for NULL this thread's
 * default stream, where every op of ours runs (NCCL would take 0 as the
 * legacy one, and the watchdog's cudaStreamQuery would not name it). */
static cudaStream_t op_stream(void *stream) { return stream ? (cudaStream_t)stream : cudaStreamPerThread; }

qd_status qd_nccl_all_reduce_sum_f32(qd_nccl *c, float *buf, size_t n, void *stream)
{
    if (c->dead)
        return dead_error(c);
    if (c->world == 1 || n == 0)
        return QD_OK;
    char what[WHAT_MAX];
    describe(c, "all_reduce_sum_f32", n * sizeof(float), what);
    cudaStream_t s = op_stream(stream);
    qd_status st = issued(c, what, "ncclAllReduce", ncclAllReduce(buf, buf, n, ncclFloat32, ncclSum, c->comm, s));
    return st ? st : watch(c, what, s, 1);
}

qd_status qd_nccl_broadcast(qd_nccl *c, void *buf, size_t bytes, int root, void *stream)
{
    if (c->dead)
        return dead_error(c);
    char what[WHAT_MAX];
    describe(c, "broadcast", bytes, what);
    if (root < 0 || root >= c->world)
        return fail(c, QD_ERR_ARG, what, "root %d is outside 0..%d", root, c->world - 1);
    if (c->world == 1 || bytes == 0)
        return QD_OK;
    cudaStream_t s = op_stream(stream);
    qd_status st = issued(c, what, "ncclBroadcast", ncclBroadcast(buf, buf, bytes, ncclUint8, root, c->comm, s));
    return st ? st : watch(c, what, s, 1);
}

/* The sends and receives to the other ranks, as one NCCL group. */
static ncclResult_t exchange(qd_nccl *c, const char *send, const size_t *send_counts, const size_t *send_displs,
                             char *recv, const size_t *recv_counts, const size_t *recv_displs, size_t eb,
                             cudaStream_t s)
{
    ncclResult_t r = ncclGroupStart();
    for (int p = 0; p < c->world && (r == ncclSuccess || r == ncclInProgress); p++) {
        if (p == c->rank)
            continue;
        if (send_counts[p])
            r = ncclSend(send + send_displs[p] * eb, send_counts[p] * eb, ncclUint8, p, c->comm, s);
        if (recv_counts[p] && (r == ncclSuccess || r == ncclInProgress))
            r = ncclRecv(recv + recv_displs[p] * eb, recv_counts[p] * eb, ncclUint8, p, c->comm, s);
    }
    ncclResult_t g = ncclGroupEnd(); /* a group once started is always ended */
    return r == ncclSuccess || r == ncclInProgress ? g : r;
}

qd_status qd_nccl_all_to_all_v(qd_nccl *c, const void *send, const size_t *send_counts, const size_t *send_displs,
                               void *recv, const size_t *recv_counts, const size_t *recv_displs,
                               size_t elem_bytes, void *stream)
{
    if (c->dead)
        return dead_error(c);
    size_t sent = 0;
    for (int p = 0; p < c->world; p++)
        sent += send_counts[p];
    char what[WHAT_MAX];
    describe(c, "all_to_all_v (bytes sent)", sent * elem_bytes, what);
    const char *sb = (const char *)send;
    char *rb = (char *)recv;
    size_t self = send_counts[c->rank], eb = elem_bytes;
    if (self != recv_counts[c->rank])
        return fail(c, QD_ERR_ARG, what, "rank %d sends itself %zu elements but expects %zu", c->rank, self,
                    recv_counts[c->rank]);
    cudaStream_t s = op_stream(stream);
    cudaError_t e = self ? cudaMemcpyAsync(rb + recv_displs[c->rank] * eb, sb + send_displs[c->rank] * eb,
                                           self * eb, cudaMemcpyDeviceToDevice, s)
                         : cudaSuccess;
    if (e != cudaSuccess)
        return fail(c, QD_ERR_DEVICE, what, "cudaMemcpyAsync to itself: %s", cudaGetErrorString(e));
    if (c->world > 1) {
        qd_status st = issued(c, what, "ncclSend/ncclRecv group",
                              exchange(c, sb, send_counts, send_displs, rb, recv_counts, recv_displs, eb, s));
        if (st)
            return st;
    }
    return watch(c, what, s, 1);
}
