/* backends/model.c: Qwen3-MoE written once, over the device ops of
 * backends/ops.h. Every backend (the CPU reference, backends/cpu/cpu_ops.c; the
 * CUDA backend, backends/cuda/cuda_ops.cu) is this driver plus its ops, so the
 * model's structure, the recipe table, the buffers, AdamW, the RAC state and
 * the diagnostics exist in one place and exact-mode parity holds by
 * construction: both run the same op sequence, and each op has one definition
 * of its numbers (the CPU's).
 *
 * The math is Hugging Face's modeling_qwen3_moe.py: RMSNorm
 * w * (x * rsqrt(mean(x^2) + eps)); attention with per-head q/k RMSNorm, RoPE
 * in the rotate_half convention, GQA, causal softmax, scale head_dim^-0.5
 * applied after the dot product; the sparse block's router softmax in float32,
 * top-k, optional renormalization, SwiGLU experts summed in ascending expert
 * index; dense SwiGLU MLP layers where decoder_sparse_step/mlp_only_layers say.
 *
 * Letters: N = tokens of the batch (sequences packed, padding dropped),
 * C = hidden, H / KV = query / key-value heads, D = head_dim, E = experts,
 * K = experts per token, I = a layer's FFN width, V = vocab, R = routed rows.
 *
 * Reduction orders (the exact mode's definition) are the ops' (cpu_ops.c):
 * products sum over the reduction index ascending from a fresh accumulator, a
 * gradient is added to the gradient buffer after (gradients always accumulate
 * with +=); the MoE output adds each token's expert outputs in ascending expert
 * index; the global gradient norm adds double partial sums of fixed 4096-float
 * chunks in ascending order (here, on the host). Every op but attention works
 * row by row, so a sequence's numbers do not depend on the other sequences of
 * its batch (generation relies on it).
 *
 * BF16 (every recipe but fp32): embedding rows, norm weights, router and
 * lm_head weights are BF16-rounded copies of the float32 master weights; a
 * BF16 linear rounds its input to BF16 and accumulates in float32; all other
 * activations stay float32. Backward is float32 with the straight-through
 * rule: a rounded or fake-quantized copy passes the gradient unchanged to the
 * master weight (NUMERICS.md §5). The replay trainers (nvfp4-replay,
 * quads-replay) run the rollout's W4A4 (+ RAC) forward and a straight-through
 * backward against the dequantized operands (docs/numerics.md §5).
 *
 * A rollout-role instance is lean (but under fp32, or options.keep_master):
 * no master weights; a weight sync streams each tensor through a staging
 * scratch into what the forward reads (codes, BF16 bits, float32 values),
 * the bits of the master-keeping layout; the layers share one set of
 * activations; what needs the master (backward, AdamW, get_weights) is
 * refused naming the role.
 *
 * Generation: a prefill of the prompts, then decode steps of one token per
 * unfinished sequence against a KV cache, both through the attend op, so
 * rollout log-probs equal the forward's bit for bit; sampling as NUMERICS.md
 * §6 (Philox4x32-10 keyed by seed, sequence id and position). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "backends/layout.h"
#include "backends/ops.h"
#include "backends/shared.h"

/* ------------------------------------------------------------------------ */
/* the model's state                                                         */

typedef struct {
    size_t w;              /* offset of the weight (out, in) in the flat buffers */
    size_t wk;             /* offset of its working copy in wk: w, or in a lean instance its
                              place there (NOT_HELD: none, the products read the codes) */
    size_t wk16;           /* lean: offset of its BF16 working copy in wk16, else NOT_HELD */
    int out, in;
    qd_linear_mode mode;
    int quantized;         /* one of the layers a recipe quantizes (not router, lm_head) */
    const char *name;      /* the weight's HF name */
    /* rollout copies (dev), rebuilt at every sync */
    qd_nvfp4 wq;           /* W4A4: (out, in); RAC: (out, in + nrac); buffers in wq_mem */
    void *wq_mem;
    uint8_t *w8;           /* FP8: (out, in) E4M3 codes */
    float *w8_inv;         /* FP8: (out) decode scales */
    int64_t *rac_ch;       /* RAC: host (in), nrac used, ascending (a view of the model's rac_ch) */
    int64_t *d_rac_ch;     /* RAC: dev copy (a view of d_rac_ch) */
    int64_t nrac;
    double *d_rac_err;     /* RAC: dev (in) squared activation error since the last sync (a view
                              of d_rac_err) */
    /* diagnostics (options.diagnostics), host */
    double act_err, act_norm; /* sum of squared NVFP4 activation error and of x^2, last forward */
    double weight_err;     /* sum (W - dequant(quantize(W)))^2 / sum W^2, last sync */
} linear;

typedef qd_layout_layer layer; /* backends/layout.h */

/* Activations of one layer kept for backward (dev). */
typedef struct {
    float *x;                /* (N, C) residual stream entering the layer */
    float *ln1, *rstd1;      /* (N, C), (N) */
    float *q, *k, *v;        /* (N, H*D), (N, KV*D), (N, KV*D) projections */
    float *rstd_q, *rstd_k;  /* (N, H), (N, KV) */
    float *qr, *kr;          /* (N, H*D), (N, KV*D) after norm and RoPE */
    float *att;              /* (N, H, Tm) softmax probabilities */
    float *ao;               /* (N, H*D) attention output */
    float *xmid;             /* (N, C) residual after attention */
    float *ln2, *rstd2;      /* (N, C), (N) */
    float *probs;            /* (N, E) router softmax (MoE) */
    int32_t *topk;           /* (N, K) experts chosen, rank order (MoE) */
    float *topw;             /* (N, K) their weights after renormalization (MoE) */
    int32_t *row_tok;        /* (R) token of each routed row; rows grouped by expert */
    float *row_w;            /* (R) routing weight of each row */
    int32_t *row_rank;       /* (R) top-k rank of each row (0 when dense) */
    int32_t *tok_rows;       /* (N, K) rows of each token in ascending expert order */
    float *xe, *g, *u, *h, *y; /* (R, C), (R, I), (R, I), (R, I), (R, C) */
    int32_t *exp_off;        /* host (nexp + 1) first row of each expert; with off_dev only
                              * exp_off[nexp] (the rows, N K) is set */
    int32_t *d_off;          /* off_dev: dev (nexp + 1) the offsets (moe_group_dev) */
    int off_dev;             /* this forward's experts read their offsets on the device */
    int xe16, h16;           /* xe, h rounded to BF16 in place: their experts' effective input
                              * (experts_round_only), so no copy is made of it */
    int xeb, hb;             /* xe, h hold BF16 bits instead (R x C, R x I uint16 at their start:
                              * the ops' experts16 path) */
    int dw_set;              /* this backward overwrites the experts' weight gradients (a lazy
                              * zero_grad left them: grads_begin) */
} layer_acts;

/* Grow-only dev scratch buffers. */
enum { S_XE, S_XH, S_ACT, S_FP8Q, S_FP8S, S_LOGP, S_BWD, S_DIAG, S_ROWS, S_STAGE, S_MOEOFF, S_NSCRATCH };

typedef struct {
    qd_model_config cfg;
    qd_backend_options opt;
    qd_backend base;
    const qd_ops *ops;
    void *dev;
    void (*free_dev)(void *dev);
    qd_param_info *info;
    int ninfo;
    size_t nfloats;
    linear *lin;
    int nlin;
    layer *layers;
    size_t embed, final_norm;      /* offsets: (V, C), (C) */
    int lm_head;                   /* linear index (tied: points at the embedding) */
    float *params, *grads, *m, *v; /* dev (nfloats) each: master, grad, AdamW moments; the
                                      last three made (zeroed) at the first call that trains,
                                      so a rollout instance never holds them */
    float *wk;                     /* dev (nfloats) working copy the forward reads (= params for fp32);
                                      lean: (nwk) only the tensors the forward reads as float */
    /* lean (the rollout role, unless options.keep_master): no master weights
     * (params NULL); a weight sync streams each tensor from its source (the
     * host, or another instance's master) through the S_STAGE scratch into
     * its quantized copy, or into wk (rounded) where the forward reads it as
     * float; every layer shares one set of activations (no backward) */
    int lean;
    size_t *wk_at;                 /* lean: (ninfo) each tensor's offset in wk, NOT_HELD if none */
    size_t nwk;                    /* floats of wk */
    uint16_t *wk16;                /* lean: dev (nwk16) BF16 bits of the tensors read as BF16 values
                                      by embed_w16 / matmul_w16 (embedding, router, lm_head, ...) */
    size_t *wk16_at, nwk16;        /* lean: (ninfo) each tensor's offset in wk16, or NOT_HELD */
    size_t embed16;                /* the embedding's offset in wk16, or NOT_HELD */
    int *lin_at;                   /* lean: (ninfo) the linear whose weight tensor t is, or -1 */
    void *head_bfp;                /* dev: the lm_head's weights as bfp_weights makes them (head_bfp_on),
                                      remade at every sync; NULL where its product is another */
    /* RAC: every RAC linear's channels (host and dev) and statistics (dev), in
     * linear order, in units of its in (nrac_in in all): a sync moves them in
     * one call each */
    int64_t *rac_ch, *d_rac_ch;
    double *d_rac_err;
    size_t nrac_in;
    int rac_host_stale;            /* d_rac_ch was picked on the device since rac_ch was read */
    int wk_rounded;                /* the optimizer step wrote wk (adamw_round) outside the fake-quant
                                    * linears: the sync's round_rest is not needed */
    int rac_pending;               /* set_rac_state installed channel sets that the next weight
                                      sync builds the RAC copies with (no pick); a lean instance
                                      has no other copy of them until then */
    float *rope_cos, *rope_sin;    /* dev (max_position_embeddings, D/2) */
    /* the last forward */
    int N, Tm, B;                  /* tokens, longest sequence, sequences */
    int32_t *tok, *tgt, *pos, *src, *row, *seq_off; /* host (N) x5, (B + 1) */
    int32_t *d_tok, *d_tgt, *d_pos, *d_row, *d_kbase, *d_slen; /* dev (N) */
    layer_acts *acts;              /* (L) */
    float *xf, *lnf, *rstdf, *logits, *lse; /* dev (N, C), (N, C), (N), (N, V), (N) */
    float temp;                    /* log-probs are log_softmax(logits / temp) */
    void *arena;                   /* dev activations, grow-only */
    size_t arena_cap;
    void *harena;                  /* host side of the batch, grow-only */
    size_t harena_cap;
    void *scratch[S_NSCRATCH];
    size_t scratch_cap[S_NSCRATCH];
    /* A fused op left pre_src (dev, pre_rows x pre_cols) quantized per row
     * in S_ACT, where act_nvfp4 of that shape lays it out: quantize_act
     * takes it there instead of quantizing again (any other act_nvfp4
     * forgets it). */
    const float *pre_src;
    int64_t pre_rows, pre_cols;
    /* KV cache of a generation: NULL outside one */
    float *kc, *vc;                /* dev (L, rows, Tc, KV*D) keys after norm and RoPE, values */
    int cache_rows, Tc;
    uint64_t graph_seen;           /* the key of the last decode step that ran without a step graph */
    int graph_off;                 /* a step graph's recording failed: decode steps launch as they run */
    int decode;                    /* 1: the batch is one new token per row, attend to the cache */
    int generating;                /* 1 inside a generate: logits only of each row's last token */
    int Bl;                        /* a generate's logit rows (B, or a shared prefill's rows) */
    const int32_t *lmap;           /* host (Bl): the sequence whose last token gives row b's
                                      logits (a shared prefill), NULL: sequence b */
    int rac_stats;                 /* 1 while a call that asked for RAC statistics runs */
    int recomputing;               /* 1 while the backward recomputes a layer (options.recompute): no
                                      statistics, no diagnostics */
    float *rx;                     /* options.recompute: dev (N, C) the recomputed layer's output */
    int have_forward;
    int lazy_zero;                 /* QUADS_LAZY_ZERO=1 at init: zero_grad only marks the gradients */
    int zero_pending;              /* marked: zeroed at their next use (grads_settle, grads_begin) */
    int head_dw_set;               /* this backward's head_backward overwrites the lm_head's dW */
    int have_diag;                 /* a forward or generate has run */
    int diag_paused;               /* a generate with no_diagnostics runs: nothing measured */
    double *d_diag;                /* diagnostics' sums where the ops add them (diag_add): dev (4 nlin),
                                      linear i's activation err and norm at 2i, its weight's at
                                      2 (nlin + i) (diag_on_dev) */
    unsigned char *wmeasured;      /* (nlin) this sync measured linear i's weight a shape at a time */
    size_t plan_sdiag;             /* the plan's S_DIAG bytes (what grouped weight errors may use) */
    size_t plan_sxh;               /* the plan's S_XH bytes (what measure_uncoded's codes may use) */
    /* what diagnostics hands out */
    const char **dg_names;         /* (quantized linears) */
    double *dg_act_err, *dg_act_norm, *dg_weight_err;
    int32_t *dg_topk;              /* (moe layers, N, K) */
    /* memory: bytes held now and at most, per kind (every dev buffer goes
     * through dalloc/drelease); the plan made at init */
    size_t mem_now[QD_MEM_COUNT], mem_peak[QD_MEM_COUNT];
    size_t kv_bytes;               /* of each of kc, vc */
    qd_mem_plan plan;
    size_t free_at_init, dev_total;
} model;

#define NOT_HELD ((size_t)-1)

/* The tensor holding flat offset off (tensors in ascending offset order). */
static int tensor_at(const model *c, size_t off)
{
    int lo = 0, hi = c->ninfo - 1;
    while (lo < hi) {
        int mid = (lo + hi + 1) / 2;
        if (c->info[mid].offset <= off)
            lo = mid;
        else
            hi = mid - 1;
    }
    return lo;
}

/* The working copy of the tensor at flat offset off: the same offset, or in
 * a lean instance its place in the compacted wk. */
static size_t wk_off(const model *c, size_t off)
{
    if (!c->lean)
        return off;
    int t = tensor_at(c, off);
    return c->wk_at[t] + (off - c->info[t].offset);
}

#define P(c, off) ((c)->wk + wk_off((c), (off)))
/* A linear's working weight (NULL where a lean instance holds only its codes). */
#define LW(c, L) ((L)->wk == NOT_HELD ? NULL : (c)->wk + (L)->wk)

/* The lm_head's exact product is the row block-floating-point one
 * (docs/numerics.md §3b) where its weights are BF16 values (every recipe but
 * fp32; BF16 or the activation-only ablation's linear), in exact mode, where
 * the ops have it and its width fits (a multiple of 16, at most 16384). */
static int head_bfp_on(const model *c)
{
    const linear *L = &c->lin[c->lm_head];
    return c->opt.mode == QD_MODE_EXACT && c->ops->matmul_bfp && c->ops->bfp_weights &&
           c->opt.recipe != QD_RECIPE_FP32 && (L->mode == QD_LINEAR_BF16 || L->mode == QD_LINEAR_ACT_QAT) &&
           qd_bfp_shape_ok(0, L->in, L->out);
}

/* The bytes of the lm_head's mantissas (0 where head_bfp_on is not). */
static size_t head_bfp_bytes(const model *c)
{
    return head_bfp_on(c) ? qd_bfp_bytes(c->lin[c->lm_head].out, c->lin[c->lm_head].in) : 0;
}
#define OP(c, name, ...) ((c)->ops->name((c)->dev, __VA_ARGS__))

/* A switch read once from the environment into *cache (-1: not read yet): 0
 * where the variable is "0", 1 where it is "1", else dflt; returns it. */
static int env_switch(int *cache, const char *name, int dflt)
{
    if (*cache < 0) {
        const char *e = getenv(name);
        *cache = e && !strcmp(e, "0") ? 0 : e && !strcmp(e, "1") ? 1 : dflt;
    }
    return *cache;
}

static model *ctx_of(qd_backend *b) { return (model *)b->context; }

static void mark(model *c, qd_phase ph)
{
    if (c->ops->mark)
        c->ops->mark(c->dev, ph);
}

static qd_status finish(model *c)
{
    return c->ops->finish ? c->ops->finish(c->dev) : QD_OK;
}

static size_t up256(size_t n) { return (n + 255) & ~(size_t)255; }

/* Every dev buffer of the driver is made and given back through these two,
 * so the bytes of each kind are counted (qd_memory's peak). */
static qd_status dalloc(model *c, void **p, size_t bytes, qd_mem_kind k, const char *what)
{
    QD_TRY(OP(c, alloc, p, bytes, what));
    c->mem_now[k] += bytes;
    if (c->mem_now[k] > c->mem_peak[k])
        c->mem_peak[k] = c->mem_now[k];
    return QD_OK;
}

static void drelease(model *c, void *p, size_t bytes, qd_mem_kind k)
{
    if (!p)
        return;
    c->ops->release(c->dev, p);
    c->mem_now[k] -= bytes;
}

/* A scratch buffer of at least bytes (contents undefined). */
static qd_status scratch(model *c, int slot, size_t bytes, void **out)
{
    if (c->scratch_cap[slot] < bytes) {
        drelease(c, c->scratch[slot], c->scratch_cap[slot], QD_MEM_SCRATCH);
        c->scratch[slot] = NULL;
        c->scratch_cap[slot] = 0;
        QD_TRY(dalloc(c, &c->scratch[slot], bytes, QD_MEM_SCRATCH, "scratch"));
        c->scratch_cap[slot] = bytes;
    }
    *out = c->scratch[slot];
    return QD_OK;
}

/* An NVFP4 matrix (rows, cols) laid out on mem: codes, scales, s_dec, each
 * 256-byte aligned (the quant kernels' vector loads). */
static size_t nvfp4_bytes(int64_t rows, int64_t cols)
{
    return up256((size_t)(rows * cols / 2)) + up256((size_t)(rows * cols / 16)) + sizeof(float) * (size_t)rows;
}

static void nvfp4_view(qd_nvfp4 *a, void *mem, int64_t rows, int64_t cols, qd_scale_kind scale)
{
    a->rows = rows;
    a->cols = cols;
    a->codes = (uint8_t *)mem;
    a->scales = a->codes + up256((size_t)(rows * cols / 2));
    a->s_dec = (float *)(a->scales + up256((size_t)(rows * cols / 16)));
    a->per_row = scale;
}

static qd_status act_nvfp4(model *c, qd_nvfp4 *a, int64_t rows, int64_t cols)
{
    void *p;
    c->pre_src = NULL;
    QD_TRY(scratch(c, S_ACT, nvfp4_bytes(rows, cols), &p));
    nvfp4_view(a, p, rows, cols, QD_SCALE_PER_ROW);
    return QD_OK;
}

/* a (rows, cols) = nvfp4_quantize of inp into S_ACT, or what a fused op
 * already wrote there of inp (pre_src): the same bits. */
static qd_status quantize_act(model *c, qd_nvfp4 *a, const float *inp, int64_t rows, int64_t cols)
{
    int pre = c->pre_src == inp && c->pre_rows == rows && c->pre_cols == cols;
    QD_TRY(act_nvfp4(c, a, rows, cols));
    return pre ? QD_OK : OP(c, nvfp4_quantize, a, inp);
}

/* The S_ACT activation a fused op quantizes src (rows, cols) into (the next
 * quantize_act of src then takes it), or NULL where want is 0. */
static qd_status pre_quant(model *c, qd_nvfp4 *a, qd_nvfp4 **q, const float *src, int64_t rows, int64_t cols,
                           int want)
{
    *q = NULL;
    if (!want || rows == 0)
        return QD_OK;
    QD_TRY(act_nvfp4(c, a, rows, cols));
    c->pre_src = src;
    c->pre_rows = rows;
    c->pre_cols = cols;
    *q = a;
    return QD_OK;
}

/* (Re)makes a weight NVFP4 matrix when its shape changes (RAC's width). */
static qd_status weight_nvfp4(model *c, linear *L, int64_t rows, int64_t cols)
{
    if (L->wq_mem && L->wq.rows == rows && L->wq.cols == cols)
        return QD_OK;
    if (L->wq_mem)
        drelease(c, L->wq_mem, nvfp4_bytes(L->wq.rows, L->wq.cols), QD_MEM_QUANT);
    L->wq_mem = NULL;
    QD_TRY(dalloc(c, &L->wq_mem, nvfp4_bytes(rows, cols), QD_MEM_QUANT, "NVFP4 weights"));
    nvfp4_view(&L->wq, L->wq_mem, rows, cols, QD_SCALE_PER_TENSOR);
    return QD_OK;
}

/* ------------------------------------------------------------------------ */
/* the linear layer of every precision recipe                                */

/* Modes with RAC channel sets (the replay trainer's are the rollout's). */
static int has_rac(qd_linear_mode m) { return m == QD_LINEAR_W4A4_RAC || m == QD_LINEAR_W4A4_RAC_STE; }

/* Modes whose forward is the canonical W4A4 product (the replay trainers' too). */
static int is_w4a4(qd_linear_mode m) { return m == QD_LINEAR_W4A4 || m == QD_LINEAR_W4A4_STE || has_rac(m); }

static int is_replay(qd_linear_mode m) { return m == QD_LINEAR_W4A4_STE || m == QD_LINEAR_W4A4_RAC_STE; }

/* Modes whose products read codes rebuilt at every sync (sync_rollout_linear). */
static int is_rollout_quant(qd_linear_mode m) { return m == QD_LINEAR_FP8 || is_w4a4(m); }

/* Modes of a rollout only: no backward. */
static int is_rollout_only(qd_linear_mode m) { return is_rollout_quant(m) && !is_replay(m); }

/* Modes whose working copy in wk is dequant(quantize(W)) (the straight-through weight). */
static int is_fake_quant_weight(qd_linear_mode m)
{
    return m == QD_LINEAR_AQAT || m == QD_LINEAR_SYM_QAT || is_replay(m);
}

/* Diagnostics are gathered now: options.diagnostics, outside a generate that
 * asked for none. */
static int diag_now(const model *c) { return c->opt.diagnostics && !c->diag_paused; }

static int measured(const model *c, const linear *L)
{
    return diag_now(c) && !c->recomputing && L->quantized && L->in % QD_NVFP4_BLOCK == 0;
}

/* Diagnostics' sums stay on the device (d_diag, the ops' diag_add) and come
 * to the host once, when asked for; else each measurement copies its row
 * sums to the host (a wait for the device a linear) and adds them there.
 * The same bits. */
static int diag_on_dev(const model *c)
{
    static int env = -1; /* QUADS_DIAG_DEV=0: the host's sums (the same bits; for the side-by-side) */
    env_switch(&env, "QUADS_DIAG_DEV", 1);
    return env && c->opt.diagnostics && c->ops->diag_add;
}

/* e (dev: 2 rows doubles, sqerr_rows's) added by one diag_add into the
 * d_diag pairs of Ls[k][g] for each of the nsets (<= 32) sets (weights: their
 * weight error's pairs, from 0.0). */
static qd_status diag_add_sets(model *c, linear *const *const *Ls, int nsets, const int32_t *off,
                               const int32_t *d_off, int nseg, const double *e, int rows, int weights)
{
    int32_t *slot = calloc((size_t)(nseg > 0 ? nseg : 1) * (size_t)nsets, sizeof(int32_t));
    if (!slot)
        return qd_error(QD_ERR_NOMEM, "%s backend: diagnostics", c->ops->name);
    for (int k = 0; k < nsets; k++)
        for (int g = 0; g < nseg; g++)
            slot[(size_t)k * nseg + g] = (int32_t)(Ls[k][g] - c->lin) + (weights ? c->nlin : 0);
    qd_status st = OP(c, diag_add, c->d_diag, e, rows, off, d_off, slot, nseg, nsets, weights ? QD_DIAG_SET : 0);
    free(slot);
    return st;
}

static qd_status diag_add_dev(model *c, linear *const *L, const int32_t *off, const int32_t *d_off, int nseg,
                              const double *e, int rows, int weights)
{
    return diag_add_sets(c, &L, 1, off, d_off, nseg, e, rows, weights);
}

/* Diagnostics' weight errors a shape at a time (sqerr_weights, diag_add):
 * whether this instance measures them so. */
static int wgrouped(const model *c) { return diag_on_dev(c) && c->ops->sqerr_weights && c->wmeasured; }

/* The weight errors of the m linears idx[] of one shape, their dev float
 * weights x[j] and fake-quants xh[j] (xh NULL: codes, the linears' own or,
 * where codes is given, codes[j]), in chunks of at most 64 that S_DIAG holds
 * at its planned size (at least one weight); each marked in wmeasured. The
 * bits of measure_weight_error per linear. */
static qd_status measure_weights_grouped(model *c, const int *idx, int m, const float *const *x,
                                         const float *const *xh, const qd_nvfp4 *const *codes)
{
    if (m == 0)
        return QD_OK;
    const linear *L0 = &c->lin[idx[0]];
    size_t per = sizeof(double) * 2 * (size_t)L0->out;
    int chunk = c->plan_sdiag ? (int)(c->plan_sdiag / per) : 64; /* no plan (no workload): not bounded by one */
    chunk = chunk < 1 ? 1 : chunk > 64 ? 64 : chunk;
    const qd_nvfp4 *q[64];
    linear *L[64];
    int32_t off[65];
    qd_status st = QD_OK;
    for (int j0 = 0; j0 < m && !st; j0 += chunk) {
        int n = m - j0 < chunk ? m - j0 : chunk;
        void *e;
        st = scratch(c, S_DIAG, per * (size_t)n, &e);
        for (int j = 0; j < n && !st; j++) {
            L[j] = &c->lin[idx[j0 + j]];
            q[j] = codes ? codes[j0 + j] : &L[j]->wq;
            off[j] = j * L0->out;
        }
        off[n] = n * L0->out;
        if (!st)
            st = OP(c, sqerr_weights, (double *)e, x + j0, xh ? xh + j0 : NULL, q, n, L0->out, L0->in);
        if (!st)
            st = diag_add_dev(c, L, off, NULL, n, (const double *)e, n * L0->out, 1);
        for (int j = 0; j < n && !st; j++)
            c->wmeasured[idx[j0 + j]] = 1;
    }
    return st;
}

