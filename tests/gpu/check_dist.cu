/* On a machine with several GPUs: dist/'s NCCL communicator between real
 * processes. Each rank checks, against values computed on the host:
 *   all_reduce_sum_f32 (small integers: the sum is exact), broadcast from the
 *   last rank, all_to_all_v with a different count for every pair of ranks,
 *   and equal checksums of the reduced buffer (rendezvous allgather);
 * then prints the bus bandwidth of the all-reduce and the all-to-all (NCCL's
 * definitions: all-reduce 2(W-1)/W x bytes / time, all-to-all (W-1)/W x bytes
 * sent per rank / time). --fail exit|hang makes the last rank leave or stall
 * before the all-reduce: every other rank must then fail within the timeout
 * with a message naming it. Exit 0 when every rank passed, 1 otherwise.
 *     torchrun --nproc-per-node 2 tests/gpu/check_dist [--mb 64] [--timeout 20]
 *     tests/gpu/check_dist --spawn 2 [...]   forks the ranks itself (127.0.0.1) */
#include <cuda_runtime.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
extern "C" {
#include "dist/launch.h"
}
#include "dist/nccl_comm.h"

typedef struct {
    int spawn;      /* > 0: fork this many ranks here */
    const char *fail; /* "none", "exit", "hang" */
    double timeout, mb;
} args;

