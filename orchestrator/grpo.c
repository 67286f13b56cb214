/* GRPO/DAPO math: advantages, the clipped loss and its per-token gradient,
 * KL estimators, importance weights, group filtering, overlong penalty, gap
 * metrics. Formulas: GRPO (Shao et al. 2024), Dr.GRPO (Liu et al. 2025), DAPO
 * (Yu et al. 2025), KL estimators k1/k2/k3 (Schulman, "Approximating KL
 * divergence", 2020), TIS (Yao et al. 2025), masked IS (Liu et al. 2025). */
#include <math.h>
#include <string.h>
#include "orchestrator/grpo.h"

static int parse(const char *s, const char *const *names, int n)
{
    for (int i = 0; i < n; i++)
        if (strcmp(s, names[i]) == 0)
            return i;
    return -1;
}

int qd_grpo_adv_kind_parse(const char *s) { return parse(s, (const char *const[]){"grpo", "dr_grpo"}, 2); }
int qd_grpo_kl_type_parse(const char *s) { return parse(s, (const char *const[]){"k1", "k2", "k3"}, 3); }
int qd_grpo_tis_parse(const char *s) { return parse(s, (const char *const[]){"none", "tis", "masked"}, 3); }
int qd_grpo_lr_schedule_parse(const char *s)
{
    return parse(s, (const char *const[]){"constant", "cosine", "linear"}, 3);
}
int qd_grpo_loss_agg_parse(const char *s)
{
    return parse(s, (const char *const[]){"token_mean", "seq_mean_token_sum", "seq_mean_token_mean"}, 3);
}

void qd_grpo_params_from_config(qd_grpo_params *p, const qd_config *cfg)
{
    /* The config admits only the enum names, so the parses cannot fail. */
    const qd_knobs *k = qd_config_knobs(cfg);
    *p = (qd_grpo_params){
        .clip_low = k->algo.clip_low,
        .clip_high = k->algo.clip_high,
        .agg = (qd_loss_agg)qd_grpo_loss_agg_parse(k->algo.loss_agg),
        .kl_coef = k->algo.kl_coef,
        .kl_type = (qd_kl_type)qd_grpo_kl_type_parse(k->algo.kl_type),
        .tis = (qd_tis_kind)qd_grpo_tis_parse(k->algo.tis),
        .tis_cap = k->algo.tis_cap,
    };
}

qd_status qd_grpo_advantages(float *adv, const float *reward, int64_t n_groups, int64_t G, qd_adv_kind kind,
                             double eps)
{
    if (G < 2 || n_groups < 0)
        return qd_error(QD_ERR_ARG, "grpo advantages: group size %lld, need >= 2", (long long)G);
    for (int64_t i = 0; i < n_groups * G; i++)
        if (!isfinite(reward[i]))
            return qd_error(QD_ERR_NONFINITE, "grpo advantages: reward[%lld] is %g", (long long)i, reward[i]);
    for (int64_t g = 0; g < n_groups; g++) {
        const float *r = reward + g * G;
        double mean = 0, ss = 0;
        for (int64_t j = 0; j < G; j++)
            mean += r[j];
        mean /= (double)G;
        for (int64_t j = 0; j < G; j++)
            ss += (r[j] - mean) * (r[j] - mean);
        double denom = kind == QD_ADV_GRPO ? sqrt(ss / (double)(G - 1)) + eps : 1.0;
        for (int64_t j = 0; j < G; j++)
            adv[g * G + j] = (float)((r[j] - mean) / denom);
    }
    return QD_OK;
}

double qd_grpo_kl(qd_kl_type type, double d, double *grad)
{
    switch (type) {
    case QD_KL_K1: *grad = 1.0; return d;
    case QD_KL_K2: *grad = d; return 0.5 * d * d;
    default: *grad = 1.0 - exp(-d); return exp(-d) + d - 1.0;
    }
}

/* First non-finite value of x at the masked positions (name it), else QD_OK. */
static qd_status check_finite(const float *x, const uint8_t *mask, int64_t B, int64_t T, const char *name)
{
    for (int64_t i = 0; i < B * T; i++)
        if (mask[i] && !isfinite(x[i]))
            return qd_error(QD_ERR_NONFINITE, "grpo loss: %s[%lld, %lld] is %g", name, (long long)(i / T),
                            (long long)(i % T), x[i]);
    return QD_OK;
}

