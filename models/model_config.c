/* Reads a Hugging Face config.json into qd_model_config (see config.h). */
#include <jansson.h>
#include <limits.h>
#include <stdint.h>
#include <math.h>
#include <stdio.h>
#include <string.h>
#include "models/model_config.h"
#include "quant/fileio.h"

/* An integer member >= min; dflt when absent (or null), refused when absent and required. */
static qd_status get_int(const json_t *root, const char *key, int required, int dflt, int min, int *out,
                         const char *name)
{
    const json_t *v = json_object_get(root, key);
    if (!v || json_is_null(v)) {
        *out = dflt;
        return required ? qd_error(QD_ERR_FORMAT, "%s: %s: missing", name, key) : QD_OK;
    }
    if (!json_is_integer(v))
        return qd_error(QD_ERR_FORMAT, "%s: %s: expected an integer", name, key);
    json_int_t x = json_integer_value(v);
    if (x < min || x > 1 << 30)
        return qd_error(QD_ERR_FORMAT, "%s: %s: %lld out of range [%d, 2^30]", name, key, (long long)x, min);
    *out = (int)x;
    return QD_OK;
}

/* A finite number > 0 (integer or real); dflt when absent, refused when absent and required. */
static qd_status get_positive(const json_t *obj, const char *key, int required, double dflt, double *out,
                              const char *name, const char *where)
{
    const json_t *v = json_object_get(obj, key);
    if (!v || json_is_null(v)) {
        *out = dflt;
        return required ? qd_error(QD_ERR_FORMAT, "%s: %s%s: missing", name, where, key) : QD_OK;
    }
    if (!json_is_number(v))
        return qd_error(QD_ERR_FORMAT, "%s: %s%s: expected a number", name, where, key);
    *out = json_number_value(v);
    if (!isfinite(*out) || *out <= 0)
        return qd_error(QD_ERR_FORMAT, "%s: %s%s: expected a finite number > 0", name, where, key);
    return QD_OK;
}

static qd_status get_bool(const json_t *root, const char *key, int dflt, int *out, const char *name)
{
    const json_t *v = json_object_get(root, key);
    *out = dflt;
    if (!v || json_is_null(v))
        return QD_OK;
    if (!json_is_boolean(v))
        return qd_error(QD_ERR_FORMAT, "%s: %s: expected true or false", name, key);
    *out = json_is_true(v);
    return QD_OK;
}

static qd_status refuse(const char *name, const char *key, const char *why)
{
    return qd_error(QD_ERR_UNSUPPORTED, "%s: %s: %s", name, key, why);
}

/* The architecture from "architectures" (or "model_type" alone), checked against "model_type". */
static qd_status get_arch(const json_t *root, qd_arch *arch, const char *name)
{
    const json_t *archs = json_object_get(root, "architectures");
    const json_t *mt = json_object_get(root, "model_type");
    const char *type = json_string_value(mt);
    if (mt && !json_is_string(mt))
        return qd_error(QD_ERR_FORMAT, "%s: model_type: expected a string", name);
    if (archs && !json_is_null(archs)) {
        const char *a = json_string_value(json_array_get(archs, 0));
        if (!json_is_array(archs) || json_array_size(archs) != 1 || !a)
            return qd_error(QD_ERR_FORMAT, "%s: architectures: expected an array of one string", name);
        if (!strcmp(a, "Qwen3MoeForCausalLM"))
            *arch = QD_ARCH_QWEN3_MOE;
        else if (!strcmp(a, "Qwen3ForCausalLM"))
            *arch = QD_ARCH_QWEN3;
        else
            return qd_error(QD_ERR_UNSUPPORTED, "%s: architectures: \"%s\" is not supported "
                            "(Qwen3MoeForCausalLM, Qwen3ForCausalLM)", name, a);
    } else if (type && (!strcmp(type, "qwen3_moe") || !strcmp(type, "qwen3"))) {
        *arch = strcmp(type, "qwen3") ? QD_ARCH_QWEN3_MOE : QD_ARCH_QWEN3;
    } else
        return qd_error(QD_ERR_FORMAT, "%s: architectures: missing (and no known model_type)", name);
    const char *want = *arch == QD_ARCH_QWEN3_MOE ? "qwen3_moe" : "qwen3";
    if (type && strcmp(type, want))
        return qd_error(QD_ERR_FORMAT, "%s: model_type: \"%s\" does not match the architecture (\"%s\")",
                        name, type, want);
    return QD_OK;
}

