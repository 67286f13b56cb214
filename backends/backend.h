/* backends/: the one interface every compute backend implements (ARCHITECTURE.md,
 * "The backend interface"), in the style of ggml-backend: callers hold an
 * opaque qd_backend and use the qd_backend_* dispatchers below; a backend fills
 * a static const qd_backend_i table (NULL in optional slots) and a context.
 *
 * A backend instance holds one model: float32 master weights, their gradients
 * and the AdamW state, each one flat buffer in the order of qd_param_info
 * (Hugging Face tensor names, per-expert tensors separate), plus the working
 * copies its precision recipe derives from the master weights at each sync. */
#ifndef QD_BACKEND_H
#define QD_BACKEND_H

#include <stddef.h>
#include <stdint.h>
#include "quant/status.h"
#include "models/model_config.h"

/* ---- precision recipes (ARCHITECTURE.md, the recipe table) */

typedef enum {
    QD_RECIPE_FP32 = 0,      /* reference: everything float32 */
    QD_RECIPE_BF16,
    QD_RECIPE_FP8,
    QD_RECIPE_NVFP4,
    QD_RECIPE_NVFP4_AQAT,
    QD_RECIPE_NVFP4_RAC,
    QD_RECIPE_QUADS,
    QD_RECIPE_NVFP4_SYM_QAT,
    QD_RECIPE_NVFP4_REPLAY,  /* the trainer's forward is the rollout's W4A4 (no gap in exact mode) */
    QD_RECIPE_QUADS_REPLAY,  /* the same with the RAC rollout: channel sets copied to the trainer */
    QD_RECIPE_NVFP4_W16A4,   /* ablation: rollout with NVFP4 activations only (quads ablate) */
    QD_RECIPE_NVFP4_W4A16,   /* ablation: rollout with NVFP4 weights only */
    QD_RECIPE_COUNT
} qd_recipe;

typedef enum { QD_ROLE_ROLLOUT = 0, QD_ROLE_TRAINER } qd_role;

/* Execution mode (NUMERICS.md §6): exact reproduces the CPU backend's bits
 * (the default, and the CPU's only mode); fast lets the CUDA backend use
 * cuBLASLt GEMMs and fused kernels, within a stated relative error. */
typedef enum { QD_MODE_EXACT = 0, QD_MODE_FAST } qd_exec_mode;

/* What one linear layer does with its input x and master weight W. */
typedef enum {
    QD_LINEAR_FP32 = 0,  /* x . W^T in float32 */
    QD_LINEAR_BF16,      /* x and W rounded to BF16, float32 accumulation */
    QD_LINEAR_FP8,       /* E4M3 W8A8: per-row weight scales, per-token activation scales */
    QD_LINEAR_W4A4,      /* NVFP4 W4A4, the canonical product (NUMERICS.md §3) */
    QD_LINEAR_W4A4_RAC,  /* W4A4 with residual activation compensation (§5) */
    QD_LINEAR_AQAT,      /* x rounded to BF16, W := dequant(quantize(W)); straight-through */
    QD_LINEAR_SYM_QAT,   /* x and W both fake-quantized to NVFP4; straight-through */
    QD_LINEAR_W4A4_STE,  /* replay: the W4A4 product forward, straight-through backward with
                            W_eff = dequant(quantize(W)), x_eff = the dequantized NVFP4 input
                            (docs/numerics.md §5) */
    QD_LINEAR_W4A4_RAC_STE, /* replay of W4A4_RAC: the channel sets are set_rac_state's (the
                               rollout's), never picked; x_eff = qd_rac_fake_quant */
    QD_LINEAR_ACT_QAT    /* ablation: x fake-quantized to NVFP4 (one scale per token), W BF16;
                            straight-through */
} qd_linear_mode;

/* Canonical recipe name ("fp32", "bf16", "fp8", "nvfp4", "nvfp4-aqat",
 * "nvfp4-rac", "quads", "nvfp4-sym-qat", "nvfp4-replay", "quads-replay", and the ablations
 * "nvfp4-w16a4", "nvfp4-w4a16"); NULL for an invalid value. */
