/* Hugging Face model folders to and from the flat parameter buffer (see checkpoint.h). */
#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>
#include <omp.h>
#include "models/checkpoint.h"
#include "quant/fileio.h"
#include "quant/numerics.h"
#include "quant/quant.h"

/* Norm gains are stored 1-D by transformers; everything else is a matrix. */
static int is_vector(const qd_param_info *p) { return p->rows == 1 && qd_str_ends_with(p->name, "norm.weight"); }

qd_status qd_checkpoint_read_config(const char *dir, qd_model_config *cfg)
{
    char path[4096];
    struct stat sb;
    if (snprintf(path, sizeof path, "%s/config.json", dir) >= (int)sizeof path)
        return qd_error(QD_ERR_ARG, "%s: path too long", dir);
    if (stat(path, &sb))
        return qd_error(QD_ERR_IO, "%s: %s (a model folder needs config.json)", path, strerror(errno));
    return qd_model_config_load(path, cfg);
}

/* ---- loading */

static int cmp_name(const void *a, const void *b)
{
    return strcmp((*(const qd_param_info *const *)a)->name, (*(const qd_param_info *const *)b)->name);
}

/* The tensor's shape as "[a, b]" for messages. */
static const char *shape_str(char *buf, size_t n, const int64_t *shape, int ndim)
{
    size_t k = (size_t)snprintf(buf, n, "[");
    for (int i = 0; i < ndim && k < n; i++)
        k += (size_t)snprintf(buf + k, n - k, i ? ", %lld" : "%lld", (long long)shape[i]);
    if (k < n)
        snprintf(buf + k, n - k, "]");
    return buf;
}

/* One expected tensor t for p: its dtype and shape. */
static qd_status check_tensor(const qd_st_tensor *t, const qd_param_info *p)
{
    int64_t want[2] = {p->rows, p->cols};
    int vec = is_vector(p), ndim = vec ? 1 : 2;
    char got_s[128], want_s[64];
    if (t->dtype != QD_ST_F32 && t->dtype != QD_ST_BF16 && t->dtype != QD_ST_F16)
        return qd_error(QD_ERR_UNSUPPORTED, "%s: tensor '%s': dtype: %s is not supported (F32, BF16, F16)",
                        t->file, t->name, qd_st_dtype_name(t->dtype));
    if (t->ndim != ndim || (vec ? t->shape[0] != p->cols : t->shape[0] != want[0] || t->shape[1] != want[1]))
        return qd_error(QD_ERR_SHAPE, "%s: tensor '%s': shape: %s, expected %s", t->file, t->name,
                        shape_str(got_s, sizeof got_s, t->shape, t->ndim),
                        shape_str(want_s, sizeof want_s, vec ? want + 1 : want, ndim));
    return QD_OK;
}

/* Tensors of f that no parameter names: refused, except rotary inv_freq buffers. */
static qd_status check_extra(const qd_safetensors *f, const qd_param_info *params, int n, const char *path)
{
    const qd_param_info **sorted = malloc(sizeof *sorted * (size_t)(n > 0 ? n : 1));
    if (!sorted)
        return qd_error(QD_ERR_NOMEM, "%s: out of memory", path);
    for (int i = 0; i < n; i++)
        sorted[i] = &params[i];
    qsort(sorted, (size_t)n, sizeof *sorted, cmp_name);
    qd_status st = QD_OK;
    size_t count = qd_safetensors_count(f);
    for (size_t i = 0; i < count && !st; i++) {
        const qd_st_tensor *t = qd_safetensors_at(f, i);
        qd_param_info key;
        const qd_param_info *kp = &key;
        snprintf(key.name, sizeof key.name, "%s", t->name);
        int known = strlen(t->name) < sizeof key.name && bsearch(&kp, sorted, (size_t)n, sizeof *sorted, cmp_name);
        if (!known && !qd_str_ends_with(t->name, "rotary_emb.inv_freq"))
            st = qd_error(QD_ERR_FORMAT, "%s: tensor '%s': unexpected for this config.json (%zu tensors in the "
                          "checkpoint, %d expected)", t->file, t->name, count, n);
    }
    free(sorted);
    return st;
}

/* Loading converts pieces of CHUNK elements (256 KB of float32: the
 * finiteness pass reads them from cache) of every tensor of every shard in
 * parallel; a piece records its first non-finite element. */
#define CHUNK ((int64_t)1 << 16)

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

