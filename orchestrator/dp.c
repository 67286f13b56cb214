/* Data-parallel collectives of quads rl over the rendezvous (dp.h). */
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "orchestrator/dp.h"
#include "backends/shared.h"

/* floats or doubles per allgather: bounds rank 0's buffer (world x chunk). */
#define CHUNK_BYTES ((size_t)8 << 20)

qd_status qd_dp_open(qd_dp *dp, const qd_dist_env *env, uint64_t run_id, double timeout_s)
{
    *dp = (qd_dp){.rank = env->rank, .world = env->world_size, .local_rank = env->local_rank};
    if (env->world_size == 1)
        return QD_OK;
    qd_rdzv_opts o = {.rank = env->rank, .world_size = env->world_size, .master_addr = env->master_addr,
                      .port = env->rdzv_port, .run_id = run_id, .connect_timeout_s = timeout_s,
                      .op_timeout_s = timeout_s};
    return qd_rdzv_open(&o, &dp->rz); /* its messages name the rank, the address and the port */
}

qd_status qd_dp_finish(qd_dp *dp)
{
    qd_status st = dp->rz ? qd_rdzv_barrier(dp->rz, "end of run") : QD_OK;
    qd_rdzv_close(dp->rz);
    dp->rz = NULL;
    return st;
}

qd_status qd_dp_fail(qd_dp *dp, qd_status st)
{
    if (!dp->rz)
        return st;
    char msg[1024];
    snprintf(msg, sizeof msg, "%s", qd_last_error());
    qd_rdzv_abort(dp->rz, msg); /* a no-op on a handle that already failed */
    qd_rdzv_close(dp->rz);
    dp->rz = NULL;
    return qd_error(st, "%s", msg);
}

/* Sums world blobs of n elements of size es from all into out, in rank order. */
static void sum_ranks(const uint8_t *all, int world, size_t n, size_t es, double *acc)
{
    memset(acc, 0, sizeof(double) * n);
    for (int r = 0; r < world; r++) {
        const uint8_t *p = all + (size_t)r * n * es;
        for (size_t i = 0; i < n; i++) {
            if (es == sizeof(float)) {
                float v;
                memcpy(&v, p + i * es, es);
                acc[i] += v;
            } else {
                double v;
                memcpy(&v, p + i * es, es);
                acc[i] += v;
            }
        }
    }
}

/* x (n elements of size es, float or double) summed over ranks, chunk by chunk. */
static qd_status sum_any(qd_dp *dp, void *x, size_t n, size_t es)
{
    if (dp->world == 1 || n == 0)
        return QD_OK;
    size_t chunk = CHUNK_BYTES / es < n ? CHUNK_BYTES / es : n;
    uint8_t *all = malloc((size_t)dp->world * chunk * es);
    double *acc = malloc(sizeof(double) * chunk);
    qd_status st = !all || !acc ? qd_error(QD_ERR_NOMEM, "all-reduce of %zu values", n) : QD_OK;
    for (size_t a = 0; a < n && !st; a += chunk) {
        size_t k = n - a < chunk ? n - a : chunk;
        uint8_t *mine = (uint8_t *)x + a * es;
        st = qd_rdzv_allgather(dp->rz, mine, k * es, all);
        if (st)
            break;
        sum_ranks(all, dp->world, k, es, acc);
        for (size_t i = 0; i < k; i++) {
            if (es == sizeof(float))
                ((float *)(void *)mine)[i] = (float)acc[i];
            else
                ((double *)(void *)mine)[i] = acc[i];
        }
    }
    free(all), free(acc);
    return st;
}

qd_status qd_dp_sum_f32(qd_dp *dp, float *x, size_t n) { return sum_any(dp, x, n, sizeof(float)); }
qd_status qd_dp_sum_f64(qd_dp *dp, double *x, size_t n) { return sum_any(dp, x, n, sizeof(double)); }

qd_status qd_dp_max_f64(qd_dp *dp, double *x, size_t n)
{
    if (dp->world == 1 || n == 0)
        return QD_OK;
    double *all = malloc(sizeof(double) * n * (size_t)dp->world);
    if (!all)
        return qd_error(QD_ERR_NOMEM, "max over ranks");
    qd_status st = qd_rdzv_allgather(dp->rz, x, sizeof(double) * n, all);
    for (int r = 0; r < dp->world && !st; r++)
        for (size_t i = 0; i < n; i++)
            x[i] = all[(size_t)r * n + i] > x[i] ? all[(size_t)r * n + i] : x[i];
    free(all);
    return st;
}

qd_status qd_dp_gather_u64(qd_dp *dp, uint64_t mine, uint64_t *all)
{
    if (dp->world == 1) {
        all[0] = mine;
        return QD_OK;
    }
    return qd_rdzv_allgather(dp->rz, &mine, sizeof mine, all);
}