const char *qd_recipe_name(qd_recipe r);
/* QD_ERR_ARG (message naming the value and the valid names) if unknown. */
qd_status qd_recipe_parse(qd_recipe *out, const char *name);
/* "exact" or "fast"; NULL for an invalid value. */
const char *qd_mode_name(qd_exec_mode m);
/* QD_ERR_ARG (message naming the value and the valid names) if unknown. */
qd_status qd_mode_parse(qd_exec_mode *out, const char *name);
/* The mode of a quantized linear layer (attention q/k/v/o, expert and dense
 * MLP gate/up/down) under recipe r and role. */
qd_linear_mode qd_recipe_linear_mode(qd_recipe r, qd_role role);
/* The mode of the layers kept in high precision (router, lm_head): FP32 under
 * the fp32 recipe, BF16 otherwise. */
qd_linear_mode qd_recipe_dense_mode(qd_recipe r);

/* ---- tensors, batches, options */

/* One parameter tensor of the flat buffer: rows x cols float32 from offset. */
typedef struct {
    char name[96];       /* HF name, e.g. "model.layers.0.mlp.experts.3.up_proj.weight" */
    int64_t rows, cols;  /* a vector has rows = 1 */
    size_t offset;       /* in floats */
} qd_param_info;

/* Token sequences, right-padded: row b holds lengths[b] tokens in
 * tokens[b*T .. b*T+lengths[b]-1]; the rest is padding and never read. */
typedef struct {
    int B, T;
    const int32_t *tokens;   /* (B, T) */
    const int32_t *lengths;  /* (B), 1 <= lengths[b] <= T */
    float temperature;       /* log-probs of softmax(logits / temperature), the rollout's;
                                0 (a zero-initialized batch) means 1 */
    int rac_stats;           /* 1: add this batch's activation errors to the RAC statistics
                                (a rollout's); 0 (the default): leave them as they are */
} qd_batch;

/* The largest calls an instance will serve, for its memory plan: forwards of
 * up to fwd_B sequences of fwd_T tokens (with backward and AdamW when train),
 * generates of up to gen_B prompts of gen_Tp tokens continued by gen_M. All
 * zero (the default): no plan, no check. */
typedef struct {
    int fwd_B, fwd_T;
    int gen_B, gen_Tp, gen_M;
    int train;
} qd_workload;

/* What a backend's device memory holds (qd_mem_kind_name gives the words). */
typedef enum {
    QD_MEM_MASTER = 0,  /* float32 master weights */
    QD_MEM_WORKING,     /* the working copy the forward reads (BF16 values, fake-quant weights) */
    QD_MEM_QUANT,       /* the rollout's NVFP4 / FP8 weight copies and the RAC state */
    QD_MEM_OWN,         /* the device ops' own copies (CUDA fast mode: BF16 bits of the working copy) */
    QD_MEM_GRADS,       /* gradients */
    QD_MEM_ADAM,        /* AdamW first and second moments */
    QD_MEM_ACTS,        /* activations of the largest forward or generation step */
    QD_MEM_SCRATCH,     /* the driver's scratch (quantized activations, backward, diagnostics) */
    QD_MEM_KV,          /* the KV cache of the largest generate */
    QD_MEM_TABLES,      /* RoPE tables */
    QD_MEM_COUNT
} qd_mem_kind;

/* Bytes of each kind, and their sum. */
typedef struct {
    size_t bytes[QD_MEM_COUNT];
    size_t total;
} qd_mem_plan;

/* An instance's memory: the plan made at init for options.workload, what
 * the device had free then, and the most bytes of each kind the driver held
 * at once since (the ops' own copies counted as planned). */
typedef struct {
    qd_mem_plan plan, peak;
    size_t free_at_init, device_total;
} qd_memory;