typedef struct {
    const qd_st_tensor *t;
    float *out;
    int64_t begin, n;
    int64_t bad; /* first non-finite element of the tensor in this piece, or -1 */
} piece;

/* The pieces of the n tensors (t[i] into out + params[i].offset), in order. */
static piece *make_pieces(const qd_st_tensor **t, const qd_param_info *params, int n, float *out, size_t *np)
{
    size_t count = 0;
    for (int i = 0; i < n; i++)
        count += (size_t)((t[i]->numel + CHUNK - 1) / CHUNK);
    piece *p = malloc((count ? count : 1) * sizeof *p);
    if (!p)
        return NULL;
    size_t k = 0;
    for (int i = 0; i < n; i++)
        for (int64_t b = 0; b < t[i]->numel; b += CHUNK)
            p[k++] = (piece){t[i], out + params[i].offset + b, b,
                             t[i]->numel - b < CHUNK ? t[i]->numel - b : CHUNK, -1};
    *np = count;
    return p;
}

/* "loading DIR: 1.2 of 6.2 GB, 2.3 GB/s" on a terminal, rewritten in place,
 * once a load has taken two seconds; nothing in logs. */
static void load_progress(const char *dir, double done, double total, double t0, double *last)
{
    double t = now_s();
    if (t - t0 < 2.0 || t - *last < 0.2 || !isatty(STDERR_FILENO))
        return;
    *last = t;
    fprintf(stderr, "\r\033[Kloading %s: %.1f of %.1f GB, %.2f GB/s", dir, done / 1e9, total / 1e9,
            done / 1e9 / (t - t0));
}

/* Converts the pieces in parallel; the message of the first non-finite
 * element in tensor order (the same as a serial load's). */
static qd_status convert_pieces(piece *p, size_t np, const char *dir, double total)
{
    double t0 = now_s(), last = t0, done = 0;
    int progress = 0;
#pragma omp parallel for schedule(dynamic, 16)
    for (size_t k = 0; k < np; k++) {
        qd_safetensors_to_f32_range(p[k].out, p[k].t, p[k].begin, p[k].n);
        int64_t i = qd_first_nonfinite(p[k].out, p[k].n); /* serial here: inside the parallel loop */
        p[k].bad = i < 0 ? -1 : p[k].begin + i;
        double bytes = (double)p[k].n * (double)qd_st_dtype_size(p[k].t->dtype);
#pragma omp atomic
        done += bytes;
        if (omp_get_thread_num() == 0) {
            double d;
#pragma omp atomic read
            d = done;
            load_progress(dir, d, total, t0, &last);
            progress = last > t0;
        }
    }
    if (progress)
        fprintf(stderr, "\r\033[Kloaded %s: %.1f GB in %.1f s, %.2f GB/s\n", dir, total / 1e9, now_s() - t0,
                total / 1e9 / (now_s() - t0));
    for (size_t k = 0; k < np; k++)
        if (p[k].bad >= 0)
            return qd_error(QD_ERR_NONFINITE, "%s: tensor '%s': element %lld is not finite", p[k].t->file,
                            p[k].t->name, (long long)p[k].bad);
    return QD_OK;
}

qd_status qd_checkpoint_load(const char *dir, const qd_param_info *params, int n, float *out)
{
    qd_safetensors *f = NULL;
    qd_status st = qd_safetensors_open(&f, dir);
    if (st)
        return st;
    const qd_st_tensor **t = malloc(sizeof *t * (size_t)(n > 0 ? n : 1));
    double total = 0;
    if (!t)
        st = qd_error(QD_ERR_NOMEM, "%s: out of memory", dir);
    for (int i = 0; i < n && !st; i++) {
        t[i] = qd_safetensors_find(f, params[i].name);
        if (!t[i])
            st = qd_error(QD_ERR_FORMAT, "%s: tensor '%s': missing", dir, params[i].name);
        else
            st = check_tensor(t[i], &params[i]);
        total += st ? 0 : (double)t[i]->nbytes;
    }
    if (!st)
        st = check_extra(f, params, n, dir);
    size_t np = 0;
    piece *p = st ? NULL : make_pieces(t, params, n, out, &np);
    if (!st && !p)
        st = qd_error(QD_ERR_NOMEM, "%s: out of memory", dir);
    if (!st)
        st = convert_pieces(p, np, dir, total);
    free(p);
    free(t);
    qd_safetensors_close(f);
    return st;
}

/* ---- saving */

