/* A stand-in for the CUDA runtime and NCCL calls of dist/nccl_comm.cu, so that
 * its watchdog runs on the CPU (tests/test_nccl_mock.c links this instead of
 * cudart and libnccl). Host pointers play device pointers; collectives move no
 * data between processes, they are recorded. Knobs say how long enqueued work
 * takes and when an asynchronous error appears. */
#ifndef QD_TEST_MOCK_NCCL_H
#define QD_TEST_MOCK_NCCL_H

#include <stddef.h>

#define MOCK_MAX_P2P 8

typedef struct {
    const void *buf;
    size_t bytes;
    int peer;
} mock_p2p;

typedef struct {
    /* knobs */
    double op_s;        /* work enqueued on a stream finishes after this long; < 0: never */
    double error_s;     /* ncclCommGetAsyncError reports `error` this long after an enqueue; < 0: never */
    int error;          /* an ncclResult_t */
    int init_polls;     /* the communicator is ncclInProgress for this many polls after init */
    /* records */
    int device, nranks, rank, blocking;
    unsigned char id[128];
    int inits, aborts, finalizes, destroys, all_reduces, broadcasts, groups, group_depth, memcpys;
    size_t last_count;  /* elements of the last all-reduce / broadcast */
    int last_root;
    int nsend, nrecv;
    mock_p2p sends[MOCK_MAX_P2P], recvs[MOCK_MAX_P2P];
} mock_nccl_state;

extern mock_nccl_state mock_nccl; /* zeroed: everything finishes at once, no error */

#endif
