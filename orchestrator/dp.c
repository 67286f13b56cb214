/* Data-parallel collectives of quads rl over the rendezvous (dp.h). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "orchestrator/dp.h"

/* floats or doubles per allgather: bounds rank 0's buffer (world x chunk). */
#define CHUNK_BYTES ((size_t)8 << 20)

qd_status qd_dp_open(qd_dp *dp, const qd_dist_env *env, uint64_t run_id, double timeout_s)
{
    *dp = (qd_dp){env->rank, env->world_size, env->local_rank, NULL};
    if (env->world_size == 1)
        return QD_OK;
    qd_rdzv_opts o = {env->rank, env->world_size, env->master_addr, env->rdzv_port, run_id, timeout_s, timeout_s};
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