static qd_status check_batch(const qd_grpo_batch *b, const qd_grpo_params *p)
{
    if (b->B < 0 || b->T < 0 || !b->logp || !b->logp_old || !b->adv || !b->mask ||
        (p->tis != QD_TIS_NONE && !b->logp_rollout) || (p->kl_coef > 0 && !b->logp_ref))
        return qd_error(QD_ERR_ARG, "grpo loss: missing input array for the chosen tis/kl");
    qd_status st = check_finite(b->logp, b->mask, b->B, b->T, "logp");
    if (st == QD_OK)
        st = check_finite(b->logp_old, b->mask, b->B, b->T, "logp_old");
    if (st == QD_OK && p->tis != QD_TIS_NONE)
        st = check_finite(b->logp_rollout, b->mask, b->B, b->T, "logp_rollout");
    if (st == QD_OK && p->kl_coef > 0)
        st = check_finite(b->logp_ref, b->mask, b->B, b->T, "logp_ref");
    for (int64_t s = 0; st == QD_OK && s < b->B; s++)
        if (!isfinite(b->adv[s]))
            st = qd_error(QD_ERR_NONFINITE, "grpo loss: adv[%lld] is %g", (long long)s, b->adv[s]);
    return st;
}

/* The importance weight of a token and whether the cap changed it. */
static double tis_weight(const qd_grpo_params *p, double log_rho, int *capped)
{
    double rho = exp(log_rho);
    *capped = rho > p->tis_cap;
    if (p->tis == QD_TIS_TRUNC)
        return *capped ? p->tis_cap : rho;
    return *capped ? 0.0 : rho;
}

/* Token counts: all response tokens, and sequences with at least one. */
static void count_tokens(const qd_grpo_batch *b, int64_t *tokens, int64_t *seqs)
{
    *tokens = *seqs = 0;
    for (int64_t s = 0; s < b->B; s++) {
        int64_t n = 0;
        for (int64_t t = 0; t < b->T; t++)
            n += b->mask[s * b->T + t] != 0;
        *tokens += n;
        *seqs += n > 0;
    }
}

/* Aggregation weight of each token of a sequence with n tokens. */
static double agg_weight(const qd_grpo_params *p, int64_t n, double denom)
{
    if (p->agg == QD_AGG_SEQ_MEAN_TOKEN_MEAN)
        return 1.0 / (denom * (double)n);
    return 1.0 / denom;
}

typedef struct {
    double pg, kl, grad; /* token loss parts and dl/dlogp before aggregation */
    double ratio, w;
    int clip_low, clip_high, capped;
} token_out;

static void token_loss(token_out *o, const qd_grpo_batch *b, const qd_grpo_params *p, int64_t s, int64_t i)
{
    double A = b->adv[s];
    double r = exp((double)b->logp[i] - (double)b->logp_old[i]);
    double lo = 1.0 - p->clip_low, hi = 1.0 + p->clip_high;
    double rc = r < lo ? lo : r > hi ? hi : r;
    double unclipped = -A * r, clipped = -A * rc;
    /* The clipped branch wins (and blocks the gradient) only where it is strictly larger. */
    int clip = clipped > unclipped;
    o->ratio = r;
    o->clip_low = clip && r < lo;
    o->clip_high = clip && r > hi;
    o->pg = clip ? clipped : unclipped;
    double dpg = clip ? 0.0 : -A * r;
    o->capped = 0;
    o->w = p->tis == QD_TIS_NONE ? 1.0
                                 : tis_weight(p, (double)b->logp_old[i] - (double)b->logp_rollout[i], &o->capped);
    double dkl = 0;
    o->kl = p->kl_coef > 0 ? qd_grpo_kl(p->kl_type, (double)b->logp[i] - (double)b->logp_ref[i], &dkl) : 0.0;
    o->grad = o->w * dpg + p->kl_coef * dkl;
}

static void finish_stats(qd_grpo_stats *st, const qd_grpo_params *p)
{
    double n = st->tokens > 0 ? (double)st->tokens : 1.0;
    st->loss = st->pg_loss + p->kl_coef * st->kl;
    st->clip_frac = (st->clip_frac_low + st->clip_frac_high) / n;
    st->clip_frac_low /= n;
    st->clip_frac_high /= n;
    st->ratio_mean /= n;
    st->tis_mean /= n;
    st->tis_clipped_frac /= n;
}

