/* The backend registry, the recipe table and the dispatchers of backend.h. */
#include <assert.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "backends/backend.h"
#include "quant/quant.h"

/* ---- recipes */

static const struct {
    const char *name;
    qd_linear_mode rollout, trainer;
} recipes[QD_RECIPE_COUNT] = {
    [QD_RECIPE_FP32] = {"fp32", QD_LINEAR_FP32, QD_LINEAR_FP32},
    [QD_RECIPE_BF16] = {"bf16", QD_LINEAR_BF16, QD_LINEAR_BF16},
    [QD_RECIPE_FP8] = {"fp8", QD_LINEAR_FP8, QD_LINEAR_BF16},
    [QD_RECIPE_NVFP4] = {"nvfp4", QD_LINEAR_W4A4, QD_LINEAR_BF16},
    [QD_RECIPE_NVFP4_AQAT] = {"nvfp4-aqat", QD_LINEAR_W4A4, QD_LINEAR_AQAT},
    [QD_RECIPE_NVFP4_RAC] = {"nvfp4-rac", QD_LINEAR_W4A4_RAC, QD_LINEAR_BF16},
    [QD_RECIPE_QUADS] = {"quads", QD_LINEAR_W4A4_RAC, QD_LINEAR_AQAT},
    [QD_RECIPE_NVFP4_SYM_QAT] = {"nvfp4-sym-qat", QD_LINEAR_W4A4, QD_LINEAR_SYM_QAT},
    [QD_RECIPE_NVFP4_REPLAY] = {"nvfp4-replay", QD_LINEAR_W4A4, QD_LINEAR_W4A4_STE},
    [QD_RECIPE_QUADS_REPLAY] = {"quads-replay", QD_LINEAR_W4A4_RAC, QD_LINEAR_W4A4_RAC_STE},
    [QD_RECIPE_NVFP4_W16A4] = {"nvfp4-w16a4", QD_LINEAR_ACT_QAT, QD_LINEAR_BF16},
    [QD_RECIPE_NVFP4_W4A16] = {"nvfp4-w4a16", QD_LINEAR_AQAT, QD_LINEAR_BF16},
};

const char *qd_recipe_name(qd_recipe r)
{
    return (unsigned)r < QD_RECIPE_COUNT ? recipes[r].name : NULL;
}

qd_status qd_recipe_parse(qd_recipe *out, const char *name)
{
    for (int r = 0; r < QD_RECIPE_COUNT; r++)
        if (name && strcmp(name, recipes[r].name) == 0) {
            *out = (qd_recipe)r;
            return QD_OK;
        }
    return qd_error(QD_ERR_ARG, "precision: unknown recipe '%s' (fp32, bf16, fp8, nvfp4, "
                    "nvfp4-aqat, nvfp4-rac, quads, nvfp4-sym-qat, nvfp4-replay, quads-replay, "
                    "nvfp4-w16a4, nvfp4-w4a16)",
                    name ? name : "(null)");
}

const char *qd_mode_name(qd_exec_mode m)
{
    return m == QD_MODE_EXACT ? "exact" : m == QD_MODE_FAST ? "fast" : NULL;
}

qd_status qd_mode_parse(qd_exec_mode *out, const char *name)
{
    if (name && strcmp(name, "exact") == 0)
        *out = QD_MODE_EXACT;
    else if (name && strcmp(name, "fast") == 0)
        *out = QD_MODE_FAST;
    else
        return qd_error(QD_ERR_ARG, "mode: unknown value '%s' (exact, fast)", name ? name : "(null)");
    return QD_OK;
}

qd_linear_mode qd_recipe_linear_mode(qd_recipe r, qd_role role)
{
    assert((unsigned)r < QD_RECIPE_COUNT);
    return role == QD_ROLE_ROLLOUT ? recipes[r].rollout : recipes[r].trainer;
}

qd_linear_mode qd_recipe_dense_mode(qd_recipe r)
{
    return r == QD_RECIPE_FP32 ? QD_LINEAR_FP32 : QD_LINEAR_BF16;
}

/* ---- registry */

/* The CUDA backend's _init, a weak reference: NULL unless an object defining
 * it is linked in (an archive member is not pulled in by a weak reference, so
 * the CUDA objects must be linked directly or with --undefined). */
