/* The model configuration read from a Hugging Face config.json: the fields
 * that define the math of Qwen3MoeForCausalLM and dense Qwen3ForCausalLM.
 *
 * A field that would change the math in a way the backends do not implement
 * (rope_scaling, sliding windows, attention bias, another activation, a
 * quantized checkpoint, another architecture) is refused with a message
 * naming the file and the field. Unknown fields that do not change the math
 * (token ids, initializer_range, use_cache, ...) are ignored. Absent optional
 * fields take the defaults of transformers' Qwen3MoeConfig / Qwen3Config. */
#ifndef QD_MODEL_CONFIG_H
#define QD_MODEL_CONFIG_H

#include "quant/status.h"

#define QD_CONFIG_MAX_LAYERS 1024
/* The largest model the parameter table describes (backends/layout.c): far
 * above any Qwen3 checkpoint (235B-A22B: 2.4e11 parameters, 37k tensors), far
 * below what would overflow its 64-bit offsets. */
#define QD_CONFIG_MAX_PARAMS (1LL << 40)
#define QD_CONFIG_MAX_TENSORS (1 << 20)

typedef enum {
    QD_ARCH_QWEN3 = 1,      /* Qwen3ForCausalLM, model_type "qwen3" */
    QD_ARCH_QWEN3_MOE,      /* Qwen3MoeForCausalLM, model_type "qwen3_moe" */
} qd_arch;

typedef struct {
    qd_arch arch;
    int vocab_size;                /* V */
    int hidden_size;               /* C */
    int intermediate_size;         /* dense MLP width (dense model and dense layers of a MoE) */
    int moe_intermediate_size;     /* one expert's MLP width; 0 for a dense model */
    int num_hidden_layers;         /* L */
    int num_attention_heads;       /* NH */
    int num_key_value_heads;       /* NKV, divides NH (GQA); default NH */
    int head_dim;                  /* HS; MoE default C / NH, dense default 128 */
    double rope_theta;
    double rms_norm_eps;
    int num_experts;               /* E; 0 for a dense model (and a MoE with every layer dense) */
    int num_experts_per_tok;       /* top-k; 0 for a dense model */
    int norm_topk_prob;            /* renormalize the top-k router weights; default false */
    int decoder_sparse_step;       /* layer i is MoE when (i + 1) % step == 0; default 1 */
    int n_mlp_only_layers;
    int mlp_only_layers[QD_CONFIG_MAX_LAYERS]; /* layers forced dense, each in [0, L) */
    int tie_word_embeddings;       /* lm_head shares the embedding matrix; default false */
    int max_position_embeddings;   /* default 32768 */
    char torch_dtype[16];          /* "bfloat16", "float16", "float32", or "" when absent */
} qd_model_config;

/* Reads config.json at path into *cfg. */
qd_status qd_model_config_load(const char *path, qd_model_config *cfg);
/* The same from len bytes of JSON text; name stands for the file in messages. */
qd_status qd_model_config_load_string(const char *json, size_t len, const char *name, qd_model_config *cfg);
/* Whether layer i has a sparse MoE block (transformers' Qwen3MoeDecoderLayer rule). */
int qd_model_config_is_moe_layer(const qd_model_config *cfg, int layer);
/* QD_ERR_ARG naming the field if a value is out of range or inconsistent, or
 * the model is larger than QD_CONFIG_MAX_PARAMS / QD_CONFIG_MAX_TENSORS. */
qd_status qd_model_config_check(const qd_model_config *cfg);

#endif