/* A RoPE description that is plain RoPE: null, or rope_type/type "default". */
static int plain_rope(const json_t *r)
{
    if (!r || json_is_null(r))
        return 1;
    const char *t = json_string_value(json_object_get(r, "rope_type"));
    if (!t)
        t = json_string_value(json_object_get(r, "type"));
    const json_t *factor = json_object_get(r, "factor");
    return t && !strcmp(t, "default") && (!factor || json_is_null(factor));
}

/* rope_theta at the top level, or in transformers 5's rope_parameters. */
static qd_status get_rope(const json_t *root, qd_model_config *c, const char *name)
{
    const json_t *scaling = json_object_get(root, "rope_scaling");
    const json_t *params = json_object_get(root, "rope_parameters");
    if (!plain_rope(scaling))
        return refuse(name, "rope_scaling", "RoPE scaling is not supported (must be null)");
    if (params && !json_is_null(params)) {
        if (!json_is_object(params) || !plain_rope(params))
            return refuse(name, "rope_parameters", "only rope_type \"default\" is supported");
        if (!json_object_get(root, "rope_theta"))
            return get_positive(params, "rope_theta", 1, 0, &c->rope_theta, name, "rope_parameters.");
    }
    return get_positive(root, "rope_theta", 1, 0, &c->rope_theta, name, "");
}

/* Fields whose non-default values change the attention math. */
static qd_status check_attention(const json_t *root, const char *name)
{
    int bias, sliding, qk_norm;
    const json_t *drop = json_object_get(root, "attention_dropout");
    const json_t *layer_types = json_object_get(root, "layer_types");
    const json_t *rotary = json_object_get(root, "partial_rotary_factor");
    qd_status st = get_bool(root, "attention_bias", 0, &bias, name);
    if (!st && bias)
        return refuse(name, "attention_bias", "attention biases are not supported (must be false)");
    if (!st)
        st = get_bool(root, "use_sliding_window", 0, &sliding, name);
    if (!st && sliding)
        return refuse(name, "use_sliding_window", "sliding-window attention is not supported");
    if (!st)
        st = get_bool(root, "use_qk_norm", 1, &qk_norm, name);
    if (!st && !qk_norm)
        return refuse(name, "use_qk_norm", "Qwen3 attention without q/k norms is not supported");
    if (!st && drop && !json_is_null(drop) && !(json_is_number(drop) && json_number_value(drop) == 0.0))
        return refuse(name, "attention_dropout", "attention dropout is not supported (must be 0)");
    if (!st && rotary && !(json_is_number(rotary) && json_number_value(rotary) == 1.0))
        return refuse(name, "partial_rotary_factor", "partial RoPE is not supported (must be 1)");
    for (size_t i = 0; !st && i < json_array_size(layer_types); i++) {
        const char *lt = json_string_value(json_array_get(layer_types, i));
        if (!lt || strcmp(lt, "full_attention"))
            return refuse(name, "layer_types", "only \"full_attention\" layers are supported");
    }
    return st;
}

/* Fields that would change the MLP or the weights' meaning. */
static qd_status check_mlp_and_weights(const json_t *root, qd_model_config *c, const char *name)
{
    const json_t *act = json_object_get(root, "hidden_act");
    const json_t *dtype = json_object_get(root, "torch_dtype");
    const json_t *shared = json_object_get(root, "shared_expert_intermediate_size");
    if (!dtype || json_is_null(dtype))
        dtype = json_object_get(root, "dtype");
    if (act && !json_is_null(act) && !(json_is_string(act) && !strcmp(json_string_value(act), "silu")))
        return refuse(name, "hidden_act", "only \"silu\" is supported");
    if (json_object_get(root, "quantization_config"))
        return refuse(name, "quantization_config", "quantized checkpoints are not supported");
    if (shared && !(json_is_integer(shared) && json_integer_value(shared) == 0))
        return refuse(name, "shared_expert_intermediate_size", "shared experts are not supported");
    c->torch_dtype[0] = 0;
    if (!dtype || json_is_null(dtype))
        return QD_OK;
    const char *d = json_string_value(dtype);
    if (!d || (strcmp(d, "bfloat16") && strcmp(d, "float16") && strcmp(d, "float32")))
        return refuse(name, "torch_dtype", "expected \"bfloat16\", \"float16\" or \"float32\"");
    snprintf(c->torch_dtype, sizeof c->torch_dtype, "%s", d);
    return QD_OK;
}