qd_status qd_grpo_loss(float *coef, qd_grpo_stats *st, const qd_grpo_batch *b, const qd_grpo_params *p)
{
    qd_status status = check_batch(b, p);
    if (status != QD_OK)
        return status;
    int64_t tokens, seqs;
    count_tokens(b, &tokens, &seqs);
    double denom = p->norm > 0 ? p->norm : p->agg == QD_AGG_TOKEN_MEAN ? (double)tokens : (double)seqs;
    memset(st, 0, sizeof *st);
    st->tokens = tokens;
    for (int64_t s = 0; s < b->B; s++) {
        int64_t n = 0;
        for (int64_t t = 0; t < b->T; t++)
            n += b->mask[s * b->T + t] != 0;
        double aw = n > 0 ? agg_weight(p, n, denom) : 0.0;
        for (int64_t t = 0; t < b->T; t++) {
            int64_t i = s * b->T + t;
            if (coef)
                coef[i] = 0.0f;
            if (!b->mask[i])
                continue;
            token_out o;
            token_loss(&o, b, p, s, i);
            if (!isfinite(o.ratio) || !isfinite(o.grad))
                return qd_error(QD_ERR_NONFINITE, "grpo loss: ratio at [%lld, %lld] overflows (logp - logp_old = %g)",
                                (long long)s, (long long)t, (double)b->logp[i] - (double)b->logp_old[i]);
            if (coef)
                coef[i] = (float)(aw * o.grad);
            st->pg_loss += aw * o.w * o.pg;
            st->kl += aw * o.kl;
            st->clip_frac_low += o.clip_low;
            st->clip_frac_high += o.clip_high;
            st->ratio_mean += o.ratio;
            st->ratio_max = o.ratio > st->ratio_max ? o.ratio : st->ratio_max;
            st->tis_mean += o.w;
            st->tis_clipped_frac += o.capped;
        }
    }
    finish_stats(st, p);
    return QD_OK;
}

int64_t qd_grpo_filter_groups(uint8_t *keep, const float *score, int64_t n_groups, int64_t G)
{
    int64_t kept = 0;
    for (int64_t g = 0; g < n_groups; g++) {
        keep[g] = 0;
        for (int64_t j = 1; j < G && !keep[g]; j++)
            keep[g] = score[g * G + j] != score[g * G];
        kept += keep[g];
    }
    return kept;
}

double qd_grpo_overlong_penalty(int64_t len, int64_t max_len, int64_t buffer, double penalty)
{
    int64_t start = max_len - buffer;
    if (buffer <= 0 || len <= start)
        return 0.0;
    if (len >= max_len)
        return -penalty;
    return (double)(start - len) / (double)buffer * penalty;
}

/* Pearson correlation from sums over n points (NaN when a variance is 0). */
static double pearson(double n, double sx, double sy, double sxx, double syy, double sxy)
{
    double cov = sxy - sx * sy / n, vx = sxx - sx * sx / n, vy = syy - sy * sy / n;
    if (n < 2 || vx <= 0 || vy <= 0)
        return NAN;
    return cov / sqrt(vx * vy);
}

qd_status qd_grpo_gap(qd_gap_stats *g, const float *lt, const float *lr, const float *entropy, const uint8_t *mask,
                      int64_t B, int64_t T)
{
    qd_status st = check_finite(lt, mask, B, T, "logp_trainer");
    if (st == QD_OK)
        st = check_finite(lr, mask, B, T, "logp_rollout");
    if (st == QD_OK && entropy)
        st = check_finite(entropy, mask, B, T, "entropy");
    if (st != QD_OK)
        return st;
    /* Means of p first, so the Pearson sums are of centred values (no cancellation). */
    double n = 0, mx = 0, my = 0;
    for (int64_t i = 0; i < B * T; i++)
        if (mask[i])
            n += 1, mx += exp((double)lt[i]), my += exp((double)lr[i]);
    mx = n > 0 ? mx / n : 0;
    my = n > 0 ? my / n : 0;
    double sabs = 0, smax = 0, sk3 = 0, sent = 0, sx = 0, sy = 0, sxx = 0, syy = 0, sxy = 0;
    for (int64_t i = 0; i < B * T; i++) {
        if (!mask[i])
            continue;
        double d = (double)lt[i] - (double)lr[i];
        double x = exp((double)lt[i]) - mx, y = exp((double)lr[i]) - my;
        sabs += fabs(d);
        smax = fabs(d) > smax ? fabs(d) : smax;
        sk3 += exp(d) - 1.0 - d;
        sent += entropy ? entropy[i] : 0.0;
        sx += x, sy += y, sxx += x * x, syy += y * y, sxy += x * y;
    }
    g->tokens = (int64_t)n;
    g->mean_abs = n > 0 ? sabs / n : 0;
    g->max_abs = smax;
    g->k3_kl = n > 0 ? sk3 / n : 0;
    g->pearson = pearson(n, sx, sy, sxx, syy, sxy);
    g->entropy = entropy && n > 0 ? sent / n : NAN;
    return QD_OK;
}

double qd_grpo_lr(qd_lr_schedule sched, double peak, double min_ratio, int64_t warmup, int64_t total, int64_t s)
{
    if (s < warmup)
        return peak * (double)(s + 1) / (double)warmup;
    double p = total > warmup ? (double)(s - warmup) / (double)(total - warmup) : 1.0;
    p = p > 1.0 ? 1.0 : p;
    switch (sched) {
    case QD_LR_LINEAR: return peak * (1.0 - (1.0 - min_ratio) * p);
    case QD_LR_COSINE: return peak * (min_ratio + (1.0 - min_ratio) * 0.5 * (1.0 + cos(M_PI * p)));
    default: return peak;
    }
}