qd_backend *qd_backend_cuda_init(const qd_model_config *cfg, const qd_backend_options *opt)
    __attribute__((weak));

static qd_backend *cuda_init(const qd_model_config *cfg, const qd_backend_options *opt)
{
    if (qd_backend_cuda_init)
        return qd_backend_cuda_init(cfg, opt);
    qd_error(QD_ERR_UNSUPPORTED, "backend: built without the CUDA backend");
    return NULL;
}

qd_backend *qd_backend_init_best(const qd_model_config *cfg, const qd_backend_options *opt)
{
    qd_backend *b = cuda_init(cfg, opt);
    return b ? b : qd_backend_cpu_init(cfg, opt);
}

qd_backend *qd_backend_init_by_name(const char *name, const qd_model_config *cfg,
                                    const qd_backend_options *opt)
{
    if (strcmp(name, "auto") == 0)
        return qd_backend_init_best(cfg, opt);
    if (strcmp(name, "cpu") == 0)
        return qd_backend_cpu_init(cfg, opt);
    if (strcmp(name, "cuda") == 0)
        return cuda_init(cfg, opt);
    qd_error(QD_ERR_ARG, "backend: unknown name '%s' (auto, cpu, cuda)", name);
    return NULL;
}

/* ---- dispatchers */

const char *qd_backend_name(qd_backend *b)
{
    assert(b);
    return b->iface->get_name(b);
}

void qd_backend_free(qd_backend *b)
{
    if (b)
        b->iface->free(b);
}

const qd_param_info *qd_backend_params(const qd_backend *b, int *count)
{
    assert(b && count);
    *count = b->num_params;
    return b->params;
}

size_t qd_backend_num_floats(const qd_backend *b)
{
    assert(b);
    return b->num_floats;
}

int qd_backend_find_param(const qd_backend *b, const char *name)
{
    for (int i = 0; i < b->num_params; i++)
        if (strcmp(b->params[i].name, name) == 0)
            return i;
    return -1;
}

static qd_status check_size(const qd_backend *b, size_t n, const char *what)
{
    if (n != b->num_floats)
        return qd_error(QD_ERR_SHAPE, "backend %s: %zu floats given, model has %zu", what, n,
                        b->num_floats);
    return QD_OK;
}

qd_status qd_backend_set_weights(qd_backend *b, const float *params, size_t n)
{
    assert(b && params);
    qd_status st = check_size(b, n, "set_weights");
    int64_t bad = st ? -1 : qd_first_nonfinite(params, (int64_t)n);
    if (bad >= 0)
        st = qd_error(QD_ERR_NONFINITE, "set_weights: master weight %lld is not finite", (long long)bad);
    return st ? st : b->iface->set_weights(b, params, n);
}

/* The caller's fill, each tensor's values checked finite. */
typedef struct {
    const qd_backend *b;
    qd_weight_fill fill;
    void *user;
} checked_fill;

static qd_status fill_checked(void *user, int t, float *dst, size_t n)
{
    const checked_fill *f = user;
    QD_TRY(f->fill(f->user, t, dst, n));
    int64_t bad = qd_first_nonfinite(dst, (int64_t)n);
    if (bad >= 0)
        return qd_error(QD_ERR_NONFINITE, "set_weights: %s[%lld] is not finite", f->b->params[t].name,
                        (long long)bad);
    return QD_OK;
}

qd_status qd_backend_set_weights_fill(qd_backend *b, qd_weight_fill fill, void *user)
{
    assert(b && fill);
    checked_fill f = {.b = b, .fill = fill, .user = user};
    if (b->iface->set_weights_fill)
        return b->iface->set_weights_fill(b, fill_checked, &f);
    float *w = malloc(sizeof(float) * (b->num_floats ? b->num_floats : 1));
    if (!w)
        return qd_error(QD_ERR_NOMEM, "set_weights: %zu floats of host buffer", b->num_floats);
    qd_status st = QD_OK;
    for (int t = 0; t < b->num_params && !st; t++)
        st = fill_checked(&f, t, w + b->params[t].offset, (size_t)(b->params[t].rows * b->params[t].cols));
    if (!st)
        st = b->iface->set_weights(b, w, b->num_floats);
    free(w);
    return st;
}