typedef struct {
    qd_recipe recipe;
    qd_role role;
    qd_exec_mode mode;   /* exact (0, the default) or fast (CUDA only) */
    double rac_ratio;    /* |S|/K of RAC (recipes nvfp4-rac and quads, rollout role) */
    int num_threads;     /* OpenMP threads; 0 = the runtime's default */
    int device;          /* CUDA: the device, modulo the visible count (data parallel:
                            LOCAL_RANK); >= 0 */
    int diagnostics;     /* 1: measure quantization errors per linear layer (costs a
                            fake-quant of every quantized layer's input and weight) */
    qd_workload workload; /* not all zero: plan the memory at init and fail there, before
                            allocating, when the plan exceeds the device's free bytes */
    size_t mem_reserved; /* bytes of the device's free memory other instances will still
                            claim (their plans minus what they hold): left out of the check */
    int keep_master;     /* rollout role: 1 keeps the float32 master and working copies of every
                            weight (get_weights, backward, set_rac_state at once); 0 (the default):
                            a rollout instance holds only what its forward reads (the quantized
                            copies, the tensors it reads as float, the KV cache) and streams a
                            weight sync tensor by tensor (README "Memory"); the fp32 recipe's
                            working copy is its master either way */
    int recompute;       /* 1: between a forward and its backward keep only each decoder layer's
                            input; the backward recomputes a layer's activations from it just
                            before the layer's backward (one set of activations for all the
                            layers: less memory for about a third more forward work; the same
                            bits, RAC statistics and diagnostics counted once). Not for a lean
                            rollout instance, which has no backward and shares one set anyway */
    uint64_t quant_layers; /* ablations: 0 (the default) applies the recipe to every
                              decoder layer; else only layers l with bit l set take the
                              recipe's quantized mode, the others the dense mode (BF16);
                              a bit at or above num_hidden_layers is an error */
} qd_backend_options;

/* AdamW (decoupled weight decay, bias correction); weight decay applies to
 * matrices only (not to norm weights). grad_clip > 0 clips by global L2 norm. */
typedef struct {
    float lr, beta1, beta2, eps, weight_decay, grad_clip;
} qd_adamw;

/* A rollout: B prompts continued by sampling (NUMERICS.md §6). Token i of
 * sequence b (at position p = prompt_len[b] + i) is drawn with the uniform
 * qd_sample_uniform(seed, seq_id[b], p) from softmax(logits / temperature)
 * restricted by top_k and top_p, so it never depends on the batch or threads. */
typedef struct {
    int B, Tp;
    const int32_t *prompt;      /* (B, Tp) right-padded */
    const int32_t *prompt_len;  /* (B), 1 <= prompt_len[b] <= Tp */
    const uint64_t *seq_id;     /* (B) sampling stream of each sequence */
    uint64_t seed;
    int max_new_tokens;
    float temperature;          /* 0: greedy (argmax, ties to the lower id) */
    int top_k;                  /* 0: off */
    float top_p;                /* >= 1: off */
    const int32_t *stop;        /* (num_stop) tokens that end a sequence (kept in its output) */
    int num_stop;
    int rac_stats;              /* 1: add the rollout's activation errors to the RAC statistics
                                   (the next sync picks channels from them); 0 (the default):
                                   leave them (evaluation, diagnostics) */
    int no_diagnostics;         /* 1: a backend made with options.diagnostics measures nothing
                                   during this generate (its decode steps run as without them;
                                   the diagnostics slot then has none until the next forward):
                                   `quads rl` measures in a forward over the generated sequences */
    void (*on_step)(int steps_done, int max_new_tokens, void *ctx);
                                /* optional (NULL: none): called after each step of the generate
                                   (the prefill and its token are step 1) with the steps done so
                                   far, from the calling thread: progress lines of long rollouts;
                                   the generate's numbers do not depend on it */
    void *on_step_ctx;
} qd_generate_request;

typedef struct {
    int32_t *tokens;            /* (B, max_new_tokens) caller-owned; -1 after the end */
    float *logp;                /* (B, max_new_tokens) log_softmax(logits / T)[token] (T = 1
                                   when greedy); 0 after the end */
    int32_t *lengths;           /* (B) tokens generated, the stop token included */
} qd_generate_result;

/* Per-layer diagnostics of the last forward or generate (optional slot; the
 * backend must be made with options.diagnostics = 1). NVFP4 errors are
 * measured whatever the recipe, activations with one global scale per token
 * (NUMERICS.md §4); after a generate they are summed over all its steps and
 * the router choices are those of its last step. */