static double now_s(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

#define CK(call)                                                                                  \
    do {                                                                                          \
        cudaError_t e_ = (call);                                                                  \
        if (e_ != cudaSuccess) {                                                                  \
            fprintf(stderr, "rank %d: %s: %s\n", rank, #call, cudaGetErrorString(e_));            \
            return 1;                                                                             \
        }                                                                                         \
    } while (0)

#define OK(call)                                                                                  \
    do {                                                                                          \
        if ((call) != QD_OK) {                                                                    \
            fprintf(stderr, "rank %d: %s: %s\n", rank, #call, qd_last_error());                   \
            return 1;                                                                             \
        }                                                                                         \
    } while (0)

/* x (n floats) on every rank after the all-reduce: (i mod 1024) * W(W+1)/2. */
static int check_all_reduce(qd_nccl *c, qd_rdzv *rz, size_t n, double *busbw)
{
    int rank = qd_rdzv_rank(rz), w = qd_rdzv_world_size(rz);
    float *h = (float *)malloc(n * sizeof(float)), *d;
    for (size_t i = 0; i < n; i++)
        h[i] = (float)((i % 1024) * (size_t)(rank + 1));
    CK(cudaMalloc(&d, n * sizeof(float)));
    CK(cudaMemcpy(d, h, n * sizeof(float), cudaMemcpyHostToDevice));
    OK(qd_nccl_all_reduce_sum_f32(c, d, n, NULL));
    CK(cudaMemcpy(h, d, n * sizeof(float), cudaMemcpyDeviceToHost));
    size_t bad = 0;
    for (size_t i = 0; i < n; i++)
        bad += h[i] != (float)((i % 1024) * (size_t)(w * (w + 1) / 2));
    /* the checksum of the result agrees on every rank (the weight check of issue 7) */
    uint64_t sum = 0xcbf29ce484222325ull, all[64];
    for (size_t i = 0; i < n * sizeof(float); i++)
        sum = (sum ^ ((const unsigned char *)h)[i]) * 0x100000001b3ull;
    OK(qd_rdzv_allgather(rz, &sum, sizeof sum, all));
    for (int r = 0; r < w; r++)
        bad += all[r] != sum;
    const int iters = 5;
    double t0 = now_s();
    for (int k = 0; k < iters; k++)
        OK(qd_nccl_all_reduce_sum_f32(c, d, n, NULL));
    *busbw = 2.0 * (w - 1) / w * (double)(n * sizeof(float)) * iters / (now_s() - t0) / 1e9;
    cudaFree(d);
    free(h);
    if (bad)
        fprintf(stderr, "rank %d: all_reduce: %zu wrong values or checksums\n", rank, bad);
    return bad != 0;
}

static int check_broadcast(qd_nccl *c, qd_rdzv *rz, size_t bytes)
{
    int rank = qd_rdzv_rank(rz), root = qd_rdzv_world_size(rz) - 1;
    unsigned char *h = (unsigned char *)malloc(bytes), *d;
    for (size_t i = 0; i < bytes; i++)
        h[i] = rank == root ? (unsigned char)(i * 7 + 13) : 0;
    CK(cudaMalloc(&d, bytes));
    CK(cudaMemcpy(d, h, bytes, cudaMemcpyHostToDevice));
    OK(qd_nccl_broadcast(c, d, bytes, root, NULL));
    CK(cudaMemcpy(h, d, bytes, cudaMemcpyDeviceToHost));
    size_t bad = 0;
    for (size_t i = 0; i < bytes; i++)
        bad += h[i] != (unsigned char)(i * 7 + 13);
    cudaFree(d);
    free(h);
    if (bad)
        fprintf(stderr, "rank %d: broadcast: %zu wrong bytes\n", rank, bad);
    return bad != 0;
}

/* Rank s sends rank p (s + 2p + 1) * unit floats of value s*1e6 + p*1e3 + (j mod 1000). */
static float a2a_value(int s, int p, size_t j) { return (float)(s * 1000000 + p * 1000 + (int)(j % 1000)); }

static int check_all_to_all(qd_nccl *c, qd_rdzv *rz, size_t unit, double *busbw)
{
    int rank = qd_rdzv_rank(rz), w = qd_rdzv_world_size(rz);
    size_t sc[64], sd[64], rc[64], rd[64], ns = 0, nr = 0;
    for (int p = 0; p < w; p++) {
        sc[p] = (size_t)(rank + 2 * p + 1) * unit;
        rc[p] = (size_t)(p + 2 * rank + 1) * unit;
        sd[p] = ns;
        rd[p] = nr;
        ns += sc[p];
        nr += rc[p];
    }
    float *hs = (float *)malloc(ns * sizeof(float)), *hr = (float *)malloc(nr * sizeof(float)), *ds, *dr;
    for (int p = 0; p < w; p++)
        for (size_t j = 0; j < sc[p]; j++)
            hs[sd[p] + j] = a2a_value(rank, p, j);
    CK(cudaMalloc(&ds, ns * sizeof(float)));
    CK(cudaMalloc(&dr, nr * sizeof(float)));
    CK(cudaMemcpy(ds, hs, ns * sizeof(float), cudaMemcpyHostToDevice));
    CK(cudaMemset(dr, 0xff, nr * sizeof(float)));
    OK(qd_nccl_all_to_all_v(c, ds, sc, sd, dr, rc, rd, sizeof(float), NULL));
    CK(cudaMemcpy(hr, dr, nr * sizeof(float), cudaMemcpyDeviceToHost));
    size_t bad = 0;
    for (int p = 0; p < w; p++)
        for (size_t j = 0; j < rc[p]; j++)
            bad += hr[rd[p] + j] != a2a_value(p, rank, j);
    const int iters = 5;
    double t0 = now_s();
    for (int k = 0; k < iters; k++)
        OK(qd_nccl_all_to_all_v(c, ds, sc, sd, dr, rc, rd, sizeof(float), NULL));
    *busbw = (double)(w - 1) / w * (double)(ns * sizeof(float)) * iters / (now_s() - t0) / 1e9;
    cudaFree(ds);
    cudaFree(dr);
    free(hs);
    free(hr);
    if (bad)
        fprintf(stderr, "rank %d: all_to_all_v: %zu wrong values\n", rank, bad);
    return bad != 0;
}

/* --fail: the last rank leaves or stalls; the others must fail in time, naming it. */
static int check_failure(qd_nccl *c, qd_rdzv *rz, const args *a)
{
    int rank = qd_rdzv_rank(rz), last = qd_rdzv_world_size(rz) - 1;
    if (rank == last && strcmp(a->fail, "exit") == 0)
        _exit(3);
    if (rank == last) {
        sleep((unsigned)(2 * a->timeout + 2));
        return 0;
    }
    float *d;
    CK(cudaMalloc(&d, 1 << 20));
    double t0 = now_s();
    qd_status st = qd_nccl_all_reduce_sum_f32(c, d, (1 << 20) / sizeof(float), NULL);
    double t = now_s() - t0;
    char who[32];
    snprintf(who, sizeof who, "rank %d", last);
    const char *want = strcmp(a->fail, "exit") == 0 ? who : "timed out";
    int ok = st != QD_OK && strstr(qd_last_error(), want) && t < a->timeout + 2;
    printf("rank %d: --fail %s: %s after %.2f s: %s\n", rank, a->fail, ok ? "PASS" : "FAIL", t,
           st ? qd_last_error() : "no error");
    return !ok;
}

static int run_rank(const args *a)
{
    int rank = -1;
    qd_dist_env env;
    OK(qd_dist_env_read(&env));
    rank = env.rank;
    if (env.world_size > 64) {
        fprintf(stderr, "rank %d: world size %d: this check handles at most 64 ranks\n", rank, env.world_size);
        return 1;
    }
    int ndev = 0;
    CK(cudaGetDeviceCount(&ndev));
    int device = env.local_rank % (ndev > 0 ? ndev : 1);
    qd_rdzv_opts o = {env.rank, env.world_size, env.master_addr, env.rdzv_port, qd_rdzv_run_id("check_dist"),
                      60.0, a->timeout};
    qd_rdzv *rz;
    qd_nccl *c;
    OK(qd_rdzv_open(&o, &rz));
    double t0 = now_s();
    OK(qd_nccl_init(rz, device, a->timeout, &c));
    double t_init = now_s() - t0, bw_ar = 0, bw_a2a = 0;
    int bad = 0;
    if (strcmp(a->fail, "none") != 0) {
        bad = check_failure(c, rz, a);
    } else {
        size_t n = (size_t)(a->mb * 1048576.0 / sizeof(float));
        bad |= check_all_reduce(c, rz, n, &bw_ar);
        bad |= check_broadcast(c, rz, 1000003);
        bad |= check_all_to_all(c, rz, n / (size_t)(3 * env.world_size * env.world_size) + 1, &bw_a2a);
        OK(qd_rdzv_barrier(rz, "end"));
        printf("rank %d of %d (%s, device %d of %d): init %.2f s, all_reduce %s %.1f GB/s busbw (%.0f MB), "
               "broadcast and all_to_all_v %s %.1f GB/s busbw\n", rank, env.world_size,
               qd_dist_launcher_name(env.launcher), device, ndev, t_init, bad ? "FAIL" : "ok", bw_ar, a->mb,
               bad ? "FAIL" : "ok", bw_a2a);
    }
    qd_nccl_free(c);
    qd_rdzv_close(rz);
    return bad;
}

/* --spawn N: N ranks as child processes, the launcher's variables set by hand. */
static int spawn(const args *a)
{
    char port[16];
    snprintf(port, sizeof port, "%d", 20000 + (int)(getpid() % 20000));
    pid_t pid[64];
    for (int r = 0; r < a->spawn; r++) {
        if ((pid[r] = fork()) == 0) {
            char v[16];
            snprintf(v, sizeof v, "%d", r);
            setenv("RANK", v, 1);
            setenv("LOCAL_RANK", v, 1);
            snprintf(v, sizeof v, "%d", a->spawn);
            setenv("WORLD_SIZE", v, 1);
            setenv("LOCAL_WORLD_SIZE", v, 1);
            setenv("MASTER_ADDR", "127.0.0.1", 1);
            setenv("MASTER_PORT", port, 1);
            _exit(run_rank(a));
        }
    }
    int bad = 0;
    for (int r = 0; r < a->spawn; r++) {
        int st = 0;
        waitpid(pid[r], &st, 0);
        int left_on_purpose = r == a->spawn - 1 && strcmp(a->fail, "none") != 0;
        bad |= !left_on_purpose && !(WIFEXITED(st) && WEXITSTATUS(st) == 0);
    }
    return bad;
}

int main(int argc, char **argv)
{
    args a = {0, "none", 20.0, 64.0};
    for (int i = 1; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "--spawn"))
            a.spawn = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--fail"))
            a.fail = argv[i + 1];
        else if (!strcmp(argv[i], "--timeout"))
            a.timeout = atof(argv[i + 1]);
        else if (!strcmp(argv[i], "--mb"))
            a.mb = atof(argv[i + 1]);
    }
    if (a.spawn > 64 || a.timeout <= 0 || a.mb <= 0 ||
        (strcmp(a.fail, "none") && strcmp(a.fail, "exit") && strcmp(a.fail, "hang"))) {
        fprintf(stderr, "usage: check_dist [--spawn N<=64] [--fail none|exit|hang] [--timeout S] [--mb M]\n");
        return 2;
    }
    int bad = a.spawn > 0 ? spawn(&a) : run_rank(&a);
    printf("check_dist: %s\n", bad ? "FAIL" : "PASS");
    return bad ? 1 : 0;
}
