/* backends/shared.h: host-side pieces of both backends. */
#include <math.h>
#include <string.h>
#include "backends/layout.h"
#include "backends/shared.h"

void qd_rope_tables(float *cosb, float *sinb, const qd_model_config *cfg)
{
    int h2 = cfg->head_dim / 2, np = cfg->max_position_embeddings;
    for (int i = 0; i < h2; i++) {
        float inv = (float)(1.0 / pow(cfg->rope_theta, (double)(2 * i) / cfg->head_dim));
        for (int p = 0; p < np; p++) {
            double a = (double)p * (double)inv;
            cosb[(size_t)p * h2 + i] = (float)cos(a);
            sinb[(size_t)p * h2 + i] = (float)sin(a);
        }
    }
}

qd_status qd_pack_batch(int32_t *tok, int32_t *tgt, int32_t *pos, int32_t *row, int32_t *src, int32_t *seq_off,
                        const qd_batch *bt, int vocab)
{
    int n = 0;
    for (int b = 0; b < bt->B; b++) {
        seq_off[b] = n;
        for (int t = 0; t < bt->lengths[b]; t++, n++) {
            int32_t id = bt->tokens[(size_t)b * bt->T + t];
            if (id < 0 || id >= vocab)
                return qd_error(QD_ERR_ARG, "forward: tokens[%d][%d] = %d not in [0, %d)", b, t, id, vocab);
            tok[n] = id;
            pos[n] = t;
            row[n] = b;
            src[n] = b * bt->T + t;
            tgt[n] = t + 1 < bt->lengths[b] ? bt->tokens[(size_t)b * bt->T + t + 1] : -1;
        }
    }
    seq_off[bt->B] = n;
    return QD_OK;
}

void qd_decode_pack(int32_t *tok, int32_t *pos, int32_t *row, int32_t *tgt, int32_t *src, int32_t *seq_off,
                    const int32_t *seq, const int32_t *len, const int32_t *idx, int na, int Tmax)
{
    for (int i = 0; i < na; i++) {
        int b = idx[i];
        tok[i] = seq[(size_t)b * Tmax + len[b] - 1];
        pos[i] = len[b] - 1;
        row[i] = b;
        tgt[i] = -1;
        src[i] = i;
        seq_off[i] = i;
    }
    seq_off[na] = na;
}

void qd_generate_begin(int32_t *seq, int32_t *len, int *done, const qd_generate_request *rq,
                       qd_generate_result *res, int Tmax)
{
    int M = rq->max_new_tokens;
    for (int b = 0; b < rq->B; b++) {
        memcpy(seq + (size_t)b * Tmax, rq->prompt + (size_t)b * rq->Tp, sizeof(int32_t) * rq->prompt_len[b]);
        len[b] = rq->prompt_len[b];
        done[b] = M == 0;
        res->lengths[b] = 0;
        for (int i = 0; i < M; i++) {
            res->tokens[(size_t)b * M + i] = -1;
            res->logp[(size_t)b * M + i] = 0.0f;
        }
    }
}

qd_status qd_gather_dlogp(float *d, const float *dlogp, const int32_t *src, int N)
{
    for (int n = 0; n < N; n++) {
        d[n] = dlogp[src[n]];
        if (!isfinite(d[n]))
            return qd_error(QD_ERR_NONFINITE, "backward: dlogp[%d] is not finite", src[n]);
    }
    return QD_OK;
}

void qd_adamw_scalars(const qd_adamw *o, int step, double norm, float *gscale, float *bc1, float *bc2)
{
    *gscale = o->grad_clip > 0 && norm > o->grad_clip ? (float)(o->grad_clip / norm) : 1.0f;
    *bc1 = qd_adamw_bias_correction(o->beta1, step);
    *bc2 = qd_adamw_bias_correction(o->beta2, step);
}

float qd_adamw_decay(const qd_adamw *o, const qd_param_info *pi) { return pi->rows > 1 ? o->weight_decay : 0.0f; }

float qd_adamw_bias_correction(float beta, int step)
{
    double p = 1.0;
    for (int i = 0; i < step; i++)
        p *= (double)beta;
    return (float)(1.0 - p);
}

int qd_generate_is_stop(const qd_generate_request *rq, int32_t tok)
{
    for (int i = 0; i < rq->num_stop; i++)
        if (rq->stop[i] == tok)
            return 1;
    return 0;
}

size_t qd_rac_state_bytes(int in)
{
    return sizeof(int64_t) * (1 + (size_t)in) + sizeof(double) * (size_t)in;
}

qd_status qd_rac_check_channels(const char *name, int in, int64_t nrac, const int64_t *ch)
{
    if (nrac < 0 || nrac > in)
        return qd_error(QD_ERR_FORMAT, "set_rac_state: %s: %lld channels of %d", name, (long long)nrac, in);
    for (int64_t j = 0; j < nrac; j++)
        if (ch[j] < 0 || ch[j] >= in || (j && ch[j] <= ch[j - 1]))
            return qd_error(QD_ERR_FORMAT, "set_rac_state: %s: channel %lld is %lld", name, (long long)j,
                            (long long)ch[j]);
    return QD_OK;
}

qd_status qd_rac_state_errors(void *blob, size_t n, const qd_model_config *cfg, double *err, size_t *count,
                              qd_rac_errors_dir dir)
{
    qd_model_layout m;
    qd_status st = qd_model_layout_init(&m, cfg);
    if (st)
        return st;
    size_t at = 0, k = 0;
    for (int i = 0; i < m.nlin; i++) {
        if (!m.lin[i].quantized)
            continue;
        size_t in = (size_t)m.lin[i].in, e = at + sizeof(int64_t) * (1 + in);
        at += qd_rac_state_bytes(m.lin[i].in);
        if (at > n)
            break;
        if (err && dir == QD_RAC_ERRORS_PUT)
            memcpy((char *)blob + e, err + k, sizeof(double) * in);
        else if (err)
            memcpy(err + k, (char *)blob + e, sizeof(double) * in);
        k += in;
    }
    qd_model_layout_free(&m);
    if (at != n)
        return qd_error(QD_ERR_FORMAT, "RAC state: %zu bytes, the model's quantized linears need %zu", n, at);
    *count = k;
    return QD_OK;
}