typedef struct {
    int num_linear;             /* quantized linear layers, in parameter order */
    const char *const *names;   /* (num_linear) weight names */
    const double *act_err;      /* (num_linear) sum of (x - dequant(quantize(x)))^2 */
    const double *act_norm;     /* (num_linear) sum of x^2 */
    const double *weight_err;   /* (num_linear) sum (W - What)^2 / sum W^2 at the last sync */
    int num_tokens;             /* N: the last forward's (step's) tokens, packed in batch order */
    int num_moe_layers;
    int top_k;
    const int32_t *router_topk; /* (num_moe_layers, N, top_k) experts chosen, rank order */
} qd_diagnostics;

/* Writes tensor t's n float32 master weights (qd_param_info order) into dst
 * (host); a weight sync that never holds the whole model on the host
 * (qd_backend_set_weights_fill). */
typedef qd_status (*qd_weight_fill)(void *user, int t, float *dst, size_t n);

/* ---- the vtable (implementers only; callers use the dispatchers). Every table
 * and options struct of the interface is initialized with designated
 * initializers, so fields may be added anywhere. */

typedef struct qd_backend qd_backend;

struct qd_backend_i {
    const char *(*get_name)(qd_backend *b);
    void (*free)(qd_backend *b);
    /* Copy n float32 master weights in (qd_param_info order) and rebuild every
     * working copy: this is the weight sync (quantize(W) once, NUMERICS.md §5). */
    qd_status (*set_weights)(qd_backend *b, const float *params, size_t n);
    qd_status (*get_weights)(qd_backend *b, float *params, size_t n);
    /* set_weights with the weights asked for tensor by tensor (fill, whose
     * values the dispatcher has checked finite), through a host buffer of one
     * tensor. Optional: the dispatcher then fills a whole host array. */
    qd_status (*set_weights_fill)(qd_backend *b, qd_weight_fill fill, void *user);
    /* logp (B, T): logp[b][t] = log p(tokens[b][t+1] | tokens[b][..t]) for
     * t < lengths[b]-1, 0 elsewhere, with p = softmax(logits / batch->temperature)
     * normalized as the sampler does (bit-equal to a generate's logp); logits
     * (B, T, V), raw (not divided), if not NULL, 0 in padding. Keeps what
     * backward needs (the gradient includes the 1/temperature). */
    qd_status (*forward)(qd_backend *b, const qd_batch *batch, float *logp, float *logits);
    /* Given dL/dlogp (B, T) for the last forward's batch, accumulates (+=)
     * dL/dW of every parameter into the gradient buffer. Optional. */
    qd_status (*backward)(qd_backend *b, const float *dlogp);
    void (*zero_grad)(qd_backend *b);
    qd_status (*get_grads)(qd_backend *b, float *grads, size_t n);
    /* One AdamW step (step counts from 1) on the master weights, then a sync.
     * *grad_norm receives the global gradient norm before clipping. */
    qd_status (*optimizer_step)(qd_backend *b, const qd_adamw *opt, int step, float *grad_norm);
    /* Rollout; optional. */
    qd_status (*generate)(qd_backend *b, const qd_generate_request *req, qd_generate_result *res);
    /* Optional. The pointers are owned by the backend and stay valid until the
     * next diagnostics call or free. */
    qd_status (*diagnostics)(qd_backend *b, qd_diagnostics *out);
    /* Checkpoint state beyond the master weights; optional. The AdamW moments
     * m and v (n floats each, qd_param_info order). */
    qd_status (*get_adam)(qd_backend *b, float *m, float *v, size_t n);
    qd_status (*set_adam)(qd_backend *b, const float *m, const float *v, size_t n);
    /* The RAC state (channel sets and the activation-error statistics gathered
     * since the last sync) as an opaque byte blob of rac_state_size bytes
     * (0 when no layer uses RAC). set_rac_state installs the channel sets and
     * statistics, and the next weight sync (set_weights, sync_from, an
     * optimizer step) builds the RAC weight copies with those sets and keeps
     * the statistics (no pick), so a restored rollout quantizes exactly as the
     * saved one did. An instance with master weights also rebuilds the copies
     * from them at once; a rollout-role instance without (options.keep_master
     * 0) refuses forward and generate until that sync. */
    size_t (*rac_state_size)(qd_backend *b);
    qd_status (*get_rac_state)(qd_backend *b, void *buf, size_t n);
    qd_status (*set_rac_state)(qd_backend *b, const void *buf, size_t n);
    /* The RAC statistics alone: for each RAC linear in order, its in doubles
     * (the squared activation error per channel gathered since the last sync,
     * by forwards and generates that asked for it); rac_stats_count doubles in
     * all. set_rac_stats replaces them and touches nothing else (data
     * parallel: the sum over ranks before a pick). Optional. */
    size_t (*rac_stats_count)(qd_backend *b);
    qd_status (*get_rac_stats)(qd_backend *b, double *err, size_t n);
    qd_status (*set_rac_stats)(qd_backend *b, const double *err, size_t n);
    /* Replaces the gradient buffer (n floats, qd_param_info order): data-parallel
     * training writes the all-reduced gradients back before optimizer_step.
     * Optional. */
    qd_status (*set_grads)(qd_backend *b, const float *grads, size_t n);
    /* The weight sync from another instance of the same model without the
     * host: b's master weights become src's and every working copy (NVFP4,
     * FP8, RAC with b's own statistics) is rebuilt as set_weights does, the
     * same bits. QD_ERR_UNSUPPORTED (no message) when src is not of b's kind
     * or lives in other memory: the dispatcher then goes through the host.
     * Optional. */
    qd_status (*sync_from)(qd_backend *b, qd_backend *src);
    /* The memory plan and the bytes held (qd_memory). Optional. */
    qd_status (*memory)(qd_backend *b, qd_memory *out);
    /* Returns once everything the instance has queued (an optimizer step's
     * update on a device) is done. Optional: a backend that queues nothing
     * leaves it NULL. */
    qd_status (*wait)(qd_backend *b);
};

