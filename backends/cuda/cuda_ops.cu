/* The CUDA backend: the device ops of backends/ops.h on one GPU, each slot
 * the twin of the CPU's of the same name (backends/cpu/cpu_ops.c), so the one
 * model driver (backends/model.c) computes the CPU's bits in exact mode
 * (NUMERICS.md §6). The kernels are backends/cuda/cuda_kernels.cu's (one per
 * CPU loop nest) and the quantizers and the W4A4 product cuda_quant.cu's
 * (checked bit for bit against quant/). What still runs on the host, as the
 * CPU's own code: the MoE row bookkeeping (qd_moe_group, topk copied back once
 * per MoE layer) and the sampler (qd_sample_batch on the last logits).
 *
 * Fast mode (options.mode, NUMERICS.md §7) changes only the products and
 * attention: BF16 linears through cuBLASLt's BF16 GEMM (float32 accumulate),
 * other float linears through cuBLASLt float32 GEMMs, FP8 through cuBLASLt
 * FP8, W4A4 through cuBLASLt's block-scaled FP4 on Blackwell (the canonical
 * kernels elsewhere), a prefill's attention through cuBLAS batched products
 * (qd_cuda_attend_gemm), decode attention through one fused kernel. The
 * experts' float products go through cuBLAS (qd_cuda_gemm_grouped_*). A BF16
 * linear's forward reads BF16 operands (its values are BF16 already), any other
 * float linear's (AQAT's fake-quant weights) float32 ones. Under the BF16
 * recipes every backward product reads BF16 operands (dy rounded; float32
 * accumulate; the experts' in one grouped call a direction; docs/numerics.md
 * §7b gives the error); QUADS_FAST_BF16=0 makes them TF32. Under fp32 every
 * product is float32.
 *
 * Work is enqueued on the legacy default stream; finish() synchronizes and
 * reports a non-finite input any async quantizer saw. */
#include <cuda_runtime.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include "backends/cuda/cuda_blas.h"
#include "backends/cuda/cuda_check.h"
#include "backends/cuda/cuda_quant.h"
extern "C" {
#include "backends/cuda/cuda_kernels.h"
#include "backends/layout.h"
#include "backends/ops.h"
}

/* Grow-only scratch of the ops themselves (dev unless said). */
enum { D_XH, D_RACWS, D_X16, D_W16, D_DY16, D_LOGP, D_SAMPLE, D_MOE, D_RACPTR, D_RACFQ, D_RMSW, D_XF, D_GDEV,
       D_DYF, D_EMBB, D_DIAG, D_SQW, D_BFP, D_NSCRATCH };

#define STAGE_SLOTS 64 /* to_dev's pinned ring: slots, each STAGE_BYTES */
#define STAGE_BYTES (16 << 10)
#define QD_GRAPHS 8    /* step graphs kept (graph_end) */
#define QD_CTABS 4096  /* const_table's tables kept */

/* A recorded step (graph_end): its key, qd_cuda_buf_gen when made, when last run. */
typedef struct {
    uint64_t key;
    unsigned long gen, used;
    cudaGraphExec_t ex;
} step_graph;

/* A table of pointers the device reads (const_table): its bytes on the host
 * and on the device. */
typedef struct {
    uint64_t hash;
    size_t bytes;
    void *host, *dev;
} const_tab;

/* A per-tensor fake-quant output recorded for QUADS_AQAT16 (cuda_dev.fq). */
typedef struct {
    const float *w; /* the fake-quant output (dev) */
    size_t n;
    int slot;       /* its s_dec in fq_dsdec[slot] */
    int bits;       /* its wk16 bits written with it (nvfp4_fake_quant_weights) */
} fq_range;

typedef struct {
    int device;                    /* the ordinal current when the context was made */
    qd_exec_mode mode;
    int bf16_copy;                 /* fast mode, BF16 recipes: keep wk16 */
    int fast16;                    /* fast mode, BF16 recipes: every backward product's operands as BF16
                                    * (QUADS_FAST_BF16=0: bwd_math's instead) */
    size_t dy16_bytes;             /* fast16: the backward's dy bits a block (QUADS_DY16_BYTES, for tests) */
    int lp_fast;                   /* fast mode: log-probs in one pass over the logits (qdk_logprob_fast;
                                    * QUADS_LOGPROB_FAST=0: the exact mode's two) */
    const float *held_x;           /* hold_input's x (n floats), and whether D_X16 holds its bits */
    size_t held_n;
    const void *held_bits;         /* D_X16 as it was when they were made */
    int held_ok, hold_on;          /* hold_on: QUADS_HOLD_X=1 (opt-in until run on a GPU) */
    int embed_sort;                /* embed_backward over sorted tokens (default since 2026-12-05;
                                    * QUADS_EMBED_SORT=0: one thread a column over all tokens) */
    int dlogit_fast;               /* fast16: the lm_head backward's dy bits with the hardware's exp
                                    * (default since 2026-12-05; QUADS_DLOGIT_FAST=0: the exact
                                    * expression's, then rounded) */
    /* QUADS_AQAT16=1 (fast16): a per-tensor fake-quant weight of the working
     * copy (AQAT, sym-QAT, replay) is kept in wk16 as its E2M1 x E4M3 part (a
     * BF16 value), its global decode scale the products' alpha, so its forward
     * runs on BF16 tensor cores too (aqat_*; docs/numerics.md §7b) */
    int aqat16;
    /* fast mode: decode's attention and x.W^T of at most 8 rows (BF16 weight
     * bits) by the exact kernels, which are faster there (QUADS_FAST_SMALL=0:
     * the fast ones, for the side-by-side) */
    int small_exact;
    /* fast mode: the FP8 recipe's experts on the E4M3 tensor cores (cuda_fp8.cu;
     * by default since 2026-12-06: a3b-4 fast fp8 rollout at batch 64 on the
     * H200 157 ms against the exact kernel's 1,776; QUADS_FP8_GROUPED=0 for
     * the exact kernel) */
    int fp8_tc;
    fq_range *fq;                  /* recorded since the last weights_changed, then those in wk, by w */
    int nfq, fq_cap, fq_live;      /* fq_live: entries in force (after weights_changed) */
    float *fq_dsdec, *fq_sdec;     /* the scales: dev (FQ_SLOTS), host copy at weights_changed */
    qd_gemm_math bwd_math;         /* fast mode: the backward products (experts, linears, attention)
                                    * and attention's forward ones: TF32 under BF16 recipes */
    const float *wk;               /* the working copy wk16 mirrors, (nwk) */
    size_t nwk;
    uint16_t *wk16;                /* fast mode: the working copy's BF16 bits */
    size_t fresh16;                /* floats of wk16 adamw_round wrote since the last weights_changed */
    int *d_bad;                    /* logprob's overflow flag */
    void *scratch[D_NSCRATCH];
    size_t scratch_cap[D_NSCRATCH];
    void *host;                    /* host scratch (sampling logits, MoE rows), grow-only */
    size_t host_cap;
    unsigned char *stage;          /* pinned ring for small host-to-device copies (to_dev) */
    cudaEvent_t stage_ev[STAGE_SLOTS];
    int stage_next, stage_ok;      /* stage_ok: 1 made, -1 could not be made (copies stay synchronous) */
    /* QUADS_CUDA_PROFILE=1: wall time per phase (synchronizing at each mark), printed at free */
    int prof, prof_sec;            /* 2: QUADS_CUDA_PROFILE=last */
    double prof_last, prof_t[QD_PH_COUNT];
    long prof_n[QD_PH_COUNT];
    int prof_steps;                /* optimizer steps ended (a weight sync left) */
    step_graph graphs[QD_GRAPHS];  /* graph_end's recordings (ex NULL: free slot) */
    unsigned long graph_clock;
    long graph_made, graph_failed, graph_runs; /* told at free under QUADS_CUDA_GRAPH=1 */
    const_tab *ctab;               /* const_table's tables, nctab of them */
    int nctab;
    double prof_t0[QD_PH_COUNT], prof_step[QD_PH_COUNT]; /* the totals at the last step's end; that step's */
    long prof_n0[QD_PH_COUNT], prof_nstep[QD_PH_COUNT];
} cuda_dev;

#define D(dev) ((cuda_dev *)(dev))

static const char *const prof_names[QD_PH_COUNT] = {
    "other", "attention linears", "attention", "routing", "experts", "lm_head", "log-probs",
    "logits to host + sampling", "backward: the rest", "AdamW", "weight sync", "backward: lm_head + log-probs",
    "backward: experts", "backward: routing", "backward: attention linears", "backward: attention"};

/* ------------------------------------------------------------------------ */
/* memory                                                                    */

/* cudaMalloc (zeroed) with an out-of-memory message giving the sizes asked for and free. */
static qd_status cuda_alloc(void *dev, void **p, size_t bytes, const char *what)
{
    (void)dev;
    *p = NULL;
    QD_REFUSE_RECORDING();
    cudaError_t e = cudaMalloc(p, bytes ? bytes : 1);
    if (e == cudaErrorMemoryAllocation) {
        cudaGetLastError();
        size_t fr = 0, tot = 0;
        cudaMemGetInfo(&fr, &tot);
        return qd_error(QD_ERR_NOMEM, "cuda backend: out of GPU memory for %s: %zu bytes asked for, "
                        "%zu free of %zu", what, bytes, fr, tot);
    }
    if (e != cudaSuccess)
        return qd_error(QD_ERR_DEVICE, "%s:%d: cudaMalloc(%zu bytes, %s): %s", __FILE__, __LINE__, bytes, what,
                        cudaGetErrorString(e));
    QD_CUDA_CHECK(cudaMemset(*p, 0, bytes ? bytes : 1));
    return QD_OK;
}

static void cuda_release(void *dev, void *p)
{
    (void)dev;
    if (p) {
        qd_cuda_buf_gen++;
        cudaFree(p);
    }
}

static qd_status cuda_zero(void *dev, void *p, size_t bytes)
{
    (void)dev;
    if (bytes)
        QD_CUDA_CHECK(cudaMemsetAsync(p, 0, bytes, 0));
    return QD_OK;
}

/* Host to device. A copy of at most STAGE_BYTES goes through a slot of a
 * pinned ring, enqueued on the legacy default stream after every op before
 * it, and the call returns at once; a slot is reused when its event says its
 * copy is done (64 copies later). cudaMemcpy from pageable memory first waits
 * for the device: a decode step's six batch tables and each RAC layer's
 * pointer table drained the GPU. Larger copies (weights) stay cudaMemcpy. */
static qd_status cuda_to_dev(void *dev, void *dst, const void *src, size_t bytes)
{
    cuda_dev *d = D(dev);
    if (!bytes)
        return QD_OK;
    QD_REFUSE_RECORDING(); /* a step graph holds no host copy (its source could change) */
    if (d->stage_ok == 0) {
        d->stage_ok = -1;
        if (cudaHostAlloc((void **)&d->stage, (size_t)STAGE_SLOTS * STAGE_BYTES, cudaHostAllocDefault) ==
            cudaSuccess) {
            int i = 0;
            for (; i < STAGE_SLOTS; i++)
                if (cudaEventCreateWithFlags(&d->stage_ev[i], cudaEventDisableTiming) != cudaSuccess)
                    break;
            d->stage_ok = i == STAGE_SLOTS ? 1 : -1;
            if (d->stage_ok < 0) {
                while (i-- > 0)
                    cudaEventDestroy(d->stage_ev[i]);
                cudaFreeHost(d->stage);
                d->stage = NULL;
            }
        }
        cudaGetLastError(); /* a failure here only leaves the copies synchronous */
    }
    if (d->stage_ok < 0 || bytes > STAGE_BYTES) {
        QD_CUDA_CHECK(cudaMemcpy(dst, src, bytes, cudaMemcpyHostToDevice));
        return QD_OK;
    }
    int k = d->stage_next;
    d->stage_next = (k + 1) % STAGE_SLOTS;
    unsigned char *slot = d->stage + (size_t)k * STAGE_BYTES;
    QD_CUDA_CHECK(cudaEventSynchronize(d->stage_ev[k])); /* a never-recorded event is complete */
    memcpy(slot, src, bytes);
    QD_CUDA_CHECK(cudaMemcpyAsync(dst, slot, bytes, cudaMemcpyHostToDevice, 0));
    QD_CUDA_CHECK(cudaEventRecord(d->stage_ev[k], 0));
    return QD_OK;
}

static qd_status cuda_to_host(void *dev, void *dst, const void *src, size_t bytes)
{
    (void)dev;
    if (!bytes)
        return QD_OK;
    QD_REFUSE_RECORDING(); /* nothing runs while recording */
    QD_CUDA_CHECK(cudaMemcpy(dst, src, bytes, cudaMemcpyDeviceToHost));
    return QD_OK;
}

/* Device to device on this thread's default stream: after every op enqueued
 * before it, by this context or another of this thread. */
static qd_status cuda_copy(void *dev, void *dst, const void *src, size_t bytes)
{
    (void)dev;
    if (bytes)
        QD_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, 0));
    return QD_OK;
}

static int cuda_memory_id(void *dev) { return D(dev)->device; }

