/* dist/rendezvous: how the ranks of one job find each other and agree, before
 * and beside NCCL. A star over TCP: rank 0 listens on the rendezvous port, every
 * other rank connects to it and says hello (its rank, the world size and a run
 * id, so that a process of another job on the same port is refused). Over these
 * connections run small collectives (the NCCL unique id, checksums of weights,
 * barriers) and the abort messages that make a failure everyone's failure.
 *
 * Failure model: a rank that dies closes its connection (the kernel closes the
 * sockets of a killed process); rank 0 sees it and sends every surviving rank an
 * abort message naming the rank, so every rank returns QD_ERR_IO with the same
 * cause ("rank 3 closed its connection during barrier 'step 12'"). Every blocking
 * call has a deadline (poll()): rank 0 waits op_timeout_s for every rank to enter
 * a collective, the others wait twice that for rank 0's answer, so rank 0's
 * verdict (which rank is late) normally reaches them first. After an error the
 * handle is dead: every later call returns QD_ERR_IO with the first message.
 *
 * World size 1 opens no socket; the collectives copy or do nothing. A handle is
 * used by one thread at a time. */
#ifndef QD_DIST_RENDEZVOUS_H
#define QD_DIST_RENDEZVOUS_H

#include <stddef.h>
#include <stdint.h>
#include "quant/status.h"

typedef struct qd_rdzv qd_rdzv; /* opaque; one per process */

typedef struct {
    int rank, world_size;      /* 0 <= rank < world_size */
    const char *master_addr;   /* host name or address of rank 0 (unused at world size 1) */
    int port;                  /* 1..65535: rank 0 listens here, on every interface */
    uint64_t run_id;           /* equal on every rank of a job: qd_rdzv_run_id of its config */
    double connect_timeout_s;  /* open(): how long ranks retry and rank 0 waits for all */
    double op_timeout_s;       /* each collective (rank 0's wait; the others wait 2x) */
} qd_rdzv_opts;

/* Connects this rank to the others; returns after every rank has joined (open is
 * a barrier). *out is owned by the caller: qd_rdzv_close. */
qd_status qd_rdzv_open(const qd_rdzv_opts *o, qd_rdzv **out);
/* Closes the connections; the other ranks see this rank leave, which is a
 * failure for a rank still using the handle: end a run with a barrier, then
 * close. NULL is a no-op. */
void qd_rdzv_close(qd_rdzv *r);

/* buf (n bytes) on every rank = rank 0's buf. n must be equal on every rank. */
qd_status qd_rdzv_bcast(qd_rdzv *r, void *buf, size_t n);
/* all (world_size * n bytes) = every rank's mine (n bytes), in rank order. */
qd_status qd_rdzv_allgather(qd_rdzv *r, const void *mine, size_t n, void *all);
/* Returns when every rank has entered barrier `name` (named in messages; the
 * names must agree: a rank in another barrier is an error naming both). */
qd_status qd_rdzv_barrier(qd_rdzv *r, const char *name);

/* Non-blocking liveness check, for loops that wait on something else (the NCCL
 * watchdog): QD_OK when no rank has left or aborted; otherwise the error, with
 * `during` (what the caller is waiting for) in its message. */
qd_status qd_rdzv_check(qd_rdzv *r, const char *during);
/* Tells every rank that this one fails because of `why` (they return QD_ERR_IO
 * naming this rank and why) and kills the handle. Returns QD_ERR_IO. */
qd_status qd_rdzv_abort(qd_rdzv *r, const char *why);

int qd_rdzv_rank(const qd_rdzv *r);
int qd_rdzv_world_size(const qd_rdzv *r);
/* FNV-1a 64 of text: a run id from a job's configuration. */
uint64_t qd_rdzv_run_id(const char *text);

#endif