struct qd_backend {
    const struct qd_backend_i *iface;
    const qd_param_info *params;  /* owned by context */
    int num_params;               /* tensors */
    size_t num_floats;            /* total floats of the flat buffer */
    void *context;
};

/* ---- backends and the registry */

/* The CPU (OpenMP) backend, the exact reference. NULL on a bad config or
 * option (message in qd_last_error()) or when out of memory. Master weights
 * start at zero: call qd_backend_set_weights. */
qd_backend *qd_backend_cpu_init(const qd_model_config *cfg, const qd_backend_options *opt);
/* The CUDA backend (backends/cuda); NULL when no device is present. Declared
 * weak: backend.c calls it only when an object defining it is linked in. */
qd_backend *qd_backend_cuda_init(const qd_model_config *cfg, const qd_backend_options *opt);
/* CUDA first (when linked in and a device is present), else the CPU. */
qd_backend *qd_backend_init_best(const qd_model_config *cfg, const qd_backend_options *opt);
/* "auto", "cpu" or "cuda"; NULL with a message when unknown or unavailable. */
qd_backend *qd_backend_init_by_name(const char *name, const qd_model_config *cfg,
                                    const qd_backend_options *opt);

/* ---- dispatchers: check arguments once, then call the backend */

const char *qd_backend_name(qd_backend *b);
void qd_backend_free(qd_backend *b);
/* The parameter table; *count receives the number of tensors. */
const qd_param_info *qd_backend_params(const qd_backend *b, int *count);
size_t qd_backend_num_floats(const qd_backend *b);
/* Index of the tensor called name, or -1. */
int qd_backend_find_param(const qd_backend *b, const char *name);
/* QD_ERR_NONFINITE on a NaN/Inf weight (nothing is changed then). */
qd_status qd_backend_set_weights(qd_backend *b, const float *params, size_t n);
qd_status qd_backend_get_weights(qd_backend *b, float *params, size_t n);
/* set_weights of the values fill writes, one tensor at a time, so the host
 * holds one tensor (a model larger than the host's memory: bench_backend's
 * a3b). A fill error or a non-finite value (QD_ERR_NONFINITE naming the
 * tensor) stops the sync; the instance's weights are then undefined until
 * the next sync. */