static qd_status get_sizes(const json_t *root, qd_model_config *c, const char *name)
{
    qd_status st = get_int(root, "vocab_size", 1, 0, 1, &c->vocab_size, name);
    if (!st)
        st = get_int(root, "hidden_size", 1, 0, 1, &c->hidden_size, name);
    if (!st)
        st = get_int(root, "intermediate_size", 1, 0, 1, &c->intermediate_size, name);
    if (!st)
        st = get_int(root, "num_hidden_layers", 1, 0, 1, &c->num_hidden_layers, name);
    if (!st && c->num_hidden_layers > QD_CONFIG_MAX_LAYERS)
        return qd_error(QD_ERR_UNSUPPORTED, "%s: num_hidden_layers: more than %d", name, QD_CONFIG_MAX_LAYERS);
    if (!st)
        st = get_int(root, "num_attention_heads", 1, 0, 1, &c->num_attention_heads, name);
    if (!st)
        st = get_int(root, "num_key_value_heads", 0, c->num_attention_heads, 1, &c->num_key_value_heads, name);
    if (!st && c->num_attention_heads % c->num_key_value_heads)
        return qd_error(QD_ERR_FORMAT, "%s: num_key_value_heads: %d does not divide num_attention_heads %d",
                        name, c->num_key_value_heads, c->num_attention_heads);
    /* transformers: Qwen3MoeAttention uses hidden_size / heads when head_dim is absent,
     * Qwen3Config defaults to 128. */
    if (!st)
        st = get_int(root, "head_dim", 0, c->arch == QD_ARCH_QWEN3_MOE ? c->hidden_size / c->num_attention_heads : 128,
                     2, &c->head_dim, name);
    if (!st && c->head_dim < 2) /* the MoE default, hidden_size / num_attention_heads, may be 0 or 1 */
        return qd_error(QD_ERR_FORMAT, "%s: head_dim: missing, and hidden_size / num_attention_heads = %d "
                        "is below 2", name, c->head_dim);
    if (!st && c->head_dim % 2)
        return qd_error(QD_ERR_FORMAT, "%s: head_dim: %d is odd (RoPE rotates pairs)", name, c->head_dim);
    if (!st)
        st = get_int(root, "max_position_embeddings", 0, 32768, 1, &c->max_position_embeddings, name);
    if (!st)
        st = get_positive(root, "rms_norm_eps", 1, 0, &c->rms_norm_eps, name, "");
    if (!st)
        st = get_bool(root, "tie_word_embeddings", 0, &c->tie_word_embeddings, name);
    return st;
}

static qd_status get_mlp_only_layers(const json_t *root, qd_model_config *c, const char *name)
{
    const json_t *v = json_object_get(root, "mlp_only_layers");
    c->n_mlp_only_layers = 0;
    if (!v || json_is_null(v))
        return QD_OK;
    if (!json_is_array(v) || json_array_size(v) > QD_CONFIG_MAX_LAYERS)
        return qd_error(QD_ERR_FORMAT, "%s: mlp_only_layers: expected an array of layer indices", name);
    for (size_t i = 0; i < json_array_size(v); i++) {
        const json_t *e = json_array_get(v, i);
        if (!json_is_integer(e) || json_integer_value(e) < 0 ||
            json_integer_value(e) >= c->num_hidden_layers)
            return qd_error(QD_ERR_FORMAT, "%s: mlp_only_layers[%zu]: expected a layer index in [0, %d)",
                            name, i, c->num_hidden_layers);
        c->mlp_only_layers[c->n_mlp_only_layers++] = (int)json_integer_value(e);
    }
    return QD_OK;
}

