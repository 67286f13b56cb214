/* The mock of tests/mock_nccl.h: the real headers give the prototypes, so a
 * change of signature in NCCL or CUDA fails here at compile time. */
#include <cuda_runtime_api.h>
#include <nccl.h>
#include <string.h>
#include <time.h>
#include "tests/mock_nccl.h"

mock_nccl_state mock_nccl;

static double enqueued_at = -1; /* when the last work was enqueued (-1: none) */
static int polls_left;
static char comm_storage; /* what the mock communicator points at */

static double now_s(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static void enqueue(void) { enqueued_at = now_s(); }

static int elapsed_past(double s) { return enqueued_at >= 0 && s >= 0 && now_s() - enqueued_at >= s; }

/* ---- nvcc's registration of the (empty) device code of a .cu file */

void **__cudaRegisterFatBinary(void *fat_cubin)
{
    static void *handle;
    return &handle;
}
void __cudaRegisterFatBinaryEnd(void **handle) {}
void __cudaUnregisterFatBinary(void **handle) {}

/* ---- CUDA runtime */

cudaError_t cudaSetDevice(int device)
{
    mock_nccl.device = device;
    return cudaSuccess;
}

cudaError_t cudaStreamQuery(cudaStream_t stream)
{
    return enqueued_at < 0 || elapsed_past(mock_nccl.op_s) ? cudaSuccess : cudaErrorNotReady;
}

const char *cudaGetErrorString(cudaError_t error) { return "mock CUDA error"; }

cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t count, enum cudaMemcpyKind kind, cudaStream_t stream)
{
    memcpy(dst, src, count);
    mock_nccl.memcpys++;
    enqueue();
    return cudaSuccess;
}

/* ---- NCCL */

ncclResult_t ncclGetUniqueId(ncclUniqueId *id)
{
    for (int i = 0; i < NCCL_UNIQUE_ID_BYTES; i++)
        id->internal[i] = (char)(i * 3 + 1);
    return ncclSuccess;
}

ncclResult_t ncclCommInitRankConfig(ncclComm_t *comm, int nranks, ncclUniqueId id, int rank, ncclConfig_t *config)
{
    mock_nccl.inits++;
    mock_nccl.nranks = nranks;
    mock_nccl.rank = rank;
    mock_nccl.blocking = config->blocking;
    memcpy(mock_nccl.id, id.internal, sizeof mock_nccl.id);
    polls_left = mock_nccl.init_polls;
    *comm = (ncclComm_t)&comm_storage;
    return ncclInProgress;
}

ncclResult_t ncclCommGetAsyncError(ncclComm_t comm, ncclResult_t *state)
{
    if (polls_left > 0) {
        polls_left--;
        *state = ncclInProgress;
    } else {
        *state = elapsed_past(mock_nccl.error_s) ? (ncclResult_t)mock_nccl.error : ncclSuccess;
    }
    return ncclSuccess;
}

ncclResult_t ncclCommAbort(ncclComm_t comm)
{
    mock_nccl.aborts++;
    return ncclSuccess;
}

ncclResult_t ncclCommFinalize(ncclComm_t comm)
{
    mock_nccl.finalizes++;
    return ncclInProgress;
}

ncclResult_t ncclCommDestroy(ncclComm_t comm)
{
    mock_nccl.destroys++;
    return ncclSuccess;
}

const char *ncclGetErrorString(ncclResult_t result)
{
    return result == ncclRemoteError ? "remote process exited or there was a network error" : "mock NCCL error";
}

const char *ncclGetLastError(ncclComm_t comm) { return "mock last error"; }

ncclResult_t ncclAllReduce(const void *sendbuff, void *recvbuff, size_t count, ncclDataType_t datatype,
                           ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream)
{
    mock_nccl.all_reduces++;
    mock_nccl.last_count = count;
    enqueue();
    return ncclSuccess;
}

ncclResult_t ncclBroadcast(const void *sendbuff, void *recvbuff, size_t count, ncclDataType_t datatype, int root,
                           ncclComm_t comm, cudaStream_t stream)
{
    mock_nccl.broadcasts++;
    mock_nccl.last_count = count;
    mock_nccl.last_root = root;
    enqueue();
    return ncclSuccess;
}

ncclResult_t ncclGroupStart(void)
{
    mock_nccl.group_depth++;
    return ncclSuccess;
}

ncclResult_t ncclGroupEnd(void)
{
    mock_nccl.group_depth--;
    mock_nccl.groups++;
    enqueue();
    return ncclInProgress; /* a non-blocking communicator's group may still be launching */
}

static ncclResult_t record(mock_p2p *list, int *n, const void *buf, size_t count, int peer)
{
    if (*n >= MOCK_MAX_P2P || mock_nccl.group_depth != 1)
        return ncclInvalidUsage; /* point-to-point calls belong in a group */
    list[(*n)++] = (mock_p2p){buf, count, peer};
    return ncclSuccess;
}

ncclResult_t ncclSend(const void *sendbuff, size_t count, ncclDataType_t datatype, int peer, ncclComm_t comm,
                      cudaStream_t stream)
{
    return record(mock_nccl.sends, &mock_nccl.nsend, sendbuff, count, peer);
}

ncclResult_t ncclRecv(void *recvbuff, size_t count, ncclDataType_t datatype, int peer, ncclComm_t comm,
                      cudaStream_t stream)
{
    return record(mock_nccl.recvs, &mock_nccl.nrecv, recvbuff, count, peer);
}