/* Diagnostics: per-row NVFP4 error sums of the input rows (rows, in) (one
 * global scale per row, §4), then for each of the nsets linear sets Ls[k],
 * segment g's rows off[g] .. off[g+1]-1 added in row order to linear
 * Ls[k][g]'s sums (sets of one linear, or the experts of a grouped
 * projection; several sets: linears of one input, q, k and v or gate and
 * up, whose sums are those of that input, made once). off host, or NULL
 * with d_off on the device (a decode's expert offsets, which only diag_add
 * reads). */
static qd_status measure_act_sets(model *c, linear *const *const *Ls, int nsets, const int32_t *off,
                                  const int32_t *d_off, int nseg, const float *inp, int rows, int in)
{
    if (nsets == 0)
        return QD_OK;
    void *xh, *sums;
    QD_TRY(scratch(c, S_XH, sizeof(float) * (size_t)rows * in, &xh));
    QD_TRY(scratch(c, S_DIAG, sizeof(double) * 2 * (size_t)rows, &sums));
    QD_TRY(OP(c, nvfp4_fake_quant, (float *)xh, inp, rows, in, QD_SCALE_PER_ROW));
    double *e = (double *)sums;
    QD_TRY(OP(c, sqerr_rows, e, e + rows, inp, (const float *)xh, rows, in));
    if (diag_on_dev(c))
        return diag_add_sets(c, Ls, nsets, off, d_off, nseg, e, rows, 0);
    if (!off)
        return qd_error(QD_ERR_ARG, "%s backend: diagnostics of device offsets without diag_add", c->ops->name);
    double *h = malloc(sizeof(double) * 2 * (size_t)(rows ? rows : 1));
    if (!h)
        return qd_error(QD_ERR_NOMEM, "%s backend: diagnostics", c->ops->name);
    qd_status st = OP(c, to_host, h, e, sizeof(double) * 2 * (size_t)rows);
    for (int k = 0; k < nsets && !st; k++)
        for (int g = 0; g < nseg; g++)
            for (int r = off[g]; r < off[g + 1]; r++) {
                Ls[k][g]->act_err += h[r];
                Ls[k][g]->act_norm += h[rows + r];
            }
    free(h);
    return st;
}

static qd_status measure_act_rows(model *c, linear *const *L, const int32_t *off, const int32_t *d_off, int nseg,
                                  const float *inp, int rows, int in)
{
    return measure_act_sets(c, &L, 1, off, d_off, nseg, inp, rows, in);
}

/* The measured ones of n linears of one input (N rows) measured once (32 at
 * a time: diag_add's sets). */
static qd_status measure_act_linears(model *c, linear *const *L, int n, const float *inp, int N)
{
    linear *const *Ls[32];
    int32_t off[2] = {0, N};
    for (int i0 = 0; i0 < n; i0 += 32) {
        int m = 0;
        for (int i = i0; i < n && i < i0 + 32; i++)
            if (measured(c, L[i]))
                Ls[m++] = &L[i];
        QD_TRY(measure_act_sets(c, Ls, m, off, NULL, 1, inp, N, L[0]->in));
    }
    return QD_OK;
}

static qd_status fwd_w4a4(model *c, float *out, const float *inp, linear *L, int N)
{
    qd_nvfp4 a;
    int64_t K = L->in + (has_rac(L->mode) ? L->nrac : 0);
    QD_TRY(act_nvfp4(c, &a, N, K));
    if (has_rac(L->mode)) {
        if (c->rac_stats)
            QD_TRY(OP(c, rac_error, L->d_rac_err, inp, N, L->in));
        QD_TRY(OP(c, rac_augment_act, &a, inp, N, L->in, L->d_rac_ch, L->nrac));
    } else {
        QD_TRY(OP(c, nvfp4_quantize, &a, inp));
    }
    return OP(c, w4a4_gemm, out, &a, &L->wq);
}

static qd_status fwd_fp8(model *c, float *out, const float *inp, const linear *L, int N)
{
    void *qa, *sa;
    QD_TRY(scratch(c, S_FP8Q, (size_t)N * L->in, &qa));
    QD_TRY(scratch(c, S_FP8S, sizeof(float) * (size_t)N, &sa));
    QD_TRY(OP(c, fp8_quantize_rows, qa, sa, inp, N, L->in));
    return OP(c, fp8_gemm, out, qa, sa, L->w8, L->w8_inv, N, L->out, L->in);
}

/* The input a BF16/QAT linear really multiplies: x itself (FP32), rounded to
 * BF16, or fake-quantized to NVFP4 with one global scale per row (sym-QAT, the
 * activation-only ablation). For a replay trainer's backward, the activation
 * its W4A4 product multiplied, bit for bit: that fake-quant, or under RAC the
 * same plus the dequantized residuals on the channels (docs/numerics.md §5). */
static qd_status effective_input(model *c, const float **xe, const float *inp, const linear *L, int N)
{
    *xe = inp;
    if (L->mode == QD_LINEAR_FP32)
        return QD_OK;
    void *p;
    size_t n = (size_t)N * L->in;
    QD_TRY(scratch(c, S_XE, sizeof(float) * (n ? n : 1), &p));
    *xe = p;
    if (L->mode == QD_LINEAR_SYM_QAT || L->mode == QD_LINEAR_W4A4_STE || L->mode == QD_LINEAR_ACT_QAT)
        return OP(c, nvfp4_fake_quant, p, inp, N, L->in, QD_SCALE_PER_ROW);
    if (L->mode == QD_LINEAR_W4A4_RAC_STE)
        return N ? OP(c, rac_fake_quant, p, inp, N, L->in, L->d_rac_ch, L->nrac) : QD_OK;
    return OP(c, round_bf16, p, inp, n);
}

/* effective_input of a linear's matmul, matmul_w16 or matmul_backward (the
 * ops rounds_bf16_input speaks for): a BF16 linear's input as it is where
 * those round it themselves (QUADS_ROUND_INPUT=1: rounded here all the same) */
static int input_unrounded(const model *c, const linear *L, int N)
{
    static int env = -1;
    env_switch(&env, "QUADS_ROUND_INPUT", 0);
    return L->mode == QD_LINEAR_BF16 && !env && c->ops->rounds_bf16_input &&
           c->ops->rounds_bf16_input(c->dev, N, L->in, L->out);
}

static qd_status linear_input(model *c, const float **xe, const float *inp, const linear *L, int N)
{
    if (input_unrounded(c, L, N)) {
        *xe = inp;
        return QD_OK;
    }
    return effective_input(c, xe, inp, L, N);
}

/* AQAT's input is BF16-rounded (effective_input) and its weight a per-tensor
 * fake-quant; sym-QAT's and replay's inputs are NVFP4 fake-quants, not BF16 values. */
static qd_prec prec_of(const linear *L)
{
    return L->mode == QD_LINEAR_BF16 ? QD_PREC_BF16 : L->mode == QD_LINEAR_AQAT ? QD_PREC_BF16_X : QD_PREC_F32;
}

/* out (N, out) = x (N, in) . W^T under the layer's mode; its input measured
 * by diagnostics unless the caller did (measure 0). */
static qd_status linear_forward_m(model *c, float *out, const float *inp, linear *L, int N, int measure)
{
    if (N == 0)
        return QD_OK;
    if (measure && measured(c, L)) {
        int32_t off[2] = {0, N};
        QD_TRY(measure_act_rows(c, &L, off, NULL, 1, inp, N, L->in));
    }
    if (is_w4a4(L->mode))
        return fwd_w4a4(c, out, inp, L, N);
    if (L->mode == QD_LINEAR_FP8)
        return fwd_fp8(c, out, inp, L, N);
    const float *xe;
    QD_TRY(linear_input(c, &xe, inp, L, N));
    if (c->head_bfp && L == &c->lin[c->lm_head])
        return OP(c, matmul_bfp, out, xe, c->head_bfp, N, L->in, L->out);
    if (L->wk16 != NOT_HELD)
        return OP(c, matmul_w16, out, xe, c->wk16 + L->wk16, N, L->in, L->out, prec_of(L));
    return OP(c, matmul, out, xe, LW(c, L), N, L->in, L->out, prec_of(L));
}

static qd_status linear_forward(model *c, float *out, const float *inp, linear *L, int N)
{
    return linear_forward_m(c, out, inp, L, N, 1);
}

/* A plain W4A4 linear (no RAC channels, no diagnostics): its input's codes
 * depend on the input alone, so linears reading one input can share them. */
static int shares_act(const model *c, const linear *L)
{
    (void)c;
    return L->mode == QD_LINEAR_W4A4 || L->mode == QD_LINEAR_W4A4_STE;
}

/* Linears of one input that rac_multi augments in one call: every one RAC,
 * of one input width (the op present). */
static int rac_multi_ok(const model *c, const linear *const *L, int n)
{
    if (!c->ops->rac_multi || n < 2 || n > QD_RAC_MULTI)
        return 0;
    for (int i = 0; i < n; i++)
        if (!has_rac(L[i]->mode) || L[i]->in != L[0]->in)
            return 0;
    return 1;
}

/* count NVFP4 activations (rows, in + nrac[i]) one after the other on S_ACT. */
static size_t acts_bytes(int64_t rows, int64_t in, const int64_t *nrac, int count)
{
    size_t b = 0;
    for (int i = 0; i < count; i++)
        b += up256(nvfp4_bytes(rows, in + nrac[i]));
    return b;
}

static qd_status acts_nvfp4(model *c, qd_nvfp4 *a, int64_t rows, int64_t in, const int64_t *nrac, int count)
{
    void *p;
    c->pre_src = NULL;
    QD_TRY(scratch(c, S_ACT, acts_bytes(rows, in, nrac, count), &p));
    for (int i = 0; i < count; i++) {
        nvfp4_view(&a[i], p, rows, in + nrac[i], QD_SCALE_PER_ROW);
        p = (char *)p + up256(nvfp4_bytes(rows, in + nrac[i]));
    }
    return QD_OK;
}

/* RAC's augmented activations of count linears of one input: the rows
 * off[e] .. off[e+1]-1 of x (off[E], in) with channel set ch[i][e] (statistics
 * into err[i][e] when gathered) into a[i], by rac_multi: the bits of
 * rac_grouped (rac_error and rac_augment_act) per linear. */
static qd_status rac_acts(model *c, qd_nvfp4 *a, double *const *const *err, const int64_t *const *const *ch,
                          const int64_t *nrac, int count, const int32_t *off, const int32_t *d_off, int E,
                          const float *x, int in)
{
    qd_nvfp4 *ap[QD_RAC_MULTI];
    QD_TRY(acts_nvfp4(c, a, off[E], in, nrac, count));
    for (int i = 0; i < count; i++)
        ap[i] = &a[i];
    if (d_off) /* off holds only off[E] (off_dev) */
        return OP(c, rac_multi_dev, ap, c->rac_stats ? err : NULL, ch, nrac, count, d_off, E, off[E], x, in);
    return OP(c, rac_multi, ap, c->rac_stats ? err : NULL, ch, nrac, count, off, E, x, in);
}

/* out[i] = a[i] . W_i^T of n linears' W4A4 products: w4a4_gemm_multi, or
 * w4a4_gemm per product where a backend leaves it NULL. */
static qd_status gemms(model *c, float *const *out, const qd_nvfp4 *a, int a_step, linear *const *L, int n)
{
    const qd_nvfp4 *ap[QD_RAC_MULTI], *wp[QD_RAC_MULTI];
    if (!c->ops->w4a4_gemm_multi || n > QD_RAC_MULTI) {
        for (int i = 0; i < n; i++)
            QD_TRY(OP(c, w4a4_gemm, out[i], &a[i * a_step], &L[i]->wq));
        return QD_OK;
    }
    for (int i = 0; i < n; i++) {
        ap[i] = &a[i * a_step];
        wp[i] = &L[i]->wq;
    }
    return OP(c, w4a4_gemm_multi, out, ap, wp, n);
}

/* inp (n floats) unchanged until hold(c, NULL, 0): the ops' hold_input */
static void hold(model *c, const float *inp, size_t n)
{
    if (c->ops->hold_input)
        c->ops->hold_input(c->dev, inp, n);
}

/* out[i] (N, L[i]->out) = inp (N, in) . W_i^T for n linears of one input (q, k
 * and v): where every one is plain W4A4 the input is quantized once and each
 * product reads those codes, the bits of n linear_forward calls; where every
 * one is RAC, their augmented activations come from one rac_multi. */
static qd_status linears_forward(model *c, float *const *out, const float *inp, linear *const *L, int n, int N)
{
    if (N > 0 && rac_multi_ok(c, (const linear *const *)L, n)) {
        qd_nvfp4 a[QD_RAC_MULTI];
        int64_t nr[QD_RAC_MULTI];
        double *const *err[QD_RAC_MULTI];
        const int64_t *const *ch[QD_RAC_MULTI];
        int32_t off[2] = {0, N};
        QD_TRY(measure_act_linears(c, L, n, inp, N));
        for (int i = 0; i < n; i++) {
            nr[i] = L[i]->nrac;
            err[i] = &L[i]->d_rac_err;
            ch[i] = (const int64_t *const *)&L[i]->d_rac_ch;
        }
        QD_TRY(rac_acts(c, a, err, ch, nr, n, off, NULL, 1, inp, L[0]->in));
        return gemms(c, out, a, 1, L, n);
    }
    int share = N > 0;
    for (int i = 0; i < n; i++)
        share = share && shares_act(c, L[i]) && L[i]->in == L[0]->in;
    int same_in = 1;
    for (int i = 0; i < n; i++)
        same_in = same_in && L[i]->in == L[0]->in;
    if (N > 0 && same_in)
        QD_TRY(measure_act_linears(c, L, n, inp, N));
    if (!share) {
        qd_status st = QD_OK;
        hold(c, inp, (size_t)N * L[0]->in); /* the products may share what they make of inp */
        for (int i = 0; i < n && !st; i++)
            st = linear_forward_m(c, out[i], inp, L[i], N, !same_in);
        hold(c, NULL, 0);
        return st;
    }
    qd_nvfp4 a;
    QD_TRY(quantize_act(c, &a, inp, N, L[0]->in));
    return gemms(c, out, &a, 0, L, n);
}

/* dinp += dout . W_eff (flags QD_BWD_DX_SET: =, dinp's first writer); grad(W) +=
 * dout^T . x_eff (straight-through; W_eff is the working copy in wk, x_eff
 * effective_input's). */
static qd_status linear_backward(model *c, float *dinp, const float *dout, const float *inp, const linear *L,
                                 int N, int flags)
{
    if (N == 0)
        return QD_OK;
    const float *xe;
    QD_TRY(linear_input(c, &xe, inp, L, N));
    return OP(c, matmul_backward, dinp, c->grads + L->w, dout, xe, LW(c, L), N, L->in, L->out, flags);
}

/* ------------------------------------------------------------------------ */
/* weight sync                                                               */

/* The RAC channels of a rollout's linears for this sync: of largest
 * activation error since the last one (the op rac_select, on the device,
 * all linears in one call), the statistics then zeroed; the host copy of the
 * channels is fetched when read (rac_host). The sets set_rac_state
 * installed, and a replay trainer's, are kept. */
static qd_status rac_pick(model *c)
{
    int m = 0;
    for (int i = 0; i < c->nlin; i++)
        m += c->lin[i].mode == QD_LINEAR_W4A4_RAC;
    if (!m || c->rac_pending)
        return QD_OK;
    size_t *off = malloc(sizeof(size_t) * (size_t)m);
    int *K = malloc(sizeof(int) * (size_t)m);
    qd_status st = off && K ? QD_OK : qd_error(QD_ERR_NOMEM, "%s backend: RAC channels", c->ops->name);
    for (int i = 0, j = 0; i < c->nlin && !st; i++) {
        linear *L = &c->lin[i];
        if (L->mode != QD_LINEAR_W4A4_RAC)
            continue;
        off[j] = (size_t)(L->rac_ch - c->rac_ch);
        K[j++] = L->in;
        L->nrac = qd_rac_count(c->opt.rac_ratio, L->in);
    }
    if (!st)
        st = OP(c, rac_select, c->d_rac_ch, c->d_rac_err, off, K, m, c->opt.rac_ratio);
    free(off);
    free(K);
    QD_TRY(st);
    c->rac_host_stale = 1;
    return OP(c, zero, c->d_rac_err, sizeof(double) * c->nrac_in);
}

/* The host copy of the RAC channels, fetched after a pick on the device. */
static qd_status rac_host(model *c)
{
    if (!c->rac_host_stale)
        return QD_OK;
    QD_TRY(OP(c, to_host, c->rac_ch, c->d_rac_ch, sizeof(int64_t) * c->nrac_in));
    c->rac_host_stale = 0;
    return QD_OK;
}

/* A W4A4 linear's codes for this sync made ready (RAC channels picked): the
 * NVFP4 matrix (out, in + the channels) there; returns those channels' count. */
static qd_status codes_prepare(model *c, linear *L, int64_t *n)
{
    *n = has_rac(L->mode) ? L->nrac : 0;
    return weight_nvfp4(c, L, L->out, L->in + *n);
}

/* The rollout copies of one quantized linear from its float weight w (dev:
 * the master, the trainer's master, or a lean instance's staging buffer). */
static qd_status sync_rollout_linear(model *c, linear *L, const float *w)
{
    if (L->mode == QD_LINEAR_FP8)
        return OP(c, fp8_quantize_rows, L->w8, L->w8_inv, w, L->out, L->in);
    int64_t n;
    QD_TRY(codes_prepare(c, L, &n));
    return n ? OP(c, rac_augment_weight, &L->wq, w, L->out, L->in, L->d_rac_ch, n) : OP(c, nvfp4_quantize, &L->wq, w);
}

/* The W4A4 linears of a sync grouped by shape: (out, in, RAC channels), then index. */
typedef struct {
    int out, in, i;
    int64_t n;
} codes_key;

static int codes_key_cmp(const void *pa, const void *pb)
{
    const codes_key *a = pa, *b = pb;
    if (a->out != b->out)
        return a->out < b->out ? -1 : 1;
    if (a->in != b->in)
        return a->in < b->in ? -1 : 1;
    if (a->n != b->n)
        return a->n < b->n ? -1 : 1;
    return (a->i > b->i) - (a->i < b->i);
}

static int same_shape(const codes_key *a, const codes_key *b)
{
    return a->out == b->out && a->in == b->in && a->n == b->n;
}

/* Whether linear i takes part in a shape-grouped pass (*take) and its RAC
 * channels (*n), u the pass's own data; an error stops the pass. */
typedef qd_status (*shape_pick)(model *c, int i, const void *u, int *take, int64_t *n);

/* The linears pick takes, in index order, as keys sorted by shape into *out
 * (malloc'd, nlin entries) and their count into *m; shape_end then gives
 * each group's end. */
static qd_status shape_sort(model *c, shape_pick pick, const void *u, codes_key **out, int *m)
{
    codes_key *k = malloc(sizeof *k * (size_t)(c->nlin ? c->nlin : 1));
    qd_status st = k ? QD_OK : qd_error(QD_ERR_NOMEM, "%s backend: weight sync", c->ops->name);
    *m = 0;
    for (int i = 0; i < c->nlin && !st; i++) {
        int take = 0;
        int64_t n = 0;
        st = pick(c, i, u, &take, &n);
        if (!st && take)
            k[(*m)++] = (codes_key){.out = c->lin[i].out, .in = c->lin[i].in, .i = i, .n = n};
    }
    if (!st)
        qsort(k, (size_t)*m, sizeof *k, codes_key_cmp);
    if (st) {
        free(k);
        k = NULL;
    }
    *out = k;
    return st;
}

/* The end of the shape group that starts at k[j0]. */
static int shape_end(const codes_key *k, int m, int j0)
{
    int j1 = j0 + 1;
    while (j1 < m && same_shape(&k[j1], &k[j0]))
        j1++;
    return j1;
}

/* m weights x[j] (out, in) of one shape into q[j] (with n RAC channels
 * ch[j] each) in one call (nvfp4_quantize_weights), or per weight where a
 * backend has no such op. */
static qd_status quantize_shape(model *c, qd_nvfp4 *const *q, const float *const *x, const int64_t *const *ch, int m,
                                int out, int in, int64_t n)
{
    if (c->ops->nvfp4_quantize_weights)
        return OP(c, nvfp4_quantize_weights, q, x, ch, m, out, in, n);
    for (int j = 0; j < m; j++)
        QD_TRY(n ? OP(c, rac_augment_weight, q[j], x[j], out, in, ch[j], n) : OP(c, nvfp4_quantize, q[j], x[j]));
    return QD_OK;
}

/* One shape's linears k[0 .. m-1] quantized from src into their codes (quantize_shape). */
static qd_status codes_group(model *c, const codes_key *k, int m, const float *src, qd_nvfp4 **q, const float **x,
                             const int64_t **ch)
{
    for (int j = 0; j < m; j++) {
        linear *L = &c->lin[k[j].i];
        q[j] = &L->wq;
        x[j] = src + L->w;
        ch[j] = L->d_rac_ch;
    }
    return quantize_shape(c, q, x, ch, m, k[0].out, k[0].in, k[0].n);
}

/* The codes of every W4A4 linear (the rollout's, RAC too, and a replay
 * trainer's) from the float weights in src (dev, the flat layout: the master,
 * or the trainer's master a lean instance syncs from; RAC channels picked):
 * prepared one by one, then quantized a shape at a time (the experts of a layer in one call), the
 * bits of sync_rollout_linear per linear. */
static qd_status pick_codes(model *c, int i, const void *u, int *take, int64_t *n)
{
    (void)u;
    *take = is_w4a4(c->lin[i].mode);
    return *take ? codes_prepare(c, &c->lin[i], n) : QD_OK;
}

static qd_status sync_codes(model *c, const float *src)
{
    codes_key *k = NULL;
    int m = 0;
    void **p = malloc(sizeof(void *) * 3 * (size_t)(c->nlin ? c->nlin : 1));
    int *idx = malloc(sizeof(int) * (size_t)(c->nlin ? c->nlin : 1));
    qd_status st = p && idx ? shape_sort(c, pick_codes, NULL, &k, &m)
                            : qd_error(QD_ERR_NOMEM, "%s backend: weight sync", c->ops->name);
    for (int j0 = 0, j1; j0 < m && !st; j0 = j1) {
        j1 = shape_end(k, m, j0);
        const float **x = (const float **)(p + c->nlin);
        st = codes_group(c, k + j0, j1 - j0, src, (qd_nvfp4 **)p, x, (const int64_t **)(p + 2 * c->nlin));
        /* the weight errors of the group's measured linears, from their codes */
        int nm = 0;
        for (int j = j0; j < j1 && wgrouped(c); j++)
            if (measured(c, &c->lin[k[j].i])) {
                x[nm] = src + c->lin[k[j].i].w;
                idx[nm++] = k[j].i;
            }
        if (!st)
            st = measure_weights_grouped(c, idx, nm, x, NULL, NULL);
    }
    free(idx);
    free(k);
    free(p);
    return st;
}

/* The weight errors of diagnostics for the measured linears that have no
 * W4A4 codes of their own (the BF16 and FP8 recipes'; in a lean instance
 * the fake-quant weights' too, which its sync makes a tensor at a time;
 * elsewhere measure_fake_quants reads those fake-quants),
 * from the float weights in src (dev), a shape at a time: each chunk of a
 * shape quantized into S_XH (quantize_shape) and measured against those codes (measure_weights_grouped; the
 * error from the codes is the fake-quant's, test_ops'
 * sqerr_weights_codes_equal_fake_quant), where sync_linear measured them one
 * by one: five or so small launches a linear, about 800 a sync of the
 * study's 106M model (its bf16 and fp8 syncs took 0.22-0.26 s against
 * nvfp4's 0.03 on an H100). The chunks stay within the plan's S_XH (which
 * holds one linear's float fake-quant); a shape where fewer than two fit is
 * left to sync_linear. */
static qd_status pick_uncoded(model *c, int i, const void *u, int *take, int64_t *n)
{
    const linear *L = &c->lin[i];
    (void)u;
    (void)n;
    *take = measured(c, L) && !is_w4a4(L->mode) && (c->lean || !is_fake_quant_weight(L->mode)) && !c->wmeasured[i];
    return QD_OK;
}

