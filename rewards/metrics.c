/* Reward functions (outcome, format, DAPO overlong) and evaluation metrics
 * (pass@k, mean@k, maj@k, bootstrap confidence intervals). */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include "rewards/rewards.h"

qd_rewards_config qd_rewards_config_default(void)
{
    return (qd_rewards_config){.correct = 1.0, .incorrect = 0.0, .format_penalty = 0.0};
}

double qd_rewards_overlong(int len, int l_max, int l_cache)
{
    if (len <= l_max - l_cache)
        return 0.0;
    if (len <= l_max)
        return (double)((l_max - l_cache) - len) / (double)l_cache;
    return -1.0;
}

double qd_rewards_score(const qd_rewards_config *cfg, bool has_answer, bool correct, int len)
{
    double r = !has_answer ? cfg->format_penalty : correct ? cfg->correct : cfg->incorrect;
    if (cfg->overlong_max > 0)
        r += qd_rewards_overlong(len, cfg->overlong_max, cfg->overlong_cache);
    return r;
}

static qd_status check_nck(int n, int c, int k)
{
    if (n < 1 || c < 0 || c > n || k < 1 || k > n)
        return qd_error(QD_ERR_ARG, "pass@k: need 0 <= c <= n and 1 <= k <= n (n=%d c=%d k=%d)", n, c, k);
    return QD_OK;
}

qd_status qd_rewards_pass_at_k(int n, int c, int k, double *out)
{
    qd_status st = check_nck(n, c, k);
    if (st)
        return st;
    if (n - c < k) { /* every k-subset holds a correct sample */
        *out = 1.0;
        return QD_OK;
    }
    double prod = 1.0;
    for (int i = n - c + 1; i <= n; i++)
        prod *= 1.0 - (double)k / (double)i;
    *out = 1.0 - prod;
    return QD_OK;
}

static unsigned __int128 gcd128(unsigned __int128 a, unsigned __int128 b)
{
    while (b) {
        unsigned __int128 t = a % b;
        a = b;
        b = t;
    }
    return a;
}

qd_status qd_rewards_pass_at_k_exact(int n, int c, int k, uint64_t *num, uint64_t *den)
{
    qd_status st = check_nck(n, c, k);
    if (st)
        return st;
    /* C(n-c, k) / C(n, k) = prod_{i<k} (n-c-i) / (n-i), kept reduced */
    unsigned __int128 p = 1, q = 1;
    for (int i = 0; i < k && p; i++) {
        p *= (unsigned)(n - c - i > 0 ? n - c - i : 0);
        q *= (unsigned)(n - i);
        unsigned __int128 g = gcd128(p, q);
        p /= g ? g : 1;
        q /= g ? g : 1;
        if (q > UINT64_MAX)
            return qd_error(QD_ERR_ARG, "pass@k exact: n=%d k=%d overflows 64 bits", n, k);
    }
    if (p == 0)
        q = 1;
    *num = (uint64_t)(q - p);
    *den = (uint64_t)q;
    return QD_OK;
}

double qd_rewards_mean_at_k(const bool *correct, int k)
{
    int s = 0;
    for (int i = 0; i < k; i++)
        s += correct[i];
    return k > 0 ? (double)s / k : 0.0;
}

int qd_rewards_majority(char *const *answers, int k)
{
    int best = -1, best_votes = 0;
    for (int i = 0; i < k; i++) {
        if (!answers[i])
            continue;
        bool seen = false; /* counted already as a member of an earlier cluster */
        for (int j = 0; j < i && !seen; j++)
            seen = answers[j] && qd_rewards_equiv(answers[j], answers[i]);
        if (seen)
            continue;
        int votes = 0;
        for (int j = i; j < k; j++)
            votes += answers[j] && qd_rewards_equiv(answers[i], answers[j]);
        if (votes > best_votes) {
            best_votes = votes;
            best = i;
        }
    }
    return best;
}

bool qd_rewards_maj_at_k(char *const *answers, int k, const char *gold)
{
    int m = qd_rewards_majority(answers, k);
    return m >= 0 && qd_rewards_equiv(gold, answers[m]);
}

static uint64_t splitmix64(uint64_t *s)
{
    uint64_t z = (*s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* Linear interpolation between order statistics (numpy's default). */
static double quantile(const double *sorted, int n, double q)
{
    double pos = q * (n - 1);
    int i = (int)floor(pos);
    if (i >= n - 1)
        return sorted[n - 1];
    return sorted[i] + (pos - i) * (sorted[i + 1] - sorted[i]);
}

qd_status qd_rewards_bootstrap_ci(const double *x, int n, int reps, double level,
                                  uint64_t seed, double *lo, double *hi)
{
    if (n < 1 || reps < 2 || !(level > 0 && level < 1))
        return qd_error(QD_ERR_ARG, "bootstrap: need n >= 1, reps >= 2, 0 < level < 1");
    double *means = malloc(sizeof *means * (size_t)reps);
    if (!means)
        return qd_error(QD_ERR_NOMEM, "bootstrap: %d resamples", reps);
    uint64_t s = seed;
    for (int r = 0; r < reps; r++) {
        double sum = 0;
        for (int i = 0; i < n; i++)
            sum += x[splitmix64(&s) % (uint64_t)n];
        means[r] = sum / n;
    }
    qsort(means, (size_t)reps, sizeof *means, cmp_double);
    *lo = quantile(means, reps, (1 - level) / 2);
    *hi = quantile(means, reps, 1 - (1 - level) / 2);
    free(means);
    return QD_OK;
}
