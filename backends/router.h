/* The MoE router's selection, one definition for the CPU backend and the CUDA
 * kernel (host and device, as backends/exact_math.h): softmax of one token's
 * router logits in float32 (max, then exp sums ascending, then a division),
 * top-k with ties to the lower expert index (torch.topk leaves tie order
 * unspecified; this is ours), and the routing weights, renormalized over the
 * top-k in rank order when norm_topk_prob is set. */
#ifndef QD_ROUTER_H
#define QD_ROUTER_H

#include <math.h>
#include <stdint.h>
#include "backends/exact_math.h"

/* The weights of the chosen experts: their probabilities, or those divided by
 * their sum over the top-k (HF's norm_topk_prob). */
typedef enum { QD_TOPK_PROBS = 0, QD_TOPK_RENORM } qd_topk_norm;

/* r (E): router logits in, probabilities out. */
QD_HD void qd_router_softmax(float *r, int E)
{
    float mx = -INFINITY, sum = 0.0f;
    for (int e = 0; e < E; e++)
        mx = fmaxf(mx, r[e]);
    for (int e = 0; e < E; e++) {
        r[e] = qd_expf(r[e] - mx);
        sum = sum + r[e];
    }
    for (int e = 0; e < E; e++)
        r[e] = r[e] / sum;
}

/* idx (K): the experts of largest p (E), largest first, ties to the lower index;
 * w (K): their weights, p / (sum of the K p in rank order) under QD_TOPK_RENORM,
 * else p. */
QD_HD void qd_router_select(int32_t *idx, float *w, const float *p, int E, int K, qd_topk_norm norm)
{
    for (int j = 0; j < K; j++) {
        int best = -1;
        for (int e = 0; e < E; e++) {
            int taken = 0;
            for (int i = 0; i < j; i++)
                taken |= idx[i] == e;
            if (!taken && (best < 0 || p[e] > p[best]))
                best = e;
        }
        idx[j] = best;
    }
    float sum = 0.0f;
    for (int j = 0; j < K; j++)
        sum = sum + p[idx[j]];
    for (int j = 0; j < K; j++)
        w[j] = norm == QD_TOPK_RENORM ? p[idx[j]] / sum : p[idx[j]];
}

#endif