static const char *dtype_torch_name(qd_st_dtype dt) { return dt == QD_ST_BF16 ? "bfloat16" : "float32"; }

static void set_int(json_t *o, const char *k, long long v) { json_object_set_new(o, k, json_integer(v)); }
static void set_bool(json_t *o, const char *k, int v) { json_object_set_new(o, k, json_boolean(v)); }
static void set_real(json_t *o, const char *k, double v) { json_object_set_new(o, k, json_real(v)); }
static void set_str(json_t *o, const char *k, const char *v) { json_object_set_new(o, k, json_string(v)); }

static void config_moe_fields(json_t *o, const qd_model_config *c)
{
    json_t *only = json_array();
    for (int i = 0; i < c->n_mlp_only_layers; i++)
        json_array_append_new(only, json_integer(c->mlp_only_layers[i]));
    json_object_set_new(o, "mlp_only_layers", only);
    set_int(o, "decoder_sparse_step", c->decoder_sparse_step);
    set_int(o, "moe_intermediate_size", c->moe_intermediate_size);
    set_int(o, "num_experts", c->num_experts);
    set_int(o, "num_experts_per_tok", c->num_experts_per_tok);
    set_bool(o, "norm_topk_prob", c->norm_topk_prob);
    set_bool(o, "output_router_logits", 0);
    set_real(o, "router_aux_loss_coef", 0.001);
}

/* config.json as transformers' Qwen3MoeConfig / Qwen3Config would write it. */
static json_t *config_json(const qd_model_config *c, qd_st_dtype dtype)
{
    int moe = c->arch == QD_ARCH_QWEN3_MOE;
    json_t *o = json_object(), *archs = json_array();
    json_array_append_new(archs, json_string(moe ? "Qwen3MoeForCausalLM" : "Qwen3ForCausalLM"));
    json_object_set_new(o, "architectures", archs);
    set_str(o, "model_type", moe ? "qwen3_moe" : "qwen3");
    set_bool(o, "attention_bias", 0);
    set_real(o, "attention_dropout", 0.0);
    set_int(o, "head_dim", c->head_dim);
    set_str(o, "hidden_act", "silu");
    set_int(o, "hidden_size", c->hidden_size);
    set_real(o, "initializer_range", 0.02);
    set_int(o, "intermediate_size", c->intermediate_size);
    set_int(o, "max_position_embeddings", c->max_position_embeddings);
    set_int(o, "num_attention_heads", c->num_attention_heads);
    set_int(o, "num_hidden_layers", c->num_hidden_layers);
    set_int(o, "num_key_value_heads", c->num_key_value_heads);
    set_real(o, "rms_norm_eps", c->rms_norm_eps);
    set_real(o, "rope_theta", c->rope_theta);
    json_object_set_new(o, "rope_scaling", json_null());
    json_object_set_new(o, "sliding_window", json_null());
    set_bool(o, "tie_word_embeddings", c->tie_word_embeddings);
    set_str(o, "torch_dtype", dtype_torch_name(dtype));
    set_bool(o, "use_cache", 1);
    set_bool(o, "use_sliding_window", 0);
    set_int(o, "vocab_size", c->vocab_size);
    if (moe)
        config_moe_fields(o, c);
    return o;
}

/* Significant digits that print v exactly as Python would ("1e-06",
 * "10000.0"): the fewest that round-trip, and all of an integer's digits. */
static int real_digits(double v)
{
    char buf[64];
    int p = 1;
    for (; p < 17; p++) {
        snprintf(buf, sizeof buf, "%.*g", p, v);
        if (strtod(buf, NULL) == v)
            break;
    }
    if (v == floor(v) && fabs(v) >= 1 && fabs(v) < 1e16)
        p = fmax(p, floor(log10(fabs(v))) + 1);
    return p;
}

/* One precision for the whole file: the most any of its reals needs. */
static int config_precision(const qd_model_config *c)
{
    double reals[] = {c->rms_norm_eps, c->rope_theta, 0.02, 0.001};
    int p = 1;
    for (size_t i = 0; i < sizeof reals / sizeof *reals; i++)
        p = p > real_digits(reals[i]) ? p : real_digits(reals[i]);
    return p;
}