static qd_status get_moe(const json_t *root, qd_model_config *c, const char *name)
{
    /* transformers 5 writes num_local_experts; published checkpoints num_experts */
    const char *experts_key = json_object_get(root, "num_experts") || !json_object_get(root, "num_local_experts")
                                  ? "num_experts" : "num_local_experts";
    qd_status st = get_int(root, experts_key, 1, 0, 0, &c->num_experts, name);
    if (!st)
        st = get_int(root, "num_experts_per_tok", 1, 0, 1, &c->num_experts_per_tok, name);
    if (!st && c->num_experts && c->num_experts_per_tok > c->num_experts)
        return qd_error(QD_ERR_FORMAT, "%s: num_experts_per_tok: %d exceeds num_experts %d", name,
                        c->num_experts_per_tok, c->num_experts);
    if (!st)
        st = get_int(root, "moe_intermediate_size", 1, 0, 1, &c->moe_intermediate_size, name);
    if (!st)
        st = get_int(root, "decoder_sparse_step", 0, 1, 1, &c->decoder_sparse_step, name);
    if (!st)
        st = get_bool(root, "norm_topk_prob", 0, &c->norm_topk_prob, name);
    if (!st)
        st = get_mlp_only_layers(root, c, name);
    return st;
}

/* params += a * b * k, refused (0) past QD_CONFIG_MAX_PARAMS or on int64 overflow. */
static int add_params(int64_t *params, int64_t a, int64_t b, int64_t k)
{
    int64_t p;
    return !__builtin_mul_overflow(a, b, &p) && !__builtin_mul_overflow(p, k, &p) &&
           !__builtin_add_overflow(*params, p, params) && *params <= QD_CONFIG_MAX_PARAMS;
}

/* The field that takes a config (with positive sizes) past what the parameter
 * table can describe: a linear layer's width above INT_MAX, more than
 * QD_CONFIG_MAX_TENSORS tensors or QD_CONFIG_MAX_PARAMS parameters; NULL when
 * it fits. Counted in checked 64-bit arithmetic, tensor by tensor as
 * backends/layout.c lays them out. */
static const char *oversized_field(const qd_model_config *c)
{
    int64_t C = c->hidden_size, D = c->head_dim, HD = (int64_t)c->num_attention_heads * D;
    int64_t KD = (int64_t)c->num_key_value_heads * D, params = 0, tensors = 4;
    if (HD > INT_MAX || KD > INT_MAX)
        return "head_dim";
    if (!add_params(&params, c->vocab_size, C, c->tie_word_embeddings ? 1 : 2) || !add_params(&params, 1, C, 1))
        return "vocab_size";
    for (int l = 0; l < c->num_hidden_layers; l++) {
        int moe = qd_model_config_is_moe_layer(c, l);
        if (!add_params(&params, C, 2 * HD + 2 * KD + 2, 1) || !add_params(&params, D, 2, 1))
            return "num_attention_heads";
        tensors += 8 + (moe ? 1 + 3 * (int64_t)c->num_experts : 3);
        if (tensors > QD_CONFIG_MAX_TENSORS)
            return "num_experts";
        if (moe ? !add_params(&params, C, c->num_experts, 1) ||
                  !add_params(&params, C, c->moe_intermediate_size, 3 * (int64_t)c->num_experts)
                : !add_params(&params, C, c->intermediate_size, 3))
            return moe ? "moe_intermediate_size" : "intermediate_size";
    }
    return NULL;
}

static qd_status check_size(const json_t *root, const qd_model_config *c, const char *name)
{
    const char *field = oversized_field(c);
    if (!field)
        return QD_OK;
    if (!strcmp(field, "num_experts") && !json_object_get(root, "num_experts"))
        field = "num_local_experts"; /* the spelling the file used */
    return qd_error(QD_ERR_UNSUPPORTED, "%s: %s: the model would have more than 2^40 parameters, 2^20 tensors "
                    "or a layer wider than 2^31-1 (%d layers, hidden_size %d, %d experts)", name, field,
                    c->num_hidden_layers, c->hidden_size, c->num_experts);
}

static qd_status parse(const json_t *root, qd_model_config *c, const char *name)
{
    memset(c, 0, sizeof *c);
    if (!json_is_object(root))
        return qd_error(QD_ERR_FORMAT, "%s: (top level): expected a JSON object", name);
    qd_status st = get_arch(root, &c->arch, name);
    if (!st)
        st = get_sizes(root, c, name);
    if (!st)
        st = get_rope(root, c, name);
    if (!st)
        st = check_attention(root, name);
    if (!st)
        st = check_mlp_and_weights(root, c, name);
    if (!st && c->arch == QD_ARCH_QWEN3_MOE)
        st = get_moe(root, c, name);
    if (!st)
        st = check_size(root, c, name);
    return st;
}