qd_status qd_backend_get_weights(qd_backend *b, float *params, size_t n)
{
    assert(b && params);
    qd_status st = check_size(b, n, "get_weights");
    return st ? st : b->iface->get_weights(b, params, n);
}

qd_status qd_backend_forward(qd_backend *b, const qd_batch *batch, float *logp, float *logits)
{
    assert(b && batch && batch->tokens && batch->lengths && logp);
    if (batch->B <= 0 || batch->T <= 0)
        return qd_error(QD_ERR_SHAPE, "forward: batch shape (%d, %d)", batch->B, batch->T);
    if (!(batch->temperature >= 0.0f) || isinf(batch->temperature))
        return qd_error(QD_ERR_ARG, "forward: temperature %g is not a finite number >= 0",
                        (double)batch->temperature);
    for (int i = 0; i < batch->B; i++)
        if (batch->lengths[i] < 1 || batch->lengths[i] > batch->T)
            return qd_error(QD_ERR_SHAPE, "forward: lengths[%d] = %d not in [1, %d]", i,
                            batch->lengths[i], batch->T);
    return b->iface->forward(b, batch, logp, logits);
}

qd_status qd_backend_backward(qd_backend *b, const float *dlogp)
{
    assert(b && dlogp);
    if (!b->iface->backward)
        return qd_error(QD_ERR_UNSUPPORTED, "backend %s: no backward", qd_backend_name(b));
    return b->iface->backward(b, dlogp);
}

void qd_backend_zero_grad(qd_backend *b)
{
    assert(b);
    if (b->iface->zero_grad)
        b->iface->zero_grad(b);
}

qd_status qd_backend_set_grads(qd_backend *b, const float *grads, size_t n)
{
    assert(b && grads);
    qd_status st = check_size(b, n, "set_grads");
    if (st != QD_OK)
        return st;
    if (!b->iface->set_grads)
        return qd_error(QD_ERR_UNSUPPORTED, "set_grads: not supported by backend %s", qd_backend_name(b));
    for (size_t i = 0; i < n; i++)
        if (!isfinite(grads[i]))
            return qd_error(QD_ERR_NONFINITE, "set_grads: gradient %zu is not finite", i);
    return b->iface->set_grads(b, grads, n);
}

qd_status qd_backend_get_grads(qd_backend *b, float *grads, size_t n)
{
    assert(b && grads);
    qd_status st = check_size(b, n, "get_grads");
    if (st)
        return st;
    if (!b->iface->get_grads)
        return qd_error(QD_ERR_UNSUPPORTED, "backend %s: no gradients", qd_backend_name(b));
    return b->iface->get_grads(b, grads, n);
}

qd_status qd_backend_optimizer_step(qd_backend *b, const qd_adamw *opt, int step, float *grad_norm)
{
    assert(b && opt);
    if (step < 1)
        return qd_error(QD_ERR_ARG, "optimizer: step %d (counts from 1)", step);
    if (!b->iface->optimizer_step)
        return qd_error(QD_ERR_UNSUPPORTED, "backend %s: no optimizer", qd_backend_name(b));
    float norm_unused;
    return b->iface->optimizer_step(b, opt, step, grad_norm ? grad_norm : &norm_unused);
}

qd_status qd_backend_generate(qd_backend *b, const qd_generate_request *req, qd_generate_result *res)
{
    assert(b && req && res && req->prompt && req->prompt_len && req->seq_id);
    assert(res->tokens && res->logp && res->lengths);
    if (!b->iface->generate)
        return qd_error(QD_ERR_UNSUPPORTED, "backend %s: no generate", qd_backend_name(b));
    if (req->B <= 0 || req->Tp <= 0 || req->max_new_tokens < 0)
        return qd_error(QD_ERR_SHAPE, "generate: B %d, Tp %d, max_new_tokens %d", req->B, req->Tp,
                        req->max_new_tokens);
    for (int i = 0; i < req->B; i++)
        if (req->prompt_len[i] < 1 || req->prompt_len[i] > req->Tp)
            return qd_error(QD_ERR_SHAPE, "generate: prompt_len[%d] = %d not in [1, %d]", i,
                            req->prompt_len[i], req->Tp);
    if (!(req->temperature >= 0.0f) || !(req->top_p > 0.0f) || req->top_k < 0 || req->num_stop < 0)
        return qd_error(QD_ERR_ARG, "generate: temperature %g, top_k %d, top_p %g", req->temperature,
                        req->top_k, req->top_p);
    return b->iface->generate(b, req, res);
}

