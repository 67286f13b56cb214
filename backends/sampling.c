/* The sampling rule (NUMERICS.md §6). Every float operation below is a
 * correctly rounded float32 +, -, *, / or a comparison, or qd_expf / qd_logf
 * from backends/exact_math.h, in the order written here; a CUDA kernel that
 * follows these steps gives the same bits. Compile with -ffp-contract=off.
 *
 * Row of V logits x, temperature T, top_k, top_p, seed, sequence id q,
 * position n:
 *  1. Scale: s_i = x_i / T (one division; T = 1 when greedy, T == 0).
 *     A non-finite x_i, or an s_i that overflows, is an error naming i.
 *  2. Max: m = max_i s_i, then m = m + 0 (turns -0 into +0, so the bits do
 *     not depend on which of +0 / -0 a reduction met first).
 *  3. e_i = qd_expf(s_i - m). Note e = 1 exactly for every token with s_i = m.
 *  4. Lane-tree sum of a masked vector w (w_i = e_i for kept tokens, else 0):
 *     lane j in [0, 1024) sums w_j, w_{j+1024}, w_{j+2048}, ... from 0.0f in
 *     ascending token order; then for h = 512, 256, ..., 1:
 *     lane[j] = lane[j] + lane[j + h] for j < h (the classic shared-memory
 *     block reduction); the sum is lane[0]. Every level is kept for step 9.
 *  5. Z = tree sum of e (all tokens), logZ = qd_logf(Z). The rollout
 *     log-prob of token t is (s_t - m) - logZ = log_softmax(x / T)[t].
 *  6. Greedy (T == 0): t = the lowest id with s_t = m; logprob_kept = 0; stop.
 *  7. Rank order: a ranks before b iff s_a > s_b, or s_a == s_b and a < b (a
 *     strict total order; probabilities never increase along it because
 *     qd_expf is monotonic). Top-k: the first K = min(top_k, V) tokens of
 *     the rank order (all V when top_k <= 0). Z_K = tree sum over them.
 *  8. Top-p (only when top_p < 1): theta = top_p * Z_K; walking the top-K set
 *     in rank order with c = 0.0f, c = c + e_r, keep the ranks up to and
 *     including the first r with c >= theta (all K if none does).
 *     (c / Z_K >= p is the renormalized cumulative probability, written
 *     without the division.) Z_kept = tree sum over the kept set.
 *  9. Draw: u = qd_philox_sample_u(seed, q, n) (backends/philox.h), a multiple
 *     of 2^-24 in [0, 1); r = u * Z_kept. Descend the tree of Z_kept from the
 *     root: at a node whose children are lane[j] (first) and lane[j + h]
 *     (second) on the level below, go to the first if r < lane[j] or
 *     lane[j + h] == 0, else r = r - lane[j] and go to the second. At the
 *     leaf lane j, walk its tokens j, j+1024, ... in ascending order with
 *     c = 0.0f, c = c + w_i; the token is the first with c > r (it always
 *     has w_i > 0, so it is kept). If rounding leaves none, the last token of
 *     the lane with w_i > 0 (the descent only enters non-zero nodes).
 * 10. logprob = (s_t - m) - logZ; logprob_kept = (s_t - m) - qd_logf(Z_kept).
 *
 * Why a tree over strided lanes rather than a scan in rank order: the sum is
 * one O(V) pass with no sort even when nothing is truncated (V ~ 150k), it is
 * the layout a 1024-thread GPU block reduces with coalesced loads, its error
 * grows like ~150 + 10 additions rather than V, and the descent walks
 * exactly the partial sums the total was built from, so r < Z_kept always
 * lands on a kept token. Sorting is only needed for the top-p prefix, and
 * there only for the ranks it reaches (sorted in growing stages). */
#include <stdlib.h>
#include <math.h>
#include "backends/sampling.h"
#include "backends/philox.h"
#include "backends/exact_math.h"

#define TREE_NODES (2 * QD_SAMPLE_LANES - 1)

typedef struct {
    float s;
    int32_t id;
} cand;

struct qd_sample_ws {
    int V;
    float *s;               /* (V) scaled logits */
    float *e;               /* (V) exp(s - m) */
    cand *c;                /* (V) top-k / top-p candidates */
    float tree[TREE_NODES]; /* level of n nodes at [2L - 2n, 2L - n), L = lanes */
};