qd_status qd_checkpoint_write_config(const char *dir, const qd_model_config *cfg, qd_st_dtype dtype)
{
    char path[4096];
    snprintf(path, sizeof path, "%s/config.json", dir);
    json_t *o = config_json(cfg, dtype);
    size_t flags = JSON_INDENT(2) | JSON_SORT_KEYS | JSON_REAL_PRECISION(config_precision(cfg));
    char *text = o ? json_dumps(o, flags) : NULL;
    json_decref(o);
    if (!text)
        return qd_error(QD_ERR_NOMEM, "%s: out of memory", path);
    size_t len = strlen(text);
    text[len] = '\n'; /* json_dumps leaves room only for the NUL: write it as the newline */
    qd_status st = qd_atomic_write(path, text, len + 1);
    free(text);
    return st;
}

/* One tensor into the writer: F32 borrowed from data, BF16 converted. */
static qd_status add_tensor(qd_safetensors_writer *w, const qd_param_info *p, const float *data,
                            qd_st_dtype dtype)
{
    int64_t shape[2] = {p->rows, p->cols};
    int vec = is_vector(p);
    const float *x = data + p->offset;
    size_t numel = (size_t)(p->rows * p->cols);
    if (dtype == QD_ST_F32)
        return qd_safetensors_writer_add(w, p->name, dtype, vec ? 1 : 2, vec ? shape + 1 : shape, x);
    uint16_t *h = malloc(numel * sizeof *h + 1);
    if (!h)
        return qd_error(QD_ERR_NOMEM, "%s: out of memory", p->name);
    for (size_t i = 0; i < numel; i++)
        h[i] = qd_bf16_from_f32(x[i]);
    return qd_safetensors_writer_add_steal(w, p->name, dtype, vec ? 1 : 2, vec ? shape + 1 : shape, h);
}

static qd_status write_weights(const char *dir, const qd_param_info *params, int n, const float *data,
                               qd_st_dtype dtype)
{
    char path[4096];
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    qd_safetensors_writer *w = NULL;
    qd_status st = qd_safetensors_writer_new(&w);
    if (!st)
        st = qd_safetensors_writer_set_metadata(w, "format", "pt");
    for (int i = 0; i < n && !st; i++)
        st = add_tensor(w, &params[i], data, dtype);
    if (!st)
        st = qd_safetensors_writer_write(w, path);
    qd_safetensors_writer_free(w);
    return st;
}

qd_status qd_checkpoint_save(const char *dir, const qd_model_config *cfg, const qd_param_info *params,
                             int n, const float *data, qd_st_dtype dtype)
{
    if (dtype != QD_ST_F32 && dtype != QD_ST_BF16)
        return qd_error(QD_ERR_ARG, "%s: dtype %s: checkpoints are saved as F32 or BF16", dir,
                        qd_st_dtype_name(dtype));
    if (strlen(dir) > 4000)
        return qd_error(QD_ERR_ARG, "%s: path too long", dir);
    qd_status st = qd_model_config_check(cfg);
    for (int i = 0; i < n && !st; i++)
        for (int64_t k = 0; k < params[i].rows * params[i].cols; k++)
            if (!isfinite(data[params[i].offset + (size_t)k]))
                return qd_error(QD_ERR_NONFINITE, "%s: tensor '%s': element %lld is not finite", dir,
                                params[i].name, (long long)k);
    if (!st)
        st = qd_mkdirs(dir);
    if (!st)
        st = write_weights(dir, params, n, data, dtype);
    if (!st)
        st = qd_checkpoint_write_config(dir, cfg, dtype);
    return st;
}

/* ---- a backend holding a checkpoint */

qd_backend *qd_checkpoint_open_backend(const char *dir, const char *backend_name,
                                       const qd_backend_options *opt)
{
    qd_model_config cfg;
    qd_backend_options dflt = {.recipe = QD_RECIPE_FP32, .role = QD_ROLE_ROLLOUT};
    if (qd_checkpoint_read_config(dir, &cfg))
        return NULL;
    qd_backend *b = qd_backend_init_by_name(backend_name ? backend_name : "auto", &cfg, opt ? opt : &dflt);
    if (!b)
        return NULL;
    int n;
    const qd_param_info *params = qd_backend_params(b, &n);
    size_t nf = qd_backend_num_floats(b);
    float *w = malloc(nf * sizeof *w + 1);
    qd_status st = w ? qd_checkpoint_load(dir, params, n, w) : qd_error(QD_ERR_NOMEM, "%s: out of memory", dir);
    if (!st)
        st = qd_backend_set_weights(b, w, nf);
    free(w);
    if (st) {
        qd_backend_free(b);
        return NULL;
    }
    return b;
}