static qd_status measure_uncoded(model *c, const float *src)
{
    if (!src || !wgrouped(c) || !c->plan_sxh)
        return QD_OK;
    codes_key *k = NULL;
    int m = 0;
    qd_status st = shape_sort(c, pick_uncoded, NULL, &k, &m);
    for (int j0 = 0, j1; j0 < m && !st; j0 = j1) {
        j1 = shape_end(k, m, j0);
        const int out = k[j0].out, in = k[j0].in;
        const size_t per = up256(nvfp4_bytes(out, in));
        const size_t fit = c->plan_sxh / per;
        const int chunk = fit > 64 ? 64 : (int)fit;
        for (int a = j0; a + 1 < j1 && chunk >= 2 && !st; a += chunk) {
            const int n = j1 - a < chunk ? j1 - a : chunk;
            qd_nvfp4 q[64];
            qd_nvfp4 *qp[64];
            const float *x[64];
            const int64_t *ch[64];
            int idx[64];
            void *mem;
            st = scratch(c, S_XH, per * (size_t)n, &mem);
            for (int j = 0; j < n && !st; j++) {
                nvfp4_view(&q[j], (char *)mem + per * (size_t)j, out, in, QD_SCALE_PER_TENSOR);
                qp[j] = &q[j];
                idx[j] = k[a + j].i;
                x[j] = src + c->lin[idx[j]].w;
                ch[j] = NULL;
            }
            if (!st)
                st = quantize_shape(c, qp, x, ch, n, out, in, 0);
            if (!st)
                st = measure_weights_grouped(c, idx, n, x, NULL, (const qd_nvfp4 *const *)qp);
        }
    }
    free(k);
    return st;
}

/* Diagnostics: relative squared NVFP4 error of the float weight w (dev);
 * per-row sums in double, rows added in order. fq: w's per-tensor fake-quant
 * where the sync made it already (a fake-quant working weight), else NULL. */
static qd_status measure_weight_error(model *c, linear *L, const float *w, const float *fq)
{
    void *wh = (void *)fq, *sums;
    QD_TRY(scratch(c, S_DIAG, sizeof(double) * 2 * (size_t)L->out, &sums));
    if (!fq) {
        QD_TRY(scratch(c, S_XH, sizeof(float) * (size_t)L->out * L->in, &wh));
        QD_TRY(OP(c, nvfp4_fake_quant, wh, w, L->out, L->in, QD_SCALE_PER_TENSOR));
    }
    double *e = sums;
    QD_TRY(OP(c, sqerr_rows, e, e + L->out, w, wh, L->out, L->in));
    if (diag_on_dev(c)) {
        int32_t off[2] = {0, L->out};
        return diag_add_dev(c, &L, off, NULL, 1, e, L->out, 1);
    }
    double *h = malloc(sizeof(double) * 2 * (size_t)L->out), num = 0, den = 0;
    if (!h)
        return qd_error(QD_ERR_NOMEM, "%s backend: diagnostics", c->ops->name);
    qd_status st = OP(c, to_host, h, e, sizeof(double) * 2 * (size_t)L->out);
    for (int r = 0; r < L->out && !st; r++) {
        num += h[r];
        den += h[L->out + r];
    }
    free(h);
    L->weight_err = den > 0 ? num / den : 0.0;
    return st;
}

/* The working copies of a linear's weight from its float weight w (dev):
 * the codes the forward multiplies and, for a trainer, the weight its
 * backward multiplies (the replay trainer has both: the rollout's codes
 * forward, their dequantization backward). */
static qd_status sync_linear(model *c, linear *L, const float *w, int codes_done)
{
    if (measured(c, L) && !(c->wmeasured && c->wmeasured[L - c->lin]))
        QD_TRY(measure_weight_error(c, L, w, NULL));
    if (is_rollout_quant(L->mode) && !(codes_done && is_w4a4(L->mode)))
        QD_TRY(sync_rollout_linear(c, L, w));
    if (is_fake_quant_weight(L->mode))
        return OP(c, nvfp4_fake_quant, LW(c, L), w, L->out, L->in, QD_SCALE_PER_TENSOR);
    return QD_OK; /* BF16: rounded with everything else */
}

/* A linear whose sync_linear (codes done) is only its fake-quant working
 * weight (and the weight error of diagnostics, which reads that fake-quant). */
static int fake_quant_only(const model *c, const linear *L)
{
    return is_fake_quant_weight(L->mode) && L->wk != NOT_HELD && !(is_rollout_quant(L->mode) && !is_w4a4(L->mode));
}

/* Whether a sync makes the fake_quant_only linears' weights a shape at a
 * time (the ops' nvfp4_fake_quant_weights; QUADS_FQ_GROUPED=0: per tensor,
 * the same bits). The memory plan asks it too (their weight error reads
 * those fake-quants: no S_XH). */
static int fq_grouped(const model *c)
{
    static int env = -1;
    env_switch(&env, "QUADS_FQ_GROUPED", 1);
    return env && c->ops->nvfp4_fake_quant_weights;
}

/* The fake-quant working weights of the fake_quant_only linears from src,
 * a shape at a time through the ops' nvfp4_fake_quant_weights (the bits of
 * sync_linear's op per linear); done[i] set for the linears it took. */
static qd_status pick_fake_quant(model *c, int i, const void *u, int *take, int64_t *n)
{
    (void)u;
    (void)n;
    *take = fake_quant_only(c, &c->lin[i]);
    return QD_OK;
}

static qd_status sync_fake_quants(model *c, const float *src, unsigned char *done)
{
    if (!fq_grouped(c))
        return QD_OK;
    codes_key *k = NULL;
    int m = 0;
    void **p = malloc(sizeof(void *) * 2 * (size_t)(c->nlin ? c->nlin : 1));
    qd_status st = p ? shape_sort(c, pick_fake_quant, NULL, &k, &m)
                     : qd_error(QD_ERR_NOMEM, "%s backend: weight sync", c->ops->name);
    float **out = (float **)p;
    const float **x = (const float **)(p + c->nlin);
    for (int j0 = 0, j1; j0 < m && !st; j0 = j1) {
        j1 = shape_end(k, m, j0);
        for (int j = j0; j < j1; j++) {
            const linear *L = &c->lin[k[j].i];
            out[j - j0] = LW(c, L);
            x[j - j0] = src + L->w;
        }
        st = OP(c, nvfp4_fake_quant_weights, out, x, j1 - j0, k[j0].out, k[j0].in);
        if (st == QD_ERR_UNSUPPORTED) { /* nothing enqueued: sync_linear does them */
            st = QD_OK;
            break;
        }
        for (int j = j0; j < j1 && !st; j++)
            done[k[j].i] = 1;
    }
    free(k);
    free(p);
    return st;
}

/* The weight errors of the measured linears whose fake-quant working weight
 * this sync wrote (done[i]) and no grouped measurement took from their codes:
 * read from those fake-quants, a shape at a time where the ops offer it. */
static qd_status pick_measured(model *c, int i, const void *u, int *take, int64_t *n)
{
    const unsigned char *done = u;
    (void)n;
    *take = done[i] && measured(c, &c->lin[i]) && !(c->wmeasured && c->wmeasured[i]);
    return QD_OK;
}

static qd_status measure_fake_quants(model *c, const unsigned char *done)
{
    codes_key *k = NULL;
    int m = 0;
    int *idx = malloc(sizeof(int) * (size_t)(c->nlin ? c->nlin : 1));
    const float **x = malloc(sizeof(float *) * 2 * (size_t)(c->nlin ? c->nlin : 1));
    qd_status st = idx && x ? shape_sort(c, pick_measured, done, &k, &m)
                            : qd_error(QD_ERR_NOMEM, "%s backend: weight sync", c->ops->name);
    for (int j0 = 0, j1; j0 < m && !st; j0 = j1) {
        j1 = shape_end(k, m, j0);
        for (int j = j0; j < j1; j++) {
            linear *L = &c->lin[k[j].i];
            idx[j - j0] = k[j].i;
            x[j - j0] = c->params + L->w;
            x[c->nlin + j - j0] = LW(c, L);
        }
        if (wgrouped(c)) {
            st = measure_weights_grouped(c, idx, j1 - j0, x, x + c->nlin, NULL);
        } else {
            for (int j = j0; j < j1 && !st; j++)
                st = measure_weight_error(c, &c->lin[k[j].i], x[j - j0], x[c->nlin + j - j0]);
        }
    }
    free(k);
    free(idx);
    free(x);
    return st;
}

static int range_cmp(const void *pa, const void *pb)
{
    const size_t *a = pa, *b = pb;
    return (a[0] > b[0]) - (a[0] < b[0]);
}

/* wk = round_bf16(params) (an instance with a master: the same offsets)
 * outside the working weights of the linears done[i] (their fake-quants
 * wrote them): the runs between those, ascending, an op each. */
static qd_status round_rest(model *c, const unsigned char *done)
{
    size_t *r = malloc(sizeof(size_t) * 2 * (size_t)(c->nlin ? c->nlin : 1)), at = 0;
    if (!r)
        return qd_error(QD_ERR_NOMEM, "%s backend: weight sync", c->ops->name);
    int m = 0;
    for (int i = 0; i < c->nlin; i++)
        if (done[i]) {
            r[2 * m] = c->lin[i].wk;
            r[2 * m + 1] = c->lin[i].wk + (size_t)c->lin[i].out * (size_t)c->lin[i].in;
            m++;
        }
    qsort(r, (size_t)m, 2 * sizeof(size_t), range_cmp);
    qd_status st = QD_OK;
    for (int j = 0; j <= m && !st; j++) {
        size_t end = j < m ? r[2 * j] : c->nfloats;
        if (end > at)
            st = OP(c, round_bf16, c->wk + at, c->params + at, end - at);
        if (j < m && r[2 * j + 1] > at)
            at = r[2 * j + 1];
    }
    free(r);
    return st;
}

/* Tensor t of the flat layout is the weight of a linear that fake_quant_only
 * says the sync writes (fq[t] = 1); malloc'd, NULL when out of memory. */
static unsigned char *fake_quant_tensors(const model *c)
{
    unsigned char *fq = calloc((size_t)(c->ninfo ? c->ninfo : 1), 1);
    for (int i = 0; fq && i < c->nlin; i++)
        if (fake_quant_only(c, &c->lin[i]))
            fq[tensor_at(c, c->lin[i].w)] = 1;
    return fq;
}

/* Where a weight sync of a lean instance (or a fill) reads the float
 * weights: host (the caller's array), dev (another instance's master), fill
 * (the caller's, through the host buffer buf of cap floats), else zeros (at
 * init). */
typedef struct {
    const float *host, *dev;
    qd_weight_fill fill;
    void *user;
    float *buf;
    size_t cap;
} wsrc;

/* dst (dev, n floats) = floats k0 .. k0+n-1 of tensor t's weights (a fill
 * is asked for the whole tensor at k0 = 0, ranges read in ascending order). */
static qd_status load_range(model *c, float *dst, wsrc *s, int t, size_t k0, size_t n)
{
    size_t off = c->info[t].offset + k0, all = (size_t)(c->info[t].rows * c->info[t].cols);
    if (s->host)
        return OP(c, to_dev, dst, s->host + off, sizeof(float) * n);
    if (s->dev)
        return OP(c, copy, dst, s->dev + off, sizeof(float) * n);
    if (!s->fill)
        return OP(c, zero, dst, sizeof(float) * n);
    if (k0 == 0 && s->cap < all) {
        free(s->buf);
        s->buf = malloc(sizeof(float) * all);
        s->cap = s->buf ? all : 0;
        if (!s->buf)
            return qd_error(QD_ERR_NOMEM, "%s backend: weight sync (%s)", c->ops->name, c->info[t].name);
    }
    if (k0 == 0)
        QD_TRY(s->fill(s->user, t, s->buf, all));
    return OP(c, to_dev, dst, s->buf + k0, sizeof(float) * n);
}

static qd_status load_tensor(model *c, float *dst, wsrc *s, int t, size_t n)
{
    return load_range(c, dst, s, t, 0, n);
}

/* The floats a lean sync converts to BF16 at a time through S_STAGE. */
enum { STAGE_CHUNK = 1 << 22 };

/* A tensor held as BF16 and not staged whole: converted chunk by chunk (from
 * another instance's master at once). */
static qd_status sync_bf16(model *c, int t, wsrc *s, size_t n)
{
    uint16_t *dst = c->wk16 + c->wk16_at[t];
    if (s->dev)
        return OP(c, to_bf16, dst, s->dev + c->info[t].offset, n);
    void *w;
    QD_TRY(scratch(c, S_STAGE, sizeof(float) * (n < STAGE_CHUNK ? n : STAGE_CHUNK), &w));
    for (size_t k = 0; k < n; k += STAGE_CHUNK) {
        size_t m = n - k < STAGE_CHUNK ? n - k : STAGE_CHUNK;
        QD_TRY(load_range(c, w, s, t, k, m));
        QD_TRY(OP(c, to_bf16, dst + k, w, m));
    }
    return QD_OK;
}

/* A lean instance's linear whose weight goes through the staging buffer:
 * its copies are built from the float weight (codes, fake-quant, the
 * weight error of diagnostics). */
static int staged(const model *c, const linear *L)
{
    return L && (measured(c, L) || is_rollout_quant(L->mode) || is_fake_quant_weight(L->mode));
}

/* One tensor of a lean sync: into wk (rounded to BF16 unless fp32) where it
 * is read as float, through S_STAGE into the linear's copies where staged
 * (from another instance's master, read where it is: no staging); the bits
 * of sync_weights' round_bf16 and sync_linear. codes_done: sync_codes made
 * the W4A4 codes. */
static qd_status sync_tensor(model *c, int t, wsrc *s, int codes_done)
{
    const qd_param_info *pi = &c->info[t];
    size_t n = (size_t)(pi->rows * pi->cols);
    linear *L = c->lin_at[t] >= 0 ? &c->lin[c->lin_at[t]] : NULL;
    float *dst = c->wk_at[t] == NOT_HELD ? NULL : c->wk + c->wk_at[t];
    int fp32 = c->opt.recipe == QD_RECIPE_FP32, w16 = c->wk16_at[t] != NOT_HELD;
    if (w16 && !staged(c, L))
        return sync_bf16(c, t, s, n);
    if (!staged(c, L) && s->dev)
        return fp32 ? OP(c, copy, dst, s->dev + pi->offset, sizeof(float) * n)
                    : OP(c, round_bf16, dst, s->dev + pi->offset, n);
    if (!staged(c, L)) {
        QD_TRY(load_tensor(c, dst, s, t, n));
        return fp32 ? QD_OK : OP(c, round_bf16, dst, dst, n);
    }
    const float *w = s->dev ? s->dev + pi->offset : NULL;
    if (!w) {
        void *stage;
        QD_TRY(scratch(c, S_STAGE, sizeof(float) * n, &stage));
        QD_TRY(load_tensor(c, stage, s, t, n));
        w = stage;
    }
    QD_TRY(sync_linear(c, L, w, codes_done));
    if (w16)
        return OP(c, to_bf16, c->wk16 + c->wk16_at[t], w, n);
    if (!dst || is_fake_quant_weight(L->mode))
        return QD_OK;
    return fp32 ? OP(c, copy, dst, w, sizeof(float) * n) : OP(c, round_bf16, dst, w, n);
}

/* Rebuild every working copy from the master weights (NUMERICS.md §5); a
 * lean instance from s, tensor by tensor (an instance with a master takes
 * a fill's values into it first). The W4A4 codes, where the float weights
 * are on the device, a shape at a time (sync_codes). */
static qd_status sync_weights_from(model *c, wsrc *s)
{
    int rounded = c->wk_rounded; /* this sync's only: a failed one leaves no claim behind */
    c->wk_rounded = 0;
    if (c->wmeasured)
        memset(c->wmeasured, 0, (size_t)c->nlin);
    for (int t = 0; !c->lean && s->fill && t < c->ninfo; t++)
        QD_TRY(load_tensor(c, c->params + c->info[t].offset, s, t,
                           (size_t)(c->info[t].rows * c->info[t].cols)));
    const float *src = c->lean ? s->dev : c->params;
    QD_TRY(rac_pick(c));
    if (src)
        QD_TRY(sync_codes(c, src));
    QD_TRY(measure_uncoded(c, src));
    if (c->lean) {
        for (int t = 0; t < c->ninfo; t++)
            QD_TRY(sync_tensor(c, t, s, src != NULL));
    } else {
        unsigned char *done = calloc((size_t)(c->nlin ? c->nlin : 1), 1);
        if (!done)
            return qd_error(QD_ERR_NOMEM, "%s backend: weight sync", c->ops->name);
        qd_status st = sync_fake_quants(c, c->params, done);
        /* the rest of wk: what the fake-quants do not write; the optimizer
         * step's adamw_round wrote it already (all but the fake_quant_only
         * linears, whose fake-quant, grouped or per tensor, writes them) */
        if (!st && c->wk != c->params && !(rounded && !s->fill))
            st = round_rest(c, done);
        if (!st)
            st = measure_fake_quants(c, done);
        for (int i = 0; i < c->nlin && !st; i++)
            if (!done[i])
                st = sync_linear(c, &c->lin[i], c->params + c->lin[i].w, 1);
        free(done);
        QD_TRY(st);
    }
    c->rac_pending = 0;
    if (c->head_bfp) {
        const linear *H = &c->lin[c->lm_head];
        QD_TRY(OP(c, bfp_weights, c->head_bfp, H->wk16 != NOT_HELD ? c->wk16 + H->wk16 : NULL,
                  H->wk16 != NOT_HELD ? NULL : LW(c, H), H->out, H->in));
    }
    if (c->ops->weights_changed)
        QD_TRY(OP(c, weights_changed, c->wk, c->lean ? c->nwk : c->nfloats));
    return finish(c);
}

static qd_status sync_weights(model *c)
{
    return sync_weights_from(c, &(wsrc){0});
}

/* What a lean instance cannot do, named with its role. */
static qd_status lean_refusal(const model *c, const char *what)
{
    return qd_error(QD_ERR_UNSUPPORTED, "%s: a %s backend in the rollout role (recipe %s) keeps no float32 master "
                    "weights (options.keep_master keeps them)", what, c->ops->name, qd_recipe_name(c->opt.recipe));
}

/* The training state (gradients, AdamW moments), zeroed, on first use. */
static qd_status ensure_train(model *c)
{
    if (c->lean)
        return lean_refusal(c, "training state");
    size_t n = sizeof(float) * c->nfloats;
    if (!c->grads)
        QD_TRY(dalloc(c, (void **)&c->grads, n, QD_MEM_GRADS, "gradients"));
    if (!c->m)
        QD_TRY(dalloc(c, (void **)&c->m, n, QD_MEM_ADAM, "AdamW first moments"));
    if (!c->v)
        QD_TRY(dalloc(c, (void **)&c->v, n, QD_MEM_ADAM, "AdamW second moments"));
    return QD_OK;
}

/* ------------------------------------------------------------------------ */
/* activations                                                               */

/* Bump allocator: a first pass with base NULL only counts bytes. */
typedef struct {
    char *base;
    size_t used;
} arena;

static void *take(arena *a, size_t bytes)
{
    void *p = a->base ? a->base + a->used : NULL;
    a->used += up256(bytes);
    return p;
}

#define TAKE_F(a, n) ((float *)take((a), sizeof(float) * (size_t)(n)))
#define TAKE_I(a, n) ((int32_t *)take((a), sizeof(int32_t) * (size_t)(n)))

static void layout_layer(arena *a, layer_acts *s, const model *c, const layer *ly)
{
    const qd_model_config *g = &c->cfg;
    /* size_t products: the memory plan sizes batches whose counts pass 2^31 */
    size_t N = (size_t)c->N, C = (size_t)g->hidden_size, H = (size_t)g->num_attention_heads;
    size_t KV = (size_t)g->num_key_value_heads, D = (size_t)g->head_dim;
    size_t K = ly->moe ? (size_t)g->num_experts_per_tok : 1, R = N * K;
    s->x = TAKE_F(a, N * C);
    s->ln1 = TAKE_F(a, N * C);
    s->rstd1 = TAKE_F(a, N);
    s->q = TAKE_F(a, N * H * D);
    s->k = TAKE_F(a, N * KV * D);
    s->v = TAKE_F(a, N * KV * D);
    s->rstd_q = TAKE_F(a, N * H);
    s->rstd_k = TAKE_F(a, N * KV);
    s->qr = TAKE_F(a, N * H * D);
    s->kr = TAKE_F(a, N * KV * D);
    s->att = TAKE_F(a, N * H * (size_t)c->Tm);
    s->ao = TAKE_F(a, N * H * D);
    s->xmid = TAKE_F(a, N * C);
    s->ln2 = TAKE_F(a, N * C);
    s->rstd2 = TAKE_F(a, N);
    s->probs = TAKE_F(a, N * (size_t)ly->nexp);
    s->topk = TAKE_I(a, N * K);
    s->topw = TAKE_F(a, N * K);
    s->row_tok = TAKE_I(a, R);
    s->row_w = TAKE_F(a, R);
    s->row_rank = TAKE_I(a, R);
    s->tok_rows = TAKE_I(a, R);
    s->xe = TAKE_F(a, R * C);
    s->g = TAKE_F(a, R * (size_t)ly->ffn);
    s->u = TAKE_F(a, R * (size_t)ly->ffn);
    s->h = TAKE_F(a, R * (size_t)ly->ffn);
    s->y = TAKE_F(a, R * C);
}

/* A lean instance (no backward), or options.recompute: the layers share one
 * set of activations, shaped for the widest layer, but for the residual
 * stream entering each (lean: two buffers in turn, a layer reads one and
 * writes the other; recompute: one a layer, the backward recomputes from it)
 * and the experts each token chose (diagnostics reads every layer's). */
static void layout_shared(arena *a, model *c)
{
    int nl = c->cfg.num_hidden_layers;
    layer w = c->layers[0];
    for (int l = 1; l < nl; l++) {
        const layer *ly = &c->layers[l];
        w.moe |= ly->moe;
        w.nexp = ly->nexp > w.nexp ? ly->nexp : w.nexp;
        w.ffn = ly->ffn > w.ffn ? ly->ffn : w.ffn;
    }
    layout_layer(a, &c->acts[0], c, &w);
    size_t N = (size_t)c->N, K = w.moe ? (size_t)c->cfg.num_experts_per_tok : 1, C = (size_t)c->cfg.hidden_size;
    for (int l = 1; l < nl; l++) {
        c->acts[l] = c->acts[0];
        c->acts[l].x = l == 1 || !c->lean ? TAKE_F(a, N * C) : c->acts[l - 2].x;
        c->acts[l].topk = TAKE_I(a, N * K);
    }
    c->rx = c->lean ? NULL : TAKE_F(a, N * C);
}

static void layout_acts(arena *a, model *c)
{
    size_t N = (size_t)c->N, C = (size_t)c->cfg.hidden_size;
    c->d_tok = TAKE_I(a, N);
    c->d_tgt = TAKE_I(a, N);
    c->d_pos = TAKE_I(a, N);
    c->d_row = TAKE_I(a, N);
    c->d_kbase = TAKE_I(a, N);
    c->d_slen = TAKE_I(a, N);
    int shared = c->lean || c->opt.recompute;
    if (shared)
        layout_shared(a, c);
    for (int l = 0; !shared && l < c->cfg.num_hidden_layers; l++)
        layout_layer(a, &c->acts[l], c, &c->layers[l]);
    c->xf = TAKE_F(a, N * C);
    c->lnf = TAKE_F(a, N * C);
    c->rstdf = TAKE_F(a, N);
    c->logits = TAKE_F(a, (c->generating ? (size_t)c->Bl : N) * (size_t)c->cfg.vocab_size);
    c->lse = TAKE_F(a, N);
}

/* Host side: tok, tgt, pos, src, row (N), seq_off (B + 1), and per layer
 * exp_off (nexp + 1). */
static size_t host_bytes(const model *c)
{
    size_t n = sizeof(int32_t) * (5 * (size_t)c->N + c->B + 1);
    for (int l = 0; l < c->cfg.num_hidden_layers; l++)
        n += sizeof(int32_t) * (size_t)(c->layers[l].nexp + 1);
    return n;
}

/* The activations of a batch of c->N tokens, c->B sequences, longest c->Tm. */
/* The arena holds at least this batch's activations (grown, contents lost). */
static qd_status reserve_acts(model *c)
{
    arena a = {NULL, 0};
    layout_acts(&a, c);
    if (a.used > c->arena_cap) {
        drelease(c, c->arena, c->arena_cap, QD_MEM_ACTS);
        c->arena = NULL;
        c->arena_cap = 0;
        QD_TRY(dalloc(c, &c->arena, a.used, QD_MEM_ACTS, "activations"));
        c->arena_cap = a.used;
    }
    return QD_OK;
}

static qd_status alloc_acts(model *c)
{
    QD_TRY(reserve_acts(c));
    arena a = {NULL, 0};
    a.base = c->arena;
    a.used = 0;
    layout_acts(&a, c);
    size_t hb = host_bytes(c);
    if (hb > c->harena_cap) {
        free(c->harena);
        c->harena = malloc(hb);
        c->harena_cap = c->harena ? hb : 0;
        if (!c->harena)
            return qd_error(QD_ERR_NOMEM, "%s backend: batch of %d tokens", c->ops->name, c->N);
    }
    int32_t *h = c->harena;
    c->tok = h, h += c->N;
    c->tgt = h, h += c->N;
    c->pos = h, h += c->N;
    c->src = h, h += c->N;
    c->row = h, h += c->N;
    c->seq_off = h, h += c->B + 1;
    for (int l = 0; l < c->cfg.num_hidden_layers; l++)
        c->acts[l].exp_off = h, h += c->layers[l].nexp + 1;
    return QD_OK;
}