static qd_status cuda_mem_info(void *dev, size_t *free_bytes, size_t *total_bytes)
{
    (void)dev;
    QD_CUDA_CHECK(cudaMemGetInfo(free_bytes, total_bytes));
    return QD_OK;
}

/* Fast mode, BF16 recipes: wk16 (cuda_weights_changed). */
static size_t cuda_own_bytes(void *dev, size_t nfloats)
{
    return D(dev)->bf16_copy ? sizeof(uint16_t) * nfloats : 0;
}

static qd_status cuda_finish(void *dev)
{
    (void)dev;
    if (qd_cuda_recording()) /* the caller finishes after running the recording */
        return QD_OK;
    return qd_cuda_nonfinite_check();
}

/* ------------------------------------------------------------------------ */
/* step graphs (ops.h graph_begin): this thread's default stream recorded    */

static qd_status cuda_graph_begin(void *dev)
{
    if (D(dev)->prof || qd_cuda_recording()) /* the profile synchronizes at each phase */
        return QD_ERR_UNSUPPORTED;
    if (cudaStreamBeginCapture(cudaStreamPerThread, cudaStreamCaptureModeThreadLocal) != cudaSuccess) {
        (void)cudaGetLastError();
        return QD_ERR_UNSUPPORTED;
    }
    return QD_OK;
}

/* The slot of key's recording, or -1. */
static int graph_slot(const cuda_dev *d, uint64_t key)
{
    for (int i = 0; i < QD_GRAPHS; i++)
        if (d->graphs[i].ex && d->graphs[i].key == key)
            return i;
    return -1;
}

static qd_status cuda_graph_end(void *dev, uint64_t key, int ok)
{
    cuda_dev *d = D(dev);
    cudaGraph_t g = NULL;
    cudaGraphExec_t ex = NULL;
    cudaError_t e = cudaStreamEndCapture(cudaStreamPerThread, &g);
    if (e == cudaSuccess && ok && g)
        e = cudaGraphInstantiate(&ex, g, 0);
    if (g)
        cudaGraphDestroy(g);
    if (e != cudaSuccess || !ok || !ex) {
        (void)cudaGetLastError(); /* a broken recording's error is not the device's */
        if (ex)
            cudaGraphExecDestroy(ex);
        d->graph_failed++;
        return QD_ERR_UNSUPPORTED;
    }
    d->graph_made++;
    int k = graph_slot(d, key);
    for (int i = 0; k < 0 && i < QD_GRAPHS; i++)
        if (!d->graphs[i].ex)
            k = i;
    if (k < 0) { /* the least recently run */
        k = 0;
        for (int i = 1; i < QD_GRAPHS; i++)
            if (d->graphs[i].used < d->graphs[k].used)
                k = i;
    }
    if (d->graphs[k].ex)
        cudaGraphExecDestroy(d->graphs[k].ex);
    d->graphs[k] = step_graph{key, qd_cuda_buf_gen, ++d->graph_clock, ex};
    return QD_OK;
}

static qd_status cuda_graph_run(void *dev, uint64_t key)
{
    cuda_dev *d = D(dev);
    int k = graph_slot(d, key);
    if (k < 0)
        return QD_ERR_UNSUPPORTED;
    if (d->graphs[k].gen != qd_cuda_buf_gen) { /* a buffer it reads was freed */
        cudaGraphExecDestroy(d->graphs[k].ex);
        d->graphs[k].ex = NULL;
        return QD_ERR_UNSUPPORTED;
    }
    d->graphs[k].used = ++d->graph_clock;
    d->graph_runs++;
    QD_CUDA_CHECK(cudaGraphLaunch(d->graphs[k].ex, cudaStreamPerThread));
    return QD_OK;
}

static void cuda_graph_drop(void *dev)
{
    cuda_dev *d = D(dev);
    for (int i = 0; i < QD_GRAPHS; i++)
        if (d->graphs[i].ex) {
            cudaGraphExecDestroy(d->graphs[i].ex);
            d->graphs[i].ex = NULL;
        }
}

static void ctab_free(cuda_dev *d)
{
    for (int i = 0; i < d->nctab; i++) {
        free(d->ctab[i].host);
        cuda_release(d, d->ctab[i].dev);
    }
    d->nctab = 0;
}

/* The device copy of bytes of h, pointers (and offsets) that stay the same
 * from call to call (an expert set's weights, a RAC set's channel sets): made
 * once through to_dev and kept (QD_CTABS of them, then all made again), so a
 * call uploads nothing (a step graph can hold it) and waits for nothing. */
static qd_status const_table(cuda_dev *d, const void *h, size_t bytes, void **out)
{
    uint64_t hs = 1469598103934665603ull ^ (uint64_t)bytes, w;
    for (size_t i = 0; i + 8 <= bytes; i += 8) {
        memcpy(&w, (const char *)h + i, 8);
        hs = (hs ^ w) * 1099511628211ull;
    }
    for (int i = 0; i < d->nctab; i++) {
        const const_tab *t = &d->ctab[i];
        if (t->hash == hs && t->bytes == bytes && !memcmp(t->host, h, bytes)) {
            *out = t->dev;
            return QD_OK;
        }
    }
    QD_REFUSE_RECORDING(); /* a new table is an allocation and a copy */
    if (!d->ctab && !(d->ctab = (const_tab *)calloc(QD_CTABS, sizeof *d->ctab)))
        return qd_error(QD_ERR_NOMEM, "cuda backend: pointer tables");
    if (d->nctab == QD_CTABS)
        ctab_free(d);
    const_tab t = {hs, bytes, malloc(bytes ? bytes : 1), NULL};
    if (!t.host)
        return qd_error(QD_ERR_NOMEM, "cuda backend: pointer tables");
    memcpy(t.host, h, bytes);
    qd_status st = cuda_alloc(d, &t.dev, bytes, "pointer table");
    if (!st)
        st = cuda_to_dev(d, t.dev, h, bytes);
    if (st) {
        free(t.host);
        cuda_release(d, t.dev);
        return st;
    }
    d->ctab[d->nctab++] = t;
    *out = t.dev;
    return QD_OK;
}

/* A dev scratch buffer of at least bytes (contents undefined). */
static qd_status scratch(cuda_dev *d, int slot, size_t bytes, void **out)
{
    if (d->scratch_cap[slot] < bytes) {
        QD_REFUSE_RECORDING();
        qd_cuda_buf_gen++;
        cudaFree(d->scratch[slot]);
        d->scratch[slot] = NULL;
        d->scratch_cap[slot] = 0;
        QD_TRY(cuda_alloc(d, &d->scratch[slot], bytes, "scratch"));
        d->scratch_cap[slot] = bytes;
    }
    *out = d->scratch[slot];
    return QD_OK;
}

static qd_status host_scratch(cuda_dev *d, size_t bytes, void **out)
{
    if (d->host_cap < bytes) {
        free(d->host);
        d->host = malloc(bytes);
        d->host_cap = d->host ? bytes : 0;
        if (!d->host)
            return qd_error(QD_ERR_NOMEM, "cuda backend: %zu bytes of host scratch", bytes);
    }
    *out = d->host;
    return QD_OK;
}