/* The kept set: every token ranked at or before the boundary (s_b, id_b). */
typedef struct {
    int all;
    float s_b;
    int32_t id_b;
} kept_set;

qd_sample_ws *qd_sample_ws_new(int V)
{
    if (V < 1)
        return NULL;
    qd_sample_ws *ws = calloc(1, sizeof *ws);
    if (!ws)
        return NULL;
    ws->V = V;
    ws->s = malloc((size_t)V * sizeof *ws->s);
    ws->e = malloc((size_t)V * sizeof *ws->e);
    ws->c = malloc((size_t)V * sizeof *ws->c);
    if (!ws->s || !ws->e || !ws->c) {
        qd_sample_ws_free(ws);
        return NULL;
    }
    return ws;
}

void qd_sample_ws_free(qd_sample_ws *ws)
{
    if (!ws)
        return;
    free(ws->s);
    free(ws->e);
    free(ws->c);
    free(ws);
}

/* ---- rank order (step 7) */

static int ranks_before(float sa, int32_t a, float sb, int32_t b)
{
    return sa > sb || (sa == sb && a < b);
}

static int cand_cmp(const void *pa, const void *pb)
{
    const cand *a = pa, *b = pb;
    if (ranks_before(a->s, a->id, b->s, b->id))
        return -1;
    return ranks_before(b->s, b->id, a->s, a->id) ? 1 : 0;
}

static int cand_before(const cand *a, const cand *b) { return ranks_before(a->s, a->id, b->s, b->id); }

static void cand_swap(cand *a, cand *b)
{
    cand t = *a;
    *a = *b;
    *b = t;
}

/* Index of the median of c[a], c[b], c[d] under the rank order. */
static int median3(const cand *c, int a, int b, int d)
{
    if (cand_before(&c[a], &c[b]))
        return cand_before(&c[b], &c[d]) ? b : (cand_before(&c[a], &c[d]) ? d : a);
    return cand_before(&c[a], &c[d]) ? a : (cand_before(&c[b], &c[d]) ? d : b);
}

/* Quickselect: afterwards c[0, k) are the k highest-ranked of c[0, n), in no
 * particular order. The order is strict, so the set is unique whatever the
 * pivots; expected O(n). */
static void select_top(cand *c, int n, int k)
{
    int lo = 0, hi = n;
    while (hi - lo > 1 && k > lo && k < hi) {
        cand_swap(&c[median3(c, lo, lo + (hi - lo) / 2, hi - 1)], &c[hi - 1]);
        int i = lo;
        for (int j = lo; j < hi - 1; j++)
            if (cand_before(&c[j], &c[hi - 1]))
                cand_swap(&c[i++], &c[j]);
        cand_swap(&c[i], &c[hi - 1]); /* pivot at i: c[lo, i) rank before it */
        if (k <= i)
            hi = i;
        else
            lo = i + 1;
    }
}

/* ---- lane tree (step 4) and descent (step 9) */

static int is_kept(const kept_set *k, float s, int32_t i)
{
    return k->all || s > k->s_b || (s == k->s_b && i <= k->id_b);
}

static float *tree_level(qd_sample_ws *ws, int n) { return ws->tree + 2 * QD_SAMPLE_LANES - 2 * n; }

static float lane_tree(qd_sample_ws *ws, int V, const kept_set *k)
{
    float *lane = tree_level(ws, QD_SAMPLE_LANES);
    for (int j = 0; j < QD_SAMPLE_LANES; j++)
        lane[j] = 0.0f;
    for (int i = 0; i < V; i++)
        lane[i % QD_SAMPLE_LANES] = lane[i % QD_SAMPLE_LANES] + (is_kept(k, ws->s[i], i) ? ws->e[i] : 0.0f);
    for (int n = QD_SAMPLE_LANES; n > 1; n /= 2) {
        const float *child = tree_level(ws, n);
        float *parent = tree_level(ws, n / 2);
        for (int j = 0; j < n / 2; j++)
            parent[j] = child[j] + child[j + n / 2];
    }
    return tree_level(ws, 1)[0];
}