/* The per-token tables to the device: token, target, position, KV row, the
 * first key row of its attention (kbase: its sequence's first token in a
 * prefill, its cache row's first slot in a decode) and its sequence's length. */
static qd_status upload_batch(model *c)
{
    int N = c->N;
    int32_t *t = malloc(sizeof(int32_t) * 2 * (size_t)(N ? N : 1));
    if (!t)
        return qd_error(QD_ERR_NOMEM, "%s backend: batch", c->ops->name);
    for (int b = 0, n = 0; b < c->B; b++)
        for (; n < c->seq_off[b + 1]; n++) {
            t[n] = c->decode ? c->row[n] * c->Tc : c->seq_off[b];
            t[N + n] = c->seq_off[b + 1] - c->seq_off[b];
        }
    size_t nb = sizeof(int32_t) * (size_t)N;
    qd_status st = OP(c, to_dev, c->d_tok, c->tok, nb);
    if (!st)
        st = OP(c, to_dev, c->d_tgt, c->tgt, nb);
    if (!st)
        st = OP(c, to_dev, c->d_pos, c->pos, nb);
    if (!st)
        st = OP(c, to_dev, c->d_row, c->row, nb);
    if (!st)
        st = OP(c, to_dev, c->d_kbase, t, nb);
    if (!st)
        st = OP(c, to_dev, c->d_slen, t + N, nb);
    free(t);
    return st;
}

/* Pack the batch: tokens of row b at seq_off[b] .. seq_off[b+1]-1. */
/* The attention probabilities' row length over a batch whose longest
 * sequence has Tm tokens: a multiple of 4 floats, so that every row starts on
 * 16 bytes (the CUDA fast prefill's tensor-core products need it). */
static int att_stride(int Tm) { return (Tm + 3) & ~3; }

/* bt's tokens as the batch; Bl logit rows in a generate; where row_of is
 * set, sequence b's keys and values go to cache row row_of[b]. */
static qd_status pack_batch_rows(model *c, const qd_batch *bt, int Bl, const int32_t *row_of)
{
    c->N = 0;
    c->Tm = 0;
    for (int b = 0; b < bt->B; b++) {
        c->N += bt->lengths[b];
        if (bt->lengths[b] > c->Tm)
            c->Tm = bt->lengths[b];
    }
    if (c->Tm > c->cfg.max_position_embeddings)
        return qd_error(QD_ERR_SHAPE, "forward: length %d > max_position_embeddings %d", c->Tm,
                        c->cfg.max_position_embeddings);
    c->Tm = att_stride(c->Tm);
    c->B = bt->B;
    c->Bl = Bl;
    c->temp = bt->temperature > 0.0f ? bt->temperature : 1.0f;
    QD_TRY(alloc_acts(c));
    QD_TRY(qd_pack_batch(c->tok, c->tgt, c->pos, c->row, c->src, c->seq_off, bt, c->cfg.vocab_size));
    for (int n = 0; row_of && n < c->N; n++)
        c->row[n] = row_of[c->row[n]];
    return upload_batch(c);
}

static qd_status pack_batch(model *c, const qd_batch *bt)
{
    return pack_batch_rows(c, bt, bt->B, NULL);
}

/* ------------------------------------------------------------------------ */
/* forward                                                                   */

static linear *expert_lin(model *c, const layer *ly, int e, int which)
{
    return &c->lin[ly->mlp0 + 3 * e + which];
}

/* The experts of a layer run as one grouped op per projection: the same rows
 * and operations as one linear_forward per expert, so the same bits. Under RAC
 * every expert quantizes its rows with its own channel set first; the widths
 * agree (qd_rac_select takes floor(ratio * in / 16) * 16 channels of every
 * expert), so one grouped W4A4 product follows. A restored RAC state with
 * unequal widths (not one that this code saves) goes expert by expert. */
static int experts_grouped(const model *c, const layer *ly)
{
    const linear *L0 = &c->lin[ly->mlp0];
    if (!has_rac(L0->mode))
        return 1;
    for (int e = 0; e < ly->nexp; e++)
        for (int w = 0; w < 3; w++)
            if (c->lin[ly->mlp0 + 3 * e + w].nrac != c->lin[ly->mlp0 + w].nrac)
                return 0;
    return 1;
}

/* The experts' dev pointers of projection `which` into host arrays. */
typedef struct {
    linear **L;
    const float **w;
    float **dw;
    const qd_nvfp4 **wq;
    const uint8_t **w8;
    const float **w8_inv;
    double **rac_err;
    const int64_t **rac_ch;
} expert_set;

static void expert_set_free(expert_set *x)
{
    free(x->L);
    free(x->w);
    free(x->dw);
    free(x->wq);
    free(x->w8);
    free(x->w8_inv);
    free(x->rac_err);
    free(x->rac_ch);
}

static qd_status expert_set_make(model *c, expert_set *x, const layer *ly, int which)
{
    int E = ly->nexp;
    x->L = malloc(sizeof(linear *) * E);
    x->w = malloc(sizeof(float *) * E);
    x->dw = malloc(sizeof(float *) * E);
    x->wq = malloc(sizeof(qd_nvfp4 *) * E);
    x->w8 = malloc(sizeof(uint8_t *) * E);
    x->w8_inv = malloc(sizeof(float *) * E);
    x->rac_err = malloc(sizeof(double *) * E);
    x->rac_ch = malloc(sizeof(int64_t *) * E);
    if (!x->L || !x->w || !x->dw || !x->wq || !x->w8 || !x->w8_inv || !x->rac_err || !x->rac_ch) {
        expert_set_free(x);
        return qd_error(QD_ERR_NOMEM, "%s backend: experts", c->ops->name);
    }
    for (int e = 0; e < E; e++) {
        linear *L = expert_lin(c, ly, e, which);
        x->L[e] = L;
        x->w[e] = LW(c, L);
        x->dw[e] = c->grads ? c->grads + L->w : NULL;
        x->wq[e] = &L->wq;
        x->w8[e] = L->w8;
        x->w8_inv[e] = L->w8_inv;
        x->rac_err[e] = L->d_rac_err;
        x->rac_ch[e] = L->d_rac_ch;
    }
    return QD_OK;
}

/* The grouped ops of the experts, or where a backend leaves one NULL
 * (ops.h) one call of its plain op per expert on that expert's rows: the
 * same bits, each grouped op being defined as that loop. */

/* Rows r0 .. r0+m-1 of an NVFP4 matrix (a view of its buffers). */
static qd_nvfp4 nvfp4_rows(const qd_nvfp4 *a, int64_t r0, int64_t m)
{
    qd_nvfp4 v = *a;
    v.rows = m;
    v.codes = a->codes + r0 * (a->cols / 2);
    v.scales = a->scales + r0 * (a->cols / QD_NVFP4_BLOCK);
    if (a->per_row == QD_SCALE_PER_ROW)
        v.s_dec = a->s_dec + r0;
    return v;
}

static qd_status grouped_matmul(model *c, float *out, const float *x, const float *const *w, const int32_t *off,
                                int E, int IC, int OC, qd_prec prec)
{
    if (c->ops->matmul_grouped)
        return OP(c, matmul_grouped, out, x, w, off, E, IC, OC, prec);
    for (int e = 0; e < E; e++) {
        int r0 = off[e], m = off[e + 1] - r0;
        if (m)
            QD_TRY(OP(c, matmul, out + (size_t)r0 * OC, x + (size_t)r0 * IC, w[e], m, IC, OC, prec));
    }
    return QD_OK;
}

static qd_status grouped_matmul_backward(model *c, float *dinp, float *const *dw, const float *dout,
                                         const float *x, const float *const *w, const int32_t *off, int E, int IC,
                                         int OC)
{
    if (c->ops->matmul_grouped_backward)
        return OP(c, matmul_grouped_backward, dinp, dw, dout, x, w, off, E, IC, OC);
    for (int e = 0; e < E; e++) {
        int r0 = off[e], m = off[e + 1] - r0;
        if (m)
            QD_TRY(OP(c, matmul_backward, dinp ? dinp + (size_t)r0 * IC : NULL, dw[e], dout + (size_t)r0 * OC,
                      x + (size_t)r0 * IC, w[e], m, IC, OC, 0));
    }
    return QD_OK;
}

static qd_status grouped_fp8_gemm(model *c, float *y, const uint8_t *qa, const float *sa_inv,
                                  const uint8_t *const *qw, const float *const *sw_inv, const int32_t *off, int E,
                                  int N, int K)
{
    if (c->ops->fp8_gemm_grouped)
        return OP(c, fp8_gemm_grouped, y, qa, sa_inv, qw, sw_inv, off, E, N, K);
    for (int e = 0; e < E; e++) {
        int r0 = off[e], m = off[e + 1] - r0;
        if (m)
            QD_TRY(OP(c, fp8_gemm, y + (size_t)r0 * N, qa + (size_t)r0 * K, sa_inv + r0, qw[e], sw_inv[e], m, N,
                      K));
    }
    return QD_OK;
}

static qd_status grouped_w4a4_gemm(model *c, float *y, const qd_nvfp4 *a, const qd_nvfp4 *const *w,
                                   const layer_acts *s, int E)
{
    const int32_t *off = s->exp_off;
    if (s->off_dev)
        return OP(c, w4a4_gemm_grouped_dev, y, a, w, s->d_off, E, c->N);
    if (c->ops->w4a4_gemm_grouped)
        return OP(c, w4a4_gemm_grouped, y, a, w, off, E);
    for (int e = 0; e < E; e++) {
        int r0 = off[e], m = off[e + 1] - r0;
        qd_nvfp4 v = nvfp4_rows(a, r0, m);
        if (m)
            QD_TRY(OP(c, w4a4_gemm, y + (size_t)r0 * (size_t)w[e]->rows, &v, w[e]));
    }
    return QD_OK;
}

static qd_status grouped_rac(model *c, qd_nvfp4 *a, double *const *err, const int64_t *const *ch,
                             const layer_acts *s, int E, const float *x, int K, int64_t n)
{
    const int32_t *off = s->exp_off;
    if (s->off_dev)
        return OP(c, rac_multi_dev, &a, err ? &err : NULL, &ch, &n, 1, s->d_off, E, off[E], x, K);
    if (c->ops->rac_grouped)
        return OP(c, rac_grouped, a, err, ch, off, E, x, K, n);
    for (int e = 0; e < E; e++) {
        int r0 = off[e], m = off[e + 1] - r0;
        qd_nvfp4 v = nvfp4_rows(a, r0, m);
        if (!m)
            continue;
        if (err)
            QD_TRY(OP(c, rac_error, err[e], x + (size_t)r0 * K, m, K));
        QD_TRY(OP(c, rac_augment_act, &v, x + (size_t)r0 * K, m, K, ch[e], n));
    }
    return QD_OK;
}

/* Whether every expert's projection `which` takes its input rounded to BF16
 * and nothing else (BF16, AQAT: effective_input's round_bf16) with no
 * diagnostics reading the input as it was: then the layer's forward rounds that
 * input once in place (xe16, h16) and neither direction rounds a copy of it. */
static int experts_round_only(model *c, const layer *ly, int which)
{
    for (int e = 0; e < ly->nexp; e++) {
        const linear *L = expert_lin(c, ly, e, which);
        if ((L->mode != QD_LINEAR_BF16 && L->mode != QD_LINEAR_AQAT) || measured(c, L))
            return 0;
    }
    return 1;
}

/* Whether the ops keep the experts' rounded inputs as BF16 bits (experts16). */
static int experts16(const model *c)
{
    const qd_ops *o = c->ops;
    return o->experts16 && o->gather16 && o->swiglu16 && o->matmul_grouped16 && o->matmul_grouped_backward16 &&
           o->experts16(c->dev);
}

/* inp is xe or h of s holding BF16 bits (experts16). */
static int held_bits(const layer_acts *s, const float *inp)
{
    return (inp == s->xe && s->xeb) || (inp == s->h && s->hb);
}

/* inp is xe or h of s, already rounded in place (no effective_input copy). */
static int rounded_in_place(const layer_acts *s, const float *inp)
{
    return (inp == s->xe && s->xe16) || (inp == s->h && s->h16);
}

/* measure_act_sets over the experts' rows of inp, by the offsets where this
 * forward keeps them (the host's, or the device's) */
static qd_status measure_experts(model *c, linear *const *const *Ls, int nsets, const layer_acts *s, int E,
                                 const float *inp, int in)
{
    return measure_act_sets(c, Ls, nsets, s->off_dev ? NULL : s->exp_off, s->off_dev ? s->d_off : NULL, E, inp,
                            s->exp_off[E], in);
}

static qd_status experts_forward_set(model *c, float *out, const float *inp, const layer_acts *s,
                                     const layer *ly, const expert_set *x)
{
    int E = ly->nexp, R = s->exp_off[E];
    const linear *L0 = x->L[0];
    int IC = L0->in, OC = L0->out;
    if (measured(c, L0)) {
        linear *const *one[1] = {x->L};
        QD_TRY(measure_experts(c, one, 1, s, E, inp, IC));
    }
    if (L0->mode == QD_LINEAR_W4A4 || L0->mode == QD_LINEAR_W4A4_STE) {
        qd_nvfp4 a;
        QD_TRY(quantize_act(c, &a, inp, R, IC));
        return grouped_w4a4_gemm(c, out, &a, x->wq, s, E);
    }
    if (has_rac(L0->mode)) {
        qd_nvfp4 a;
        QD_TRY(act_nvfp4(c, &a, R, IC + L0->nrac));
        QD_TRY(grouped_rac(c, &a, c->rac_stats ? x->rac_err : NULL, x->rac_ch, s, E, inp, IC,
                           L0->nrac));
        return grouped_w4a4_gemm(c, out, &a, x->wq, s, E);
    }
    if (L0->mode == QD_LINEAR_FP8) {
        void *qa, *sa;
        QD_TRY(scratch(c, S_FP8Q, (size_t)R * IC, &qa));
        QD_TRY(scratch(c, S_FP8S, sizeof(float) * (size_t)R, &sa));
        QD_TRY(OP(c, fp8_quantize_rows, qa, sa, inp, R, IC));
        return grouped_fp8_gemm(c, out, qa, sa, x->w8, x->w8_inv, s->exp_off, E, OC, IC);
    }
    if (held_bits(s, inp))
        return OP(c, matmul_grouped16, out, (const uint16_t *)inp, x->w, s->exp_off, E, IC, OC, prec_of(L0));
    const float *xe = inp;
    if (!rounded_in_place(s, inp))
        QD_TRY(effective_input(c, &xe, inp, L0, R));
    return grouped_matmul(c, out, xe, x->w, s->exp_off, E, IC, OC, prec_of(L0));
}

/* out (R, OC) = rows of inp (R, IC) of each expert times its projection `which`. */
static qd_status experts_forward(model *c, float *out, const float *inp, const layer_acts *s, const layer *ly,
                                 int which)
{
    if (s->exp_off[ly->nexp] == 0)
        return QD_OK;
    expert_set x;
    QD_TRY(expert_set_make(c, &x, ly, which));
    qd_status st = experts_forward_set(c, out, inp, s, ly, &x);
    expert_set_free(&x);
    return st;
}

/* The gate and up projections of the experts (one input): plain W4A4 experts
 * share one quantization of it (linears_forward's reason), RAC experts take
 * their augmented rows from one rac_multi; then one grouped product each
 * (experts_forward_set's bits). */
static qd_status experts_forward_gate_up(model *c, float *gate, float *up, const float *inp, const layer_acts *s,
                                         const layer *ly)
{
    int E = ly->nexp, R = s->exp_off[E];
    if (R == 0)
        return QD_OK;
    const linear *gu[2] = {expert_lin(c, ly, 0, 0), expert_lin(c, ly, 0, 1)};
    int rac = rac_multi_ok(c, gu, 2);
    if (!rac && (!shares_act(c, gu[0]) || !shares_act(c, gu[1]))) {
        QD_TRY(experts_forward(c, gate, inp, s, ly, 0));
        return experts_forward(c, up, inp, s, ly, 1);
    }
    expert_set x[2];
    QD_TRY(expert_set_make(c, &x[0], ly, 0));
    qd_status st = expert_set_make(c, &x[1], ly, 1);
    if (st) { /* expert_set_make freed x[1] */
        expert_set_free(&x[0]);
        return st;
    }
    qd_nvfp4 a[2];
    memset(a, 0, sizeof a);
    int in = x[0].L[0]->in;
    linear *const *Ls[2];
    int nm = 0;
    for (int w = 0; w < 2; w++)
        if (measured(c, x[w].L[0]))
            Ls[nm++] = x[w].L;
    st = measure_experts(c, Ls, nm, s, E, inp, in);
    if (st) {
        expert_set_free(&x[1]);
        expert_set_free(&x[0]);
        return st;
    }
    if (rac) {
        int64_t nr[2] = {x[0].L[0]->nrac, x[1].L[0]->nrac};
        double *const *err[2] = {x[0].rac_err, x[1].rac_err};
        const int64_t *const *ch[2] = {x[0].rac_ch, x[1].rac_ch};
        if (!st)
            st = rac_acts(c, a, err, ch, nr, 2, s->exp_off, s->off_dev ? s->d_off : NULL, E, inp, in);
    } else {
        st = quantize_act(c, &a[0], inp, R, in); /* gather_nvfp4's codes where it made them */
        a[1] = a[0];
    }
    if (!st)
        st = grouped_w4a4_gemm(c, gate, &a[0], x[0].wq, s, E);
    if (!st)
        st = grouped_w4a4_gemm(c, up, &a[1], x[1].wq, s, E);
    expert_set_free(&x[1]);
    expert_set_free(&x[0]);
    return st;
}

/* effective_input of the experts' rows: under the RAC replay each expert's
 * rows with its own channel set. */
static qd_status experts_effective_input(model *c, const float **xe, const float *inp, const layer_acts *s,
                                         const layer *ly, const expert_set *x)
{
    int IC = x->L[0]->in, R = s->exp_off[ly->nexp];
    if (rounded_in_place(s, inp)) {
        *xe = inp;
        return QD_OK;
    }
    if (x->L[0]->mode != QD_LINEAR_W4A4_RAC_STE)
        return effective_input(c, xe, inp, x->L[0], R);
    void *p;
    QD_TRY(scratch(c, S_XE, sizeof(float) * (size_t)R * IC, &p));
    *xe = p;
    for (int e = 0; e < ly->nexp; e++) {
        int r0 = s->exp_off[e], m = s->exp_off[e + 1] - r0;
        if (m)
            QD_TRY(OP(c, rac_fake_quant, (float *)p + (size_t)r0 * IC, inp + (size_t)r0 * IC, m, IC,
                      x->rac_ch[e], x->L[e]->nrac));
    }
    return QD_OK;
}

/* which: 0 gate, 1 up, 2 down, EXPERTS_GATE_UP gate and up as one product of
 * 2 ffn rows (gate_up_fused; dout16 only). */
#define EXPERTS_GATE_UP 3

/* dinp (R, IC) += dout . W_e; grad(W_e) += dout^T . x_eff over each expert's rows.
 * With dout16 (experts_bwd16: dout's BF16 bits, inp held as bits) in place of
 * dout, dinp is overwritten where add is 0; the float paths always add. */
static qd_status experts_backward(model *c, float *dinp, const float *dout, const uint16_t *dout16, int add,
                                  const float *inp, const layer_acts *s, const layer *ly, int which)
{
    int E = ly->nexp, R = s->exp_off[E];
    if (R == 0 && !(dout16 && s->dw_set)) /* (overwritten dw: the op's zeros even so) */
        return QD_OK;
    int gu = which == EXPERTS_GATE_UP; /* gate's weights, gradients and dout rows run on into up's */
    if (gu && !dout16)
        return qd_error(QD_ERR_ARG, "%s backend: gate|up's backward in one product needs dout as BF16 bits",
                        c->ops->name);
    expert_set x;
    QD_TRY(expert_set_make(c, &x, ly, gu ? 0 : which));
    const float *xe;
    qd_status st = QD_OK;
    if (dout16) /* experts_bwd16: dout as BF16 bits, inp held as bits; dinp overwritten where add is 0,
                 * dw where the lazy zero_grad left it (grads_begin) */
        st = OP(c, matmul_grouped_backward16b, dinp, x.dw, dout16, (const uint16_t *)inp, x.w, s->exp_off, E,
                x.L[0]->in, x.L[0]->out * (gu ? 2 : 1), (add ? QD_BWD_DX_ADD : 0) | (s->dw_set ? QD_BWD_DW_SET : 0));
    else if (held_bits(s, inp))
        st = OP(c, matmul_grouped_backward16, dinp, x.dw, dout, (const uint16_t *)inp, x.w, s->exp_off, E,
                x.L[0]->in, x.L[0]->out);
    else if (!(st = experts_effective_input(c, &xe, inp, s, ly, &x)))
        st = grouped_matmul_backward(c, dinp, x.dw, dout, xe, x.w, s->exp_off, E, x.L[0]->in, x.L[0]->out);
    expert_set_free(&x);
    return st;
}

/* Whether mlp_backward's experts_bwd16 runs gate's and up's backward as one
 * product of twice the rows (EXPERTS_GATE_UP): dx = [dg | du] . [Wg ; Wu] and
 * [dWg ; dWu] += [dg | du]^T . x, the same products (dx's sums over both in
 * one, in the tensor cores' order: fast mode's bound), one product a
 * direction instead of two. Where every expert's up weight,
 * working copy and gradient follow its gate's (the layout's order) and both
 * are plain BF16 linears (no fake-quant scale to tell them apart);
 * QUADS_GATE_UP=0: never (for the side-by-side). */
static int gate_up_fused(const model *c, const layer *ly)
{
    static int env = -1;
    env_switch(&env, "QUADS_GATE_UP", 1);
    if (!env || !ly->moe)
        return 0;
    size_t n = (size_t)ly->ffn * c->cfg.hidden_size;
    for (int e = 0; e < ly->nexp; e++) {
        const linear *g = &c->lin[ly->mlp0 + 3 * e], *u = g + 1;
        if (g->mode != QD_LINEAR_BF16 || u->mode != QD_LINEAR_BF16 || u->w != g->w + n || g->wk == NOT_HELD ||
            u->wk != g->wk + n)
            return 0;
    }
    return 1;
}

/* The backward of the experts whose inputs are held as BF16 bits (xeb, hb)
 * with its products' dout as BF16 bits too (the ops' moe_dy16,
 * swiglu_backward16, matmul_grouped_backward16b): the same products.
 * QUADS_EXPERTS_BWD16=0: float32 dy, dg, du converted for each product, and
 * dh, dxe zeroed and added to, as before (for the side-by-side). */
static int experts_bwd16(const model *c, const layer_acts *s)
{
    static int env = -1;
    env_switch(&env, "QUADS_EXPERTS_BWD16", 1);
    const qd_ops *o = c->ops;
    return env && s->xeb && s->hb && o->moe_dy16 && o->swiglu_backward16 && o->matmul_grouped_backward16b;
}

/* One linear_forward per expert (RAC states of unequal widths). */
static qd_status experts_forward_each(model *c, layer_acts *s, const layer *ly)
{
    int C = c->cfg.hidden_size, I = ly->ffn;
    for (int e = 0; e < ly->nexp; e++) {
        int r0 = s->exp_off[e], m = s->exp_off[e + 1] - r0;
        size_t oi = (size_t)r0 * I, oc = (size_t)r0 * C;
        QD_TRY(linear_forward(c, s->g + oi, s->xe + oc, expert_lin(c, ly, e, 0), m));
        QD_TRY(linear_forward(c, s->u + oi, s->xe + oc, expert_lin(c, ly, e, 1), m));
        if (m)
            QD_TRY(OP(c, swiglu, s->h + oi, s->g + oi, s->u + oi, (size_t)m * I));
        QD_TRY(linear_forward(c, s->y + oc, s->h + oi, expert_lin(c, ly, e, 2), m));
    }
    return QD_OK;
}

static qd_topk_norm topk_norm(const model *c) { return c->cfg.norm_topk_prob ? QD_TOPK_RENORM : QD_TOPK_PROBS; }

/* The most decode rows whose experts read their offsets on the device (no
 * host synchronization a MoE layer, so the step can be one CUDA graph): 8
 * until 2026-12-06, when past 8 rows the device-offset product lost to the
 * host offsets' kernels (0.84x at batch 64 on an H100); with the streaming
 * kernel taken by the same rule, its row tiles listed by a warp scan and the
 * step replayed from a graph, 64 on an H100 (a3b-4 exact nvfp4, 64 new
 * tokens): batch 16 1.069x, 32 1.053x, 64 1.037x, 64 with 1,024 new tokens
 * 1.045x, quads batch 16 1.067x, 64 1.059x. */
#define QD_DEV_OFF_ROWS 64

/* The most decode rows whose expert offsets stay on the device:
 * QD_DEV_OFF_ROWS, or QUADS_MOE_DEV_ROWS=N (N past 64: CUDA's W4A4 MMA or
 * streaming kernel over row tiles listed on the device; untimed there). */
static int dev_off_rows(void)
{
    static int v = -1;
    if (v < 0) {
        const char *e = getenv("QUADS_MOE_DEV_ROWS");
        char *end = NULL;
        long n = e && *e ? strtol(e, &end, 10) : QD_DEV_OFF_ROWS;
        if (e && *e && (*end || n < 0)) /* not a count: the default */
            n = QD_DEV_OFF_ROWS;
        v = n > 65536 ? 65536 : (int)n;
    }
    return v;
}

