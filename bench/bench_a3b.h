/* The "a3b" model of the benchmarks: Qwen3-30B-A3B's layer shapes (hidden
 * 2048, 128 experts top-8 of width 768, 32 / 4 heads of 128, vocab 151936) at
 * `layers` depth (bench_backend's rollout and train rows, bench_load's
 * checkpoint; bench/bench_torch.py builds the same shape). Header only. */
#ifndef QD_BENCH_A3B_H
#define QD_BENCH_A3B_H

#include <stdio.h>
#include <string.h>
#include "backends/backend.h"

static inline void qd_bench_a3b_config(qd_model_config *c, int layers)
{
    memset(c, 0, sizeof *c);
    c->arch = QD_ARCH_QWEN3_MOE;
    c->vocab_size = 151936;
    c->hidden_size = 2048;
    c->intermediate_size = 6144; /* unused: every layer is sparse */
    c->moe_intermediate_size = 768;
    c->num_hidden_layers = layers;
    c->num_attention_heads = 32;
    c->num_key_value_heads = 4;
    c->head_dim = 128;
    c->rope_theta = 1000000.0;
    c->rms_norm_eps = 1e-6;
    c->num_experts = 128;
    c->num_experts_per_tok = 8;
    c->norm_topk_prob = 1;
    c->decoder_sparse_step = 1;
    c->max_position_embeddings = 40960;
    snprintf(c->torch_dtype, sizeof c->torch_dtype, "bfloat16");
}

#endif