qd_status qd_backend_set_weights_fill(qd_backend *b, qd_weight_fill fill, void *user);
qd_status qd_backend_forward(qd_backend *b, const qd_batch *batch, float *logp, float *logits);
qd_status qd_backend_backward(qd_backend *b, const float *dlogp);
void qd_backend_zero_grad(qd_backend *b);
qd_status qd_backend_get_grads(qd_backend *b, float *grads, size_t n);
/* QD_ERR_NONFINITE (naming the index) on a NaN/Inf gradient; nothing is written then. */
qd_status qd_backend_set_grads(qd_backend *b, const float *grads, size_t n);
qd_status qd_backend_optimizer_step(qd_backend *b, const qd_adamw *opt, int step, float *grad_norm);
qd_status qd_backend_generate(qd_backend *b, const qd_generate_request *req, qd_generate_result *res);
qd_status qd_backend_diagnostics(qd_backend *b, qd_diagnostics *out);
qd_status qd_backend_get_adam(qd_backend *b, float *m, float *v, size_t n);
/* QD_ERR_NONFINITE on a NaN/Inf moment (nothing is changed then). */
qd_status qd_backend_set_adam(qd_backend *b, const float *m, const float *v, size_t n);
/* 0 when the backend has no RAC state (or no such slot). */
size_t qd_backend_rac_state_size(qd_backend *b);
qd_status qd_backend_get_rac_state(qd_backend *b, void *buf, size_t n);
qd_status qd_backend_set_rac_state(qd_backend *b, const void *buf, size_t n);
/* Trainer -> rollout: dst's master weights become src's and dst rebuilds its
 * working copies (the weight sync, NUMERICS.md §5), device to device when both
 * are of one kind on one device (the CPU: one process), else through a host
 * buffer (get_weights, set_weights). *direct (if not NULL) receives 1 when no
 * host copy was made. QD_ERR_SHAPE when the models differ. The bits are those
 * of qd_backend_set_weights(dst, get_weights(src)). */
qd_status qd_backend_sync_from(qd_backend *dst, qd_backend *src, int *direct);
/* The instance's memory plan and peak bytes; QD_ERR_UNSUPPORTED without the slot. */
qd_status qd_backend_memory(qd_backend *b, qd_memory *out);
/* Waits for the work b has queued (a timed phase ends with it); QD_OK at once
 * for a backend without the slot. */
qd_status qd_backend_wait(qd_backend *b);
/* The memory plan of an instance of cfg under opt (opt->workload) without
 * making one or touching a device: the bytes the driver allocates on every
 * backend, but for the CUDA fast mode's own BF16 copy of the working weights
 * (QD_MEM_OWN, 2 bytes a working float), not counted here. */
qd_status qd_backend_plan(const qd_model_config *cfg, const qd_backend_options *opt, qd_mem_plan *out);
/* "master weights", "working weights", ...; NULL for an invalid value. */
const char *qd_mem_kind_name(qd_mem_kind k);
/* The plan as one line: "total 12.3 MB (master weights 1.0 MB, ...)", kinds
 * of 0 bytes left out. */
void qd_mem_plan_format(const qd_mem_plan *p, char *buf, size_t n);
/* "1.5 GB", "12.0 MB", "512 B" (powers of 1024). */
void qd_format_bytes(size_t bytes, char *buf, size_t n);
/* 0 when the backend has no RAC linear (or no such slot). */
size_t qd_backend_rac_stats_count(qd_backend *b);
qd_status qd_backend_get_rac_stats(qd_backend *b, double *err, size_t n);
/* QD_ERR_NONFINITE or QD_ERR_ARG (naming the index) on a NaN/Inf or negative
 * statistic (nothing is changed then). */
qd_status qd_backend_set_rac_stats(qd_backend *b, const double *err, size_t n);

#endif /* QD_BACKEND_H */