/* Whether a decode of N rows keeps MoE layer ly's expert offsets on the
 * device: at most QD_DEV_OFF_ROWS rows, the ops offer it, every expert
 * projection plain W4A4 or W4A4 with RAC (grouped), and no diagnostics unless
 * the ops add them on the device (diag_add reads the offsets there);
 * QUADS_MOE_DEV_OFF=0 turns it off (the same
 * bits either way). The memory plan asks it too. */
int qd_model_moe_dev_off = 1;

static int moe_dev_decode(model *c, const layer *ly, int N)
{
    static int env = -1;
    env_switch(&env, "QUADS_MOE_DEV_OFF", 1);
    const qd_ops *o = c->ops;
    if (!env || !qd_model_moe_dev_off || !ly->moe || N > dev_off_rows() ||
        (diag_now(c) && !diag_on_dev(c)) || !o->moe_group_dev || !o->w4a4_gemm_grouped_dev ||
        !o->rac_multi_dev || !experts_grouped(c, ly))
        return 0;
    for (int e = 0; e < ly->nexp; e++)
        for (int w = 0; w < 3; w++) {
            qd_linear_mode m = expert_lin(c, ly, e, w)->mode;
            if (m != QD_LINEAR_W4A4 && m != QD_LINEAR_W4A4_RAC)
                return 0;
        }
    return 1;
}

/* This forward's MoE layer ly keeps its expert offsets on the device. */
static int moe_offsets_on_device(model *c, const layer *ly) { return c->decode && moe_dev_decode(c, ly, c->N); }

/* Route tokens: router softmax, top-k, weights; rows grouped by expert in
 * ascending token order. A dense layer routes every token to "expert 0" with
 * weight 1 (exact: 0 + 1 * y = y). */
static qd_status route(model *c, layer_acts *s, const layer *ly)
{
    int N = c->N, E = ly->nexp, K = ly->moe ? c->cfg.num_experts_per_tok : 1;
    if (ly->moe)
        QD_TRY(OP(c, route, s->topk, s->topw, s->probs, N, E, K, topk_norm(c)));
    s->off_dev = moe_offsets_on_device(c, ly);
    if (s->off_dev) {
        void *p;
        QD_TRY(scratch(c, S_MOEOFF, sizeof(int32_t) * ((size_t)E + 1), &p));
        s->d_off = (int32_t *)p;
        memset(s->exp_off, 0, sizeof(int32_t) * (size_t)E);
        s->exp_off[E] = N * K;
        return OP(c, moe_group_dev, s->d_off, s->row_tok, s->row_w, s->row_rank, s->tok_rows, s->topk, s->topw, N,
                  E, K);
    }
    return OP(c, moe_group, s->exp_off, s->row_tok, s->row_w, s->row_rank, s->tok_rows, ly->moe ? s->topk : NULL,
              s->topw, N, E, K);
}

/* Whether the forward calls the fused rows ops (ops.h: add_rmsnorm,
 * combine_add_rmsnorm, swiglu_nvfp4, qk_norm_rope) where the ops have them:
 * the bits of the ops they replace, fewer launches. QUADS_FUSED_ROWS=0 or
 * qd_model_fused_rows = 0: the separate ops. */
int qd_model_fused_rows = 1;

static int fused_rows(const model *c)
{
    (void)c;
    static int v = -1;
    return qd_model_fused_rows && env_switch(&v, "QUADS_FUSED_ROWS", 1);
}

/* A fused rows op, or where fused_rows says no (or the ops lack it) ops.h's
 * qd_<name>_ops: the ops it stands for, one after the other. */