static void cuda_mark(void *dev, qd_phase ph)
{
    cuda_dev *d = D(dev);
    if (!d->prof)
        return;
    cudaDeviceSynchronize();
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    double t = (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
    if (d->prof_last > 0)
        d->prof_t[d->prof_sec] += t - d->prof_last;
    if (d->prof_sec == QD_PH_SYNC && ph != QD_PH_SYNC) { /* an optimizer step ended: its own share */
        for (int i = 0; i < QD_PH_COUNT; i++) {
            d->prof_step[i] = d->prof_t[i] - d->prof_t0[i], d->prof_t0[i] = d->prof_t[i];
            d->prof_nstep[i] = d->prof_n[i] - d->prof_n0[i], d->prof_n0[i] = d->prof_n[i];
        }
        d->prof_steps++;
    }
    d->prof_n[ph]++;
    d->prof_sec = ph;
    d->prof_last = t;
}

static void cuda_report(void *dev)
{
    cuda_dev *d = D(dev);
    if (!d->prof)
        return;
    int last = d->prof == 2 && d->prof_steps > 0;
    fprintf(stderr, "cuda backend profile (QUADS_CUDA_PROFILE%s):\n",
            last ? "=last: the last optimizer step, from the end of the one before" : "");
    for (int i = 0; i < QD_PH_COUNT; i++)
        fprintf(stderr, "  %-28s %8ld marks %10.3f ms\n", prof_names[i], last ? d->prof_nstep[i] : d->prof_n[i],
                1e3 * (last ? d->prof_step[i] : d->prof_t[i]));
}

static qd_status fq_install(cuda_dev *d, size_t fresh);

/* Fast mode, BF16 recipes: the BF16 bits of the working copy for cuBLASLt. */
static qd_status cuda_weights_changed(void *dev, const float *wk, size_t n)
{
    cuda_dev *d = D(dev);
    if (!d->bf16_copy)
        return QD_OK;
    if (!d->wk16 || d->nwk != n || d->wk != wk) { /* bits written since belong to the old copy */
        for (int i = 0; i < d->nfq; i++)
            d->fq[i].bits = 0;
        d->fresh16 = 0;
    }
    if (!d->wk16 || d->nwk != n) {
        cudaFree(d->wk16);
        d->wk16 = NULL;
        QD_TRY(cuda_alloc(d, (void **)&d->wk16, sizeof(uint16_t) * n, "working weights (BF16)"));
    }
    d->wk = wk;
    d->nwk = n;
    size_t fresh = d->fresh16;
    d->fresh16 = 0;
    if (d->aqat16)
        return fq_install(d, fresh); /* the bits outside the fake-quant ranges, then theirs */
    return fresh == n ? QD_OK : qdk_bf16_bits(d->wk16, wk, n);
}

/* The BF16 bits of n floats of x in scratch slot (on the device). In D_X16
 * the held input's (hold_input) are made once while it is held. */
static qd_status bits16(cuda_dev *d, int slot, const float *x, size_t n, const uint16_t **out)
{
    void *p;
    QD_TRY(scratch(d, slot, sizeof(uint16_t) * (n ? n : 1), &p));
    *out = (const uint16_t *)p;
    if (slot == D_X16) {
        int held = d->held_x && x == d->held_x && n == d->held_n;
        if (held && d->held_ok && p == d->held_bits)
            return QD_OK;
        d->held_ok = held && n; /* the conversion below makes them */
        d->held_bits = p;
    }
    return n ? qdk_bf16_bits((uint16_t *)p, x, n) : QD_OK;
}

static void cuda_hold_input(void *dev, const float *x, size_t n)
{
    cuda_dev *d = D(dev);
    d->held_x = d->hold_on ? x : NULL;
    d->held_n = n;
    d->held_ok = 0;
}

/* A weight's BF16 bits: wk16's where w (n floats) lies in the working copy,
 * else converted into scratch slot. */
static qd_status weight16(cuda_dev *d, const float *w, size_t n, int slot, const uint16_t **out)
{
    if (d->wk16 && w >= d->wk && w + n <= d->wk + d->nwk) {
        *out = d->wk16 + (w - d->wk);
        return QD_OK;
    }
    return bits16(d, slot, w, n, out);
}

/* ---- QUADS_AQAT16: fake-quant weights as E2M1 x E4M3 bits and a scale */
#define FQ_SLOTS 65536 /* per-tensor fake-quants recorded a sync (a3b at 48 layers: about 18,600) */

static int fq_cmp(const void *a, const void *b)
{
    const float *x = ((const fq_range *)a)->w, *y = ((const fq_range *)b)->w;
    return x < y ? -1 : x > y;
}

/* A per-tensor fake-quant into out: recorded (its scale written to a slot)
 * while the slots last; the next weights_changed keeps those in the working copy. */
/* Before recording m more fake-quants: a new sync's first rebuilds the
 * ranges in force; the scale slots made; room for the ranges of the m, or of
 * as many as the slots take (*fit of them). */
static qd_status fq_reserve(cuda_dev *d, int m, int *fit)
{
    if (d->fq_live) /* a new sync: the ranges in force are rebuilt */
        d->nfq = d->fq_live = 0;
    if (!d->fq_dsdec)
        QD_TRY(cuda_alloc(d, (void **)&d->fq_dsdec, sizeof(float) * FQ_SLOTS, "fake-quant scales"));
    *fit = FQ_SLOTS - d->nfq < m ? FQ_SLOTS - d->nfq : m;
    if (d->nfq + *fit > d->fq_cap) {
        int cap = d->fq_cap ? d->fq_cap : 1024;
        while (cap < d->nfq + *fit)
            cap *= 2;
        void *p = realloc(d->fq, sizeof *d->fq * (size_t)cap);
        if (!p)
            return qd_error(QD_ERR_NOMEM, "cuda backend: fake-quant ranges");
        d->fq = (fq_range *)p, d->fq_cap = cap;
    }
    return QD_OK;
}

static qd_status fq_record(cuda_dev *d, float *out, const float *x, int rows, int cols)
{
    int fit;
    QD_TRY(fq_reserve(d, 1, &fit));
    if (!fit) { /* not recorded: its bits come from the plain conversion */
        d->fresh16 = 0;
        return qd_cuda_nvfp4_fake_quant_async(out, x, rows, cols, QD_SCALE_PER_TENSOR);
    }
    fq_range r = {out, (size_t)rows * (size_t)cols, d->nfq, 0};
    d->fq[d->nfq] = r;
    QD_TRY(qd_cuda_nvfp4_fake_quant_sdec_async(out, d->fq_dsdec + d->nfq, x, rows, cols));
    d->nfq++;
    return QD_OK;
}

/* Count per-tensor fake-quants in a few launches (the slots fq_record gives
 * each, where they last; else one fq_record each). QUADS_FQ_GROUPED=0
 * (benchmarks) declines: the driver's one op a tensor. */
static qd_status cuda_nvfp4_fake_quant_weights(void *dev, float *const *out, const float *const *x, int count, int N,
                                               int K)
{
    cuda_dev *d = D(dev);
    if (count <= 0 || N <= 0 || K <= 0)
        return QD_OK;
    if (!d->aqat16)
        return qd_cuda_nvfp4_fake_quant_weights_async(out, NULL, NULL, x, count, N, K);
    int fit;
    QD_TRY(fq_reserve(d, count, &fit));
    float **sd = (float **)malloc(sizeof(float *) * (size_t)(fit ? fit : 1));
    uint16_t **bits = (uint16_t **)malloc(sizeof(uint16_t *) * (size_t)(fit ? fit : 1));
    if (!sd || !bits) {
        free(sd), free(bits);
        return qd_error(QD_ERR_NOMEM, "cuda backend: fake-quant scales");
    }
    size_t nt = (size_t)N * (size_t)K;
    for (int i = 0; i < fit; i++) {
        /* inside the working copy of the last weights_changed (a trainer's
         * wk stays put): its wk16 bits written by the same kernel (not by the
         * legacy quantizers') */
        int in = !qd_cuda_quant_legacy && d->wk16 && out[i] >= d->wk && out[i] + nt <= d->wk + d->nwk &&
                 qd_aligned(d->wk16 + (out[i] - d->wk), 16);
        bits[i] = in ? d->wk16 + (out[i] - d->wk) : NULL;
        fq_range r = {out[i], nt, d->nfq, in};
        d->fq[d->nfq] = r;
        sd[i] = d->fq_dsdec + d->nfq++;
    }
    qd_status st = qd_cuda_nvfp4_fake_quant_weights_async(out, sd, qd_cuda_quant_legacy ? NULL : bits, x, fit, N, K);
    free(sd), free(bits);
    for (int i = fit; i < count && !st; i++) /* past the slots: fq_record's fallback */
        st = fq_record(d, out[i], x[i], N, K);
    return st;
}

/* The wk16 bits of the n installed ranges (sorted, disjoint): the plain bits
 * of the working copy between them, and of each range not written with its
 * fake-quant, its E2M1 x E4M3 part, QDK_DIV_GROUP a launch. */
static qd_status fq_bits(cuda_dev *d, int n, size_t fresh)
{
    /* adamw_round wrote the bits of everything outside the ranges (its
     * floats and theirs fill the copy exactly): no gap to convert */
    size_t in_ranges = 0;
    for (int i = 0; i < n; i++)
        in_ranges += d->fq[i].n;
    size_t at = fresh && fresh + in_ranges == d->nwk ? d->nwk : 0;
    for (int i = 0; i < n && at < d->nwk; i++) {
        size_t a = (size_t)(d->fq[i].w - d->wk);
        if (a > at)
            QD_TRY(qdk_bf16_bits(d->wk16 + at, d->wk + at, a - at));
        at = a + d->fq[i].n > at ? a + d->fq[i].n : at;
    }
    if (at < d->nwk)
        QD_TRY(qdk_bf16_bits(d->wk16 + at, d->wk + at, d->nwk - at));
    qdk_div_group g;
    int m = 0;
    for (int i = 0; i <= n; i++) {
        if (m == QDK_DIV_GROUP || (i == n && m)) {
            QD_TRY(qdk_bf16_bits_div_group(&g, m));
            m = 0;
        }
        if (i == n || d->fq[i].bits)
            continue;
        const fq_range *r = &d->fq[i];
        g.dst[m] = d->wk16 + (r->w - d->wk);
        g.src[m] = r->w;
        g.n[m] = r->n;
        g.s[m] = d->fq_dsdec + r->slot;
        m++;
    }
    return QD_OK;
}

/* At weights_changed: the recorded ranges inside the working copy, sorted,
 * their wk16 bits the E2M1 x E4M3 parts, their scales copied to the host. */
static qd_status fq_install(cuda_dev *d, size_t fresh)
{
    int n = 0, slots = d->nfq;
    for (int i = 0; i < d->nfq; i++)
        if (d->fq[i].w >= d->wk && d->fq[i].w + d->fq[i].n <= d->wk + d->nwk)
            d->fq[n++] = d->fq[i];
    qsort(d->fq, (size_t)n, sizeof *d->fq, fq_cmp);
    if (!d->fq_sdec && n) {
        d->fq_sdec = (float *)malloc(sizeof(float) * FQ_SLOTS);
        if (!d->fq_sdec)
            return qd_error(QD_ERR_NOMEM, "cuda backend: fake-quant scales");
    }
    QD_TRY(fq_bits(d, n, fresh));
    if (n)
        QD_CUDA_CHECK(cudaMemcpy(d->fq_sdec, d->fq_dsdec, sizeof(float) * (size_t)slots, cudaMemcpyDeviceToHost));
    d->nfq = n;
    d->fq_live = 1;
    return QD_OK;
}

/* Whether the n weights at w lie in an installed fake-quant range (their
 * wk16 bits the E2M1 x E4M3 parts); *alpha = its decode scale, else 1: the
 * alpha of any product that reads those bits. */
static int fq_alpha(const cuda_dev *d, const float *w, size_t n, float *alpha)
{
    *alpha = 1.0f;
    if (!d->fq_live)
        return 0;
    int lo = 0, hi = d->nfq - 1;
    while (lo <= hi) {
        int mid = (lo + hi) / 2;
        const fq_range *r = &d->fq[mid];
        if (w < r->w) {
            hi = mid - 1;
        } else if (w >= r->w + r->n) {
            lo = mid + 1;
        } else {
            if (w + n > r->w + r->n)
                return 0;
            *alpha = d->fq_sdec[r->slot];
            return 1;
        }
    }
    return 0;
}

/* ------------------------------------------------------------------------ */
/* elementwise and rows                                                      */

static qd_status cuda_round_bf16(void *dev, float *dst, const float *src, size_t n)
{
    cuda_dev *d = D(dev);
    if (d->wk && dst < d->wk + d->nwk && dst + n > d->wk) /* the working copy changed untracked */
        d->fresh16 = 0;
    return qdk_round_bf16(dst, src, n);
}

static qd_status cuda_add(void *dev, float *out, const float *a, const float *b, size_t n)
{
    (void)dev;
    return qdk_add(out, a, b, n);
}

static qd_status cuda_embed(void *dev, float *x, const float *emb, const int32_t *tok, int N, int C)
{
    (void)dev;
    return qdk_embed(x, emb, tok, N, C);
}

/* the tokens grouped by a sort first where there are many (the same bits;
 * QUADS_EMBED_SORT=0: one thread a column walking all of them) */
static qd_status cuda_embed_backward(void *dev, float *gemb, const float *dres, const int32_t *tok, int N, int C)
{
    cuda_dev *d = D(dev);
    size_t wb = d->embed_sort ? qdk_embed_backward_work_bytes(N) : 0;
    void *work = NULL;
    if (wb)
        QD_TRY(scratch(d, D_EMBB, wb, &work));
    return qdk_embed_backward(gemb, dres, tok, N, C, work);
}

static qd_status cuda_rmsnorm(void *dev, float *out, float *rstd, const float *x, const float *w, int rows, int C,
                              float eps)
{
    (void)dev;
    return qdk_rmsnorm(out, rstd, x, w, rows, C, eps);
}

static qd_status cuda_rmsnorm_backward(void *dev, float *dinp, float *dw, const float *dout, const float *x,
                                       const float *w, const float *rstd, int rows, int C, int flags)
{
    cuda_dev *d = D(dev);
    int set = (flags & QD_BWD_DX_SET) != 0;
    if (d->mode != QD_MODE_FAST || rows <= QDK_RMSNORM_CHUNK)
        return qdk_rmsnorm_backward(dinp, dw, dout, x, w, rstd, rows, C, set);
    void *work;
    size_t nch = ((size_t)rows + QDK_RMSNORM_CHUNK - 1) / QDK_RMSNORM_CHUNK;
    QD_TRY(scratch(d, D_RMSW, sizeof(float) * nch * (size_t)C, &work));
    return qdk_rmsnorm_backward_fast(dinp, dw, (float *)work, dout, x, w, rstd, rows, C, set);
}

static qd_status cuda_rope(void *dev, float *x, const int32_t *pos, const float *cosb, const float *sinb, int N,
                           int nh, int D, qd_rope_dir dir)
{
    (void)dev;
    return qdk_rope(x, pos, cosb, sinb, N, nh, D, dir);
}

/* The fused rows ops (ops.h): their kernels (by default since 2026-12-07:
 * on an H100, a3b-4 exact nvfp4 b64 1.038x with QUADS_GFD_INLINE and
 * QUADS_MOE_GROUP1, b1 1.052x), else (QUADS_FUSED_ROWS=0, which also makes the
 * driver call the separate ops) the kernels of the ops they stand for, one
 * after the other; the same bits either way. */
static int fused_rows_on(void)
{
    static int v = -2;
    return qd_env_pick(&v, "QUADS_FUSED_ROWS", 0, 1) != 0;
}

extern "C" const qd_ops *qd_cuda_ops(void);

/* the quantizer of the fused kernels is qk_row's (not the legacy kernels') */
static int fused_quant_ok(const qd_nvfp4 *q) { return !q || !qd_cuda_quant_legacy; }

static qd_status cuda_add_rmsnorm(void *dev, float *sum, float *out, float *rstd, const float *a, const float *b,
                                  const float *w, int rows, int C, float eps, qd_nvfp4 *q)
{
    if (fused_rows_on() && fused_quant_ok(q))
        return qdk_add_rmsnorm(sum, out, rstd, a, b, w, rows, C, eps, q);
    return qd_add_rmsnorm_ops(qd_cuda_ops(), dev, sum, out, rstd, a, b, w, rows, C, eps, q);
}

static qd_status cuda_combine_add_rmsnorm(void *dev, float *sum, float *out, float *rstd, const float *res,
                                          const float *y, const float *row_w, const int32_t *tok_rows, int N, int K,
                                          int C, const float *w, float eps, qd_nvfp4 *q)
{
    if (fused_rows_on() && fused_quant_ok(q) && K <= QDK_FR_MAXK)
        return qdk_combine_add_rmsnorm(sum, out, rstd, res, y, row_w, tok_rows, N, K, C, w, eps, q);
    return qd_combine_add_rmsnorm_ops(qd_cuda_ops(), dev, sum, out, rstd, res, y, row_w, tok_rows, N, K, C, w, eps,
                                      q);
}

static qd_status cuda_swiglu_nvfp4(void *dev, qd_nvfp4 *q, float *h, const float *g, const float *u, int rows, int I)
{
    if (fused_rows_on() && fused_quant_ok(q))
        return qdk_swiglu_nvfp4(q, h, g, u, rows, I);
    return qd_swiglu_nvfp4_ops(qd_cuda_ops(), dev, q, h, g, u, rows, I);
}

static qd_status cuda_qk_norm_rope(void *dev, const qd_qk_args *a)
{
    if (fused_rows_on() && a->D % 2 == 0)
        return qdk_qk_norm_rope(a);
    return qd_qk_norm_rope_ops(qd_cuda_ops(), dev, a);
}

/* Where the caller keeps nothing of xe (keep 0), the fused kernel quantizes
 * each row from its token's row of x and writes no float copy (a3b's b64
 * prefill: 537 MB a layer written and read back): by default since 2026-12-07
 * (H100, the same bits: a3b-4 exact b64 rollout 1.054x); QUADS_GATHER_DROP=0
 * for the copy */
static int gather_drop_on(void)
{
    static int v = -2;
    return qd_env_pick(&v, "QUADS_GATHER_DROP", 0, 1) != 0;
}

static qd_status cuda_gather_nvfp4(void *dev, qd_nvfp4 *q, float *xe, const float *x, const int32_t *row_tok, int R,
                                   int C, int keep)
{
    if (q && fused_rows_on() && fused_quant_ok(q))
        return qdk_gather_nvfp4(q, keep || !gather_drop_on() ? xe : NULL, x, row_tok, R, C);
    return qd_gather_nvfp4_ops(qd_cuda_ops(), dev, q, xe, x, row_tok, R, C, keep);
}

/* ------------------------------------------------------------------------ */
/* float products                                                            */

static qd_status cuda_matmul(void *dev, float *out, const float *x, const float *w, int N, int IC, int OC,
                             qd_prec prec)
{
    cuda_dev *d = D(dev);
    size_t nw = (size_t)OC * IC;
    float alpha = 1.0f;
    /* an installed fake-quant weight times a BF16-valued x */
    int fq = prec == QD_PREC_BF16_X && fq_alpha(d, w, nw, &alpha) && IC % 8 == 0;
    if (d->mode == QD_MODE_FAST && (fq || (prec == QD_PREC_BF16 &&
        ((d->fast16 && IC % 8 == 0) || (d->wk16 && w >= d->wk && w + nw <= d->wk + d->nwk))))) {
        const uint16_t *x16, *w16;
        QD_TRY(bits16(d, D_X16, x, (size_t)N * IC, &x16));
        QD_TRY(weight16(d, w, nw, D_W16, &w16));
        return qd_cuda_gemm_bf16_scaled(out, x16, w16, N, OC, IC, alpha, 0.0f);
    }
    if (d->mode == QD_MODE_FAST)
        return qd_cuda_gemm_f32(out, x, w, N, OC, IC, 0.0f);
    if (IC % 8)
        return qdk_matmul(out, x, w, N, OC, IC, QDK_NT, QDK_OVERWRITE);
    return qdk_matmul_wt(out, x, w, QDK_F32, N, OC, IC, prec);
}

/* matmul with BF16 weight bits: the exact x.W^T reads them as they are; fast
 * mode's BF16 GEMM too, with x's BF16 bits. */
static qd_status cuda_matmul_w16(void *dev, float *out, const float *x, const uint16_t *w, int N, int IC, int OC,
                                 qd_prec prec)
{
    cuda_dev *d = D(dev);
    if (IC % 8)
        return qd_error(QD_ERR_SHAPE, "cuda backend: matmul_w16: in-features %d not a multiple of 8", IC);
    if (d->mode == QD_MODE_FAST && prec == QD_PREC_BF16 && N > (d->small_exact ? 8 : 0)) {
        const uint16_t *x16;
        QD_TRY(bits16(d, D_X16, x, (size_t)N * IC, &x16));
        return qd_cuda_gemm_bf16(out, x16, w, N, OC, IC, 0.0f);
    }
    return qdk_matmul_wt(out, x, w, QDK_BF16, N, OC, IC, prec);
}

/* The row block-floating-point product (cuda_bfp.cu), both modes: the bits
 * of cpu_bfp_weights and cpu_matmul_bfp. */
static qd_status bfp_shape(int N, int IC, int OC, const char *what)
{
    if (!qd_bfp_shape_ok(N, IC, OC))
        return qd_error(QD_ERR_SHAPE, "cuda backend: %s: in-features %d: a multiple of 16 up to %d wanted", what,
                        IC, QD_BFP_MAX_IC);
    return QD_OK;
}

static qd_status cuda_bfp_weights(void *dev, void *wq, const uint16_t *w16, const float *wf, int OC, int IC)
{
    (void)dev;
    QD_TRY(bfp_shape(0, IC, OC, "bfp_weights"));
    return qdk_bfp_weights(wq, w16, wf, OC, IC);
}

static qd_status cuda_matmul_bfp(void *dev, float *out, const float *x, const void *wq, int N, int IC, int OC)
{
    QD_TRY(bfp_shape(N, IC, OC, "matmul_bfp"));
    if (!N || !OC)
        return QD_OK;
    void *ws;
    QD_TRY(scratch(D(dev), D_BFP, qdk_bfp_rows_bytes(N, IC), &ws));
    return qdk_matmul_bfp(out, x, wq, ws, N, IC, OC);
}

static qd_status cuda_to_bf16(void *dev, uint16_t *dst, const float *src, size_t n)
{
    (void)dev;
    return qdk_bf16_bits(dst, src, n);
}

static qd_status cuda_embed_w16(void *dev, float *x, const uint16_t *emb, const int32_t *tok, int N, int C)
{
    (void)dev;
    return qdk_embed_w16(x, emb, tok, N, C);
}

/* Fast mode's backward with BF16 operands (float32 accumulate): dy's bits a
 * block of columns at a time (at most dy16_bytes: the lm_head's dy is N x
 * vocab), each block's dinp += dy_b . w_b and dw_b += dy_b^T . x. */

/* backward16's dy made from the log-probs (head_backward): the lm_head's
 * dlogits, never stored in float32 */
typedef struct {
    const float *dlogp, *logits, *lse;
    const int32_t *tgt;
    float T;
} lp_grad;

static qd_status backward16(cuda_dev *d, float *dinp, float *dw, const float *dout, const lp_grad *lp,
                            const float *x, const float *w, int N, int IC, int OC, float dw_beta, float dx_beta)
{
    const uint16_t *w16 = NULL, *x16 = NULL;
    float alpha;
    fq_alpha(d, w, (size_t)OC * IC, &alpha); /* an installed fake-quant weight's scale, else 1 */
    if (dinp)
        QD_TRY(weight16(d, w, (size_t)OC * IC, D_W16, &w16));
    if (dw)
        QD_TRY(bits16(d, D_X16, x, (size_t)N * IC, &x16));
    int64_t cw = (int64_t)(d->dy16_bytes / (sizeof(uint16_t) * (size_t)N)) / 8 * 8; /* rows stay on 16 bytes */
    if (cw < 8)
        cw = 8;
    if (cw > OC)
        cw = OC;
    void *p;
    QD_TRY(scratch(d, D_DY16, sizeof(uint16_t) * (size_t)N * (size_t)cw, &p));
    uint16_t *dy16 = (uint16_t *)p;
    for (int64_t c0 = 0; c0 < OC; c0 += cw) {
        int64_t nc = OC - c0 < cw ? OC - c0 : cw;
        if (lp)
            QD_TRY(qdk_logprob_backward_bf16_cols(dy16, lp->dlogp, lp->logits, lp->lse, lp->tgt, N, OC, lp->T,
                                                  (int)c0, (int)nc, d->dlogit_fast));
        else
            QD_TRY(qdk_bf16_bits_cols(dy16, dout + c0, N, nc, OC));
        if (dinp) /* dx_beta 0: the first block overwrites dinp, the rest add to it */
            QD_TRY(qd_cuda_gemm_bf16_dx_scaled(dinp, dy16, w16 + c0 * IC, N, nc, IC, alpha, c0 ? 1.0f : dx_beta));
        if (dw)
            QD_TRY(qd_cuda_gemm_bf16_dw(dw + c0 * IC, dy16, x16, N, nc, IC, dw_beta)); /* rows of its own */
    }
    return QD_OK;
}

static qd_status cuda_matmul_backward(void *dev, float *dinp, float *dw, const float *dout, const float *x,
                                      const float *w, int N, int IC, int OC, int flags)
{
    cuda_dev *d = D(dev);
    int set = dinp && (flags & QD_BWD_DX_SET), b16 = d->fast16 && IC % 8 == 0 && OC % 8 == 0;
    /* set where no product overwrites: an empty sum (OC 0), or the routes that add into zeros */
    if (set && N && (OC == 0 || (!b16 && (d->mode != QD_MODE_FAST || d->bwd_math == QD_GEMM_TF32))))
        QD_CUDA_CHECK(cudaMemsetAsync(dinp, 0, sizeof(float) * (size_t)N * IC));
    if (b16) /* BF16 rows on 16 bytes */
        return N ? backward16(d, dinp, dw, dout, NULL, x, w, N, IC, OC, 1.0f, set ? 0.0f : 1.0f) : QD_OK;
    if (d->mode == QD_MODE_FAST && d->bwd_math == QD_GEMM_TF32) { /* through cuBLAS as one expert */
        const float *wp[1] = {w};
        float *dwp[1] = {dw};
        int32_t off[2] = {0, N};
        return qd_cuda_gemm_grouped_f32_backward(dinp, dw ? dwp : NULL, dout, x, wp, off, 1, OC, IC, d->bwd_math);
    }
    if (d->mode == QD_MODE_FAST) {
        if (dinp)
            QD_TRY(qd_cuda_gemm_f32_dx(dinp, dout, w, N, OC, IC, set ? 0.0f : 1.0f));
        return dw ? qd_cuda_gemm_f32_dw(dw, dout, x, N, OC, IC, 1.0f) : QD_OK;
    }
    if (dinp)
        QD_TRY(qdk_matmul(dinp, dout, w, N, IC, OC, QDK_NN, QDK_ACCUMULATE));
    return dw ? qdk_matmul(dw, dout, x, OC, IC, N, QDK_TN, QDK_ACCUMULATE) : QD_OK;
}

/* Fast mode with BF16 operands: the lm_head's backward16 with dy's blocks
 * made from the log-probs (the bits of logprob_backward then matmul_backward,
 * without the N x V float32 dlogits); else the driver's two ops. */
static qd_status cuda_head_backward(void *dev, float *dinp, float *dw, const float *dlogp, const float *logits,
                                    const float *lse, const int32_t *tgt, const float *x, const float *w, int N,
                                    int IC, int V, float T, int flags)
{
    cuda_dev *d = D(dev);
    if (!(d->fast16 && IC % 8 == 0 && V % 8 == 0))
        return QD_ERR_UNSUPPORTED;
    lp_grad lp = {dlogp, logits, lse, tgt, T};
    if (!N && dw && (flags & QD_BWD_DW_SET)) /* an empty sum, overwritten */
        QD_CUDA_CHECK(cudaMemsetAsync(dw, 0, sizeof(float) * (size_t)V * IC));
    return N ? backward16(d, dinp, dw, NULL, &lp, x, w, N, IC, V, flags & QD_BWD_DW_SET ? 0.0f : 1.0f, 1.0f) : QD_OK;
}

/* Fast mode, BF16 linears: w16[e] = expert e's BF16 bits (n values each):
 * wk16's where every w[e] lies in the working copy, else converted into
 * scratch (the experts with rows). */
static qd_status expert_w16(cuda_dev *d, const uint16_t **w16, float *alpha, const float *const *w,
                            const int32_t *off, int E, size_t n)
{
    int held = d->wk16 != NULL;
    for (int e = 0; e < E && held; e++)
        held = w[e] >= d->wk && w[e] + n <= d->wk + d->nwk;
    if (held) {
        for (int e = 0; e < E; e++) {
            w16[e] = d->wk16 + (w[e] - d->wk);
            fq_alpha(d, w[e], n, &alpha[e]); /* an installed fake-quant weight's scale, else 1 */
        }
        return QD_OK;
    }
    void *p;
    QD_TRY(scratch(d, D_W16, sizeof(uint16_t) * n * (E ? E : 1), &p));
    for (int e = 0; e < E; e++) {
        w16[e] = (const uint16_t *)p + n * e;
        alpha[e] = 1.0f;
        if (off[e + 1] > off[e])
            QD_TRY(qdk_bf16_bits((uint16_t *)p + n * e, w[e], n));
    }
    return QD_OK;
}

/* x's float32 values in scratch slot D_XF (the float32 products of BF16-bit inputs) */
static qd_status float_in(cuda_dev *d, int slot, const uint16_t *x, size_t n, const float **out)
{
    void *p;
    QD_TRY(scratch(d, slot, sizeof(float) * (n ? n : 1), &p));
    *out = (const float *)p;
    return qdk_bf16_float((float *)p, x, n);
}

static qd_status float_of(cuda_dev *d, const uint16_t *x, size_t n, const float **out)
{
    return float_in(d, D_XF, x, n, out);
}

/* Fast mode: the experts through cuBLAS, one GEMM an expert with rows. A BF16
 * linear's operands are BF16 values (effective_input, the working copy), so
 * their BF16 bits lose nothing and only the order of the sums changes. */
static qd_status fast_grouped(cuda_dev *d, float *out, const float *x, const uint16_t *xb, const float *const *w,
                              const int32_t *off, int E, int IC, int OC, qd_prec prec)
{
    /* a BF16-valued x, every expert an installed fake-quant weight */
    int fq = prec == QD_PREC_BF16_X && d->fq_live && IC % 8 == 0;
    for (int e = 0; e < E && fq; e++) {
        float a;
        fq = off[e + 1] == off[e] || fq_alpha(d, w[e], (size_t)OC * IC, &a);
    }
    size_t rows = E ? (size_t)off[E] : 0;
    if (prec != QD_PREC_BF16 && !fq) {
        if (!x) /* the BF16 bits' values as float32 */
            QD_TRY(float_of(d, xb, rows * IC, &x));
        return qd_cuda_gemm_grouped_f32(out, x, w, off, E, OC, IC, QD_GEMM_F32);
    }
    const uint16_t **w16 = (const uint16_t **)calloc((size_t)E + 1, sizeof *w16);
    float *alpha = (float *)malloc(sizeof(float) * ((size_t)E + 1));
    if (!w16 || !alpha) {
        free(w16), free(alpha);
        return qd_error(QD_ERR_NOMEM, "cuda backend: experts");
    }
    const uint16_t *x16 = xb;
    qd_status st = xb ? QD_OK : bits16(d, D_X16, x, rows * IC, &x16);
    if (!st)
        st = expert_w16(d, w16, alpha, w, off, E, (size_t)OC * IC);
    if (!st)
        st = qd_cuda_gemm_grouped_bf16(out, x16, w16, alpha, off, E, OC, IC);
    free(w16), free(alpha);
    return st;
}

/* Exact mode: the experts in one launch (one cuBLASLt call per expert, each of
 * its own row count, was slower on the H200: a matmul plan per shape). */
static qd_status cuda_matmul_grouped(void *dev, float *out, const float *x, const float *const *w, const int32_t *off,
                                     int E, int IC, int OC, qd_prec prec)
{
    if (D(dev)->mode == QD_MODE_FAST)
        return fast_grouped(D(dev), out, x, NULL, w, off, E, IC, OC, prec);
    qdk_mm_item *it = (qdk_mm_item *)calloc((size_t)E, sizeof *it);
    if (!it)
        return qd_error(QD_ERR_NOMEM, "cuda backend: experts");
    for (int e = 0; e < E; e++) {
        int r0 = off[e], m = off[e + 1] - r0;
        it[e] = (qdk_mm_item){.a = x + (size_t)r0 * IC, .b = w[e], .c = out + (size_t)r0 * OC, .M = m,
                              .N = m ? OC : 0, .K = IC};
    }
    qd_status st = qdk_matmul_grouped(it, E, QDK_NT, QDK_OVERWRITE, QDK_F32);
    free(it);
    return st;
}

/* Fast mode, BF16 operands: dy, x and the experts' weights as BF16 bits, all
 * the experts in one grouped call a direction. */
static qd_status fast_grouped_backward(cuda_dev *d, float *dinp, float *const *dw, const float *dout,
                                       const uint16_t *doutb, const float *x, const uint16_t *xb,
                                       const float *const *w, const int32_t *off, int E, int IC, int OC, int add)
{
    size_t rows = E ? (size_t)off[E] : 0;
    for (int e = 0; dw && (add & QD_BWD_DW_SET) && e < E; e++) /* overwritten: an empty sum's zeros */
        if (off[e + 1] == off[e])
            QD_CUDA_CHECK(cudaMemsetAsync(dw[e], 0, sizeof(float) * (size_t)OC * IC));
    if (rows == 0)
        return QD_OK;
    const uint16_t **w16 = (const uint16_t **)calloc((size_t)E + 1, sizeof *w16);
    float *alpha = (float *)malloc(sizeof(float) * ((size_t)E + 1));
    if (!w16 || !alpha) {
        free(w16), free(alpha);
        return qd_error(QD_ERR_NOMEM, "cuda backend: experts");
    }
    const uint16_t *dy16 = doutb, *x16 = xb; /* dout's bits as given, else converted */
    qd_status st = doutb ? QD_OK : bits16(d, D_DY16, dout, rows * OC, &dy16);
    if (!st && dw && !xb)
        st = bits16(d, D_X16, x, rows * IC, &x16);
    if (!st && dinp)
        st = expert_w16(d, w16, alpha, w, off, E, (size_t)OC * IC);
    if (!st)
        st = qd_cuda_gemm_grouped_bf16_backward_to(dinp, dw, dy16, x16, w16, dinp ? alpha : NULL, off, E, OC, IC,
                                                   add);
    free(w16), free(alpha);
    return st;
}

static qd_status cuda_matmul_grouped_backward(void *dev, float *dinp, float *const *dw, const float *dout,
                                              const float *x, const float *const *w, const int32_t *off, int E,
                                              int IC, int OC)
{
    cuda_dev *d = D(dev);
    if (d->fast16)
        return fast_grouped_backward(d, dinp, dw, dout, NULL, x, NULL, w, off, E, IC, OC, 1);
    if (d->mode == QD_MODE_FAST)
        return qd_cuda_gemm_grouped_f32_backward(dinp, dw, dout, x, w, off, E, OC, IC, d->bwd_math);
    qdk_mm_item *it = (qdk_mm_item *)calloc(2 * (size_t)E, sizeof *it);
    if (!it)
        return qd_error(QD_ERR_NOMEM, "cuda backend: experts");
    for (int e = 0; e < E; e++) {
        int r0 = off[e], m = off[e + 1] - r0;
        it[e] = (qdk_mm_item){.a = dout + (size_t)r0 * OC, .b = w[e], .c = dinp + (size_t)r0 * IC, .M = m,
                              .N = m ? IC : 0, .K = OC};
        it[E + e] = (qdk_mm_item){.a = dout + (size_t)r0 * OC, .b = x + (size_t)r0 * IC, .c = dw[e],
                                  .M = m ? OC : 0, .N = IC, .K = m};
    }
    qd_status st = qdk_matmul_grouped(it, E, QDK_NN, QDK_ACCUMULATE, QDK_F32);
    if (!st)
        st = qdk_matmul_grouped(it + E, E, QDK_TN, QDK_ACCUMULATE, QDK_F32);
    free(it);
    return st;
}

/* ---- the experts on BF16 activations: fast16 takes them (its products read
 * BF16 operands anyway); elsewhere the bits' values go the float32 way */
static int cuda_experts16(void *dev) { return D(dev)->fast16; }

static qd_status cuda_gather16(void *dev, uint16_t *xe, const float *x, const int32_t *row_tok, int R, int C)
{
    (void)dev;
    return qdk_gather16(xe, x, row_tok, R, C);
}

static qd_status cuda_swiglu16(void *dev, uint16_t *h, const float *g, const float *u, size_t n)
{
    (void)dev;
    return qdk_swiglu16(h, g, u, n);
}

static qd_status cuda_matmul_grouped16(void *dev, float *out, const uint16_t *x, const float *const *w,
                                       const int32_t *off, int E, int IC, int OC, qd_prec prec)
{
    cuda_dev *d = D(dev);
    if (d->mode == QD_MODE_FAST)
        return fast_grouped(d, out, NULL, x, w, off, E, IC, OC, prec);
    const float *xf;
    QD_TRY(float_of(d, x, E ? (size_t)off[E] * (size_t)IC : 0, &xf));
    return cuda_matmul_grouped(dev, out, xf, w, off, E, IC, OC, prec);
}

static qd_status cuda_matmul_grouped_backward16(void *dev, float *dinp, float *const *dw, const float *dout,
                                                const uint16_t *x, const float *const *w, const int32_t *off, int E,
                                                int IC, int OC)
{
    cuda_dev *d = D(dev);
    if (d->fast16)
        return fast_grouped_backward(d, dinp, dw, dout, NULL, NULL, x, w, off, E, IC, OC, 1);
    const float *xf;
    QD_TRY(float_of(d, x, E ? (size_t)off[E] * (size_t)IC : 0, &xf));
    return cuda_matmul_grouped_backward(dev, dinp, dw, dout, xf, w, off, E, IC, OC);
}

/* The backward's BF16 operands straight from their producers (experts16's
 * companions): only where fast16, as experts16. */
static qd_status cuda_moe_dy16(void *dev, uint16_t *dy, float *dwt, const float *dout, const float *y,
                               const float *row_w, const int32_t *row_rank, const int32_t *tok_rows, int N, int K,
                               int C)
{
    (void)dev;
    return qdk_moe_dy16(dy, dwt, dout, y, row_w, row_rank, tok_rows, N, K, C);
}

static qd_status cuda_swiglu_backward16(void *dev, uint16_t *dg, uint16_t *du, const float *dh, const float *g,
                                        const float *u, size_t rows, int cols, int ld)
{
    (void)dev;
    return qdk_swiglu_backward16(dg, du, dh, g, u, rows, cols, ld);
}

static qd_status cuda_matmul_grouped_backward16b(void *dev, float *dinp, float *const *dw, const uint16_t *dout,
                                                 const uint16_t *x, const float *const *w, const int32_t *off,
                                                 int E, int IC, int OC, int add)
{
    cuda_dev *d = D(dev);
    if (d->fast16)
        return fast_grouped_backward(d, dinp, dw, NULL, dout, NULL, x, w, off, E, IC, OC, add);
    const float *df; /* elsewhere the float path on the bits' values, added to zeros where not added to */
    size_t rows = E ? (size_t)off[E] : 0;
    QD_TRY(float_in(d, D_DYF, dout, rows * (size_t)OC, &df));
    if (!(add & QD_BWD_DX_ADD) && dinp && rows)
        QD_CUDA_CHECK(cudaMemsetAsync(dinp, 0, sizeof(float) * rows * (size_t)IC));
    for (int e = 0; dw && (add & QD_BWD_DW_SET) && e < E; e++)
        QD_CUDA_CHECK(cudaMemsetAsync(dw[e], 0, sizeof(float) * (size_t)OC * IC));
    return cuda_matmul_grouped_backward16(dev, dinp, dw, df, x, w, off, E, IC, OC);
}

/* ------------------------------------------------------------------------ */
/* quantizers and quantized products                                         */

/* a non-finite input is reported by finish (qd_cuda_nonfinite_check), as nvfp4_quantize's */
static qd_status cuda_fp8_quantize_rows(void *dev, uint8_t *q, float *scale_inv, const float *x, int rows, int cols)
{
    (void)dev;
    return qd_cuda_fp8_quantize_rows_async(q, scale_inv, x, rows, cols);
}

static qd_status cuda_fp8_gemm(void *dev, float *y, const uint8_t *qa, const float *sa_inv, const uint8_t *qw,
                               const float *sw_inv, int M, int N, int K)
{
    if (D(dev)->mode == QD_MODE_FAST && K % 16 == 0)
        return qd_cuda_gemm_fp8(y, qa, sa_inv, qw, sw_inv, M, N, K);
    return qdk_fp8_gemm(y, qa, sa_inv, qw, sw_inv, M, N, K);
}

static qd_status cuda_fp8_gemm_grouped(void *dev, float *y, const uint8_t *qa, const float *sa_inv,
                                       const uint8_t *const *qw, const float *const *sw_inv, const int32_t *off,
                                       int E, int N, int K)
{
    if (D(dev)->fp8_tc && qd_cuda_fp8_grouped_ok(qa, qw, E, K))
        return qd_cuda_gemm_fp8_grouped(y, qa, sa_inv, qw, sw_inv, off, E, N, K);
    qdk_mm_item *it = (qdk_mm_item *)calloc((size_t)E, sizeof *it);
    if (!it)
        return qd_error(QD_ERR_NOMEM, "cuda backend: experts");
    for (int e = 0; e < E; e++) {
        int r0 = off[e], m = off[e + 1] - r0;
        it[e] = (qdk_mm_item){.a = qa + (size_t)r0 * K, .b = qw[e], .c = y + (size_t)r0 * N, .sa = sa_inv + r0,
                              .sb = sw_inv[e], .M = m, .N = m ? N : 0, .K = K};
    }
    qd_status st = qdk_matmul_grouped(it, E, QDK_NT, QDK_OVERWRITE, QDK_E4M3);
    free(it);
    return st;
}

/* a non-finite input is reported by finish (qd_cuda_nonfinite_check) */
static qd_status cuda_nvfp4_quantize(void *dev, qd_nvfp4 *q, const float *x)
{
    (void)dev;
    return qd_cuda_nvfp4_quantize_async(q, x);
}

static qd_status cuda_nvfp4_fake_quant(void *dev, float *out, const float *x, int rows, int cols,
                                       qd_scale_kind scale)
{
    cuda_dev *d = D(dev);
    if (d->aqat16 && scale == QD_SCALE_PER_TENSOR && rows > 0 && cols > 0)
        return fq_record(d, out, x, rows, cols);
    return qd_cuda_nvfp4_fake_quant_async(out, x, rows, cols, scale);
}

static qd_status cuda_w4a4_gemm(void *dev, float *y, const qd_nvfp4 *a, const qd_nvfp4 *w)
{
    if (D(dev)->mode == QD_MODE_FAST)
        return qd_cuda_w4a4_gemm_fast(y, a, w);
    return qd_cuda_w4a4_gemm_tc_async(y, a, w);
}

static qd_status cuda_w4a4_gemm_grouped(void *dev, float *y, const qd_nvfp4 *a, const qd_nvfp4 *const *w,
                                        const int32_t *off, int E)
{
    (void)dev;
    int64_t *roff = (int64_t *)malloc(sizeof(int64_t) * ((size_t)E + 1));
    if (!roff)
        return qd_error(QD_ERR_NOMEM, "cuda backend: experts");
    for (int e = 0; e <= E; e++)
        roff[e] = off[e];
    qd_status st = qd_cuda_w4a4_gemm_grouped_async(y, a, w, roff, E);
    free(roff);
    return st;
}

/* The experts' weight pointers (codes, scales, s_dec, E of each) as one
 * table made once (const_table), then the device-offset product (qd_cuda_w4a4_gemm_grouped_dev_async);
 * where its decode kernel does not take the shapes, the offsets come to the
 * host and the host-offset path runs. */
static qd_status cuda_w4a4_gemm_grouped_dev(void *dev, float *y, const qd_nvfp4 *a, const qd_nvfp4 *const *w,
                                            const int32_t *d_off, int E, int maxrows)
{
    cuda_dev *d = D(dev);
    int64_t R = a->rows, K = w[0]->cols;
    int ok = E > 0, al16 = 1; /* the host-offset grouped op runs the exact kernels in both modes too */
    for (int e = 0; ok && e < E; e++) {
        ok = w[e]->rows == w[0]->rows && w[e]->cols == K && w[e]->per_row == w[0]->per_row &&
             qd_aligned(w[e]->codes, K % 64 ? 8 : 16) && qd_aligned(w[e]->scales, K % 64 ? 1 : 4);
        al16 = al16 && qd_aligned(w[e]->codes, 16) && qd_aligned(w[e]->scales, 16);
    }
    if (ok) {
        size_t bytes = sizeof(void *) * 3 * (size_t)E;
        void *h, *tab, *ws;
        QD_TRY(host_scratch(d, bytes, &h));
        void **hp = (void **)h;
        for (int e = 0; e < E; e++) {
            hp[e] = (void *)w[e]->codes;
            hp[E + e] = (void *)w[e]->scales;
            hp[2 * E + e] = (void *)w[e]->s_dec;
        }
        QD_TRY(const_table(d, h, bytes, &tab));
        QD_TRY(scratch(d, D_GDEV, qd_cuda_w4a4_grouped_dev_ws(R, E), &ws));
        qd_status st = qd_cuda_w4a4_gemm_grouped_dev_async(y, a, w[0], (const void *const *)tab, d_off, E, R,
                                                           maxrows, ws, al16);
        if (st != QD_ERR_SHAPE) /* a bare status: no message was set */
            return st;
    }
    int32_t *off = (int32_t *)malloc(sizeof(int32_t) * ((size_t)E + 1));
    if (!off)
        return qd_error(QD_ERR_NOMEM, "cuda backend: experts");
    qd_status st = cuda_to_host(dev, off, d_off, sizeof(int32_t) * ((size_t)E + 1));
    if (!st)
        st = cuda_w4a4_gemm_grouped(dev, y, a, w, off, E);
    free(off);
    return st;
}

/* Exact mode: one decode-kernel launch where the products allow it; fast
 * mode: its product one after the other. */
static qd_status cuda_w4a4_gemm_multi(void *dev, float *const *y, const qd_nvfp4 *const *a,
                                      const qd_nvfp4 *const *w, int count)
{
    if (count < 1 || count > QD_RAC_MULTI)
        return qd_error(QD_ERR_ARG, "cuda backend: w4a4_gemm_multi of %d products (1 to %d)", count, QD_RAC_MULTI);
    if (D(dev)->mode != QD_MODE_FAST)
        return qd_cuda_w4a4_gemm_multi_async(y, a, w, count);
    for (int i = 0; i < count; i++)
        QD_TRY(qd_cuda_w4a4_gemm_fast(y[i], a[i], w[i]));
    return QD_OK;
}

static qd_status cuda_rac_error(void *dev, double *err, const float *x, int rows, int K)
{
    void *xh;
    QD_TRY(scratch(D(dev), D_XH, sizeof(float) * (size_t)rows * K, &xh));
    QD_TRY(qd_cuda_nvfp4_fake_quant_async((float *)xh, x, rows, K, QD_SCALE_PER_ROW));
    return qdk_rac_error(err, x, (const float *)xh, rows, K);
}

static qd_status cuda_rac_augment_act(void *dev, qd_nvfp4 *out, const float *x, int rows, int K, const int64_t *ch,
                                      int64_t n)
{
    void *ws;
    QD_TRY(scratch(D(dev), D_RACWS, sizeof(float) * (((size_t)rows + 63) / 64 * 64 + (size_t)rows * n), &ws));
    return qd_cuda_rac_augment_act_async(out, x, rows, K, ch, n, (float *)ws);
}

/* rac_grouped's upload for count linears in one copy (the statistics'
 * pointers, the channel sets', the offsets), the fake-quant of x once for
 * the statistics, and one launch for every linear's augmented rows. */
static_assert(QD_RAC_MULTI == QD_CUDA_RAC_MULTI, "rac_multi's linear count");
/* off host (uploaded with the pointers), or d_off already on the device with R given */
static qd_status rac_multi_body(void *dev, qd_nvfp4 *const *a, double *const *const *err,
                                const int64_t *const *const *ch, const int64_t *n, int count, const int32_t *off,
                                const int32_t *d_off_in, int E, int R, const float *x, int K)
{
    cuda_dev *d = D(dev);
    if (count < 1 || count > QD_RAC_MULTI)
        return qd_error(QD_ERR_ARG, "cuda backend: rac_multi of %d linears (1 to %d)", count, QD_RAC_MULTI);
    if (R == 0)
        return QD_OK;
    size_t np = (size_t)E * (size_t)count, pb = sizeof(void *) * 2 * np;
    size_t bytes = pb + (off ? sizeof(int32_t) * ((size_t)E + 1) : 0);
    void *h, *p, *xh, *ws;
    QD_TRY(host_scratch(d, bytes, &h));
    void **hp = (void **)h;
    for (int i = 0; i < count; i++) {
        for (int e = 0; e < E; e++) {
            hp[(size_t)i * E + e] = err ? (void *)err[i][e] : NULL;
            hp[np + (size_t)i * E + e] = (void *)ch[i][e];
        }
    }
    if (off)
        memcpy((char *)h + pb, off, sizeof(int32_t) * ((size_t)E + 1));
    if (off && E > 1) { /* experts' offsets: each call its own */
        QD_TRY(scratch(d, D_RACPTR, bytes, &p));
        QD_TRY(cuda_to_dev(dev, p, h, bytes));
    } else { /* pointers, and one linear's offsets {0, R}: the same every call of R rows */
        QD_TRY(const_table(d, h, bytes, &p));
    }
    double *const *d_err = (double *const *)p;
    const int64_t *const *d_ch = (const int64_t *const *)p + np;
    const int32_t *d_off = off ? (const int32_t *)((char *)p + pb) : d_off_in;
    const int64_t *const *chi[QD_RAC_MULTI];
    for (int i = 0; i < count; i++)
        chi[i] = d_ch + (size_t)i * E;
    if (err) {
        QD_TRY(scratch(d, D_XH, sizeof(float) * (size_t)R * K, &xh));
        QD_TRY(qd_cuda_nvfp4_fake_quant_async((float *)xh, x, R, K, QD_SCALE_PER_ROW));
        for (int i = 0; i < count; i++)
            QD_TRY(qdk_rac_error_grouped(d_err + (size_t)i * E, x, (const float *)xh, d_off, E, K));
    }
    QD_TRY(scratch(d, D_RACWS, qd_cuda_rac_multi_ws(R, n, count), &ws));
    return qd_cuda_rac_multi_async(a, x, R, K, chi, n, count, d_off, E, (float *)ws);
}

static qd_status cuda_rac_multi(void *dev, qd_nvfp4 *const *a, double *const *const *err,
                                const int64_t *const *const *ch, const int64_t *n, int count, const int32_t *off,
                                int E, const float *x, int K)
{
    return rac_multi_body(dev, a, err, ch, n, count, off, NULL, E, off[E], x, K);
}

static qd_status cuda_rac_multi_dev(void *dev, qd_nvfp4 *const *a, double *const *const *err,
                                    const int64_t *const *const *ch, const int64_t *n, int count,
                                    const int32_t *d_off, int E, int R, const float *x, int K)
{
    return rac_multi_body(dev, a, err, ch, n, count, NULL, d_off, E, R, x, K);
}

/* rac_grouped is rac_multi of one linear (the op contract: the same bits). */
static qd_status cuda_rac_grouped(void *dev, qd_nvfp4 *a, double *const *err, const int64_t *const *ch,
                                  const int32_t *off, int E, const float *x, int K, int64_t n)
{
    return cuda_rac_multi(dev, &a, err ? &err : NULL, &ch, &n, 1, off, E, x, K);
}

static size_t up256(size_t n) { return (n + 255) & ~(size_t)255; }

/* The augmented rows (rows, K + n) quantized, dequantized and folded back
 * (qd_rac_fake_quant), through scratch: codes, scales, s_dec, then the floats. */
static qd_status cuda_rac_fake_quant(void *dev, float *out, const float *x, int rows, int K, const int64_t *ch,
                                     int64_t n)
{
    cuda_dev *d = D(dev);
    if (rows == 0)
        return QD_OK;
    size_t kc = (size_t)K + (size_t)n, cb = up256((size_t)rows * kc / 2), sb = up256((size_t)rows * kc / 16);
    size_t db = up256(sizeof(float) * (size_t)rows);
    void *p, *ws;
    QD_TRY(scratch(d, D_RACFQ, cb + sb + db + sizeof(float) * (size_t)rows * kc, &p));
    qd_nvfp4 a = {.rows = rows, .cols = (int64_t)kc, .codes = (uint8_t *)p, .scales = (uint8_t *)p + cb,
                  .s_dec = (float *)((char *)p + cb + sb), .per_row = QD_SCALE_PER_ROW};
    float *deq = (float *)((char *)p + cb + sb + db);
    QD_TRY(scratch(d, D_RACWS, sizeof(float) * (((size_t)rows + 63) / 64 * 64 + (size_t)rows * n), &ws));
    QD_TRY(qd_cuda_rac_augment_act_async(&a, x, rows, K, ch, n, (float *)ws));
    QD_TRY(qd_cuda_nvfp4_dequantize_async(deq, &a));
    return qdk_rac_fold(out, deq, ch, rows, K, n);
}

static qd_status cuda_rac_augment_weight(void *dev, qd_nvfp4 *out, const float *w, int N, int K, const int64_t *ch,
                                         int64_t n)
{
    (void)dev;
    return qd_cuda_rac_augment_weight(out, w, N, K, ch, n);
}

static qd_status cuda_nvfp4_quantize_weights(void *dev, qd_nvfp4 *const *q, const float *const *x,
                                             const int64_t *const *ch, int count, int N, int K, int64_t n)
{
    (void)dev;
    return qd_cuda_nvfp4_quantize_weights_async(q, x, ch, count, N, K, n);
}

static qd_status cuda_rac_select(void *dev, int64_t *ch, const double *err, const size_t *off, const int *K,
                                int count, double ratio)
{
    (void)dev;
    return qd_cuda_rac_select_async(ch, err, off, K, count, ratio);
}

static qd_status cuda_sqerr_rows(void *dev, double *err, double *nrm, const float *x, const float *xh, int rows,
                                 int cols)
{
    (void)dev;
    return qdk_sqerr_rows(err, nrm, x, xh, rows, cols);
}

/* sqerr_weights: the table of the count weights up through to_dev's pinned
 * ring, one launch. */
static qd_status cuda_sqerr_weights(void *dev, double *e, const float *const *x, const float *const *xh,
                                    const qd_nvfp4 *const *q, int count, int N, int K)
{
    cuda_dev *d = D(dev);
    if (count <= 0 || N <= 0)
        return QD_OK;
    size_t bytes = sizeof(qdk_sqw) * (size_t)count;
    void *h, *p;
    QD_TRY(host_scratch(d, bytes, &h));
    qdk_sqw *t = (qdk_sqw *)h;
    for (int i = 0; i < count; i++)
        t[i] = xh ? qdk_sqw{x[i], xh[i], NULL, NULL, NULL, 0}
                  : qdk_sqw{x[i], NULL, q[i]->codes, q[i]->scales, q[i]->s_dec, (long long)q[i]->cols};
    QD_TRY(scratch(d, D_SQW, bytes, &p));
    QD_TRY(cuda_to_dev(dev, p, h, bytes));
    return qdk_sqerr_weights(e, (const qdk_sqw *)p, count, N, K);
}

/* diag_add: the slots (and off, where on the host) go up through to_dev's
 * pinned ring, so nothing waits for the device. */
static qd_status cuda_diag_add(void *dev, double *acc, const double *e, int rows, const int32_t *off,
                               const int32_t *d_off, const int32_t *slot, int nseg, int nsets, int flags)
{
    cuda_dev *d = D(dev);
    if (nseg <= 0)
        return QD_OK;
    size_t ns = (size_t)nsets * (size_t)nseg;
    size_t bytes = sizeof(int32_t) * (ns + (off ? (size_t)nseg + 1 : 0));
    void *h, *p;
    QD_TRY(host_scratch(d, bytes, &h));
    memcpy(h, slot, sizeof(int32_t) * ns);
    if (off)
        memcpy((int32_t *)h + ns, off, sizeof(int32_t) * ((size_t)nseg + 1));
    QD_TRY(scratch(d, D_DIAG, bytes, &p));
    QD_TRY(cuda_to_dev(dev, p, h, bytes));
    const int32_t *ds = (const int32_t *)p;
    return qdk_diag_add(acc, e, rows, off ? ds + ns : d_off, ds, nseg, nsets, flags & QD_DIAG_SET);
}

/* ------------------------------------------------------------------------ */
/* attention                                                                 */

/* cuBLAS's batched products read and write through pointer arrays it cannot
 * inspect: its tensor-core kernels take 16-byte alignment for granted (a
 * misaligned pointer faults), so they run only where every row of every
 * operand starts on 16 bytes. */
static int attn_gemm_fits(int D, int Tm, const void *const *p, int n)
{
    if (D % 4 || Tm % 4)
        return 0;
    for (int i = 0; i < n; i++)
        if (!qd_aligned(p[i], 16))
            return 0;
    return 1;
}

/* Fast mode's prefill under the BF16 recipes: the fused kernel of
 * cuda_flash.cu (att then holds what its backward reads); both directions ask
 * the same question. */
static int flash_route(void *dev, int N, int D, int H, int KV, int Tm, const int32_t *seq_off)
{
    return D(dev)->mode == QD_MODE_FAST && D(dev)->fast16 && seq_off && qd_cuda_flash_fits(N, D, H, KV, Tm);
}

static qd_status cuda_attend(void *dev, float *out, float *att, const float *q, const float *kb, const float *vb,
                             const int32_t *kbase, const int32_t *pos, int N, int H, int KV, int D, int Tm,
                             const int32_t *seq_off, int nseq)
{
    if (flash_route(dev, N, D, H, KV, Tm, seq_off))
        return qd_cuda_flash_attend(out, att, q, kb, vb, seq_off, nseq, N, H, KV, D, Tm);
    if (D(dev)->mode == QD_MODE_FAST && seq_off) { /* a prefill */
        const void *p[] = {out, att, q, kb, vb};
        if (attn_gemm_fits(D, Tm, p, 5)) /* cuBLAS's batched products */
            return qd_cuda_attend_gemm(out, att, q, kb, vb, pos, seq_off, nseq, N, H, KV, D, Tm, D(dev)->bwd_math);
        /* else the kernel, att then zeroed past each query's position as the products' backward reads it */
        QD_TRY(qdk_attend_fast(out, att, q, kb, vb, kbase, pos, N, H, KV, D, Tm));
        return qd_cuda_attend_zero_tail(att, pos, N, H, Tm);
    }
    if (D(dev)->mode == QD_MODE_FAST && !D(dev)->small_exact)
        return qdk_attend_fast(out, att, q, kb, vb, kbase, pos, N, H, KV, D, Tm);
    if (seq_off) /* the exact prefill */
        return qdk_attend_prefill(out, att, q, kb, vb, kbase, pos, seq_off, nseq, N, H, KV, D, Tm);
    return qdk_attend(out, att, q, kb, vb, kbase, pos, N, H, KV, D, Tm);
}

static qd_status cuda_attend_backward(void *dev, float *dq, float *dk, float *dv, float *ds, const float *dout,
                                      const float *out, const float *att, const float *q, const float *k,
                                      const float *v, const int32_t *pos, const int32_t *slen, int N, int H, int KV,
                                      int D, int Tm, const int32_t *seq_off, int nseq, int flags)
{
    int set = (flags & QD_BWD_DX_SET) != 0;
    if (flash_route(dev, N, D, H, KV, Tm, seq_off)) /* writes every row of dq, dk, dv once */
        return qd_cuda_flash_attend_backward(dq, dk, dv, ds, dout, out, att, q, k, v, seq_off, nseq, N, H, KV, D,
                                             Tm, set);
    if (set) { /* the other routes add into them */
        QD_CUDA_CHECK(cudaMemsetAsync(dq, 0, sizeof(float) * (size_t)N * H * D));
        QD_CUDA_CHECK(cudaMemsetAsync(dk, 0, sizeof(float) * (size_t)N * KV * D));
        QD_CUDA_CHECK(cudaMemsetAsync(dv, 0, sizeof(float) * (size_t)N * KV * D));
    }
    /* the other routes read ds where they have not written it (the batched products' squares): from zero, as
     * the driver used to hand it over */
    QD_CUDA_CHECK(cudaMemsetAsync(ds, 0, sizeof(float) * (size_t)N * H * Tm));
    const void *p[] = {dq, dk, dv, ds, dout, att, q, k, v};
    if (D(dev)->mode == QD_MODE_FAST && seq_off && attn_gemm_fits(D, Tm, p, 9)) /* att as the fast prefill wrote it */
        return qd_cuda_attend_gemm_backward(dq, dk, dv, ds, dout, att, q, k, v, pos, seq_off, nseq, N, H, KV, D, Tm,
                                            D(dev)->bwd_math);
    return qdk_attend_backward(dq, dk, dv, ds, dout, att, q, k, v, pos, slen, N, H, KV, D, Tm);
}

static qd_status cuda_store_kv(void *dev, float *kc, float *vc, const float *kr, const float *v, const int32_t *row,
                               const int32_t *pos, int N, int Tc, int KD)
{
    (void)dev;
    return qdk_store_kv(kc, vc, kr, v, row, pos, N, Tc, KD);
}

/* ------------------------------------------------------------------------ */
/* MoE                                                                       */

static qd_status cuda_route(void *dev, int32_t *topk, float *topw, float *probs, int N, int E, int K,
                           qd_topk_norm norm)
{
    (void)dev;
    return qdk_route(topk, topw, probs, N, E, K, norm);
}

/* The rows grouped by expert on the device (qdk_moe_group, qd_moe_group's
 * rows); only exp_off (E + 1 ints) comes back, for the grouped launches. */
/* moe_group with the offsets left on the device (d_off): no copy to the host;
 * d_off NULL: into the scratch's first E + 1 ints (*where) */
static qd_status moe_group_on_dev(void *dev, int32_t *d_off, int32_t **where, int32_t *row_tok, float *row_w,
                                  int32_t *row_rank, int32_t *tok_rows, const int32_t *topk, const float *topw,
                                  int N, int E, int K)
{
    void *p;
    QD_TRY(scratch(D(dev), D_MOE, sizeof(int32_t) * ((size_t)N * K + 2 * (size_t)E + 1), &p));
    int32_t *ws = (int32_t *)p + E + 1;
    *where = d_off ? d_off : (int32_t *)p;
    return qdk_moe_group(*where, row_tok, row_w, row_rank, tok_rows, ws, topk, topw, N, E, K);
}

static qd_status cuda_moe_group(void *dev, int32_t *exp_off, int32_t *row_tok, float *row_w, int32_t *row_rank,
                                int32_t *tok_rows, const int32_t *topk, const float *topw, int N, int E, int K)
{
    int32_t *d_off;
    QD_TRY(moe_group_on_dev(dev, NULL, &d_off, row_tok, row_w, row_rank, tok_rows, topk, topw, N, E, K));
    /* a dense layer: every row to "expert 0", the offsets known here (no
     * copy, no sync: a decode step of a model with dense layers records as a graph) */
    if (!topk && E == 1 && K == 1) {
        exp_off[0] = 0;
        exp_off[1] = N;
        return QD_OK;
    }
    return cuda_to_host(dev, exp_off, d_off, sizeof(int32_t) * ((size_t)E + 1));
}

static qd_status cuda_moe_group_dev(void *dev, int32_t *d_off, int32_t *row_tok, float *row_w, int32_t *row_rank,
                                   int32_t *tok_rows, const int32_t *topk, const float *topw, int N, int E, int K)
{
    int32_t *where;
    return moe_group_on_dev(dev, d_off, &where, row_tok, row_w, row_rank, tok_rows, topk, topw, N, E, K);
}

static qd_status cuda_gather(void *dev, float *xe, const float *x, const int32_t *row_tok, int R, int C)
{
    (void)dev;
    return qdk_gather(xe, x, row_tok, R, C);
}

static qd_status cuda_swiglu(void *dev, float *h, const float *g, const float *u, size_t n)
{
    (void)dev;
    return qdk_swiglu(h, g, u, n);
}

static qd_status cuda_swiglu_backward(void *dev, float *dg, float *du, const float *dh, const float *g,
                                      const float *u, size_t n)
{
    (void)dev;
    return qdk_swiglu_backward(dg, du, dh, g, u, n);
}

static qd_status cuda_combine(void *dev, float *out, const float *y, const float *row_w, const int32_t *tok_rows,
                              int N, int K, int C)
{
    (void)dev;
    return qdk_combine(out, y, row_w, tok_rows, N, K, C);
}

static qd_status cuda_moe_dy(void *dev, float *dy, float *dwt, const float *dout, const float *y, const float *row_w,
                             const int32_t *row_rank, const int32_t *tok_rows, int N, int K, int C)
{
    (void)dev;
    return qdk_moe_dy(dy, dwt, dout, y, row_w, row_rank, tok_rows, N, K, C);
}

static qd_status cuda_unroute(void *dev, float *dinp, const float *dxe, const int32_t *tok_rows, int N, int K,
                              int C)
{
    (void)dev;
    return qdk_unroute(dinp, dxe, tok_rows, N, K, C);
}

static qd_status cuda_router_backward(void *dev, float *dlog, const float *dwt, const float *probs,
                                      const int32_t *topk, const float *topw, int N, int E, int K,
                                      qd_topk_norm norm)
{
    (void)dev;
    return qdk_router_backward(dlog, dwt, probs, topk, topw, N, E, K, norm);
}

/* ------------------------------------------------------------------------ */
/* log-probs, sampling, the optimizer                                        */

static qd_status cuda_logprob(void *dev, float *logp, float *lse, const float *logits, const int32_t *tgt, int N,
                              int V, float T)
{
    cuda_dev *d = D(dev);
    void *s = NULL;
    int fast = d->mode == QD_MODE_FAST && d->lp_fast;
    if (T != 1.0f && !fast)
        QD_TRY(scratch(d, D_LOGP, sizeof(float) * (size_t)N * V, &s));
    QD_CUDA_CHECK(cudaMemset(d->d_bad, 0, sizeof(int)));
    if (fast)
        QD_TRY(qdk_logprob_fast(logp, lse, logits, tgt, N, V, T, d->d_bad));
    else
        QD_TRY(qdk_logprob(logp, lse, (float *)s, logits, tgt, N, V, T, d->d_bad));
    int bad = 0;
    QD_TRY(cuda_to_host(dev, &bad, d->d_bad, sizeof bad));
    if (bad)
        return qd_error(QD_ERR_NONFINITE, "forward: token %d: logits / temperature %g overflows", bad - 1,
                        (double)T);
    return QD_OK;
}

static qd_status cuda_logprob_backward(void *dev, float *dlogits, const float *dlogp, const float *logits,
                                       const float *lse, const int32_t *tgt, int N, int V, float T)
{
    (void)dev;
    return qdk_logprob_backward(dlogits, dlogp, logits, lse, tgt, N, V, T);
}

/* The logits to the host, then the CPU's sampler (OpenMP over rows). */
static qd_status sample_on_host(cuda_dev *d, qd_sample_result *out, const float *logits, int B, int V,
                                const qd_sample_params *p, const uint64_t *seq_ids, const uint32_t *positions)
{
    void *h;
    QD_TRY(host_scratch(d, sizeof(float) * (size_t)B * V, &h));
    QD_TRY(cuda_to_host(d, h, logits, sizeof(float) * (size_t)B * V));
    return qd_sample_batch(out, (const float *)h, B, V, p, seq_ids, positions);
}

/* Rows with no top-k / top-p cut sample on the device (qdk_sample, the same
 * steps as the CPU's), so only B tokens and log-probs come back; a cut, a bad
 * parameter or a non-finite logit goes through the host sampler (which names
 * the error). */
static qd_status cuda_sample(void *dev, qd_sample_result *out, const float *logits, int B, int V,
                             const qd_sample_params *p, const uint64_t *seq_ids, const uint32_t *positions)
{
    cuda_dev *d = D(dev);
    int cut = (p->top_k > 0 && p->top_k < V) || p->top_p < 1.0f;
    int valid = p->temperature >= 0.0f && isfinite(p->temperature) && p->top_p > 0.0f && p->top_p <= 1.0f;
    if (B == 0 || V < 1 || !valid || (cut && p->temperature != 0.0f))
        return sample_on_host(d, out, logits, B, V, p, seq_ids, positions);
    size_t nb = (size_t)B;
    void *buf;
    size_t head = (8 * nb + 4 * nb * 4 + 255) & ~(size_t)255;
    QD_TRY(scratch(d, D_SAMPLE, head + qdk_sample_work_bytes(B, V), &buf));
    uint64_t *sid = (uint64_t *)buf;
    uint32_t *spos = (uint32_t *)(sid + nb);
    int32_t *tok = (int32_t *)(spos + nb);
    float *lp = (float *)(tok + nb), *lpk = lp + nb;
    QD_TRY(cuda_to_dev(d, sid, seq_ids, sizeof(uint64_t) * nb));
    QD_TRY(cuda_to_dev(d, spos, positions, sizeof(uint32_t) * nb));
    QD_CUDA_CHECK(cudaMemset(d->d_bad, 0, sizeof(int)));
    QD_TRY(qdk_sample(tok, lp, lpk, logits, B, V, p->temperature, p->seed, sid, spos, d->d_bad,
                      (char *)buf + head));
    int bad = 0;
    QD_TRY(cuda_to_host(d, &bad, d->d_bad, sizeof bad));
    if (bad)
        return sample_on_host(d, out, logits, B, V, p, seq_ids, positions);
    void *h;
    QD_TRY(host_scratch(d, 12 * nb, &h));
    QD_TRY(cuda_to_host(d, h, tok, 12 * nb));
    const int32_t *ht = (const int32_t *)h;
    const float *hl = (const float *)(ht + nb), *hk = hl + nb;
    for (int b = 0; b < B; b++)
        out[b] = (qd_sample_result){.token = ht[b], .logprob = hl[b], .logprob_kept = hk[b]};
    return QD_OK;
}

static qd_status cuda_sumsq_chunks(void *dev, double *part, const float *g, size_t n)
{
    (void)dev;
    return qdk_sumsq_chunks(part, g, n);
}

static qd_status cuda_adamw(void *dev, float *p, const float *g, float *m, float *v, size_t n, const qd_adamw *o,
                            float wd, float gscale, float bc1, float bc2)
{
    (void)dev;
    return qdk_adamw(p, g, m, v, n, o->lr, o->beta1, o->beta2, o->eps, wd, gscale, bc1, bc2);
}

/* adamw_round; where wk lies in the working copy whose BF16 bits this
 * context keeps (wk16), those bits too, counted in fresh16 (weights_changed
 * then converts only what they do not cover). */
static qd_status cuda_adamw_round(void *dev, float *p, const float *g, float *m, float *v, float *wk, size_t n,
                                  const qd_adamw *o, float wd, float gscale, float bc1, float bc2)
{
    cuda_dev *d = D(dev);
    uint16_t *bits = NULL;
    if (d->bf16_copy && d->wk16 && wk >= d->wk && wk + n <= d->wk + d->nwk) {
        bits = d->wk16 + (wk - d->wk);
        d->fresh16 += n;
    }
    return qdk_adamw_round(p, g, m, v, wk, bits, n, o->lr, o->beta1, o->beta2, o->eps, wd, gscale, bc1, bc2);
}

/* fast16: cuda_matmul's and backward16's BF16 GEMMs take x's bits (bits16), as
 * cuda_matmul_w16's does above its small-row bound; the exact kernels read floats */
static int cuda_rounds_bf16_input(void *dev, int N, int IC, int OC)
{
    cuda_dev *d = D(dev);
    return d->fast16 && IC % 8 == 0 && OC % 8 == 0 && N > (d->small_exact ? 8 : 0);
}

/* adamw_bits: fast16 only (every BF16 product reads wk16; QUADS_FAST_BF16=0's
 * float32 backward would read the floats), wk inside the working copy */
static qd_status cuda_adamw_bits(void *dev, float *p, const float *g, float *m, float *v, const float *wk, size_t n,
                                 const qd_adamw *o, float wd, float gscale, float bc1, float bc2)
{
    cuda_dev *d = D(dev);
    if (!(d->fast16 && d->wk16 && wk >= d->wk && wk + n <= d->wk + d->nwk))
        return QD_ERR_UNSUPPORTED;
    d->fresh16 += n;
    return qdk_adamw_round(p, g, m, v, NULL, d->wk16 + (wk - d->wk), n, o->lr, o->beta1, o->beta2, o->eps, wd,
                           gscale, bc1, bc2);
}

static const qd_ops cuda_ops = {
    .name = "cuda",
    .alloc = cuda_alloc,
    .release = cuda_release,
    .zero = cuda_zero,
    .to_dev = cuda_to_dev,
    .to_host = cuda_to_host,
    .copy = cuda_copy,
    .memory_id = cuda_memory_id,
    .mem_info = cuda_mem_info,
    .own_bytes = cuda_own_bytes,
    .finish = cuda_finish,
    .enter = NULL,
    .leave = NULL,
    .mark = cuda_mark,
    .report = cuda_report,
    .weights_changed = cuda_weights_changed,
    .round_bf16 = cuda_round_bf16,
    .add = cuda_add,
    .embed = cuda_embed,
    .embed_backward = cuda_embed_backward,
    .rmsnorm = cuda_rmsnorm,
    .rmsnorm_backward = cuda_rmsnorm_backward,
    .rope = cuda_rope,
    .add_rmsnorm = cuda_add_rmsnorm,
    .combine_add_rmsnorm = cuda_combine_add_rmsnorm,
    .swiglu_nvfp4 = cuda_swiglu_nvfp4,
    .qk_norm_rope = cuda_qk_norm_rope,
    .gather_nvfp4 = cuda_gather_nvfp4,
    .to_bf16 = cuda_to_bf16,
    .embed_w16 = cuda_embed_w16,
    .matmul_w16 = cuda_matmul_w16,
    .matmul = cuda_matmul,
    .matmul_backward = cuda_matmul_backward,
    .matmul_grouped = cuda_matmul_grouped,
    .matmul_grouped_backward = cuda_matmul_grouped_backward,
    .experts16 = cuda_experts16,
    .gather16 = cuda_gather16,
    .swiglu16 = cuda_swiglu16,
    .matmul_grouped16 = cuda_matmul_grouped16,
    .matmul_grouped_backward16 = cuda_matmul_grouped_backward16,
    .moe_dy16 = cuda_moe_dy16,
    .swiglu_backward16 = cuda_swiglu_backward16,
    .matmul_grouped_backward16b = cuda_matmul_grouped_backward16b,
    .fp8_quantize_rows = cuda_fp8_quantize_rows,
    .fp8_gemm = cuda_fp8_gemm,
    .fp8_gemm_grouped = cuda_fp8_gemm_grouped,
    .nvfp4_quantize = cuda_nvfp4_quantize,
    .nvfp4_fake_quant = cuda_nvfp4_fake_quant,
    .w4a4_gemm = cuda_w4a4_gemm,
    .w4a4_gemm_grouped = cuda_w4a4_gemm_grouped,
    .w4a4_gemm_multi = cuda_w4a4_gemm_multi,
    .rac_error = cuda_rac_error,
    .rac_augment_act = cuda_rac_augment_act,
    .rac_augment_weight = cuda_rac_augment_weight,
    .nvfp4_quantize_weights = cuda_nvfp4_quantize_weights,
    .nvfp4_fake_quant_weights = cuda_nvfp4_fake_quant_weights,
    .rac_select = cuda_rac_select,
    .rac_grouped = cuda_rac_grouped,
    .rac_multi = cuda_rac_multi,
    .rac_fake_quant = cuda_rac_fake_quant,
    .sqerr_rows = cuda_sqerr_rows,
    .attend = cuda_attend,
    .attend_backward = cuda_attend_backward,
    .store_kv = cuda_store_kv,
    .route = cuda_route,
    .moe_group = cuda_moe_group,
    .moe_group_dev = cuda_moe_group_dev,
    .w4a4_gemm_grouped_dev = cuda_w4a4_gemm_grouped_dev,
    .rac_multi_dev = cuda_rac_multi_dev,
    .gather = cuda_gather,
    .swiglu = cuda_swiglu,
    .swiglu_backward = cuda_swiglu_backward,
    .combine = cuda_combine,
    .moe_dy = cuda_moe_dy,
    .unroute = cuda_unroute,
    .router_backward = cuda_router_backward,
    .logprob = cuda_logprob,
    .logprob_backward = cuda_logprob_backward,
    .head_backward = cuda_head_backward,
    .sample = cuda_sample,
    .sumsq_chunks = cuda_sumsq_chunks,
    .adamw = cuda_adamw,
    .adamw_round = cuda_adamw_round,
    .adamw_bits = cuda_adamw_bits,
    .rounds_bf16_input = cuda_rounds_bf16_input,
    .hold_input = cuda_hold_input,
    .diag_add = cuda_diag_add,
    .sqerr_weights = cuda_sqerr_weights,
    .bfp_weights = cuda_bfp_weights,
    .matmul_bfp = cuda_matmul_bfp,
    .graph_begin = cuda_graph_begin,
    .graph_end = cuda_graph_end,
    .graph_run = cuda_graph_run,
    .graph_drop = cuda_graph_drop,
};

/* ------------------------------------------------------------------------ */
/* init                                                                      */

static void cuda_dev_free(void *dev)
{
    cuda_dev *d = D(dev);
    const char *ge = getenv("QUADS_CUDA_GRAPH");
    if (ge && !strcmp(ge, "1") && (d->graph_made || d->graph_failed))
        fprintf(stderr, "cuda backend: step graphs: %ld recorded, %ld failed, %ld runs%s%s\n", d->graph_made,
                d->graph_failed, d->graph_runs, qd_cuda_refused ? "; last refused by " : "",
                qd_cuda_refused ? qd_cuda_refused : "");
    cuda_graph_drop(d);
    if (d->ctab)
        ctab_free(d);
    free(d->ctab);
    cudaFree(d->wk16);
    cudaFree(d->d_bad);
    cudaFree(d->fq_dsdec);
    free(d->fq);
    free(d->fq_sdec);
    for (int i = 0; i < D_NSCRATCH; i++)
        cudaFree(d->scratch[i]);
    free(d->host);
    if (d->stage_ok > 0) {
        for (int i = 0; i < STAGE_SLOTS; i++)
            cudaEventDestroy(d->stage_ev[i]);
        cudaFreeHost(d->stage);
    }
    free(d);
}

/* An ops context on the current device; NULL with a message. */
extern "C" void *qd_cuda_dev_new(qd_exec_mode mode, qd_prec weights)
{
    cuda_dev *d = (cuda_dev *)calloc(1, sizeof *d);
    if (!d) {
        qd_error(QD_ERR_NOMEM, "cuda backend: context");
        return NULL;
    }
    if (cudaGetDevice(&d->device) != cudaSuccess) {
        qd_error(QD_ERR_DEVICE, "cuda backend: cudaGetDevice: %s", cudaGetErrorString(cudaGetLastError()));
        free(d);
        return NULL;
    }
    d->mode = mode;
    d->bf16_copy = mode == QD_MODE_FAST && weights == QD_PREC_BF16;
    d->bwd_math = weights == QD_PREC_BF16 ? QD_GEMM_TF32 : QD_GEMM_F32;
    const char *fb = getenv("QUADS_FAST_BF16");
    d->fast16 = d->bf16_copy && !(fb && !strcmp(fb, "0"));
    const char *aq = getenv("QUADS_AQAT16");
    d->aqat16 = d->fast16 && !(aq && !strcmp(aq, "0"));
    const char *se = getenv("QUADS_FAST_SMALL");
    d->small_exact = !(se && !strcmp(se, "0"));
    const char *f8 = getenv("QUADS_FP8_GROUPED");
    d->fp8_tc = mode == QD_MODE_FAST && !(f8 && !strcmp(f8, "0"));
    const char *lf = getenv("QUADS_LOGPROB_FAST");
    d->lp_fast = !(lf && !strcmp(lf, "0"));
    const char *hx = getenv("QUADS_HOLD_X"), *es = getenv("QUADS_EMBED_SORT");
    d->hold_on = hx && !strcmp(hx, "1");
    d->embed_sort = !(es && !strcmp(es, "0"));
    const char *df = getenv("QUADS_DLOGIT_FAST");
    d->dlogit_fast = !(df && !strcmp(df, "0"));
    const char *db = getenv("QUADS_DY16_BYTES");
    d->dy16_bytes = db && atol(db) > 0 ? (size_t)atol(db) : (size_t)512 << 20;
    const char *pe = getenv("QUADS_CUDA_PROFILE");
    d->prof = !pe || !*pe || !strcmp(pe, "0") ? 0 : !strcmp(pe, "last") ? 2 : 1;
    if (cuda_alloc(d, (void **)&d->d_bad, sizeof(int), "flag")) {
        free(d);
        return NULL;
    }
    return d;
}

extern "C" const qd_ops *qd_cuda_ops(void) { return &cuda_ops; }

extern "C" void qd_cuda_dev_free(void *dev) { cuda_dev_free(dev); }

static qd_status check_options(const qd_backend_options *opt)
{
    if ((unsigned)opt->recipe >= QD_RECIPE_COUNT || opt->rac_ratio < 0 || opt->rac_ratio > 1)
        return qd_error(QD_ERR_ARG, "cuda backend: bad recipe or rac_ratio");
    if (opt->mode != QD_MODE_EXACT && opt->mode != QD_MODE_FAST)
        return qd_error(QD_ERR_ARG, "cuda backend: bad mode %d", (int)opt->mode);
    return QD_OK;
}

extern "C" qd_backend *qd_backend_cuda_init(const qd_model_config *cfg, const qd_backend_options *opt)
{
    int ndev = 0;
    cudaError_t e = cudaGetDeviceCount(&ndev);
    if (e != cudaSuccess || ndev == 0) {
        cudaGetLastError();
        qd_error(QD_ERR_DEVICE, "cuda backend: no CUDA device (cudaGetDeviceCount: %s, %d devices)",
                 cudaGetErrorString(e), ndev);
        return NULL;
    }
    if (qd_model_config_check(cfg) || check_options(opt))
        return NULL;
    /* data parallel: this process's device, LOCAL_RANK modulo the visible ones
     * (so one GPU per task via CUDA_VISIBLE_DEVICES works too); per host thread */
    e = cudaSetDevice(opt->device % ndev);
    if (e != cudaSuccess) {
        qd_error(QD_ERR_DEVICE, "cuda backend: cudaSetDevice(%d of %d): %s", opt->device % ndev, ndev,
                 cudaGetErrorString(e));
        return NULL;
    }
    void *d = qd_cuda_dev_new(opt->mode, opt->recipe == QD_RECIPE_FP32 ? QD_PREC_F32 : QD_PREC_BF16);
    if (!d)
        return NULL;
    return qd_model_backend_new(cfg, opt, &cuda_ops, d, cuda_dev_free);
}