static int32_t descend(qd_sample_ws *ws, int V, const kept_set *k, float r)
{
    int j = 0;
    for (int n = 2; n <= QD_SAMPLE_LANES; n *= 2) {
        const float *level = tree_level(ws, n);
        float a = level[j], b = level[j + n / 2];
        if (!(r < a || b == 0.0f)) {
            r = r - a;
            j += n / 2;
        }
    }
    float c = 0.0f;
    int32_t last = -1;
    for (int i = j; i < V; i += QD_SAMPLE_LANES) {
        float w = is_kept(k, ws->s[i], i) ? ws->e[i] : 0.0f;
        c = c + w;
        if (c > r)
            return i;
        if (w > 0.0f)
            last = i;
    }
    return last;
}

void qd_softmax_lognorm(float *m_out, float *logz, const float *s, int V)
{
    float m = s[0], lane[QD_SAMPLE_LANES];
    for (int i = 1; i < V; i++)
        if (s[i] > m)
            m = s[i];
    m = m + 0.0f;
    for (int j = 0; j < QD_SAMPLE_LANES; j++)
        lane[j] = 0.0f;
    for (int i = 0; i < V; i++)
        lane[i % QD_SAMPLE_LANES] = lane[i % QD_SAMPLE_LANES] + qd_expf(s[i] - m);
    for (int n = QD_SAMPLE_LANES; n > 1; n /= 2)   /* the levels of lane_tree() */
        for (int j = 0; j < n / 2; j++)
            lane[j] = lane[j] + lane[j + n / 2];
    *m_out = m;
    *logz = qd_logf(lane[0]);
}

/* ---- steps 1-3 */

static qd_status scale_row(qd_sample_ws *ws, const float *x, int V, float T, int row,
                           float *m_out, int32_t *argmax)
{
    float m = 0.0f;
    int32_t am = 0;
    for (int i = 0; i < V; i++) {
        if (!isfinite(x[i]))
            return qd_error(QD_ERR_NONFINITE, "sampling: row %d: logits[%d] is %s", row, i,
                            isnan(x[i]) ? "nan" : "inf");
        float s = x[i] / T;
        if (!isfinite(s))
            return qd_error(QD_ERR_NONFINITE, "sampling: row %d: logits[%d] / temperature %g overflows",
                            row, i, (double)T);
        ws->s[i] = s;
        if (i == 0 || s > m) {
            m = s;
            am = i;
        }
    }
    m = m + 0.0f;
    for (int i = 0; i < V; i++)
        ws->e[i] = qd_expf(ws->s[i] - m);
    *m_out = m;
    *argmax = am;
    return QD_OK;
}

/* ---- steps 7-8: the kept set */

/* The K-th ranked token of c[0, K) (the worst of them). */
static kept_set worst_of(const cand *c, int K)
{
    int w = 0;
    for (int i = 1; i < K; i++)
        if (cand_before(&c[w], &c[i]))
            w = i;
    return (kept_set){ 0, c[w].s, c[w].id };
}

/* Walks c[0, K) in rank order, sorting stages of growing size only as far as
 * the walk reaches, until the cumulative sum reaches theta. */
static kept_set nucleus(qd_sample_ws *ws, int K, float theta)
{
    cand *c = ws->c;
    float cum = 0.0f;
    int lo = 0;
    for (int stage = 64; lo < K; stage *= 4) {
        int hi = K - lo > stage ? lo + stage : K;
        if (hi < K)
            select_top(c + lo, K - lo, hi - lo);
        qsort(c + lo, (size_t)(hi - lo), sizeof *c, cand_cmp);
        for (int r = lo; r < hi; r++) {
            cum = cum + ws->e[c[r].id];
            if (cum >= theta)
                return (kept_set){ 0, c[r].s, c[r].id };
        }
        lo = hi;
    }
    return (kept_set){ 0, c[K - 1].s, c[K - 1].id };
}

/* Fills the tree for the kept set (returns Z_kept) and the set itself. */
static float keep(qd_sample_ws *ws, int V, const qd_sample_params *p, float Z, kept_set *k)
{
    int K = (p->top_k <= 0 || p->top_k >= V) ? V : p->top_k;
    *k = (kept_set){ 1, 0.0f, 0 };
    if (K == V && !(p->top_p < 1.0f))
        return Z; /* the tree of step 5 is still in ws */
    for (int i = 0; i < V; i++)
        ws->c[i] = (cand){ ws->s[i], i };
    float ZK = Z;
    if (K < V) {
        select_top(ws->c, V, K);
        *k = worst_of(ws->c, K);
        ZK = lane_tree(ws, V, k);
    }
    if (!(p->top_p < 1.0f))
        return ZK;
    *k = nucleus(ws, K, p->top_p * ZK);
    return lane_tree(ws, V, k);
}