#define FUSED(c, name, ...)                                                                                       \
    ((c)->ops->name && fused_rows(c) ? OP(c, name, __VA_ARGS__) : qd_##name##_ops((c)->ops, (c)->dev, __VA_ARGS__))

/* Whether the experts' down projection quantizes its input (h) on its own
 * (plain W4A4), so that swiglu_nvfp4 can do it with the SwiGLU. */
static int down_quant_fused(model *c, const layer *ly)
{
    qd_linear_mode m = expert_lin(c, ly, 0, 2)->mode;
    return c->ops->swiglu_nvfp4 && fused_rows(c) && (m == QD_LINEAR_W4A4 || m == QD_LINEAR_W4A4_STE);
}

/* Whether n linears of one input quantize it once, as plain W4A4 codes they
 * share (no RAC): linears_forward's and experts_forward_gate_up's case. */
static int quantized_once(const model *c, const linear *const *L, int n)
{
    if (rac_multi_ok(c, L, n))
        return 0;
    for (int i = 0; i < n; i++)
        if (!shares_act(c, L[i]) || L[i]->in != L[0]->in)
            return 0;
    return 1;
}

/* Whether the grouped experts' gate and up take their one input (the
 * gathered rows) as shared codes, so that gather_nvfp4 can quantize it with
 * the gather. */
static int gate_up_quant_fused(model *c, const layer *ly)
{
    const linear *gu[2] = {expert_lin(c, ly, 0, 0), expert_lin(c, ly, 0, 1)};
    return c->ops->gather_nvfp4 && fused_rows(c) && quantized_once(c, gu, 2);
}

/* Whether layer ly's q, k and v quantize their input once, so that the norm
 * before can do it. */
static int qkv_quantized_once(model *c, const layer *ly)
{
    const linear *L[3] = {&c->lin[ly->q], &c->lin[ly->k], &c->lin[ly->v]};
    return quantized_once(c, L, 3);
}

/* The norm that follows a layer's output (the next layer's input norm, or the
 * final norm), computed by the layer's last launch where the ops fuse it. */
typedef struct {
    float *out, *rstd;
    const float *w;
    int quant; /* out quantized too, for the next layer's q, k, v (qkv_quantized_once) */
} next_norm;

/* out (N, C) = res + the MoE block or dense MLP of inp = ln2 (N, C); with nn,
 * nn's norm of out too (combine_add_rmsnorm: the bits of combine, add,
 * rmsnorm). */
static qd_status mlp_forward(model *c, float *out, layer_acts *s, const layer *ly, const float *res,
                             const next_norm *nn)
{
    int N = c->N, C = c->cfg.hidden_size, I = ly->ffn, K = ly->moe ? c->cfg.num_experts_per_tok : 1;
    mark(c, QD_PH_ROUTE);
    if (ly->moe)
        QD_TRY(linear_forward(c, s->probs, s->ln2, &c->lin[ly->router], N));
    QD_TRY(route(c, s, ly));
    int R = s->exp_off[ly->nexp], grouped = experts_grouped(c, ly), e16 = grouped && experts16(c);
    /* gate's and up's input only rounded to BF16: rounded once (in place, or
     * gathered as BF16 bits), not for each product */
    int xe_round = grouped && R && experts_round_only(c, ly, 0) && experts_round_only(c, ly, 1);
    s->xe16 = s->h16 = s->xeb = s->hb = 0;
    if (R && xe_round && e16) {
        QD_TRY(OP(c, gather16, (uint16_t *)s->xe, s->ln2, s->row_tok, R, C));
    } else if (R && grouped && !xe_round && gate_up_quant_fused(c, ly)) { /* gate/up's input quantized too */
        qd_nvfp4 a, *q;
        QD_TRY(pre_quant(c, &a, &q, s->xe, R, C, 1));
        /* a generate's step without diagnostics reads nothing of xe back:
         * the gathered rows only quantized (keep 0) */
        QD_TRY(OP(c, gather_nvfp4, q, s->xe, s->ln2, s->row_tok, R, C, !c->generating || diag_now(c)));
    } else if (R) {
        QD_TRY(OP(c, gather, s->xe, s->ln2, s->row_tok, R, C));
    }
    mark(c, QD_PH_EXPERTS);
    if (grouped) {
        if (xe_round && e16) {
            s->xeb = 1;
        } else if (xe_round) {
            QD_TRY(OP(c, round_bf16, s->xe, s->xe, (size_t)R * C));
            s->xe16 = 1;
        }
        QD_TRY(experts_forward_gate_up(c, s->g, s->u, s->xe, s, ly));
        int h_round = R && experts_round_only(c, ly, 2); /* down's input */
        if (h_round && e16) {
            QD_TRY(OP(c, swiglu16, (uint16_t *)s->h, s->g, s->u, (size_t)R * I));
            s->hb = 1;
        } else if (R && !h_round && down_quant_fused(c, ly)) { /* down's input quantized by the same launch */
            qd_nvfp4 a, *q;
            QD_TRY(pre_quant(c, &a, &q, s->h, R, I, 1));
            QD_TRY(OP(c, swiglu_nvfp4, q, s->h, s->g, s->u, R, I));
        } else if (R) {
            QD_TRY(OP(c, swiglu, s->h, s->g, s->u, (size_t)R * I));
            if (h_round) {
                QD_TRY(OP(c, round_bf16, s->h, s->h, (size_t)R * I));
                s->h16 = 1;
            }
        }
        QD_TRY(experts_forward(c, s->y, s->h, s, ly, 2));
    } else {
        QD_TRY(experts_forward_each(c, s, ly));
    }
    mark(c, QD_PH_OTHER);
    if (nn) {
        qd_nvfp4 a, *q;
        if (N == 0)
            return QD_OK;
        QD_TRY(pre_quant(c, &a, &q, nn->out, N, C, nn->quant));
        return OP(c, combine_add_rmsnorm, out, nn->out, nn->rstd, res, s->y, s->row_w, s->tok_rows, N, K, C, nn->w,
                  (float)c->cfg.rms_norm_eps, q);
    }
    if (N)
        QD_TRY(OP(c, combine, out, s->y, s->row_w, s->tok_rows, N, K, C));
    return OP(c, add, out, res, out, (size_t)N * C);
}

static qd_status attn_forward(model *c, float *out, layer_acts *s, const layer *ly, int l)
{
    const qd_model_config *g = &c->cfg;
    int N = c->N, H = g->num_attention_heads, KV = g->num_key_value_heads, D = g->head_dim;
    float eps = (float)g->rms_norm_eps;
    mark(c, QD_PH_ATTN_LIN);
    float *qkv[3] = {s->q, s->k, s->v};
    linear *lqkv[3] = {&c->lin[ly->q], &c->lin[ly->k], &c->lin[ly->v]};
    QD_TRY(linears_forward(c, qkv, s->ln1, lqkv, 3, N));
    size_t lsz = (size_t)c->cache_rows * c->Tc * KV * D;
    qd_qk_args a = {.qr = s->qr, .rstd_q = s->rstd_q, .kr = s->kr, .rstd_k = s->rstd_k, .q = s->q,
                    .wq = P(c, ly->q_norm), .k = s->k, .wk = P(c, ly->k_norm), .pos = c->d_pos, .cosb = c->rope_cos,
                    .sinb = c->rope_sin, .N = N, .H = H, .KV = KV, .D = D, .eps = eps,
                    .kc = c->kc ? c->kc + l * lsz : NULL, .vc = c->kc ? c->vc + l * lsz : NULL, .v = s->v,
                    .row = c->d_row, .Tc = c->Tc};
    QD_TRY(FUSED(c, qk_norm_rope, &a));
    mark(c, QD_PH_ATTN);
    const float *kb = c->decode ? c->kc + l * lsz : s->kr, *vb = c->decode ? c->vc + l * lsz : s->v;
    QD_TRY(OP(c, attend, s->ao, s->att, s->qr, kb, vb, c->d_kbase, c->d_pos, N, H, KV, D, c->Tm,
              c->decode ? NULL : c->seq_off, c->B));
    mark(c, QD_PH_ATTN_LIN);
    QD_TRY(linear_forward(c, out, s->ao, &c->lin[ly->o], N));
    mark(c, QD_PH_OTHER);
    return QD_OK;
}

/* The lm_head's input of a generation's prefill: only each row's last token
 * is sampled, so only those rows (B, C) go through the head (row-wise ops:
 * the same bits as the full head's rows). */
static qd_status last_rows(model *c, const float **hin)
{
    int B = c->Bl, C = c->cfg.hidden_size;
    void *p;
    QD_TRY(scratch(c, S_ROWS, up256(sizeof(float) * (size_t)B * C) + sizeof(int32_t) * (size_t)B, &p));
    int32_t *d_last = (int32_t *)((char *)p + up256(sizeof(float) * (size_t)B * C));
    int32_t *last = malloc(sizeof(int32_t) * (size_t)B);
    if (!last)
        return qd_error(QD_ERR_NOMEM, "%s backend: prefill", c->ops->name);
    for (int b = 0; b < B; b++)
        last[b] = c->seq_off[(c->lmap ? c->lmap[b] : b) + 1] - 1;
    qd_status st = OP(c, to_dev, d_last, last, sizeof(int32_t) * (size_t)B);
    free(last);
    QD_TRY(st);
    QD_TRY(OP(c, gather, p, c->lnf, d_last, B, C));
    *hin = p;
    return QD_OK;
}

/* logp: dev (N) log-probs of the batch's next tokens; NULL in a generation,
 * whose logits (one row per sequence: a prefill's last tokens, a decode's
 * rows) are sampled instead. */
/* Decoder layer l from its input acts[l].x: its activations, and its output
 * into next (N, C). ln1_done: its input norm (ln1, rstd1) was computed by the
 * layer before (nn of that call); nn: the norm that follows the output, to
 * compute with it (the fused ops; NULL: the caller computes it). */
static qd_status layer_forward(model *c, int l, float *next, int ln1_done, const next_norm *nn)
{
    const qd_model_config *g = &c->cfg;
    int N = c->N, C = g->hidden_size;
    float eps = (float)g->rms_norm_eps;
    layer_acts *s = &c->acts[l];
    const layer *ly = &c->layers[l];
    if (!ln1_done)
        QD_TRY(OP(c, rmsnorm, s->ln1, s->rstd1, s->x, P(c, ly->in_norm), N, C, eps));
    QD_TRY(attn_forward(c, next, s, ly, l)); /* next used as scratch (N, C) */
    QD_TRY(FUSED(c, add_rmsnorm, s->xmid, s->ln2, s->rstd2, s->x, next, P(c, ly->post_norm), N, C, eps, NULL));
    return mlp_forward(c, next, s, ly, s->xmid, nn);
}

/* options.recompute: layer l's activations again, from its input, for its
 * backward (the same ops on the same input: the same bits), its output into
 * rx; RAC statistics and diagnostics are the forward's alone. */
static qd_status recompute_layer(model *c, int l)
{
    int rs = c->rac_stats;
    c->rac_stats = 0;
    c->recomputing = 1;
    qd_status st = layer_forward(c, l, c->rx, 0, NULL);
    c->rac_stats = rs;
    c->recomputing = 0;
    mark(c, QD_PH_BWD);
    return st;
}

static qd_status model_forward(model *c, float *logp)
{
    const qd_model_config *g = &c->cfg;
    int N = c->N, C = g->hidden_size, L = g->num_hidden_layers;
    float eps = (float)g->rms_norm_eps;
    if (c->embed16 != NOT_HELD)
        QD_TRY(OP(c, embed_w16, c->acts[0].x, c->wk16 + c->embed16, c->d_tok, N, C));
    else
        QD_TRY(OP(c, embed, c->acts[0].x, P(c, c->embed), c->d_tok, N, C));
    c->pre_src = NULL; /* nothing quantized ahead survives a forward */
    /* each layer's last launch computes the next norm where the ops fuse it */
    int fuse = c->ops->combine_add_rmsnorm && fused_rows(c);
    for (int l = 0; l < L; l++) {
        next_norm nn = l + 1 < L ? (next_norm){c->acts[l + 1].ln1, c->acts[l + 1].rstd1,
                                               P(c, c->layers[l + 1].in_norm),
                                               fuse && qkv_quantized_once(c, &c->layers[l + 1])}
                                 : (next_norm){c->lnf, c->rstdf, P(c, c->final_norm), 0};
        QD_TRY(layer_forward(c, l, l + 1 < L ? c->acts[l + 1].x : c->xf, fuse && l > 0, fuse ? &nn : NULL));
    }
    if (!fuse || L == 0)
        QD_TRY(OP(c, rmsnorm, c->lnf, c->rstdf, c->xf, P(c, c->final_norm), N, C, eps));
    mark(c, QD_PH_HEAD);
    const float *hin = c->lnf;
    int nh = N;
    if (c->generating && !c->decode) {
        QD_TRY(last_rows(c, &hin));
        nh = c->Bl;
    }
    QD_TRY(linear_forward(c, c->logits, hin, &c->lin[c->lm_head], nh));
    mark(c, QD_PH_LOGP);
    if (logp)
        QD_TRY(OP(c, logprob, logp, c->lse, c->logits, c->d_tgt, N, g->vocab_size, c->temp));
    mark(c, QD_PH_OTHER);
    return finish(c);
}

/* ------------------------------------------------------------------------ */
/* backward (the forward in reverse; gradients accumulate with +=)            */

/* Zeroed dev floats from the backward scratch, carved in order. */
typedef struct {
    float *base;
    size_t used;
} fcarve;

static size_t up64(size_t n) { return (n + 63) & ~(size_t)63; }

static float *carve(fcarve *f, size_t n)
{
    float *p = f->base + f->used;
    f->used += up64(n);
    return p;
}

static int experts_grad_range(model *c, const layer *ly, size_t *lo, size_t *hi);

static qd_status mlp_backward(model *c, float *dinp, const float *dout, const layer_acts *s, const layer *ly,
                              float *buf)
{
    int N = c->N, C = c->cfg.hidden_size, I = ly->ffn, K = ly->moe ? c->cfg.num_experts_per_tok : 1;
    int R = s->exp_off[ly->nexp];
    fcarve f = {buf, 0};
    float *dy = carve(&f, (size_t)R * C), *dxe = carve(&f, (size_t)R * C), *dh = carve(&f, (size_t)R * I);
    float *dg = carve(&f, (size_t)R * I), *du = carve(&f, (size_t)R * I), *dw = carve(&f, (size_t)N * K);
    float *dlog = carve(&f, (size_t)N * ly->nexp);
    if (N == 0)
        return QD_OK;
    int b16 = experts_bwd16(c, s);
    if (s->dw_set && !b16) { /* grads_begin left these to products that overwrite: these add (never
                              * expected: the recomputed forward takes the same path) */
        size_t lo, hi;
        if (experts_grad_range(c, ly, &lo, &hi))
            QD_TRY(OP(c, zero, c->grads + lo, sizeof(float) * (hi - lo)));
    }
    if (!b16) { /* the two the products add into; moe_dy, swiglu_backward and router_backward overwrite the rest */
        QD_TRY(OP(c, zero, dxe, sizeof(float) * (size_t)R * C));
        QD_TRY(OP(c, zero, dh, sizeof(float) * (size_t)R * I));
    }
    mark(c, QD_PH_BWD_EXPERTS);
    if (b16) { /* dy, dg, du as BF16 bits in their float arrays' room; dh and dxe overwritten by their first product */
        uint16_t *dy16 = (uint16_t *)dy, *dg16 = (uint16_t *)dg, *du16 = (uint16_t *)du;
        QD_TRY(OP(c, moe_dy16, dy16, dw, dout, s->y, s->row_w, s->row_rank, s->tok_rows, N, K, C));
        QD_TRY(experts_backward(c, dh, NULL, dy16, 0, s->h, s, ly, 2));
        if (gate_up_fused(c, ly)) { /* [dg | du] rows in dg's room (R x 2I bits in R x I floats) */
            QD_TRY(OP(c, swiglu_backward16, dg16, dg16 + I, dh, s->g, s->u, (size_t)R, I, 2 * I));
            QD_TRY(experts_backward(c, dxe, NULL, dg16, 0, s->xe, s, ly, EXPERTS_GATE_UP));
        } else {
            QD_TRY(OP(c, swiglu_backward16, dg16, du16, dh, s->g, s->u, (size_t)R, I, I));
            QD_TRY(experts_backward(c, dxe, NULL, dg16, 0, s->xe, s, ly, 0));
            QD_TRY(experts_backward(c, dxe, NULL, du16, 1, s->xe, s, ly, 1));
        }
    } else {
        QD_TRY(OP(c, moe_dy, dy, dw, dout, s->y, s->row_w, s->row_rank, s->tok_rows, N, K, C));
        /* one grouped float product per projection, whatever the RAC widths (x_eff has K channels) */
        QD_TRY(experts_backward(c, dh, dy, NULL, 1, s->h, s, ly, 2));
        QD_TRY(OP(c, swiglu_backward, dg, du, dh, s->g, s->u, (size_t)R * I));
        QD_TRY(experts_backward(c, dxe, dg, NULL, 1, s->xe, s, ly, 0));
        QD_TRY(experts_backward(c, dxe, du, NULL, 1, s->xe, s, ly, 1));
    }
    QD_TRY(OP(c, unroute, dinp, dxe, s->tok_rows, N, K, C));
    mark(c, QD_PH_BWD);
    if (!ly->moe)
        return QD_OK;
    mark(c, QD_PH_BWD_ROUTE);
    QD_TRY(OP(c, router_backward, dlog, dw, s->probs, s->topk, s->topw, N, ly->nexp, K, topk_norm(c)));
    qd_status st = linear_backward(c, dinp, dlog, s->ln2, &c->lin[ly->router], N, 0);
    mark(c, QD_PH_BWD);
    return st;
}

static size_t mlp_backward_floats(const model *c, const layer *ly, int R)
{
    int N = c->N, C = c->cfg.hidden_size, I = ly->ffn, K = ly->moe ? c->cfg.num_experts_per_tok : 1;
    return 2 * up64((size_t)R * C) + 3 * up64((size_t)R * I) + up64((size_t)N * K) + up64((size_t)N * ly->nexp);
}

/* dx (N, C) += gradient of the attention branch's input x, given dout (N, C). */
static qd_status attn_backward(model *c, float *dx, const float *dout, const layer_acts *s, const layer *ly,
                               float *buf)
{
    const qd_model_config *g = &c->cfg;
    int N = c->N, C = g->hidden_size, H = g->num_attention_heads, KV = g->num_key_value_heads, D = g->head_dim;
    size_t nq = (size_t)N * H * D, nk = (size_t)N * KV * D;
    fcarve f = {buf, 0};
    float *dao = carve(&f, nq), *dqr = carve(&f, nq), *dq = carve(&f, nq);
    float *dkr = carve(&f, nk), *dk = carve(&f, nk), *dv = carve(&f, nk), *dln = carve(&f, (size_t)N * C);
    float *ds = carve(&f, (size_t)N * H * c->Tm);
    mark(c, QD_PH_BWD_ATTN_LIN);
    QD_TRY(linear_backward(c, dao, dout, s->ao, &c->lin[ly->o], N, QD_BWD_DX_SET));
    mark(c, QD_PH_BWD_ATTN);
    QD_TRY(OP(c, attend_backward, dqr, dkr, dv, ds, dao, s->ao, s->att, s->qr, s->kr, s->v, c->d_pos, c->d_slen, N, H,
              KV, D, c->Tm, c->seq_off, c->B, QD_BWD_DX_SET));
    mark(c, QD_PH_BWD);
    QD_TRY(OP(c, rope, dqr, c->d_pos, c->rope_cos, c->rope_sin, N, H, D, QD_ROPE_INVERSE));
    QD_TRY(OP(c, rope, dkr, c->d_pos, c->rope_cos, c->rope_sin, N, KV, D, QD_ROPE_INVERSE));
    QD_TRY(OP(c, rmsnorm_backward, dq, c->grads + ly->q_norm, dqr, s->q, P(c, ly->q_norm), s->rstd_q, N * H, D,
              QD_BWD_DX_SET));
    QD_TRY(OP(c, rmsnorm_backward, dk, c->grads + ly->k_norm, dkr, s->k, P(c, ly->k_norm), s->rstd_k, N * KV, D,
              QD_BWD_DX_SET));
    mark(c, QD_PH_BWD_ATTN_LIN);
    hold(c, s->ln1, (size_t)N * C); /* q's, k's and v's products may share what they make of ln1 */
    qd_status st = linear_backward(c, dln, dq, s->ln1, &c->lin[ly->q], N, QD_BWD_DX_SET);
    if (!st)
        st = linear_backward(c, dln, dk, s->ln1, &c->lin[ly->k], N, 0);
    if (!st)
        st = linear_backward(c, dln, dv, s->ln1, &c->lin[ly->v], N, 0);
    hold(c, NULL, 0);
    QD_TRY(st);
    mark(c, QD_PH_BWD);
    return OP(c, rmsnorm_backward, dx, c->grads + ly->in_norm, dln, s->x, P(c, ly->in_norm), s->rstd1, N, C, 0);
}

static size_t attn_backward_floats(const model *c)
{
    const qd_model_config *g = &c->cfg;
    size_t N = c->N, nq = N * g->num_attention_heads * g->head_dim, nk = N * g->num_key_value_heads * g->head_dim;
    return 3 * up64(nq) + 3 * up64(nk) + up64(N * g->hidden_size) + up64(N * g->num_attention_heads * c->Tm);
}

/* The backward scratch of a batch of c->N tokens: dlogits, dres, dln and
 * the largest layer's part (*layer_floats). Layer l's routed rows are the
 * last forward's (from_acts), else N K (MoE) or N (dense), which they equal. */
static size_t backward_floats(const model *c, int from_acts, size_t *layer_floats)
{
    const qd_model_config *g = &c->cfg;
    size_t lf = attn_backward_floats(c);
    for (int l = 0; l < g->num_hidden_layers; l++) {
        const layer *ly = &c->layers[l];
        int R = from_acts ? c->acts[l].exp_off[ly->nexp] : c->N * (ly->moe ? g->num_experts_per_tok : 1);
        size_t m = mlp_backward_floats(c, ly, R);
        lf = m > lf ? m : lf;
    }
    *layer_floats = lf;
    return up64((size_t)c->N * g->vocab_size) + 2 * up64((size_t)c->N * g->hidden_size) + lf;
}

/* dln (N, C) += the lm_head's backward from dlogp (its weight's gradient
 * too): the ops' head_backward where it fuses the two, else logprob_backward
 * into dlogits (N, V) and linear_backward. */
static qd_status head_backward(model *c, float *dln, float *dlogits, const float *dlogp)
{
    const linear *L = &c->lin[c->lm_head];
    int N = c->N, V = c->cfg.vocab_size;
    if (c->ops->head_backward && N) {
        const float *xe;
        QD_TRY(linear_input(c, &xe, c->lnf, L, N));
        qd_status st = OP(c, head_backward, dln, c->grads + L->w, dlogp, c->logits, c->lse, c->d_tgt, xe, LW(c, L),
                          N, L->in, V, c->temp, c->head_dw_set ? QD_BWD_DW_SET : 0);
        if (st != QD_ERR_UNSUPPORTED)
            return st;
    }
    if (c->head_dw_set) /* grads_begin left it to an overwriting product: the two ops below add */
        QD_TRY(OP(c, zero, c->grads + L->w, sizeof(float) * (size_t)L->in * L->out));
    QD_TRY(OP(c, logprob_backward, dlogits, dlogp, c->logits, c->lse, c->d_tgt, N, V, c->temp));
    return linear_backward(c, dln, dlogits, c->lnf, L, N, 0);
}

/* ---- the lazy zero_grad (QUADS_LAZY_ZERO=1): zero_grad marks the
 * gradients, and the next backward zeroes all but the experts' weight
 * gradients of the layers whose products can overwrite them (fast mode's
 * experts_bwd16 with the ops' QD_BWD_DW_SET) and the lm_head's (head_backward
 * with it): at a3b's 4 layers 10.9 of the 12.4 GB a step zeroed. Another reader first (get_grads, the optimizer)
 * zeroes them all. The same values: a product overwriting gives its sum where
 * zero plus the sum gave it (a zero's sign aside). */
static qd_status grads_settle(model *c)
{
    if (!c->zero_pending)
        return QD_OK;
    c->zero_pending = 0;
    return c->grads ? OP(c, zero, c->grads, sizeof(float) * c->nfloats) : QD_OK;
}

/* layer l's experts' weight gradients [*lo, *hi) when they lie one after the
 * other (the layout's order: gate, up, down an expert), else 0 */
static int experts_grad_range(model *c, const layer *ly, size_t *lo, size_t *hi)
{
    size_t a = (size_t)-1, b = 0, sum = 0;
    for (int e = 0; e < ly->nexp; e++)
        for (int w = 0; w < 3; w++) {
            const linear *L = expert_lin(c, ly, e, w);
            size_t n = (size_t)L->in * L->out;
            a = L->w < a ? L->w : a;
            b = L->w + n > b ? L->w + n : b;
            sum += n;
        }
    *lo = a, *hi = b;
    return ly->nexp > 0 && b - a == sum;
}

/* ranges of grads left to overwriting products, ascending and apart */
typedef struct {
    size_t lo, hi;
    int layer; /* -1: the lm_head's */
} dw_range;

static int dw_range_cmp(const void *a, const void *b)
{
    size_t x = ((const dw_range *)a)->lo, y = ((const dw_range *)b)->lo;
    return x < y ? -1 : x > y;
}

static qd_status grads_begin(model *c)
{
    int L = c->cfg.num_hidden_layers;
    for (int l = 0; l < L; l++)
        c->acts[l].dw_set = 0;
    c->head_dw_set = 0;
    if (!c->zero_pending)
        return QD_OK;
    c->zero_pending = 0;
    dw_range *r = malloc(sizeof *r * ((size_t)L + 1));
    if (!r)
        return qd_error(QD_ERR_NOMEM, "%s backend: gradients", c->ops->name);
    int n = 0;
    for (int l = 0; l < L; l++) {
        layer_acts *s = &c->acts[l];
        const layer *ly = &c->layers[l];
        if (ly->moe && !s->off_dev && experts_bwd16(c, s) && experts_grad_range(c, ly, &r[n].lo, &r[n].hi))
            r[n++].layer = l;
    }
    if (c->ops->head_backward && c->N) { /* where it is not fused after all, head_backward zeroes it */
        const linear *H = &c->lin[c->lm_head];
        r[n] = (dw_range){H->w, H->w + (size_t)H->in * H->out, -1};
        n++;
    }
    qsort(r, (size_t)n, sizeof *r, dw_range_cmp);
    size_t at = 0;
    qd_status st = QD_OK;
    for (int i = 0; i < n && !st; i++) {
        if (r[i].lo < at) /* overlaps the one before (a tied head): left to the zeroing */
            continue;
        if (r[i].lo > at)
            st = OP(c, zero, c->grads + at, sizeof(float) * (r[i].lo - at));
        at = r[i].hi;
        if (r[i].layer < 0)
            c->head_dw_set = 1;
        else
            c->acts[r[i].layer].dw_set = 1;
    }
    free(r);
    QD_TRY(st);
    if (c->nfloats > at)
        QD_TRY(OP(c, zero, c->grads + at, sizeof(float) * (c->nfloats - at)));
    return QD_OK; /* an expert without rows: its products' zeros (QD_BWD_DW_SET) */
}

/* dlogp: dev (N). */
static qd_status model_backward(model *c, const float *dlogp)
{
    const qd_model_config *g = &c->cfg;
    int N = c->N, C = g->hidden_size, V = g->vocab_size;
    size_t layer_floats, total = backward_floats(c, 1, &layer_floats);
    mark(c, QD_PH_BWD);
    QD_TRY(grads_begin(c));
    void *p;
    QD_TRY(scratch(c, S_BWD, sizeof(float) * total, &p));
    fcarve f = {p, 0};
    float *dlogits = carve(&f, (size_t)N * V), *dres = carve(&f, (size_t)N * C), *dln = carve(&f, (size_t)N * C);
    float *lbuf = carve(&f, layer_floats);
    /* dres and dln are added into; logprob_backward overwrites dlogits (N x vocab:
     * 10 GB at a3b's 16 x 1024 tokens), mlp_backward zeroes what it adds into */
    QD_TRY(OP(c, zero, dres, sizeof(float) * (size_t)(lbuf - dres)));
    mark(c, QD_PH_BWD_HEAD);
    QD_TRY(head_backward(c, dln, dlogits, dlogp));
    mark(c, QD_PH_BWD);
    QD_TRY(OP(c, rmsnorm_backward, dres, c->grads + c->final_norm, dln, c->xf, P(c, c->final_norm), c->rstdf, N,
              C, 0));
    for (int l = g->num_hidden_layers - 1; l >= 0; l--) {
        const layer_acts *s = &c->acts[l];
        const layer *ly = &c->layers[l];
        if (c->opt.recompute)
            QD_TRY(recompute_layer(c, l));
        QD_TRY(OP(c, zero, dln, sizeof(float) * (size_t)N * C));
        QD_TRY(mlp_backward(c, dln, dres, s, ly, lbuf));    /* reads dres, then dres += */
        QD_TRY(OP(c, rmsnorm_backward, dres, c->grads + ly->post_norm, dln, s->xmid, P(c, ly->post_norm), s->rstd2,
                  N, C, 0));
        /* attention's gradients are set by their first writers (QD_BWD_DX_SET), not zeroed first */
        QD_TRY(attn_backward(c, dres, dres, s, ly, lbuf));
    }
    QD_TRY(OP(c, embed_backward, c->grads + c->embed, dres, c->d_tok, N, C));
    QD_TRY(finish(c));
    mark(c, QD_PH_OTHER);
    return QD_OK;
}

/* Diagnostics start from zero at each forward and each generate (the
 * activations' sums; the weights' are each sync's). */
static qd_status reset_diag(model *c)
{
    c->have_diag = 0;
    for (int i = 0; i < c->nlin; i++)
        c->lin[i].act_err = c->lin[i].act_norm = 0.0;
    return c->d_diag ? OP(c, zero, c->d_diag, sizeof(double) * 2 * (size_t)c->nlin) : QD_OK;
}

/* ------------------------------------------------------------------------ */
/* generation: prefill, then decode with a KV cache; every op is the        */
/* forward's, so the rollout log-probs equal the forward's, bit for bit      */

typedef struct {
    int32_t *seq, *len, *idx;      /* (B, Tmax) prompt + generated, (B) their lengths, (B) active rows */
    qd_sample_result *sres;        /* (B) the sampler's results */
    uint64_t *sid;                 /* (B) sequence ids of the active rows */
    uint32_t *spos;                /* (B) and positions */
    int *done;                     /* (B) */
    int Tmax;
} gen_state;

/* A decode step's forward recorded by the ops (ops.h graph_begin) at the
 * second step of one shape and replayed by one launch at every step of that
 * shape after, so the host enqueues one launch a step, not every kernel of
 * every layer (decode at batch 1-8 waits on launches: a3b-4 exact nvfp4 on an
 * H100, 2026-12-06, batch 1 1.15x, batch 8 1.08x; QUADS_CUDA_GRAPH=0 turns it
 * off, =1 also logs the recordings at the end). Only where nothing of a step's forward goes
 * through the host: every MoE layer's expert offsets on the device
 * (moe_dev_decode) and no diagnostics (RAC statistics are sums on the
 * device that each replay adds as its launches did: check_backend's
 * "generate(rl: no diagnostics)" rows and run_all's `quads rl` identity
 * compare them with the CPU); the ops refuse the rest while recording, and a recording
 * that fails leaves this generate's decode steps to launch as they run. The same ops on the same buffers: the
 * same bits. */
static int graph_on(model *c)
{
    static int env = -1;
    env_switch(&env, "QUADS_CUDA_GRAPH", 1);
    if (!env || c->graph_off || !c->ops->graph_begin || diag_now(c))
        return 0;
    for (int l = 0; l < c->cfg.num_hidden_layers; l++)
        if (c->layers[l].moe && !moe_dev_decode(c, &c->layers[l], c->N))
            return 0;
    return 1;
}

/* What a recorded step read that the driver sets: its shape, the arena, the
 * scratch buffers and the KV cache (FNV-1a of their words). */
static uint64_t graph_key(const model *c)
{
    uint64_t v[10 + 2 * S_NSCRATCH], h = 1469598103934665603ull;
    int n = 0;
    v[n++] = (uint64_t)c->N, v[n++] = (uint64_t)c->B, v[n++] = (uint64_t)c->Tm, v[n++] = (uint64_t)c->Tc;
    v[n++] = (uint64_t)(uintptr_t)c->arena, v[n++] = (uint64_t)c->arena_cap;
    v[n++] = (uint64_t)(uintptr_t)c->kc, v[n++] = (uint64_t)(uintptr_t)c->vc;
    v[n++] = (uint64_t)(uintptr_t)c->head_bfp, v[n++] = (uint64_t)c->cache_rows;
    for (int i = 0; i < S_NSCRATCH; i++)
        v[n++] = (uint64_t)(uintptr_t)c->scratch[i], v[n++] = (uint64_t)c->scratch_cap[i];
    for (int i = 0; i < n; i++)
        h = (h ^ v[i]) * 1099511628211ull;
    return h;
}

/* A decode step's forward through a step graph: replayed where one of this
 * key is kept; else run as it is at the first step of a key (which makes
 * every buffer the step grows), recorded and replayed at the second. */
static qd_status decode_graph(model *c)
{
    uint64_t key = graph_key(c);
    qd_status st = c->ops->graph_run(c->dev, key);
    if (st == QD_OK)
        return finish(c);
    if (st != QD_ERR_UNSUPPORTED)
        return st;
    if (key != c->graph_seen) {
        c->graph_seen = key;
        return model_forward(c, NULL);
    }
    if (c->ops->graph_begin(c->dev) == QD_OK) {
        st = model_forward(c, NULL); /* recorded: nothing runs */
        if (c->ops->graph_end(c->dev, key, st == QD_OK) == QD_OK) {
            st = c->ops->graph_run(c->dev, key);
            if (st != QD_ERR_UNSUPPORTED)
                return st ? st : finish(c);
        }
    }
    c->graph_off = 1;
    return model_forward(c, NULL);
}

/* Decode: the last token of each of the na active rows, at its position,
 * attending to the KV cache. */
static qd_status decode_forward(model *c, gen_state *g, int na)
{
    c->N = c->B = c->Bl = na;
    c->Tm = 0;
    for (int i = 0; i < na; i++)
        if (g->len[g->idx[i]] > c->Tm)
            c->Tm = g->len[g->idx[i]];
    int gr = graph_on(c);
    if (gr) /* the attention probabilities' rows as long as the last step's (the arena's),
             * so that every step of one batch size lays out the same buffers */
        c->Tm = c->Tc - 1;
    QD_TRY(alloc_acts(c));
    qd_decode_pack(c->tok, c->pos, c->row, c->tgt, c->src, c->seq_off, g->seq, g->len, g->idx, na, g->Tmax);
    c->decode = 1;
    qd_status st = upload_batch(c);
    if (!st)
        st = gr ? decode_graph(c) : model_forward(c, NULL);
    c->decode = 0;
    return st;
}

/* out (B): qd_sample_row of each row of the logits (B, V): the ops' sample,
 * or where it is NULL the logits to the host and backends/sampling.c there. */
static qd_status sample_rows(model *c, qd_sample_result *out, int B, int V, const qd_sample_params *p,
                             const uint64_t *sid, const uint32_t *spos)
{
    if (c->ops->sample)
        return OP(c, sample, out, c->logits, B, V, p, sid, spos);
    size_t bytes = sizeof(float) * (size_t)B * (size_t)V;
    float *h = malloc(bytes ? bytes : 1);
    if (!h)
        return qd_error(QD_ERR_NOMEM, "%s backend: sampling", c->ops->name);
    qd_status st = OP(c, to_host, h, c->logits, bytes);
    if (!st)
        st = qd_sample_batch(out, h, B, V, p, sid, spos);
    free(h);
    return st;
}

int qd_model_share_prefill = 1;

/* FNV-1a of a prompt's length and tokens. */
static uint64_t prompt_hash(const int32_t *t, int n)
{
    uint64_t h = 1469598103934665603ull ^ (uint64_t)(uint32_t)n;
    for (int i = 0; i < n; i++) {
        h ^= (uint64_t)(uint32_t)t[i];
        h *= 1099511628211ull;
    }
    return h;
}

/* Rows with one prompt (a group's samples) share its prefill: whether this
 * generate may (every op is row-wise, §4: a row's numbers never depend on
 * the batch; but RAC statistics and diagnostics count every row, so not
 * while they are gathered). */
static int share_prefill_on(const model *c)
{
    static int env = -1;
    env_switch(&env, "QUADS_SHARE_PREFILL", 1);
    return env && qd_model_share_prefill && !diag_now(c) && !(c->rac_stats && c->nrac_in > 0);
}

/* The distinct prompts of rq: uq[b] the index of row b's prompt among them,
 * first[j] the first row with prompt j; returns their count. */
static int distinct_prompts(const qd_generate_request *rq, int32_t *uq, int32_t *first, uint64_t *hash)
{
    int U = 0, B = rq->B, Tp = rq->Tp;
    for (int b = 0; b < B; b++) {
        const int32_t *t = rq->prompt + (size_t)b * Tp;
        int n = rq->prompt_len[b], j = 0;
        hash[b] = prompt_hash(t, n);
        for (; j < U; j++) {
            int f = first[j];
            if (hash[f] == hash[b] && rq->prompt_len[f] == n &&
                !memcmp(rq->prompt + (size_t)f * Tp, t, sizeof(int32_t) * (size_t)n))
                break;
        }
        if (j == U)
            first[U++] = b;
        uq[b] = j;
    }
    return U;
}

/* The prompts' forward, which fills the KV cache and gives each row's first
 * logits. Where prompts repeat, only the distinct ones run: their keys and
 * values go to their first row's cache row and are then copied to the other
 * rows', and every row's logits come from its prompt's last token (the head
 * runs once a row): the bits of the whole batch's prefill. */
static qd_status prefill(model *c, const qd_generate_request *rq)
{
    int B = rq->B, Tp = rq->Tp, U = B;
    int32_t *uq = NULL, *first = NULL, *ut = NULL, *ul = NULL;
    uint64_t *hash = NULL;
    qd_status st = QD_OK;
    if (B > 1 && share_prefill_on(c)) {
        uq = malloc(sizeof(int32_t) * (size_t)B);
        first = malloc(sizeof(int32_t) * (size_t)B);
        hash = malloc(sizeof(uint64_t) * (size_t)B);
        if (!uq || !first || !hash) {
            st = qd_error(QD_ERR_NOMEM, "%s backend: prefill", c->ops->name);
            goto out;
        }
        U = distinct_prompts(rq, uq, first, hash);
    }
    if (U == B) {
        qd_batch bt = {.B = B, .T = Tp, .tokens = rq->prompt, .lengths = rq->prompt_len, .temperature = 1.0f};
        st = pack_batch(c, &bt);
        if (!st)
            st = model_forward(c, NULL);
        goto out;
    }
    ut = malloc(sizeof(int32_t) * (size_t)U * (size_t)Tp);
    ul = malloc(sizeof(int32_t) * (size_t)U);
    if (!ut || !ul) {
        st = qd_error(QD_ERR_NOMEM, "%s backend: prefill", c->ops->name);
        goto out;
    }
    for (int j = 0; j < U; j++) {
        memcpy(ut + (size_t)j * Tp, rq->prompt + (size_t)first[j] * Tp, sizeof(int32_t) * (size_t)Tp);
        ul[j] = rq->prompt_len[first[j]];
    }
    qd_batch bu = {.B = U, .T = Tp, .tokens = ut, .lengths = ul, .temperature = 1.0f};
    c->lmap = uq;
    st = pack_batch_rows(c, &bu, B, first);
    if (!st)
        st = model_forward(c, NULL);
    c->lmap = NULL;
    /* the other rows' cache rows: each layer's keys and values of their prompt */
    size_t row = (size_t)c->Tc * c->cfg.num_key_value_heads * c->cfg.head_dim;
    size_t lsz = (size_t)c->cache_rows * row;
    for (int l = 0; l < c->cfg.num_hidden_layers && !st; l++)
        for (int b = 0; b < B && !st; b++) {
            int f = first[uq[b]];
            if (f == b)
                continue;
            size_t bytes = sizeof(float) * (size_t)rq->prompt_len[b] * c->cfg.num_key_value_heads * c->cfg.head_dim;
            st = OP(c, copy, c->kc + l * lsz + (size_t)b * row, c->kc + l * lsz + (size_t)f * row, bytes);
            if (!st)
                st = OP(c, copy, c->vc + l * lsz + (size_t)b * row, c->vc + l * lsz + (size_t)f * row, bytes);
        }
out:
    free(uq);
    free(first);
    free(ut);
    free(ul);
    free(hash);
    return st;
}

/* One token for every unfinished row: the prompts' forward (prefill, which
 * fills the KV cache) at step 0, a decode step after; *active = rows that ran. */
static qd_status gen_step(model *c, gen_state *g, const qd_generate_request *rq, qd_generate_result *res,
                          int step, int *active)
{
    int na = 0, V = c->cfg.vocab_size, M = rq->max_new_tokens;
    for (int b = 0; b < rq->B; b++)
        if (!g->done[b])
            g->idx[na++] = b;
    *active = na;
    if (na == 0)
        return QD_OK;
    if (step == 0) {  /* every row is active at the prefill (max_new_tokens > 0) */
        QD_TRY(prefill(c, rq));
    } else {
        QD_TRY(decode_forward(c, g, na));
    }
    mark(c, QD_PH_SAMPLE);
    for (int i = 0; i < na; i++) {
        g->sid[i] = rq->seq_id[g->idx[i]];
        g->spos[i] = (uint32_t)g->len[g->idx[i]];
    }
    qd_sample_params sp = {.temperature = rq->temperature, .top_k = rq->top_k,
                           .top_p = rq->top_p < 1.0f ? rq->top_p : 1.0f, .seed = rq->seed};
    QD_TRY(sample_rows(c, g->sres, na, V, &sp, g->sid, g->spos));
    for (int i = 0; i < na; i++) {
        int b = g->idx[i];
        int32_t tok = g->sres[i].token;
        g->seq[(size_t)b * g->Tmax + g->len[b]++] = tok;
        res->tokens[(size_t)b * M + step] = tok;
        res->logp[(size_t)b * M + step] = g->sres[i].logprob;
        res->lengths[b]++;
        g->done[b] = qd_generate_is_stop(rq, tok) || step + 1 == M;
    }
    mark(c, QD_PH_OTHER);
    return QD_OK;
}

static void gen_free(model *c, gen_state *g, int M)
{
    free(g->seq);
    free(g->len);
    free(g->idx);
    free(g->sres);
    free(g->sid);
    free(g->spos);
    free(g->done);
    if (c->ops->graph_drop) /* the step graphs read the cache */
        c->ops->graph_drop(c->dev);
    c->graph_seen = 0;
    c->graph_off = 0; /* the next generate tries again */
    drelease(c, c->kc, c->kv_bytes, QD_MEM_KV);
    drelease(c, c->vc, c->kv_bytes, QD_MEM_KV);
    c->kc = c->vc = NULL;
    c->generating = 0;
    c->have_forward = 0;  /* the activations are the last step's, not a batch's */
    c->have_diag = M > 0 && !c->diag_paused;
}

static qd_status generate_run(model *c, gen_state *g, const qd_generate_request *rq, qd_generate_result *res)
{
    int B = rq->B, M = rq->max_new_tokens;
    size_t ncache = (size_t)c->cfg.num_hidden_layers * B * g->Tmax * c->cfg.num_key_value_heads * c->cfg.head_dim;
    if (!g->seq || !g->len || !g->idx || !g->sres || !g->sid || !g->spos || !g->done)
        return qd_error(QD_ERR_NOMEM, "%s backend: generate (host state)", c->ops->name);
    c->kv_bytes = sizeof(float) * ncache;
    QD_TRY(dalloc(c, (void **)&c->kc, c->kv_bytes, QD_MEM_KV, "KV cache (keys)"));
    QD_TRY(dalloc(c, (void **)&c->vc, c->kv_bytes, QD_MEM_KV, "KV cache (values)"));
    c->cache_rows = B;
    c->Tc = g->Tmax;
    c->generating = 1;
    qd_generate_begin(g->seq, g->len, g->done, rq, res, g->Tmax);
    QD_TRY(reset_diag(c));
    if (M > 1) { /* the arena of the last decode step (B rows attending to Tmax - 1 positions) now:
                  * a step's activations grow with its positions, and are never made again */
        c->N = c->B = c->Bl = B;
        c->Tm = g->Tmax - 1;
        c->decode = 1;
        qd_status st = reserve_acts(c);
        c->decode = 0;
        QD_TRY(st);
    }
    int active = 1;
    for (int step = 0; step < M && active; step++) {
        QD_TRY(gen_step(c, g, rq, res, step, &active));
        if (active && rq->on_step) /* a step with rows left (the one that finds none does nothing) */
            rq->on_step(step + 1, M, rq->on_step_ctx);
    }
    return QD_OK;
}

static qd_status generate_impl(model *c, const qd_generate_request *rq, qd_generate_result *res)
{
    int B = rq->B, Tmax = rq->Tp + rq->max_new_tokens;
    if (Tmax > c->cfg.max_position_embeddings)
        return qd_error(QD_ERR_SHAPE, "generate: prompt + max_new_tokens = %d > max_position_embeddings %d",
                        Tmax, c->cfg.max_position_embeddings);
    gen_state g = {.seq = calloc((size_t)B * Tmax, sizeof(int32_t)), .len = calloc((size_t)B, sizeof(int32_t)),
                   .idx = calloc((size_t)B, sizeof(int32_t)), .sres = calloc((size_t)B, sizeof(qd_sample_result)),
                   .sid = calloc((size_t)B, sizeof(uint64_t)), .spos = calloc((size_t)B, sizeof(uint32_t)),
                   .done = calloc((size_t)B, sizeof(int)),
                   .Tmax = Tmax};
    qd_status st = generate_run(c, &g, rq, res);
    gen_free(c, &g, rq->max_new_tokens);
    return st;
}

/* ------------------------------------------------------------------------ */
/* AdamW                                                                     */

/* Global L2 norm of the gradients: fixed 4096-float chunks, each summed in
 * double ascending (the op), chunks added ascending here. */
static qd_status grad_norm(model *c, double *norm)
{
    size_t nch = (c->nfloats + 4095) / 4096;
    void *part;
    QD_TRY(scratch(c, S_DIAG, sizeof(double) * (nch ? nch : 1), &part));
    QD_TRY(OP(c, sumsq_chunks, part, c->grads, c->nfloats));
    double *h = malloc(sizeof(double) * (nch ? nch : 1)), total = 0.0;
    if (!h)
        return qd_error(QD_ERR_NOMEM, "%s backend: gradient norm", c->ops->name);
    qd_status st = OP(c, to_host, h, part, sizeof(double) * nch);
    for (size_t k = 0; k < nch && !st; k++)
        total += h[k];
    free(h);
    *norm = sqrt(total);
    return st;
}

/* fq (fake_quant_tensors) += 2 for the weights of the experts' plain BF16
 * linears, whose working floats no product reads where the ops keep their
 * BF16 bits (adamw_bits); not with diagnostics, which compare those floats
 * with the master (QUADS_ADAMW_BITS=0: never, for the side-by-side). */
static void mark_bits_only(model *c, unsigned char *fq)
{
    static int env = -1;
    env_switch(&env, "QUADS_ADAMW_BITS", 1);
    if (!env || !c->ops->adamw_bits || c->opt.diagnostics)
        return;
    for (int l = 0; l < c->cfg.num_hidden_layers; l++) {
        const layer *ly = &c->layers[l];
        for (int e = 0; ly->moe && e < ly->nexp; e++)
            for (int w = 0; w < 3; w++) {
                const linear *L = expert_lin(c, ly, e, w);
                int t = tensor_at(c, L->w);
                if (L->mode == QD_LINEAR_BF16 && !fq[t])
                    fq[t] = 2;
            }
    }
}

static qd_status optimizer_step_impl(model *c, const qd_adamw *o, int step, float *norm_out)
{
    double norm;
    QD_TRY(ensure_train(c));
    mark(c, QD_PH_OPT);
    QD_TRY(grads_settle(c));
    QD_TRY(grad_norm(c, &norm));
    if (!isfinite(norm))
        return qd_error(QD_ERR_NONFINITE, "optimizer: gradient norm is not finite");
    *norm_out = (float)norm;
    float gscale, bc1, bc2;
    qd_adamw_scalars(o, step, norm, &gscale, &bc1, &bc2);
    /* one op a run of adjacent tensors with the same decay (an update is per
     * element: the same bits as one op a tensor, in a few launches, not one a
     * tensor: a3b at 4 layers has 1,600 tensors); where the working copy is
     * the master rounded to BF16, the same pass writes it (adamw_round), but
     * for the fake-quant linears, which the sync writes */
    int fuse = !c->lean && c->wk != c->params && c->ops->adamw_round;
    unsigned char *fq = fuse ? fake_quant_tensors(c) : NULL;
    if (fuse && !fq)
        return qd_error(QD_ERR_NOMEM, "%s backend: optimizer step", c->ops->name);
    if (fq)
        mark_bits_only(c, fq);
    qd_status ast = QD_OK;
    for (int t = 0, u; t < c->ninfo && !ast; t = u) {
        size_t off = c->info[t].offset, n = (size_t)(c->info[t].rows * c->info[t].cols);
        float wd = qd_adamw_decay(o, &c->info[t]);
        int r = fuse && fq[t] != 1;
        for (u = t + 1; u < c->ninfo && c->info[u].offset == off + n && qd_adamw_decay(o, &c->info[u]) == wd &&
                        (!fuse || fq[u] == fq[t]);
             u++)
            n += (size_t)(c->info[u].rows * c->info[u].cols);
        ast = QD_ERR_UNSUPPORTED;
        if (r && fq[t] == 2)
            ast = OP(c, adamw_bits, c->params + off, c->grads + off, c->m + off, c->v + off, c->wk + off, n, o, wd,
                     gscale, bc1, bc2);
        if (ast == QD_ERR_UNSUPPORTED)
            ast = r ? OP(c, adamw_round, c->params + off, c->grads + off, c->m + off, c->v + off, c->wk + off, n, o,
                         wd, gscale, bc1, bc2)
                    : OP(c, adamw, c->params + off, c->grads + off, c->m + off, c->v + off, n, o, wd, gscale, bc1,
                         bc2);
    }
    free(fq);
    QD_TRY(ast);
    c->wk_rounded = fuse;
    c->have_forward = 0;
    mark(c, QD_PH_SYNC);
    qd_status st = sync_weights(c);
    mark(c, QD_PH_OTHER);
    return st;
}

/* ------------------------------------------------------------------------ */
/* forward and backward of the interface                                     */

static qd_status forward_impl(model *c, const qd_batch *bt, float *logp, float *logits)
{
    int V = c->cfg.vocab_size;
    c->have_forward = 0;
    QD_TRY(reset_diag(c));
    QD_TRY(pack_batch(c, bt));
    void *d_lp;
    QD_TRY(scratch(c, S_LOGP, sizeof(float) * (size_t)(c->N ? c->N : 1), &d_lp));
    QD_TRY(model_forward(c, d_lp));
    float *lp = malloc(sizeof(float) * (size_t)(c->N ? c->N : 1));
    if (!lp)
        return qd_error(QD_ERR_NOMEM, "%s backend: log-probs", c->ops->name);
    qd_status st = OP(c, to_host, lp, d_lp, sizeof(float) * (size_t)c->N);
    if (!st) {
        memset(logp, 0, sizeof(float) * (size_t)bt->B * bt->T);
        for (int n = 0; n < c->N; n++)
            logp[c->src[n]] = lp[n];
    }
    free(lp);
    if (!st && logits) {  /* a sequence's tokens are consecutive in both layouts: one copy each */
        memset(logits, 0, sizeof(float) * (size_t)bt->B * bt->T * V);
        for (int b = 0; b < c->B && !st; b++) {
            int n0 = c->seq_off[b], len = c->seq_off[b + 1] - n0;
            if (len)
                st = OP(c, to_host, logits + (size_t)c->src[n0] * V, c->logits + (size_t)n0 * V,
                        sizeof(float) * (size_t)len * V);
        }
    }
    if (!st)
        c->have_forward = c->have_diag = 1;
    return st;
}

static qd_status backward_impl(model *c, const float *dlogp)
{
    if (!c->have_forward)
        return qd_error(QD_ERR_ARG, "backward: no forward since the last weight change");
    if (c->lean)
        return lean_refusal(c, "backward");
    for (int i = 0; i < c->nlin; i++)
        if (is_rollout_only(c->lin[i].mode))
            return qd_error(QD_ERR_UNSUPPORTED, "backward: recipe %s has no backward in the rollout role",
                            qd_recipe_name(c->opt.recipe));
    QD_TRY(ensure_train(c));
    float *d = malloc(sizeof(float) * (size_t)(c->N ? c->N : 1));
    if (!d)
        return qd_error(QD_ERR_NOMEM, "%s backend: dlogp", c->ops->name);
    qd_status st = qd_gather_dlogp(d, dlogp, c->src, c->N);
    void *dd = NULL;
    if (!st)
        st = scratch(c, S_LOGP, sizeof(float) * (size_t)(c->N ? c->N : 1), &dd);
    if (!st)
        st = OP(c, to_dev, dd, d, sizeof(float) * (size_t)c->N);
    free(d);
    return st ? st : model_backward(c, dd);
}

static qd_status diagnostics_impl(model *c, qd_diagnostics *out)
{
    if (!c->opt.diagnostics || !c->have_diag)
        return qd_error(QD_ERR_ARG, "diagnostics: %s", c->opt.diagnostics ? "no forward yet"
                        : "not enabled in the backend options");
    int nq = 0, nmoe = 0, K = c->cfg.num_experts_per_tok;
    for (int l = 0; l < c->cfg.num_hidden_layers; l++)
        nmoe += c->layers[l].moe;
    free(c->dg_topk);
    c->dg_topk = malloc(sizeof(int32_t) * ((size_t)nmoe * c->N * K + 1));
    if (!c->dg_topk)
        return qd_error(QD_ERR_NOMEM, "%s backend: diagnostics", c->ops->name);
    for (int l = 0, m = 0; l < c->cfg.num_hidden_layers; l++)
        if (c->layers[l].moe)
            QD_TRY(OP(c, to_host, c->dg_topk + (size_t)(m++) * c->N * K, c->acts[l].topk,
                      sizeof(int32_t) * (size_t)c->N * K));
    double *h = NULL;
    if (c->d_diag) { /* d_diag's sums, each linear's weight error from its pair as measure_weight_error's */
        h = malloc(sizeof(double) * 4 * (size_t)c->nlin);
        if (!h)
            return qd_error(QD_ERR_NOMEM, "%s backend: diagnostics", c->ops->name);
        qd_status st = OP(c, to_host, h, c->d_diag, sizeof(double) * 4 * (size_t)c->nlin);
        if (st) {
            free(h);
            return st;
        }
    }
    for (int i = 0; i < c->nlin; i++) {
        const linear *L = &c->lin[i];
        if (!L->quantized)
            continue;
        c->dg_names[nq] = L->name;
        if (h) {
            const double *w = h + 2 * ((size_t)c->nlin + i);
            c->dg_act_err[nq] = h[2 * i];
            c->dg_act_norm[nq] = h[2 * i + 1];
            c->dg_weight_err[nq++] = w[1] > 0 ? w[0] / w[1] : 0.0;
        } else {
            c->dg_act_err[nq] = L->act_err;
            c->dg_act_norm[nq] = L->act_norm;
            c->dg_weight_err[nq++] = L->weight_err;
        }
    }
    free(h);
    *out = (qd_diagnostics){.num_linear = nq, .names = c->dg_names, .act_err = c->dg_act_err,
                            .act_norm = c->dg_act_norm, .weight_err = c->dg_weight_err, .num_tokens = c->N,
                            .num_moe_layers = nmoe, .top_k = K, .router_topk = c->dg_topk};
    return QD_OK;
}

/* ------------------------------------------------------------------------ */
/* the RAC state blob: for each RAC linear in order, int64 nrac, int64        */
/* rac_ch[in] (the first nrac used), double rac_err[in] (backends/shared.h)  */

static size_t rac_state_size_impl(model *c)
{
    size_t n = 0;
    for (int i = 0; i < c->nlin; i++)
        if (has_rac(c->lin[i].mode))
            n += qd_rac_state_bytes(c->lin[i].in);
    return n;
}

static qd_status get_rac_impl(model *c, char *p)
{
    QD_TRY(rac_host(c));
    for (int i = 0; i < c->nlin; i++) {
        const linear *L = &c->lin[i];
        if (!has_rac(L->mode))
            continue;
        memcpy(p, &L->nrac, sizeof(int64_t));
        memcpy(p + sizeof(int64_t), L->rac_ch, sizeof(int64_t) * (size_t)L->in);
        p += sizeof(int64_t) * (1 + (size_t)L->in);
        QD_TRY(OP(c, to_host, p, L->d_rac_err, sizeof(double) * (size_t)L->in));
        p += sizeof(double) * (size_t)L->in;
    }
    return QD_OK;
}

/* One linear's part of the blob (tmp: scratch of in int64, so a bad set is
 * found before anything changes and the blob need not be aligned). */
static qd_status set_rac_linear(model *c, linear *L, const char *p, int64_t *tmp)
{
    int64_t nrac;
    memcpy(&nrac, p, sizeof nrac);
    memcpy(tmp, p + sizeof(int64_t), sizeof(int64_t) * (size_t)L->in);
    QD_TRY(qd_rac_check_channels(L->name, L->in, nrac, tmp));
    memcpy(L->rac_ch, tmp, sizeof(int64_t) * (size_t)L->in);
    L->nrac = nrac;
    p += sizeof(int64_t) * (1 + (size_t)L->in);
    memcpy(tmp, p, sizeof(double) * (size_t)L->in);
    QD_TRY(OP(c, to_dev, L->d_rac_err, tmp, sizeof(double) * (size_t)L->in));
    QD_TRY(OP(c, to_dev, L->d_rac_ch, L->rac_ch, sizeof(int64_t) * (size_t)L->in)); /* all: the copies agree */
    if (c->lean) /* no float weight here: the next sync builds the copy with these sets */
        return QD_OK;
    QD_TRY(weight_nvfp4(c, L, L->out, L->in + L->nrac));
    return OP(c, rac_augment_weight, &L->wq, c->params + L->w, L->out, L->in, L->d_rac_ch, L->nrac);
}

static qd_status set_rac_impl(model *c, const char *p)
{
    QD_TRY(rac_host(c)); /* a linear the blob does not reach keeps its channels */
    for (int i = 0; i < c->nlin; i++) {
        linear *L = &c->lin[i];
        if (!has_rac(L->mode))
            continue;
        int64_t *tmp = malloc(sizeof(int64_t) * (size_t)L->in);
        if (!tmp)
            return qd_error(QD_ERR_NOMEM, "set_rac_state");
        qd_status st = set_rac_linear(c, L, p, tmp);
        free(tmp);
        QD_TRY(st);
        p += qd_rac_state_bytes(L->in);
    }
    c->have_forward = 0;
    c->rac_pending = 1;
    return finish(c);
}

/* The statistics alone: each RAC linear's in doubles, in order, read out
 * (QD_RAC_ERRORS_GET) or written into the backend (..._PUT). */
static qd_status rac_stats_io(model *c, double *err, qd_rac_errors_dir dir)
{
    for (int i = 0; i < c->nlin; i++) {
        linear *L = &c->lin[i];
        if (!has_rac(L->mode))
            continue;
        size_t bytes = sizeof(double) * (size_t)L->in;
        QD_TRY(dir == QD_RAC_ERRORS_PUT ? OP(c, to_dev, L->d_rac_err, err, bytes)
                                        : OP(c, to_host, err, L->d_rac_err, bytes));
        err += L->in;
    }
    return QD_OK;
}

static size_t rac_stats_count_impl(model *c)
{
    size_t n = 0;
    for (int i = 0; i < c->nlin; i++)
        if (has_rac(c->lin[i].mode))
            n += (size_t)c->lin[i].in;
    return n;
}

/* ------------------------------------------------------------------------ */
/* the memory plan: the bytes each kind reaches under options.workload, by  */
/* the size rules of the allocations above                                   */

static void need(size_t *have, size_t bytes)
{
    if (bytes > *have)
        *have = bytes;
}

/* A RAC linear's width: what qd_rac_select picks at every sync. */
static int64_t planned_nrac(const model *c, const linear *L)
{
    return has_rac(L->mode) ? qd_rac_count(c->opt.rac_ratio, L->in) : 0;
}

/* Scratch of one linear over rows of input, forward or backward
 * (linear_forward, experts_forward_set, effective_input; plain: a linear of
 * its own, whose input linear_input may leave unrounded). */
static void plan_linear(const model *c, const linear *L, int rows, int plain, size_t *s)
{
    size_t r = (size_t)rows;
    if (rows == 0)
        return;
    if (measured(c, L)) { /* linear_forward measures before anything else */
        need(&s[S_XH], sizeof(float) * r * L->in);
        need(&s[S_DIAG], sizeof(double) * 2 * r);
    }
    if (plain && input_unrounded(c, L, rows))
        return;
    if (is_w4a4(L->mode)) {
        need(&s[S_ACT], nvfp4_bytes(rows, L->in + planned_nrac(c, L)));
        if (is_replay(L->mode)) /* the backward's dequantized input (effective_input) */
            need(&s[S_XE], sizeof(float) * r * L->in);
    } else if (L->mode == QD_LINEAR_FP8) {
        need(&s[S_FP8Q], r * L->in);
        need(&s[S_FP8S], sizeof(float) * r);
    } else if (L->mode != QD_LINEAR_FP32) {
        need(&s[S_XE], sizeof(float) * r * L->in);
    }
}

enum { PASS_FORWARD, PASS_PREFILL, PASS_DECODE };

/* One model_forward over N tokens in B sequences (longest Tm): its
 * activations and scratch. */
static void plan_pass(model *c, int N, int B, int Tm, int pass, size_t *acts, size_t *s)
{
    const qd_model_config *g = &c->cfg;
    c->N = N, c->B = c->Bl = B, c->Tm = pass == PASS_DECODE ? Tm : att_stride(Tm), c->generating = pass != PASS_FORWARD;
    arena a = {NULL, 0};
    layout_acts(&a, c);
    need(acts, a.used);
    for (int l = 0; l < g->num_hidden_layers; l++) {
        const layer *ly = &c->layers[l];
        const int attn[4] = {ly->q, ly->k, ly->v, ly->o};
        int R = N * (ly->moe ? g->num_experts_per_tok : 1);
        for (int i = 0; i < 4; i++)
            plan_linear(c, &c->lin[attn[i]], N, 1, s);
        if (ly->moe)
            plan_linear(c, &c->lin[ly->router], N, 1, s);
        for (int w = 0; w < 3; w++)
            plan_linear(c, expert_lin(c, ly, 0, w), R, 0, s);
        /* rac_multi's activations of q, k, v and of gate, up side by side */
        const linear *qkv[3] = {&c->lin[ly->q], &c->lin[ly->k], &c->lin[ly->v]};
        const linear *gu[2] = {expert_lin(c, ly, 0, 0), expert_lin(c, ly, 0, 1)};
        int64_t nr[3];
        for (int i = 0; i < 3; i++)
            nr[i] = planned_nrac(c, qkv[i]);
        if (N && rac_multi_ok(c, qkv, 3))
            need(&s[S_ACT], acts_bytes(N, qkv[0]->in, nr, 3));
        for (int i = 0; i < 2; i++)
            nr[i] = planned_nrac(c, gu[i]);
        if (R && rac_multi_ok(c, gu, 2))
            need(&s[S_ACT], acts_bytes(R, gu[0]->in, nr, 2));
        if (pass == PASS_DECODE && moe_dev_decode(c, ly, N)) /* route's d_off */
            need(&s[S_MOEOFF], sizeof(int32_t) * ((size_t)ly->nexp + 1));
    }
    plan_linear(c, &c->lin[c->lm_head], pass == PASS_PREFILL ? B : N, 1, s);
    if (pass == PASS_PREFILL)
        need(&s[S_ROWS], up256(sizeof(float) * (size_t)B * g->hidden_size) + sizeof(int32_t) * (size_t)B);
    if (pass == PASS_FORWARD)
        need(&s[S_LOGP], sizeof(float) * (size_t)(N ? N : 1));
}

/* The weights and their copies; the weight error of diagnostics at each
 * sync; a lean instance's staging buffer (its largest staged tensor). */
static void plan_weights(const model *c, qd_mem_plan *p, size_t *s)
{
    size_t nb = sizeof(float) * c->nfloats;
    p->bytes[QD_MEM_MASTER] = c->lean ? 0 : nb;
    p->bytes[QD_MEM_WORKING] = c->lean ? sizeof(float) * c->nwk + sizeof(uint16_t) * c->nwk16
                                       : c->opt.recipe == QD_RECIPE_FP32 ? 0 : nb;
    for (int t = 0; c->lean && t < c->ninfo; t++) {
        size_t n = (size_t)(c->info[t].rows * c->info[t].cols);
        if (c->lin_at[t] >= 0 && staged(c, &c->lin[c->lin_at[t]]))
            need(&s[S_STAGE], sizeof(float) * n);
        else if (c->wk16_at[t] != NOT_HELD)
            need(&s[S_STAGE], sizeof(float) * (n < STAGE_CHUNK ? n : STAGE_CHUNK));
    }
    for (int i = 0; i < c->nlin; i++) {
        const linear *L = &c->lin[i];
        if (L->mode == QD_LINEAR_FP8)
            p->bytes[QD_MEM_QUANT] += (size_t)L->out * L->in + sizeof(float) * (size_t)L->out;
        if (is_w4a4(L->mode))
            p->bytes[QD_MEM_QUANT] += nvfp4_bytes(L->out, L->in + planned_nrac(c, L));
        if (has_rac(L->mode))
            p->bytes[QD_MEM_QUANT] += (sizeof(int64_t) + sizeof(double)) * (size_t)L->in;
        if (measured(c, L)) { /* a grouped fake-quant's weight error reads it in wk */
            if (c->lean || !fake_quant_only(c, L) || !fq_grouped(c))
                need(&s[S_XH], sizeof(float) * (size_t)L->out * L->in);
            need(&s[S_DIAG], sizeof(double) * 2 * (size_t)L->out);
        }
    }
    if (diag_on_dev(c))
        p->bytes[QD_MEM_SCRATCH] += sizeof(double) * 4 * (size_t)c->nlin; /* d_diag */
    p->bytes[QD_MEM_WORKING] += head_bfp_bytes(c);
    p->bytes[QD_MEM_OWN] = c->ops->own_bytes ? c->ops->own_bytes(c->dev, c->lean ? c->nwk : c->nfloats) : 0;
    p->bytes[QD_MEM_TABLES] = 2 * sizeof(float) * (size_t)c->cfg.max_position_embeddings * (c->cfg.head_dim / 2);
}

static void plan_memory(model *c, const qd_workload *w, qd_mem_plan *p)
{
    const qd_model_config *g = &c->cfg;
    size_t s[S_NSCRATCH] = {0}, acts = 0, nb = sizeof(float) * c->nfloats;
    memset(p, 0, sizeof *p);
    plan_weights(c, p, s);
    if (w->fwd_B > 0 && w->fwd_T > 0) {
        plan_pass(c, w->fwd_B * w->fwd_T, w->fwd_B, w->fwd_T, PASS_FORWARD, &acts, s);
        size_t lf;
        if (w->train)
            need(&s[S_BWD], sizeof(float) * backward_floats(c, 0, &lf));
    }
    if (w->train) {
        size_t nch = (c->nfloats + 4095) / 4096;
        p->bytes[QD_MEM_GRADS] = nb;
        p->bytes[QD_MEM_ADAM] = 2 * nb;
        need(&s[S_DIAG], sizeof(double) * (nch ? nch : 1));
    }
    if (w->gen_B > 0 && w->gen_Tp > 0) {
        int B = w->gen_B, Tmax = w->gen_Tp + w->gen_M;
        if (w->gen_M > 0)
            plan_pass(c, B * w->gen_Tp, B, w->gen_Tp, PASS_PREFILL, &acts, s);
        if (w->gen_M > 1) /* the last decode step attends to Tmax - 1 positions */
            plan_pass(c, B, B, Tmax - 1, PASS_DECODE, &acts, s);
        p->bytes[QD_MEM_KV] = 2 * sizeof(float) * (size_t)g->num_hidden_layers * (size_t)B * (size_t)Tmax *
                              (size_t)g->num_key_value_heads * (size_t)g->head_dim;
    }
    c->N = c->B = c->Bl = c->Tm = c->generating = 0;
    p->bytes[QD_MEM_ACTS] = acts;
    c->plan_sdiag = s[S_DIAG];
    c->plan_sxh = s[S_XH];
    for (int i = 0; i < S_NSCRATCH; i++)
        p->bytes[QD_MEM_SCRATCH] += s[i];
    for (int k = 0; k < QD_MEM_COUNT; k++)
        p->total += p->bytes[k];
}

static int workload_set(const qd_workload *w)
{
    return w->fwd_B || w->fwd_T || w->gen_B || w->gen_Tp || w->gen_M || w->train;
}

/* Token and routed-row counts must fit the driver's int (and int32 rows). */
static qd_status check_workload(const model *c, const qd_workload *w)
{
    int64_t K = c->cfg.num_experts_per_tok > 1 ? c->cfg.num_experts_per_tok : 1;
    if (w->fwd_B < 0 || w->fwd_T < 0 || w->gen_B < 0 || w->gen_Tp < 0 || w->gen_M < 0 ||
        (int64_t)w->fwd_B * w->fwd_T * K > INT32_MAX || (int64_t)w->gen_B * w->gen_Tp * K > INT32_MAX ||
        (int64_t)w->gen_Tp + w->gen_M > INT32_MAX)
        return qd_error(QD_ERR_ARG, "%s backend: workload out of range: forwards of %d x %d tokens, generates "
                        "of %d x (%d + %d) tokens (routed rows must stay below 2^31)", c->ops->name, w->fwd_B,
                        w->fwd_T, w->gen_B, w->gen_Tp, w->gen_M);
    return QD_OK;
}

/* The refusal: the plan, the bytes free, the three largest kinds. */
static qd_status plan_error(const model *c, size_t avail)
{
    char msg[768], b[3][32];
    qd_format_bytes(c->plan.total, b[0], sizeof b[0]);
    qd_format_bytes(c->free_at_init, b[1], sizeof b[1]);
    qd_format_bytes(c->dev_total, b[2], sizeof b[2]);
    int n = snprintf(msg, sizeof msg, "%s backend (%s role, recipe %s): out of memory before starting: the "
                     "memory plan needs %s, %s free of %s", c->ops->name,
                     c->opt.role == QD_ROLE_ROLLOUT ? "rollout" : "trainer", qd_recipe_name(c->opt.recipe), b[0],
                     b[1], b[2]);
    if (c->opt.mem_reserved) {
        qd_format_bytes(c->opt.mem_reserved, b[0], sizeof b[0]);
        qd_format_bytes(avail, b[1], sizeof b[1]);
        n += snprintf(msg + n, sizeof msg - (size_t)n, " (%s of it planned by the other instances: %s left)", b[0],
                      b[1]);
    }
    n += snprintf(msg + n, sizeof msg - (size_t)n, "; the largest:");
    int used[QD_MEM_COUNT] = {0};
    for (int j = 0; j < 3; j++) {
        int best = -1;
        for (int k = 0; k < QD_MEM_COUNT; k++)
            if (!used[k] && c->plan.bytes[k] && (best < 0 || c->plan.bytes[k] > c->plan.bytes[best]))
                best = k;
        if (best < 0)
            break;
        used[best] = 1;
        qd_format_bytes(c->plan.bytes[best], b[0], sizeof b[0]);
        n += snprintf(msg + n, sizeof msg - (size_t)n, "%s %s %s", j ? "," : "", qd_mem_kind_name(best), b[0]);
    }
    return qd_error(QD_ERR_NOMEM, "%s", msg);
}

/* The plan of options.workload, checked against the device's free bytes
 * before anything is allocated. */
static qd_status check_plan(model *c)
{
    const qd_workload *w = &c->opt.workload;
    if (!workload_set(w))
        return QD_OK;
    QD_TRY(check_workload(c, w));
    plan_memory(c, w, &c->plan);
    if (!c->ops->mem_info)
        return QD_OK;
    QD_TRY(OP(c, mem_info, &c->free_at_init, &c->dev_total));
    size_t avail = c->free_at_init > c->opt.mem_reserved ? c->free_at_init - c->opt.mem_reserved : 0;
    return c->plan.total <= avail ? QD_OK : plan_error(c, avail);
}

/* ------------------------------------------------------------------------ */
/* the vtable: each call runs between the ops' enter and leave               */

static int enter(model *c) { return c->ops->enter ? c->ops->enter(c->dev) : 0; }

static void leave(model *c, int token)
{
    if (c->ops->leave)
        c->ops->leave(c->dev, token);
}

static const char *m_get_name(qd_backend *b) { return ctx_of(b)->ops->name; }

static void free_linear(model *c, linear *L)
{
    c->ops->release(c->dev, L->wq_mem);
    c->ops->release(c->dev, L->w8);
    c->ops->release(c->dev, L->w8_inv);
}

static void m_free(qd_backend *b)
{
    model *c = ctx_of(b);
    if (c->ops->report)
        c->ops->report(c->dev);
    for (int i = 0; c->lin && i < c->nlin; i++)
        free_linear(c, &c->lin[i]);
    c->ops->release(c->dev, c->d_rac_ch);
    c->ops->release(c->dev, c->d_rac_err);
    c->ops->release(c->dev, c->d_diag);
    free(c->rac_ch);
    if (c->wk != c->params)
        c->ops->release(c->dev, c->wk);
    c->ops->release(c->dev, c->wk16);
    c->ops->release(c->dev, c->head_bfp);
    float *bufs[] = {c->params, c->grads, c->m, c->v, c->rope_cos, c->rope_sin};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++)
        c->ops->release(c->dev, bufs[i]);
    c->ops->release(c->dev, c->arena);
    for (int i = 0; i < S_NSCRATCH; i++)
        c->ops->release(c->dev, c->scratch[i]);
    if (c->free_dev)
        c->free_dev(c->dev);
    free(c->lin);
    free(c->layers);
    free(c->acts);
    free(c->info);
    free(c->wk_at);
    free(c->wk16_at);
    free(c->lin_at);
    free(c->harena);
    free(c->dg_names);
    free(c->dg_act_err);
    free(c->dg_act_norm);
    free(c->dg_weight_err);
    free(c->dg_topk);
    free(c->wmeasured);
    free(c);
}