qd_status qd_backend_diagnostics(qd_backend *b, qd_diagnostics *out)
{
    assert(b && out);
    if (!b->iface->diagnostics)
        return qd_error(QD_ERR_UNSUPPORTED, "backend %s: no diagnostics", qd_backend_name(b));
    return b->iface->diagnostics(b, out);
}

qd_status qd_backend_get_adam(qd_backend *b, float *m, float *v, size_t n)
{
    assert(b && m && v);
    qd_status st = check_size(b, n, "get_adam");
    if (st)
        return st;
    if (!b->iface->get_adam)
        return qd_error(QD_ERR_UNSUPPORTED, "backend %s: no optimizer state", qd_backend_name(b));
    return b->iface->get_adam(b, m, v, n);
}

qd_status qd_backend_set_adam(qd_backend *b, const float *m, const float *v, size_t n)
{
    assert(b && m && v);
    qd_status st = check_size(b, n, "set_adam");
    if (st)
        return st;
    if (!b->iface->set_adam)
        return qd_error(QD_ERR_UNSUPPORTED, "backend %s: no optimizer state", qd_backend_name(b));
    int64_t bm = qd_first_nonfinite(m, (int64_t)n), bv = bm >= 0 ? -1 : qd_first_nonfinite(v, (int64_t)n);
    if (bm >= 0 || bv >= 0)
        return qd_error(QD_ERR_NONFINITE, "set_adam: AdamW %s moment %lld is not finite", bm >= 0 ? "first" : "second",
                        (long long)(bm >= 0 ? bm : bv));
    return b->iface->set_adam(b, m, v, n);
}

size_t qd_backend_rac_state_size(qd_backend *b)
{
    assert(b);
    return b->iface->rac_state_size ? b->iface->rac_state_size(b) : 0;
}

/* n given for a buffer of want units (bytes, statistics) of the backend's. */
static qd_status check_count(qd_backend *b, size_t n, size_t want, const char *unit, const char *what)
{
    if (n != want)
        return qd_error(QD_ERR_SHAPE, "backend %s: %s: %zu %s given, the backend has %zu", qd_backend_name(b),
                        what, n, unit, want);
    return QD_OK;
}

static qd_status check_rac_size(qd_backend *b, size_t n, const char *what)
{
    return check_count(b, n, qd_backend_rac_state_size(b), "bytes", what);
}

qd_status qd_backend_get_rac_state(qd_backend *b, void *buf, size_t n)
{
    qd_status st = check_rac_size(b, n, "get_rac_state");
    return st || n == 0 ? st : b->iface->get_rac_state(b, buf, n);
}

qd_status qd_backend_set_rac_state(qd_backend *b, const void *buf, size_t n)
{
    qd_status st = check_rac_size(b, n, "set_rac_state");
    return st || n == 0 ? st : b->iface->set_rac_state(b, buf, n);
}

size_t qd_backend_rac_stats_count(qd_backend *b)
{
    assert(b);
    return b->iface->rac_stats_count ? b->iface->rac_stats_count(b) : 0;
}

static qd_status check_stats_count(qd_backend *b, size_t n, const char *what)
{
    return check_count(b, n, qd_backend_rac_stats_count(b), "statistics", what);
}

qd_status qd_backend_get_rac_stats(qd_backend *b, double *err, size_t n)
{
    qd_status st = check_stats_count(b, n, "get_rac_stats");
    return st || n == 0 ? st : b->iface->get_rac_stats(b, err, n);
}

qd_status qd_backend_set_rac_stats(qd_backend *b, const double *err, size_t n)
{
    QD_TRY(check_stats_count(b, n, "set_rac_stats"));
    for (size_t i = 0; i < n; i++) {
        if (!isfinite(err[i]))
            return qd_error(QD_ERR_NONFINITE, "set_rac_stats: statistic %zu is not finite", i);
        if (err[i] < 0)
            return qd_error(QD_ERR_ARG, "set_rac_stats: statistic %zu is negative (%g)", i, err[i]);
    }
    return n == 0 ? QD_OK : b->iface->set_rac_stats(b, err, n);
}

