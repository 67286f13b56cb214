/* dist/nccl_comm: the NCCL communicator of one process per GPU, made from the
 * rendezvous (rank 0's unique id goes out by qd_rdzv_bcast), and the three
 * collectives the data-parallel and expert-parallel paths need. Built only with
 * CUDA and NCCL (configure: HAVE_NCCL).
 *
 * Nothing here may hang: the communicator is non-blocking (ncclConfig_t
 * blocking = 0) and every call returns only after its work finished on the
 * device, polled by a watchdog that reads ncclCommGetAsyncError, cudaStreamQuery
 * and qd_rdzv_check (a rank that died or aborted). On an NCCL error, a timeout
 * or a failed rank the watchdog calls ncclCommAbort, tells the other ranks
 * through the rendezvous (qd_rdzv_abort), and returns QD_ERR_IO (QD_ERR_DEVICE
 * for a CUDA error) with a message naming the op, the rank and the bytes; the
 * handle is then dead and every later call fails the same way.
 *
 * World size 1 makes no NCCL communicator: all_reduce and broadcast return at
 * once and all_to_all_v is one device copy, so one GPU runs without NCCL.
 *
 * Buffers are device pointers; `stream` is a cudaStream_t (NULL: the legacy
 * default stream). Every call is collective: all ranks make the same calls in
 * the same order. */
#ifndef QD_DIST_NCCL_COMM_H
#define QD_DIST_NCCL_COMM_H

#include <stddef.h>
#include <stdint.h>
/* dist/ and quant/ headers are C: C linkage when CUDA (C++) includes them */
#ifdef __cplusplus
extern "C" {
#endif
#include "dist/rendezvous.h"

typedef struct qd_nccl qd_nccl; /* opaque */

/* Selects CUDA device `device` for this thread and makes the communicator of
 * the ranks of rz (rz is borrowed and must outlive *out). timeout_s bounds every
 * later call (and the init itself). *out is owned by the caller: qd_nccl_free. */
qd_status qd_nccl_init(qd_rdzv *rz, int device, double timeout_s, qd_nccl **out);
/* Finalizes (flushes) and destroys the communicator; aborts it when the handle
 * is dead or the flush times out. NULL is a no-op. */
void qd_nccl_free(qd_nccl *c);

/* buf (n floats) = the sum over ranks of buf, in place (data-parallel gradients:
 * one flat buffer). */
qd_status qd_nccl_all_reduce_sum_f32(qd_nccl *c, float *buf, size_t n, void *stream);
/* buf (bytes) on every rank = buf of rank root, in place (weight sync). */
qd_status qd_nccl_broadcast(qd_nccl *c, void *buf, size_t bytes, int root, void *stream);
/* Expert-parallel token exchange. Arrays have world_size entries, in elements
 * of elem_bytes: this rank sends send_counts[p] elements from send +
 * send_displs[p] to rank p, and receives recv_counts[p] elements from rank p at
 * recv + recv_displs[p]. recv_counts[p] must equal rank p's send_counts[this
 * rank] (exchange the counts first, e.g. with the same call on one count per
 * peer); a mismatch is undefined in NCCL and ends in the watchdog's timeout. */
qd_status qd_nccl_all_to_all_v(qd_nccl *c, const void *send, const size_t *send_counts, const size_t *send_displs,
                               void *recv, const size_t *recv_counts, const size_t *recv_displs,
                               size_t elem_bytes, void *stream);

#ifdef __cplusplus
}
#endif
#endif