static qd_status m_set_weights(qd_backend *b, const float *params, size_t n)
{
    model *c = ctx_of(b);
    int t = enter(c);
    c->have_forward = 0;
    qd_status st = c->lean ? QD_OK : OP(c, to_dev, c->params, params, sizeof(float) * n);
    if (!st)
        st = sync_weights_from(c, &(wsrc){.host = params});
    leave(c, t);
    return st;
}

static qd_status m_set_weights_fill(qd_backend *b, qd_weight_fill fill, void *user)
{
    model *c = ctx_of(b);
    int t = enter(c);
    c->have_forward = 0;
    wsrc s = {.fill = fill, .user = user};
    qd_status st = sync_weights_from(c, &s);
    free(s.buf);
    leave(c, t);
    return st;
}

static qd_status m_get_weights(qd_backend *b, float *params, size_t n)
{
    model *c = ctx_of(b);
    if (c->lean)
        return lean_refusal(c, "get_weights");
    return OP(c, to_host, params, c->params, sizeof(float) * n);
}

/* A lean instance whose RAC sets await a sync cannot run its products. */
static qd_status check_pending(const model *c, const char *what)
{
    if (!c->lean || !c->rac_pending)
        return QD_OK;
    return qd_error(QD_ERR_ARG, "%s: the RAC channel sets of set_rac_state are built at the next weight sync "
                    "(set_weights, sync_from): a %s backend in the rollout role keeps no float32 weights",
                    what, c->ops->name);
}