qd_status qd_dp_gatherv(qd_dp *dp, const void *mine, size_t n, uint8_t **all, size_t *off)
{
    int W = dp->world;
    uint64_t *len = malloc(sizeof(uint64_t) * (size_t)W);
    qd_status st = len ? qd_dp_gather_u64(dp, (uint64_t)n, len) : qd_error(QD_ERR_NOMEM, "gather");
    size_t most = 0;
    for (int r = 0; r < W && !st; r++)
        most = len[r] > most ? (size_t)len[r] : most;
    /* padded to the longest blob: the rendezvous allgathers equal sizes */
    uint8_t *pad = st ? NULL : calloc(most + 1, 1), *buf = st ? NULL : malloc((size_t)W * most + 1);
    *all = st ? NULL : malloc(most * (size_t)W + 1);
    if (!st && (!pad || !buf || !*all))
        st = qd_error(QD_ERR_NOMEM, "gather of %zu bytes", most);
    if (!st) {
        if (n)
            memcpy(pad, mine, n);
        st = W == 1 ? QD_OK : qd_rdzv_allgather(dp->rz, pad, most, buf);
        if (W == 1)
            memcpy(buf, pad, most);
    }
    off[0] = 0;
    for (int r = 0; r < W && !st; r++) {
        memcpy(*all + off[r], buf + (size_t)r * most, len[r]);
        off[r + 1] = off[r] + len[r];
    }
    free(len), free(pad), free(buf);
    if (st) {
        free(*all);
        *all = NULL;
    }
    return st;
}

qd_status qd_dp_bcast(qd_dp *dp, void *buf, size_t n)
{
    return dp->world == 1 ? QD_OK : qd_rdzv_bcast(dp->rz, buf, n);
}

qd_status qd_dp_barrier(qd_dp *dp, const char *name)
{
    return dp->world == 1 ? QD_OK : qd_rdzv_barrier(dp->rz, name);
}

uint64_t qd_dp_fnv1a(const void *p, size_t n)
{
    uint64_t h = 0xcbf29ce484222325ull;
    for (size_t i = 0; i < n; i++)
        h = (h ^ ((const uint8_t *)p)[i]) * 0x100000001b3ull;
    return h;
}

/* ---- the RL loop's exchanges */

qd_status qd_dp_keep_flags(qd_dp *dp, const uint8_t *lkeep, uint8_t *keep, int P)
{
    int W = dp->world, rk = dp->rank;
    double *k = calloc((size_t)P + 1, sizeof(double));
    if (!k)
        return qd_error(QD_ERR_NOMEM, "dynamic sampling");
    for (int g = rk, i = 0; g < P; g += W, i++)
        k[g] = lkeep[i];
    qd_status st = qd_dp_sum_f64(dp, k, (size_t)P);
    for (int g = 0; g < P; g++)
        keep[g] = k[g] > 0;
    free(k);
    return st;
}

qd_status qd_dp_sum_grads(qd_dp *dp, qd_backend *trainer, size_t nf)
{
    float *g = malloc(sizeof(float) * nf);
    qd_status st = g ? qd_backend_get_grads(trainer, g, nf) : qd_error(QD_ERR_NOMEM, "gradients");
    if (!st)
        st = qd_dp_sum_f32(dp, g, nf);
    if (!st)
        st = qd_backend_set_grads(trainer, g, nf);
    free(g);
    return st;
}

qd_status qd_dp_sum_rac(qd_dp *dp, const qd_model_config *mcfg, void *rac, size_t rb)
{
    size_t ne = 0;
    qd_status st = qd_rac_state_errors(rac, rb, mcfg, NULL, &ne, QD_RAC_ERRORS_GET);
    double *e = st ? NULL : malloc(sizeof(double) * (ne ? ne : 1));
    if (!st && !e)
        st = qd_error(QD_ERR_NOMEM, "RAC statistics");
    if (!st)
        st = qd_rac_state_errors(rac, rb, mcfg, e, &ne, QD_RAC_ERRORS_GET);
    if (!st)
        st = qd_dp_sum_f64(dp, e, ne);
    if (!st)
        st = qd_rac_state_errors(rac, rb, mcfg, e, &ne, QD_RAC_ERRORS_PUT);
    free(e);
    return st;
}

qd_status qd_dp_zero_rac(const qd_model_config *mcfg, void *rac, size_t rb)
{
    size_t ne = 0;
    qd_status st = qd_rac_state_errors(rac, rb, mcfg, NULL, &ne, QD_RAC_ERRORS_GET);
    double *z = st ? NULL : calloc(ne ? ne : 1, sizeof(double));
    if (!st && !z)
        st = qd_error(QD_ERR_NOMEM, "RAC statistics");
    if (!st)
        st = qd_rac_state_errors(rac, rb, mcfg, z, &ne, QD_RAC_ERRORS_PUT);
    free(z);
    return st;
}

