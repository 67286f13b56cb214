/* The shared parameter table (backends/layout.h). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "backends/layout.h"

static size_t add_param(qd_model_layout *m, int64_t rows, int64_t cols, const char *fmt, int a, int b)
{
    qd_param_info *p = &m->info[m->ninfo++];
    snprintf(p->name, sizeof p->name, fmt, a, b);
    p->rows = rows;
    p->cols = cols;
    p->offset = m->nfloats;
    m->nfloats += (size_t)(rows * cols);
    return p->offset;
}

/* A linear layer whose weight (out, in) is at offset w, named as the last tensor. */
static int new_linear(qd_model_layout *m, size_t w, int out, int in, int quantized)
{
    qd_layout_linear *L = &m->lin[m->nlin];
    L->w = w;
    L->out = out;
    L->in = in;
    L->quantized = quantized;
    L->name = m->info[m->ninfo - 1].name;
    return m->nlin++;
}

static int add_linear(qd_model_layout *m, int out, int in, int quantized, const char *fmt, int a, int b)
{
    return new_linear(m, add_param(m, out, in, fmt, a, b), out, in, quantized);
}

static void build_layer(qd_model_layout *m, const qd_model_config *g, int l)
{
    int C = g->hidden_size, D = g->head_dim, HD = g->num_attention_heads * D;
    int KD = g->num_key_value_heads * D;
    qd_layout_layer *ly = &m->layers[l];
    ly->in_norm = add_param(m, 1, C, "model.layers.%d.input_layernorm.weight", l, 0);
    ly->q = add_linear(m, HD, C, 1, "model.layers.%d.self_attn.q_proj.weight", l, 0);
    ly->k = add_linear(m, KD, C, 1, "model.layers.%d.self_attn.k_proj.weight", l, 0);
    ly->v = add_linear(m, KD, C, 1, "model.layers.%d.self_attn.v_proj.weight", l, 0);
    ly->o = add_linear(m, C, HD, 1, "model.layers.%d.self_attn.o_proj.weight", l, 0);
    ly->q_norm = add_param(m, 1, D, "model.layers.%d.self_attn.q_norm.weight", l, 0);
    ly->k_norm = add_param(m, 1, D, "model.layers.%d.self_attn.k_norm.weight", l, 0);
    ly->post_norm = add_param(m, 1, C, "model.layers.%d.post_attention_layernorm.weight", l, 0);
    ly->moe = qd_model_config_is_moe_layer(g, l);
    ly->router = -1;
    if (ly->moe) {
        ly->nexp = g->num_experts;
        ly->ffn = g->moe_intermediate_size;
        ly->router = add_linear(m, g->num_experts, C, 0, "model.layers.%d.mlp.gate.weight", l, 0);
        for (int e = 0; e < ly->nexp; e++) {
            int i = add_linear(m, ly->ffn, C, 1, "model.layers.%d.mlp.experts.%d.gate_proj.weight", l, e);
            add_linear(m, ly->ffn, C, 1, "model.layers.%d.mlp.experts.%d.up_proj.weight", l, e);
            add_linear(m, C, ly->ffn, 1, "model.layers.%d.mlp.experts.%d.down_proj.weight", l, e);
            if (e == 0)
                ly->mlp0 = i;
        }
    } else {
        ly->nexp = 1;
        ly->ffn = g->intermediate_size;
        ly->mlp0 = add_linear(m, ly->ffn, C, 1, "model.layers.%d.mlp.gate_proj.weight", l, 0);
        add_linear(m, ly->ffn, C, 1, "model.layers.%d.mlp.up_proj.weight", l, 0);
        add_linear(m, C, ly->ffn, 1, "model.layers.%d.mlp.down_proj.weight", l, 0);
    }
}

/* Upper bounds of the tensors and linear layers the table holds. */
static void count_tensors(const qd_model_config *g, int *tensors, int *linears)
{
    *tensors = 3;
    *linears = 1;
    for (int l = 0; l < g->num_hidden_layers; l++) {
        int moe = qd_model_config_is_moe_layer(g, l), lin = 4 + (moe ? 1 + 3 * g->num_experts : 3);
        *linears += lin;
        *tensors += 4 + lin;
    }
}

qd_status qd_model_layout_init(qd_model_layout *m, const qd_model_config *g)
{
    int nt = 0, nl = 0;
    memset(m, 0, sizeof *m);
    /* the table's int counts and widths hold only for a checked config */
    qd_status st = qd_model_config_check(g);
    if (st)
        return st;
    count_tensors(g, &nt, &nl);
    m->info = calloc((size_t)nt, sizeof *m->info);
    m->lin = calloc((size_t)nl, sizeof *m->lin);
    m->layers = calloc((size_t)g->num_hidden_layers, sizeof *m->layers);
    if (!m->info || !m->lin || !m->layers) {
        qd_model_layout_free(m);
        return qd_error(QD_ERR_NOMEM, "backend: parameter table");
    }
    m->embed = add_param(m, g->vocab_size, g->hidden_size, "model.embed_tokens.weight", 0, 0);
    for (int l = 0; l < g->num_hidden_layers; l++)
        build_layer(m, g, l);
    m->final_norm = add_param(m, 1, g->hidden_size, "model.norm.weight", 0, 0);
    if (g->tie_word_embeddings) { /* a linear view of the embedding, not a tensor of its own */
        m->lm_head = new_linear(m, m->embed, g->vocab_size, g->hidden_size, 0);
        m->lin[m->lm_head].name = m->info[0].name;
    } else
        m->lm_head = add_linear(m, g->vocab_size, g->hidden_size, 0, "lm_head.weight", 0, 0);
    return QD_OK;
}

void qd_model_layout_free(qd_model_layout *m)
{
    free(m->info);
    free(m->lin);
    free(m->layers);
    memset(m, 0, sizeof *m);
}

void qd_moe_group(int32_t *exp_off, int32_t *row_tok, float *row_w, int32_t *row_rank, int32_t *tok_rows,
                  int32_t *cnt, const int32_t *topk, const float *topw, int N, int E, int K)
{
    memset(cnt, 0, sizeof(int32_t) * (size_t)E);
    for (int n = 0; n < N; n++)
        for (int j = 0; j < K; j++)
            cnt[topk ? topk[n * K + j] : 0]++;
    exp_off[0] = 0;
    for (int e = 0; e < E; e++)
        exp_off[e + 1] = exp_off[e] + cnt[e];
    memset(cnt, 0, sizeof(int32_t) * (size_t)E);
    for (int n = 0; n < N; n++) {
        int j = 0;
        for (int e = 0; e < E; e++) {  /* ascending expert index */
            int rank = topk ? -1 : 0;
            for (int i = 0; topk && i < K; i++)
                if (topk[n * K + i] == e)
                    rank = i;
            if (rank < 0)
                continue;
            int r = exp_off[e] + cnt[e]++;
            row_tok[r] = n;
            row_w[r] = topk ? topw[n * K + rank] : 1.0f;
            row_rank[r] = rank;
            tok_rows[n * K + j++] = r;
        }
    }
}