static qd_status m_forward(qd_backend *b, const qd_batch *bt, float *logp, float *logits)
{
    model *c = ctx_of(b);
    QD_TRY(check_pending(c, "forward"));
    int t = enter(c);
    c->rac_stats = bt->rac_stats != 0;
    qd_status st = forward_impl(c, bt, logp, logits);
    c->rac_stats = 0;
    leave(c, t);
    return st;
}

static qd_status m_backward(qd_backend *b, const float *dlogp)
{
    model *c = ctx_of(b);
    int t = enter(c);
    qd_status st = backward_impl(c, dlogp);
    leave(c, t);
    return st;
}

static void m_zero_grad(qd_backend *b)
{
    model *c = ctx_of(b);
    if (c->grads && c->lazy_zero)
        c->zero_pending = 1; /* grads_begin or grads_settle zeroes them */
    else if (c->grads)
        OP(c, zero, c->grads, sizeof(float) * c->nfloats);
}

/* A buffer not made yet reads as zeros. */
static qd_status get_or_zero(model *c, float *host, const float *dev_buf, size_t n)
{
    if (!dev_buf) {
        memset(host, 0, sizeof(float) * n);
        return QD_OK;
    }
    return OP(c, to_host, host, dev_buf, sizeof(float) * n);
}

static qd_status m_get_grads(qd_backend *b, float *grads, size_t n)
{
    model *c = ctx_of(b);
    QD_TRY(grads_settle(c));
    return get_or_zero(c, grads, c->grads, n);
}

static qd_status m_set_grads(qd_backend *b, const float *grads, size_t n)
{
    model *c = ctx_of(b);
    QD_TRY(ensure_train(c));
    c->zero_pending = 0; /* every one written */
    return OP(c, to_dev, c->grads, grads, sizeof(float) * n);
}

static qd_status m_optimizer_step(qd_backend *b, const qd_adamw *o, int step, float *norm_out)
{
    model *c = ctx_of(b);
    int t = enter(c);
    qd_status st = optimizer_step_impl(c, o, step, norm_out);
    leave(c, t);
    return st;
}

static qd_status m_generate(qd_backend *b, const qd_generate_request *rq, qd_generate_result *res)
{
    model *c = ctx_of(b);
    QD_TRY(check_pending(c, "generate"));
    int t = enter(c);
    c->rac_stats = rq->rac_stats != 0;
    c->diag_paused = rq->no_diagnostics != 0;
    qd_status st = generate_impl(c, rq, res);
    c->rac_stats = c->diag_paused = 0;
    leave(c, t);
    return st;
}

static qd_status m_diagnostics(qd_backend *b, qd_diagnostics *out) { return diagnostics_impl(ctx_of(b), out); }

static qd_status m_get_adam(qd_backend *b, float *m, float *v, size_t n)
{
    model *c = ctx_of(b);
    QD_TRY(get_or_zero(c, m, c->m, n));
    return get_or_zero(c, v, c->v, n);
}

static qd_status m_set_adam(qd_backend *b, const float *m, const float *v, size_t n)
{
    model *c = ctx_of(b);
    QD_TRY(ensure_train(c));
    QD_TRY(OP(c, to_dev, c->m, m, sizeof(float) * n));
    return OP(c, to_dev, c->v, v, sizeof(float) * n);
}

static size_t m_rac_state_size(qd_backend *b) { return rac_state_size_impl(ctx_of(b)); }

static qd_status m_get_rac_state(qd_backend *b, void *buf, size_t n)
{
    (void)n;
    return get_rac_impl(ctx_of(b), buf);
}

static qd_status m_set_rac_state(qd_backend *b, const void *buf, size_t n)
{
    model *c = ctx_of(b);
    (void)n;
    int t = enter(c);
    qd_status st = set_rac_impl(c, buf);
    leave(c, t);
    return st;
}

static size_t m_rac_stats_count(qd_backend *b) { return rac_stats_count_impl(ctx_of(b)); }

static qd_status m_get_rac_stats(qd_backend *b, double *err, size_t n)
{
    (void)n;
    return rac_stats_io(ctx_of(b), err, QD_RAC_ERRORS_GET);
}

static qd_status m_set_rac_stats(qd_backend *b, const double *err, size_t n)
{
    (void)n;
    return rac_stats_io(ctx_of(b), (double *)err, QD_RAC_ERRORS_PUT);
}

/* Device to device: src's master weights copied into b's (a lean b reads
 * them tensor by tensor), then b's sync (the bits of set_weights with the
 * same values). */
static qd_status m_sync_from(qd_backend *b, qd_backend *from)
{
    model *c = ctx_of(b), *s = ctx_of(from);
    if (c->ops != s->ops || !c->ops->copy || !c->ops->memory_id ||
        c->ops->memory_id(c->dev) != s->ops->memory_id(s->dev) || !s->params)
        return QD_ERR_UNSUPPORTED;
    int t = enter(c);
    c->have_forward = 0;
    qd_status st = finish(s); /* src's last update is done */
    if (!st && !c->lean)
        st = OP(c, copy, c->params, s->params, sizeof(float) * c->nfloats);
    if (!st)
        st = sync_weights_from(c, &(wsrc){.dev = s->params});
    leave(c, t);
    return st;
}

static qd_status m_memory(qd_backend *b, qd_memory *out)
{
    model *c = ctx_of(b);
    *out = (qd_memory){.plan = c->plan, .free_at_init = c->free_at_init, .device_total = c->dev_total};
    for (int k = 0; k < QD_MEM_COUNT; k++) {
        out->peak.bytes[k] = c->mem_peak[k];
        out->peak.total += c->mem_peak[k];
    }
    return QD_OK;
}

static qd_status m_wait(qd_backend *b) { return finish(ctx_of(b)); }

static const struct qd_backend_i model_iface = {
    .get_name = m_get_name,
    .free = m_free,
    .set_weights = m_set_weights,
    .get_weights = m_get_weights,
    .set_weights_fill = m_set_weights_fill,
    .forward = m_forward,
    .backward = m_backward,
    .zero_grad = m_zero_grad,
    .get_grads = m_get_grads,
    .optimizer_step = m_optimizer_step,
    .generate = m_generate,
    .diagnostics = m_diagnostics,
    .get_adam = m_get_adam,
    .set_adam = m_set_adam,
    .rac_state_size = m_rac_state_size,
    .get_rac_state = m_get_rac_state,
    .set_rac_state = m_set_rac_state,
    .rac_stats_count = m_rac_stats_count,
    .get_rac_stats = m_get_rac_stats,
    .set_rac_stats = m_set_rac_stats,
    .set_grads = m_set_grads,
    .sync_from = m_sync_from,
    .memory = m_memory,
    .wait = m_wait,
};

/* ------------------------------------------------------------------------ */
/* init                                                                      */

/* Ablations (options.quant_layers): the quantized linears of a layer left
 * out keep the dense mode. */
static void dense_layer(linear *lin, const layer *ly, qd_linear_mode dm)
{
    const int attn[4] = {ly->q, ly->k, ly->v, ly->o};
    for (int i = 0; i < 4; i++)
        lin[attn[i]].mode = dm;
    for (int i = 0; i < 3 * ly->nexp; i++)
        lin[ly->mlp0 + i].mode = dm;
}

/* Takes over the shared table (backends/layout.h); each linear layer gets the
 * mode the recipe gives it (the recipe table: qd_recipe_linear_mode), within
 * the layers options.quant_layers names. */
static qd_status build_params(model *c)
{
    int nl = c->cfg.num_hidden_layers;
    if (nl < 64 && c->opt.quant_layers >> nl)
        return qd_error(QD_ERR_ARG, "%s backend: options.quant_layers 0x%llx names a layer at or above "
                        "num_hidden_layers %d", c->ops->name, (unsigned long long)c->opt.quant_layers, nl);
    qd_model_layout m;
    QD_TRY(qd_model_layout_init(&m, &c->cfg));
    qd_linear_mode qm = qd_recipe_linear_mode(c->opt.recipe, c->opt.role);
    qd_linear_mode dm = qd_recipe_dense_mode(c->opt.recipe);
    c->lin = calloc((size_t)m.nlin, sizeof *c->lin);
    if (!c->lin) {
        qd_model_layout_free(&m);
        return qd_error(QD_ERR_NOMEM, "%s backend: parameter table", c->ops->name);
    }
    for (int i = 0; i < m.nlin; i++) {
        linear *L = &c->lin[i];
        L->w = L->wk = m.lin[i].w;
        L->wk16 = NOT_HELD;
        L->out = m.lin[i].out;
        L->in = m.lin[i].in;
        L->quantized = m.lin[i].quantized;
        L->name = m.lin[i].name;
        L->mode = L->quantized ? qm : dm;
    }
    for (int l = 0; c->opt.quant_layers && l < nl; l++)
        if (l >= 64 || !(c->opt.quant_layers >> l & 1))
            dense_layer(c->lin, &m.layers[l], dm);
    c->nlin = m.nlin;
    c->info = m.info;
    c->ninfo = m.ninfo;
    c->nfloats = m.nfloats;
    c->layers = m.layers;
    c->embed = m.embed;
    c->final_norm = m.final_norm;
    c->lm_head = m.lm_head;
    free(m.lin);
    return QD_OK;
}

/* A lean instance's tensor kept as BF16 bits: the embedding, and the
 * weights of the linears that multiply BF16-rounded weights (BF16 and the
 * activation-only ablation) but the experts' (their grouped products read
 * float32), when the ops have the BF16-weight slots and the rows are a
 * multiple of 8 wide (matmul_w16). Every recipe but fp32 rounds them. */
static int held_bf16(const model *c, int t, const int *mlp)
{
    const linear *L = c->lin_at[t] >= 0 ? &c->lin[c->lin_at[t]] : NULL;
    int bf16_weight = L && !mlp[c->lin_at[t]] && (L->mode == QD_LINEAR_BF16 || L->mode == QD_LINEAR_ACT_QAT);
    return c->ops->to_bf16 && c->ops->embed_w16 && c->ops->matmul_w16 && c->opt.recipe != QD_RECIPE_FP32 &&
           c->info[t].cols % 8 == 0 && (c->info[t].offset == c->embed || bf16_weight);
}

/* A lean instance's places of the tensors the forward reads: in wk16 those
 * held as BF16 (held_bf16), in wk the others read as float, none for the
 * linears whose products read codes; each 256-byte aligned. mlp (nlin)
 * marks the MLP and expert linears. */
static void place_tensors(model *c, const int *mlp)
{
    c->nwk = c->nwk16 = 0;
    for (int t = 0; t < c->ninfo; t++) {
        const linear *L = c->lin_at[t] >= 0 ? &c->lin[c->lin_at[t]] : NULL;
        size_t n = (size_t)(c->info[t].rows * c->info[t].cols);
        c->wk_at[t] = c->wk16_at[t] = NOT_HELD;
        if (L && is_rollout_quant(L->mode))
            continue;
        if (held_bf16(c, t, mlp)) {
            c->wk16_at[t] = c->nwk16;
            c->nwk16 += (n + 127) & ~(size_t)127;
        } else {
            c->wk_at[t] = c->nwk;
            c->nwk += up64(n);
        }
    }
    for (int i = 0; i < c->nlin; i++) {
        int t = tensor_at(c, c->lin[i].w);
        c->lin[i].wk = c->wk_at[t];
        c->lin[i].wk16 = c->wk16_at[t];
    }
    c->embed16 = c->wk16_at[tensor_at(c, c->embed)];
}

/* A lean instance (the rollout role, but the fp32 recipe, whose working copy
 * is its master, and options.keep_master): each tensor's linear and its
 * place (place_tensors). */
static qd_status build_lean(model *c)
{
    c->embed16 = NOT_HELD;
    c->lean = c->opt.role == QD_ROLE_ROLLOUT && c->opt.recipe != QD_RECIPE_FP32 && !c->opt.keep_master;
    if (!c->lean)
        return QD_OK;
    c->wk_at = malloc(sizeof(size_t) * (size_t)c->ninfo);
    c->wk16_at = malloc(sizeof(size_t) * (size_t)c->ninfo);
    c->lin_at = malloc(sizeof(int) * (size_t)c->ninfo);
    int *mlp = calloc((size_t)c->nlin, sizeof(int));
    if (!c->wk_at || !c->wk16_at || !c->lin_at || !mlp) {
        free(mlp);
        return qd_error(QD_ERR_NOMEM, "%s backend: parameter table", c->ops->name);
    }
    for (int t = 0; t < c->ninfo; t++)
        c->lin_at[t] = -1;
    for (int i = 0; i < c->nlin; i++)
        c->lin_at[tensor_at(c, c->lin[i].w)] = i;
    for (int l = 0; l < c->cfg.num_hidden_layers; l++)
        for (int i = 0; i < 3 * c->layers[l].nexp; i++)
            mlp[c->layers[l].mlp0 + i] = 1;
    place_tensors(c, mlp);
    free(mlp);
    return QD_OK;
}

static qd_status alloc_linear(model *c, linear *L)
{
    if (L->mode == QD_LINEAR_FP8) {
        QD_TRY(dalloc(c, (void **)&L->w8, (size_t)L->out * L->in, QD_MEM_QUANT, "fp8 weights"));
        QD_TRY(dalloc(c, (void **)&L->w8_inv, sizeof(float) * (size_t)L->out, QD_MEM_QUANT, "fp8 weight scales"));
    }
    if (is_w4a4(L->mode) && L->in % QD_NVFP4_BLOCK)
        return qd_error(QD_ERR_SHAPE, "%s backend: NVFP4 needs in-features %% 16 == 0, got %d", c->ops->name,
                        L->in);
    return QD_OK;
}

/* The RAC state of every RAC linear, one buffer each, the linears' views into them. */
static qd_status alloc_rac(model *c)
{
    for (int i = 0; i < c->nlin; i++)
        c->nrac_in += has_rac(c->lin[i].mode) ? (size_t)c->lin[i].in : 0;
    if (!c->nrac_in)
        return QD_OK;
    c->rac_ch = calloc(c->nrac_in, sizeof(int64_t));
    if (!c->rac_ch)
        return qd_error(QD_ERR_NOMEM, "%s backend: RAC state", c->ops->name);
    QD_TRY(dalloc(c, (void **)&c->d_rac_ch, sizeof(int64_t) * c->nrac_in, QD_MEM_QUANT, "RAC channels"));
    QD_TRY(dalloc(c, (void **)&c->d_rac_err, sizeof(double) * c->nrac_in, QD_MEM_QUANT, "RAC statistics"));
    size_t off = 0;
    for (int i = 0; i < c->nlin; i++) {
        linear *L = &c->lin[i];
        if (!has_rac(L->mode))
            continue;
        L->rac_ch = c->rac_ch + off;
        L->d_rac_ch = c->d_rac_ch + off;
        L->d_rac_err = c->d_rac_err + off;
        off += L->in;
    }
    return QD_OK;
}

/* The RoPE tables (qd_rope_tables, on the host), copied to the device. */
static qd_status upload_rope(model *c)
{
    size_t nr = (size_t)c->cfg.max_position_embeddings * (c->cfg.head_dim / 2);
    float *cs = malloc(sizeof(float) * nr), *sn = malloc(sizeof(float) * nr);
    qd_status st = cs && sn ? QD_OK : qd_error(QD_ERR_NOMEM, "%s backend: RoPE table", c->ops->name);
    if (!st)
        qd_rope_tables(cs, sn, &c->cfg);
    if (!st)
        st = dalloc(c, (void **)&c->rope_cos, sizeof(float) * nr, QD_MEM_TABLES, "RoPE cos");
    if (!st)
        st = dalloc(c, (void **)&c->rope_sin, sizeof(float) * nr, QD_MEM_TABLES, "RoPE sin");
    if (!st)
        st = OP(c, to_dev, c->rope_cos, cs, sizeof(float) * nr);
    if (!st)
        st = OP(c, to_dev, c->rope_sin, sn, sizeof(float) * nr);
    free(cs);
    free(sn);
    return st;
}

/* The host tables, the memory plan (failing here, before any device
 * buffer, when it does not fit), then the weights and their copies. */
static qd_status alloc_model(model *c)
{
    size_t n = sizeof(float) * c->nfloats;
    c->acts = calloc((size_t)c->cfg.num_hidden_layers, sizeof(layer_acts));
    c->dg_names = calloc((size_t)c->nlin, sizeof(char *));
    c->dg_act_err = calloc((size_t)c->nlin, sizeof(double));
    c->dg_act_norm = calloc((size_t)c->nlin, sizeof(double));
    c->dg_weight_err = calloc((size_t)c->nlin, sizeof(double));
    if (!c->acts || !c->dg_names || !c->dg_act_err || !c->dg_act_norm || !c->dg_weight_err)
        return qd_error(QD_ERR_NOMEM, "%s backend: tables", c->ops->name);
    QD_TRY(check_plan(c));
    if (diag_on_dev(c)) {
        QD_TRY(dalloc(c, (void **)&c->d_diag, sizeof(double) * 4 * (size_t)c->nlin, QD_MEM_SCRATCH,
                      "diagnostics' sums"));
        QD_TRY(OP(c, zero, c->d_diag, sizeof(double) * 4 * (size_t)c->nlin));
        if (c->ops->sqerr_weights && !(c->wmeasured = calloc((size_t)(c->nlin ? c->nlin : 1), 1)))
            return qd_error(QD_ERR_NOMEM, "%s backend: tables", c->ops->name);
    }
    if (c->lean) {
        QD_TRY(dalloc(c, (void **)&c->wk, sizeof(float) * c->nwk, QD_MEM_WORKING, "working weights"));
        if (c->nwk16)
            QD_TRY(dalloc(c, (void **)&c->wk16, sizeof(uint16_t) * c->nwk16, QD_MEM_WORKING,
                          "working weights (BF16)"));
    } else {
        QD_TRY(dalloc(c, (void **)&c->params, n, QD_MEM_MASTER, "master weights"));
        if (c->opt.recipe == QD_RECIPE_FP32)
            c->wk = c->params;
        else
            QD_TRY(dalloc(c, (void **)&c->wk, n, QD_MEM_WORKING, "working weights"));
    }
    if (head_bfp_bytes(c))
        QD_TRY(dalloc(c, &c->head_bfp, head_bfp_bytes(c), QD_MEM_WORKING,
                      "the lm_head's weights (row block floating point)"));
    if (c->ops->own_bytes) /* made by the ops at the first sync (weights_changed) */
        c->mem_now[QD_MEM_OWN] = c->mem_peak[QD_MEM_OWN] =
            c->ops->own_bytes(c->dev, c->lean ? c->nwk : c->nfloats);
    for (int i = 0; i < c->nlin; i++)
        QD_TRY(alloc_linear(c, &c->lin[i]));
    QD_TRY(alloc_rac(c));
    QD_TRY(upload_rope(c));
    return sync_weights(c);
}

static qd_status init_impl(model *c)
{
    QD_TRY(build_params(c));
    QD_TRY(build_lean(c));
    c->base.params = c->info;
    c->base.num_params = c->ninfo;
    c->base.num_floats = c->nfloats;
    int t = enter(c);
    qd_status st = alloc_model(c);
    leave(c, t);
    return st;
}

qd_backend *qd_model_backend_new(const qd_model_config *cfg, const qd_backend_options *opt, const qd_ops *ops,
                                 void *dev, void (*free_dev)(void *dev))
{
    model *c = calloc(1, sizeof *c);
    if (!c) {
        qd_error(QD_ERR_NOMEM, "%s backend: context", ops->name);
        if (free_dev)
            free_dev(dev);
        return NULL;
    }
    c->cfg = *cfg;
    c->opt = *opt;
    c->ops = ops;
    c->dev = dev;
    const char *lz = getenv("QUADS_LAZY_ZERO");
    c->lazy_zero = lz && !strcmp(lz, "1");
    c->free_dev = free_dev;
    c->base.iface = &model_iface;
    c->base.context = c;
    if (init_impl(c)) {
        m_free(&c->base);
        return NULL;
    }
    return &c->base;
}

qd_status qd_backend_plan(const qd_model_config *cfg, const qd_backend_options *opt, qd_mem_plan *out)
{
    QD_TRY(qd_model_config_check(cfg));
    if ((unsigned)opt->recipe >= QD_RECIPE_COUNT || opt->rac_ratio < 0 || opt->rac_ratio > 1)
        return qd_error(QD_ERR_ARG, "plan: bad recipe or rac_ratio");
    model *c = calloc(1, sizeof *c);
    if (!c)
        return qd_error(QD_ERR_NOMEM, "plan: context");
    c->cfg = *cfg;
    c->opt = *opt;
    c->ops = qd_cpu_ops();
    c->base.context = c;
    qd_status st = build_params(c);
    if (!st)
        st = build_lean(c);
    if (!st && !(c->acts = calloc((size_t)cfg->num_hidden_layers, sizeof(layer_acts))))
        st = qd_error(QD_ERR_NOMEM, "plan: tables");
    if (!st)
        st = check_workload(c, &opt->workload);
    if (!st)
        plan_memory(c, &opt->workload, out);
    m_free(&c->base);
    return st;
}