qd_status qd_dp_gather_rows(qd_dp *dp, const qd_dp_rows *mine, qd_dp_rows *all, int S)
{
    int M = mine->M;
    size_t rec = 2 * sizeof(int32_t) + 2 * sizeof(float) * M, *off = malloc(sizeof(size_t) * (dp->world + 1));
    uint8_t *buf = malloc(rec * mine->n + 1), *got = NULL;
    qd_status st = !off || !buf ? qd_error(QD_ERR_NOMEM, "gap") : QD_OK;
    for (int i = 0; i < mine->n && !st; i++) {
        int32_t h[2] = {mine->place[i], mine->rlen[i]};
        memcpy(buf + rec * i, h, sizeof h);
        memcpy(buf + rec * i + sizeof h, mine->a + (size_t)i * M, sizeof(float) * M);
        memcpy(buf + rec * i + sizeof h + sizeof(float) * M, mine->b + (size_t)i * M, sizeof(float) * M);
    }
    if (!st)
        st = qd_dp_gatherv(dp, buf, rec * mine->n, &got, off);
    for (size_t p = 0; !st && p < off[dp->world]; p += rec) {
        int32_t h[2];
        memcpy(h, got + p, sizeof h);
        if (h[0] < 0 || h[0] >= S)
            st = qd_error(QD_ERR_FORMAT, "gap: a rank sent sample %d of %d", h[0], S);
        else {
            all->rlen[h[0]] = h[1];
            memcpy(all->a + (size_t)h[0] * M, got + p + sizeof h, sizeof(float) * M);
            memcpy(all->b + (size_t)h[0] * M, got + p + sizeof h + sizeof(float) * M, sizeof(float) * M);
        }
    }
    free(off), free(buf), free(got);
    return st;
}

qd_status qd_dp_reduce_stats(qd_dp *dp, qd_rollout_stats *rs, qd_train_stats *ts, qd_layer_stats *ls)
{
    double v[] = {rs->reward_sum, rs->score_sum, rs->len_sum, (double)rs->generated, (double)rs->tokens,
                  ts->loss, ts->kl, ts->clip_frac, ts->clip_low, ts->clip_high, ts->tis_mean, ts->tis_clipped,
                  (double)ts->tokens};
    double mx[4] = {ts->ratio_max, (double)ls->nmoe, rs->grade_s, (double)ls->nlin}, verdicts[QD_CODE_N_VERDICTS];
    for (int i = 0; i < QD_CODE_N_VERDICTS; i++)
        verdicts[i] = (double)rs->verdicts[i];
    qd_status st = qd_dp_sum_f64(dp, v, sizeof v / sizeof *v);
    if (!st)
        st = qd_dp_sum_f64(dp, verdicts, QD_CODE_N_VERDICTS);
    if (!st)
        st = qd_dp_max_f64(dp, mx, 4);
    if (!st && ls->nlin < (int)mx[3]) /* measured on ranks that had samples (rl.c rollout_stats) */
        st = qd_layer_stats_zero(ls, (int)mx[3]);
    if (!st) /* a sync's weight errors: the same on the ranks that measured, 0 on the others */
        st = qd_dp_max_f64(dp, ls->weight_err, (size_t)ls->nlin);
    if (!st)
        st = qd_dp_sum_f64(dp, ls->act_sq, (size_t)ls->nlin);
    if (!st)
        st = qd_dp_sum_f64(dp, ls->act_norm, (size_t)ls->nlin);
    if (!st && ls->nmoe < (int)mx[1]) /* router agreement is measured on ranks that had mini-batch 0's data */
        st = qd_layer_stats_router(ls, (int)mx[1]);
    if (!st)
        st = qd_dp_sum_f64(dp, ls->hits, (size_t)ls->nmoe);
    if (!st)
        st = qd_dp_sum_f64(dp, ls->picks, (size_t)ls->nmoe);
    rs->reward_sum = v[0], rs->score_sum = v[1], rs->len_sum = v[2];
    rs->generated = (int64_t)v[3], rs->tokens = (int64_t)v[4];
    ts->loss = v[5], ts->kl = v[6], ts->clip_frac = v[7], ts->clip_low = v[8], ts->clip_high = v[9];
    ts->tis_mean = v[10], ts->tis_clipped = v[11], ts->tokens = (int64_t)v[12], ts->ratio_max = mx[0];
    rs->grade_s = mx[2];
    for (int i = 0; i < QD_CODE_N_VERDICTS; i++)
        rs->verdicts[i] = (int64_t)verdicts[i];
    return st;
}

qd_status qd_dp_check_weights(qd_dp *dp, const float *w, size_t nf, int64_t step, uint64_t *sum)
{
    int W = dp->world;
    uint64_t *all = malloc(sizeof(uint64_t) * W);
    *sum = qd_dp_fnv1a(w, sizeof(float) * nf);
    qd_status st = all ? qd_dp_gather_u64(dp, *sum, all) : qd_error(QD_ERR_NOMEM, "checksum");
    char msg[900] = "";
    for (int k = 1; k < W && !st; k++)
        if (all[k] != all[0] && strlen(msg) < sizeof msg - 64)
            snprintf(msg + strlen(msg), sizeof msg - strlen(msg), ", rank %d has %016llx", k,
                     (unsigned long long)all[k]);
    if (!st && *msg)
        st = qd_error(QD_ERR_FORMAT, "step %lld: the master weights differ across ranks: rank 0 has checksum %016llx%s",
                      (long long)step, (unsigned long long)all[0], msg);
    free(all);
    return st;
}