static qd_status check_params(const qd_sample_params *p, int V)
{
    if (V < 1)
        return qd_error(QD_ERR_SHAPE, "sampling: vocabulary size %d < 1", V);
    if (!(p->temperature >= 0.0f) || isinf(p->temperature))
        return qd_error(QD_ERR_ARG, "sampling: temperature %g is not a finite number >= 0",
                        (double)p->temperature);
    if (!(p->top_p > 0.0f && p->top_p <= 1.0f))
        return qd_error(QD_ERR_ARG, "sampling: top_p %g is not in (0, 1]", (double)p->top_p);
    return QD_OK;
}

static qd_status sample_one(qd_sample_result *out, qd_sample_ws *ws, const float *x, int V,
                            const qd_sample_params *p, uint64_t seq_id, uint32_t position, int row)
{
    int greedy = p->temperature == 0.0f;
    float m = 0.0f;
    int32_t am = 0;
    qd_status st = scale_row(ws, x, V, greedy ? 1.0f : p->temperature, row, &m, &am);
    if (st != QD_OK)
        return st;
    kept_set all = { 1, 0.0f, 0 };
    float logZ = qd_logf(lane_tree(ws, V, &all));
    if (greedy) {
        *out = (qd_sample_result){ am, (ws->s[am] - m) - logZ, 0.0f };
        return QD_OK;
    }
    kept_set k;
    float Zk = keep(ws, V, p, tree_level(ws, 1)[0], &k);
    float r = qd_philox_sample_u(p->seed, seq_id, position) * Zk;
    int32_t t = descend(ws, V, &k, r);
    float d = ws->s[t] - m;
    *out = (qd_sample_result){ t, d - logZ, d - qd_logf(Zk) };
    return QD_OK;
}

qd_status qd_sample_row(qd_sample_result *out, qd_sample_ws *ws, const float *logits, int V,
                        const qd_sample_params *p, uint64_t seq_id, uint32_t position)
{
    qd_status st = check_params(p, V);
    if (st != QD_OK)
        return st;
    if (!ws || ws->V < V)
        return qd_error(QD_ERR_ARG, "sampling: workspace for %d tokens, row has %d", ws ? ws->V : 0, V);
    return sample_one(out, ws, logits, V, p, seq_id, position, 0);
}

qd_status qd_sample_batch(qd_sample_result *out, const float *logits, int B, int V,
                          const qd_sample_params *p, const uint64_t *seq_ids,
                          const uint32_t *positions)
{
    qd_status st = check_params(p, V);
    if (st != QD_OK || B == 0)
        return st;
    if (B < 0)
        return qd_error(QD_ERR_SHAPE, "sampling: batch size %d < 0", B);
    qd_status *row_st = malloc((size_t)B * sizeof *row_st);
    if (!row_st)
        return qd_error(QD_ERR_NOMEM, "sampling: %d row statuses", B);
#pragma omp parallel
    {
        qd_sample_ws *ws = qd_sample_ws_new(V);
#pragma omp for schedule(static)
        for (int b = 0; b < B; b++)
            row_st[b] = ws ? sample_one(&out[b], ws, logits + (size_t)b * V, V, p, seq_ids[b],
                                        positions[b], b)
                           : QD_ERR_NOMEM;
        qd_sample_ws_free(ws);
    }
    int bad = 0;
    while (bad < B && row_st[bad] == QD_OK)
        bad++;
    free(row_st);
    if (bad == B)
        return QD_OK;
    /* qd_error's message is per thread: redo the failing row here to set it. */
    qd_sample_ws *ws = qd_sample_ws_new(V);
    if (!ws)
        return qd_error(QD_ERR_NOMEM, "sampling: workspace for %d tokens", V);
    qd_sample_result scratch;
    st = sample_one(&scratch, ws, logits + (size_t)bad * V, V, p, seq_ids[bad], positions[bad], bad);
    qd_sample_ws_free(ws);
    return st != QD_OK ? st : qd_error(QD_ERR_NOMEM, "sampling: row %d: workspace for %d tokens", bad, V);
}
