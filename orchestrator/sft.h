/* Supervised fine-tuning (cross-entropy) of a model on the synthetic task, on
 * the same backend as RL: how the embedded tiny model (models/tiny/) is made.
 *
 * Everything is deterministic in the options: the tokenizer is generated here,
 * the initial weights come from a counter-based hash of (seed, tensor,
 * element), and batches from a seeded shuffle of the train split, so on the
 * CPU backend the trained weights are the same bytes at any thread count. */
#ifndef QD_SFT_H
#define QD_SFT_H

#include <stddef.h>
#include <stdint.h>
#include "backends/backend.h"
#include "models/model_config.h"
#include "models/tokenizer.h"
#include "quant/status.h"

/* The tiny model's tokenizer: byte-level BPE over the 256 byte symbols (GPT-2
 * byte-to-unicode mapping, id = byte value), QD_SFT_TOK_MERGES merges of
 * common pieces of the task's prompts (digits are never merged), then the
 * special tokens <|endoftext|>, <|im_start|>, <|im_end|>: QD_SFT_TOK_VOCAB ids
 * in all, a multiple of 16 so every id of the model's vocabulary decodes. */
#define QD_SFT_TOK_MERGES 13
#define QD_SFT_TOK_VOCAB 272

/* The tokenizer.json text in *json (malloc'd, NUL-terminated, *len excludes
 * the NUL; same bytes on every run). */
qd_status qd_sft_tokenizer_json(char **json, size_t *len);
/* Writes it to path atomically. */
qd_status qd_sft_write_tokenizer(const char *path);

/* The tiny model's architecture: a Qwen3-MoE with the given dims, rms_norm_eps
 * 1e-6, norm_topk_prob, an untied head, and rope_theta 1e4 (not Qwen3's 1e6:
 * with head_dim 16 and prompts of ~30 tokens, more rotary pairs then turn). */
typedef struct {
    int hidden, layers, heads, kv_heads, head_dim, experts, top_k, moe_intermediate, vocab;
} qd_sft_dims;

/* hidden 64, 2 layers, 4 heads / 2 kv heads of 16, 8 experts top-2 of width 64, vocab 272. */
extern const qd_sft_dims qd_sft_default_dims;
qd_status qd_sft_make_config(const qd_sft_dims *d, qd_model_config *cfg);

/* Initial weights into params (the flat buffer of the n tensors of info):
 * norm weights 1; every matrix (out, in) ~ N(0, 1/in) approximately (a sum of
 * four uniforms, scaled), each value a function of (seed, tensor index,
 * element index) only, computed with exactly rounded operations. */
void qd_sft_init_weights(const qd_param_info *info, int n, uint64_t seed, float *params);

typedef struct {
    const char *task;        /* a qd_task_parse name */
    uint64_t seed;           /* data order and initialization */
    int steps;               /* optimizer steps */
    int batch;               /* sequences a step */
    float lr;                /* peak learning rate */
    int warmup;              /* linear warmup steps, then cosine to lr * min_lr_ratio */
    float min_lr_ratio;
    float weight_decay;
    float grad_clip;         /* 0 = off */
    int train_problems;      /* size of the train pool drawn from the task's train split */
    /* Called after each step (may be NULL). */
    void (*progress)(int step, int steps, double loss, double lr, void *ctx);
    void *ctx;
    /* Called after each step, after progress (may be NULL): an error stops
     * the training with it; *stop = 1 ends it after this step (an early stop). */
    qd_status (*after_step)(int step, void *ctx, int *stop);
} qd_sft_options;

/* The defaults `quads sft` uses (make tiny-model). */
void qd_sft_default_options(qd_sft_options *o);

/* Trains b's current weights for o->steps steps, or until o->after_step
 * stops it; *final_loss (may be NULL) receives the mean target cross-entropy
 * of the last step. */
qd_status qd_sft_train(qd_backend *b, const qd_tokenizer *tok, const qd_sft_options *o, double *final_loss);

#endif