qd_status qd_model_config_load_string(const char *json, size_t len, const char *name, qd_model_config *cfg)
{
    json_error_t err;
    json_t *root = json_loadb(json, len, JSON_REJECT_DUPLICATES, &err);
    if (!root)
        return qd_error(QD_ERR_FORMAT, "%s: line %d: %s", name, err.line, err.text);
    qd_status st = parse(root, cfg, name);
    json_decref(root);
    return st;
}

qd_status qd_model_config_load(const char *path, qd_model_config *cfg)
{
    json_error_t err;
    FILE *f;
    qd_status st = qd_fopen_regular(path, &f);
    if (st)
        return st;
    json_t *root = json_loadf(f, JSON_REJECT_DUPLICATES, &err);
    fclose(f);
    if (!root)
        return qd_error(QD_ERR_FORMAT, "%s: line %d: %s", path, err.line, err.text);
    st = parse(root, cfg, path);
    json_decref(root);
    return st;
}

int qd_model_config_is_moe_layer(const qd_model_config *c, int layer)
{
    if (c->arch != QD_ARCH_QWEN3_MOE || c->num_experts <= 0 || (layer + 1) % c->decoder_sparse_step)
        return 0;
    for (int i = 0; i < c->n_mlp_only_layers; i++)
        if (c->mlp_only_layers[i] == layer)
            return 0;
    return 1;
}

/* Ranges and consistency of a config built by hand (tests, the tiny model);
 * qd_model_config_load already refuses bad files with the file named. */
#define QD_CHECK_FIELD(cond, field) \
    do { if (!(cond)) return qd_error(QD_ERR_ARG, "config: field '%s' out of range", field); } while (0)

qd_status qd_model_config_check(const qd_model_config *c)
{
    QD_CHECK_FIELD(c->arch == QD_ARCH_QWEN3 || c->arch == QD_ARCH_QWEN3_MOE, "arch");
    QD_CHECK_FIELD(c->vocab_size > 0, "vocab_size");
    QD_CHECK_FIELD(c->hidden_size > 0, "hidden_size");
    QD_CHECK_FIELD(c->num_hidden_layers > 0 && c->num_hidden_layers <= QD_CONFIG_MAX_LAYERS, "num_hidden_layers");
    QD_CHECK_FIELD(c->num_attention_heads > 0, "num_attention_heads");
    QD_CHECK_FIELD(c->num_key_value_heads > 0 && c->num_attention_heads % c->num_key_value_heads == 0,
                   "num_key_value_heads");
    QD_CHECK_FIELD(c->head_dim > 0 && c->head_dim % 2 == 0, "head_dim");
    QD_CHECK_FIELD(c->rope_theta > 0, "rope_theta");
    QD_CHECK_FIELD(c->rms_norm_eps >= 0, "rms_norm_eps");
    QD_CHECK_FIELD(c->max_position_embeddings > 0, "max_position_embeddings");
    QD_CHECK_FIELD(c->num_experts >= 0, "num_experts");
    QD_CHECK_FIELD(c->num_experts == 0 ||
                   (c->num_experts_per_tok > 0 && c->num_experts_per_tok <= c->num_experts),
                   "num_experts_per_tok");
    QD_CHECK_FIELD(c->arch != QD_ARCH_QWEN3_MOE || c->num_experts == 0 || c->decoder_sparse_step > 0,
                   "decoder_sparse_step");
    QD_CHECK_FIELD(c->n_mlp_only_layers >= 0 && c->n_mlp_only_layers <= QD_CONFIG_MAX_LAYERS,
                   "mlp_only_layers");
    for (int l = 0; l < c->num_hidden_layers; l++) {
        if (qd_model_config_is_moe_layer(c, l))
            QD_CHECK_FIELD(c->moe_intermediate_size > 0, "moe_intermediate_size");
        else
            QD_CHECK_FIELD(c->intermediate_size > 0, "intermediate_size");
    }
    const char *field = oversized_field(c);
    QD_CHECK_FIELD(!field, field);
    return QD_OK;
}