/* ---- weight sync between instances, memory */

/* The same model: the same parameter table (names, shapes, offsets). */
static qd_status check_same_model(const qd_backend *dst, const qd_backend *src)
{
    if (dst->num_floats != src->num_floats || dst->num_params != src->num_params)
        return qd_error(QD_ERR_SHAPE, "sync_from: the models differ (%zu floats in %d tensors, %zu in %d)",
                        dst->num_floats, dst->num_params, src->num_floats, src->num_params);
    for (int i = 0; i < dst->num_params; i++) {
        const qd_param_info *a = &dst->params[i], *b = &src->params[i];
        if (strcmp(a->name, b->name) || a->rows != b->rows || a->cols != b->cols || a->offset != b->offset)
            return qd_error(QD_ERR_SHAPE, "sync_from: the models differ at tensor %d (%s, %s)", i, a->name,
                            b->name);
    }
    return QD_OK;
}

qd_status qd_backend_sync_from(qd_backend *dst, qd_backend *src, int *direct)
{
    assert(dst && src && dst != src);
    if (direct)
        *direct = 0;
    QD_TRY(check_same_model(dst, src));
    if (dst->iface == src->iface && dst->iface->sync_from) {
        qd_status st = dst->iface->sync_from(dst, src);
        if (st != QD_ERR_UNSUPPORTED) {
            if (direct)
                *direct = st == QD_OK;
            return st;
        }
    }
    float *w = malloc(sizeof(float) * (dst->num_floats ? dst->num_floats : 1));
    if (!w)
        return qd_error(QD_ERR_NOMEM, "sync_from: %zu floats of host buffer", dst->num_floats);
    qd_status st = qd_backend_get_weights(src, w, src->num_floats);
    if (!st)
        st = qd_backend_set_weights(dst, w, dst->num_floats);
    free(w);
    return st;
}

qd_status qd_backend_wait(qd_backend *b)
{
    assert(b);
    return b->iface->wait ? b->iface->wait(b) : QD_OK;
}

qd_status qd_backend_memory(qd_backend *b, qd_memory *out)
{
    assert(b && out);
    if (!b->iface->memory)
        return qd_error(QD_ERR_UNSUPPORTED, "backend %s: no memory plan", qd_backend_name(b));
    return b->iface->memory(b, out);
}

static const char *const mem_kind_names[QD_MEM_COUNT] = {
    [QD_MEM_MASTER] = "master weights",   [QD_MEM_WORKING] = "working weights",
    [QD_MEM_QUANT] = "quantized weights", [QD_MEM_OWN] = "device copies",
    [QD_MEM_GRADS] = "gradients",         [QD_MEM_ADAM] = "AdamW moments",
    [QD_MEM_ACTS] = "activations",        [QD_MEM_SCRATCH] = "scratch",
    [QD_MEM_KV] = "KV cache",             [QD_MEM_TABLES] = "RoPE tables",
};

const char *qd_mem_kind_name(qd_mem_kind k)
{
    return (unsigned)k < QD_MEM_COUNT ? mem_kind_names[k] : NULL;
}

void qd_format_bytes(size_t bytes, char *buf, size_t n)
{
    static const char *const unit[] = {"B", "KB", "MB", "GB", "TB"};
    double v = (double)bytes;
    int u = 0;
    while (v >= 1024.0 && u < 4)
        v /= 1024.0, u++;
    if (u == 0)
        snprintf(buf, n, "%zu B", bytes);
    else
        snprintf(buf, n, "%.1f %s", v, unit[u]);
}

void qd_mem_plan_format(const qd_mem_plan *p, char *buf, size_t n)
{
    char b[32];
    qd_format_bytes(p->total, b, sizeof b);
    size_t used = (size_t)snprintf(buf, n, "total %s (", b);
    const char *sep = "";
    for (int k = 0; k < QD_MEM_COUNT && used < n; k++) {
        if (!p->bytes[k])
            continue;
        qd_format_bytes(p->bytes[k], b, sizeof b);
        used += (size_t)snprintf(buf + used, n - used, "%s%s %s", sep, mem_kind_names[k], b);
        sep = ", ";
    }
    if (used < n)
        snprintf(buf + used, n - used, ")");
}
