/* The parameter table every backend shares: for a Qwen3(-MoE) config, the
 * Hugging Face name, shape and flat-buffer offset of every tensor (experts one
 * tensor each), the linear layers among them, and each decoder layer's
 * indices. One definition, so the CPU and CUDA backends (and checkpoints)
 * agree on the order by construction. */
#ifndef QD_LAYOUT_H
#define QD_LAYOUT_H

#include <stddef.h>
#include "backends/backend.h"

/* A linear layer: weight (out, in) at offset w of the flat buffer. */
typedef struct {
    size_t w;
    int out, in;
    int quantized;         /* one of the layers a recipe quantizes (not router, lm_head) */
    const char *name;      /* the weight's HF name (points into the info table) */
} qd_layout_linear;

typedef struct {
    int moe;               /* 1: sparse MoE block, 0: dense MLP */
    int nexp;              /* experts (1 for a dense MLP) */
    int ffn;               /* I: moe_intermediate_size or intermediate_size */
    size_t in_norm, post_norm, q_norm, k_norm; /* offsets: (C), (C), (D), (D) */
    int q, k, v, o;        /* linear indices */
    int router;            /* linear index of mlp.gate, -1 when dense */
    int mlp0;              /* linear index of expert 0's gate_proj; expert e has
                              gate, up, down at mlp0 + 3e + 0, 1, 2 */
} qd_layout_layer;

typedef struct {
    qd_param_info *info;   /* (ninfo) tensors in flat-buffer order */
    int ninfo;
    size_t nfloats;        /* total floats */
    qd_layout_linear *lin; /* (nlin) */
    int nlin;
    qd_layout_layer *layers; /* (num_hidden_layers) */
    size_t embed, final_norm; /* offsets: (V, C), (C) */
    int lm_head;           /* linear index (tied: a view of the embedding) */
} qd_model_layout;

/* Builds the table of cfg; the three arrays are malloc'd and owned by *m
 * (free them with qd_model_layout_free, or take them over one by one). */
qd_status qd_model_layout_init(qd_model_layout *m, const qd_model_config *cfg);
void qd_model_layout_free(qd_model_layout *m);

/* MoE rows (both backends): given each token's experts topk (N, K) in rank
 * order and their weights topw (N, K), lays the N*K routed rows out grouped by
 * expert, ascending expert index, tokens ascending within an expert:
 * exp_off (E + 1) first row of each expert, row_tok/row_w/row_rank (N*K) the
 * token, weight and top-k rank of each row, tok_rows (N, K) the rows of each
 * token in ascending expert order. A dense MLP (topk NULL) routes every token
 * to expert 0 with weight 1 (E = K = 1). cnt is scratch (E). */
void qd_moe_group(int32_t *exp_off, int32_t *row_tok, float *row_w, int32_t *row_rank, int32_t *tok_rows,
                  int32_t *cnt, const int32_t *topk, const float *topw, int N, int E, int K);

#endif
