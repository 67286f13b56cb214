/* Check suite of the orchestrator library: GRPO/DAPO math against values
 * worked out by hand below (the arithmetic is in the comments), the gradient
 * coefficients against finite differences of the loss, config errors, metrics
 * truncation, checkpoint rotation and SVG output; --backend and --mode of
 * forward, generate, eval and rl through the quads program. */
#define _GNU_SOURCE
#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include "tests/suites.h"
#include "orchestrator/ckpt.h"
#include "orchestrator/grpo.h"
#include "orchestrator/metrics.h"
#include "orchestrator/rl.h"
#include "orchestrator/rl_config.h"
#include "orchestrator/svg.h"
#include "quant/fileio.h"
#include "quant/splitmix64.h"

/* ---- helpers */

#define ck_assert_near(a, b, tol) ck_assert_msg(fabs((double)(a) - (double)(b)) <= (tol), \
    "%s = %.10g, expected %.10g (tol %g)", #a, (double)(a), (double)(b), (double)(tol))

static char tmpdir[64];

static void tmp_setup(void) { qd_test_mkdtemp(tmpdir, sizeof tmpdir, "orch"); }

static void tmp_teardown(void) { qd_test_rm_tree(tmpdir); }

static const char *tmp_path(const char *name) { return qd_test_join(tmpdir, name); }

static int count_substr(const char *s, const char *sub)
{
    int n = 0;
    for (const char *p = s; (p = strstr(p, sub)); p += strlen(sub))
        n++;
    return n;
}

static uint64_t rng_state;
static double rng_uniform(void) { return qd_splitmix64_unit(&rng_state); }

static qd_grpo_params dapo_params(void)
{
    qd_grpo_params p = {.clip_low = 0.2, .clip_high = 0.28, .agg = QD_AGG_TOKEN_MEAN, .kl_coef = 0,
                        .kl_type = QD_KL_K3, .tis = QD_TIS_NONE, .tis_cap = 2.0, .norm = 0};
    return p;
}

/* ---- advantages */

START_TEST(test_advantages_grpo)
{
    /* Group 0: r = 1 0 0 1, mean 0.5, deviations +-0.5, sum of squares 1,
     *   unbiased var 1/3, std 0.5773502692 -> A = +-0.5/0.5773502692 = +-0.8660254038.
     *   (The population std sqrt(1/4) = 0.5 would give +-1: this tells them apart.)
     * Group 1: r = 3 1 0 0, mean 1, deviations 2 0 -1 -1, sum of squares 6,
     *   var 6/3 = 2, std 1.414213562 -> A = 1.414213562 0 -0.7071067812 -0.7071067812.
     * Group 2: all equal -> deviations 0 -> A = 0 (0 / (0 + eps)). */
    const float r[12] = {1, 0, 0, 1, 3, 1, 0, 0, 1, 1, 1, 1};
    float a[12];
    ck_assert_int_eq(qd_grpo_advantages(a, r, 3, 4, QD_ADV_GRPO, 0.0), QD_OK);
    const double want[8] = {0.8660254038, -0.8660254038, -0.8660254038, 0.8660254038,
                            1.414213562, 0, -0.7071067812, -0.7071067812};
    for (int i = 0; i < 8; i++)
        ck_assert_near(a[i], want[i], 1e-6);
    ck_assert_int_eq(qd_grpo_advantages(a, r, 3, 4, QD_ADV_GRPO, 1e-6), QD_OK);
    for (int i = 8; i < 12; i++)
        ck_assert_float_eq(a[i], 0.0f);
    /* eps enters the denominator: 0.5 / (0.5773502692 + 0.1) = 0.7381941. */
    ck_assert_int_eq(qd_grpo_advantages(a, r, 1, 4, QD_ADV_GRPO, 0.1), QD_OK);
    ck_assert_near(a[0], 0.5 / (0.5773502692 + 0.1), 1e-6);
    /* Dr.GRPO: r - mean only: 0.5 -0.5 -0.5 0.5 | 2 0 -1 -1. */
    ck_assert_int_eq(qd_grpo_advantages(a, r, 2, 4, QD_ADV_DR_GRPO, 1e-6), QD_OK);
    const double dr[8] = {0.5, -0.5, -0.5, 0.5, 2, 0, -1, -1};
    for (int i = 0; i < 8; i++)
        ck_assert_near(a[i], dr[i], 1e-7);
}
END_TEST

START_TEST(test_advantages_errors)
{
    float r[4] = {1, NAN, 0, 0}, a[4];
    ck_assert_int_eq(qd_grpo_advantages(a, r, 1, 4, QD_ADV_GRPO, 1e-6), QD_ERR_NONFINITE);
    ck_assert_ptr_nonnull(strstr(qd_last_error(), "reward[1]"));
    ck_assert_int_eq(qd_grpo_advantages(a, r, 4, 1, QD_ADV_GRPO, 1e-6), QD_ERR_ARG);
}
END_TEST

/* ---- the clipped loss */

START_TEST(test_ppo_clip_hand)
{
    /* Five one-token sequences, clip [0.8, 1.28], token_mean over 5 tokens:
     *  A= 1, r=1.5: -A r = -1.5, -A clip = -1.28 -> max -1.28 (clipped high), grad 0
     *  A= 1, r=0.5: -0.5 vs -0.8 -> -0.5 (unclipped), grad -A r = -0.5
     *  A=-1, r=0.5:  0.5 vs  0.8 ->  0.8 (clipped low), grad 0
     *  A=-1, r=1.5:  1.5 vs  1.28 -> 1.5 (unclipped), grad -A r = 1.5
     *  A= 2, r=1.1: -2.2 vs -2.2 -> -2.2 (inside), grad -2.2
     * loss = (-1.28 - 0.5 + 0.8 + 1.5 - 2.2) / 5 = -1.68 / 5 = -0.336
     * coef = grad / 5 = 0 -0.1 0 0.3 -0.44; clip fraction 2/5 (1 low, 1 high). */
    const float ratio[5] = {1.5f, 0.5f, 0.5f, 1.5f, 1.1f};
    float logp[5], old[5] = {-1, -2, -0.5f, -3, -1.25f}, coef[5];
    for (int i = 0; i < 5; i++)
        logp[i] = old[i] + logf(ratio[i]);
    const float adv[5] = {1, 1, -1, -1, 2};
    const uint8_t mask[5] = {1, 1, 1, 1, 1};
    qd_grpo_batch b = {.B = 5, .T = 1, .logp = logp, .logp_old = old, .adv = adv, .mask = mask};
    qd_grpo_params p = dapo_params();
    qd_grpo_stats st;
    ck_assert_int_eq(qd_grpo_loss(coef, &st, &b, &p), QD_OK);
    ck_assert_near(st.loss, -0.336, 1e-6);
    ck_assert_near(st.pg_loss, -0.336, 1e-6);
    const double want[5] = {0, -0.1, 0, 0.3, -0.44};
    for (int i = 0; i < 5; i++)
        ck_assert_near(coef[i], want[i], 1e-6);
    ck_assert_near(st.clip_frac, 0.4, 1e-12);
    ck_assert_near(st.clip_frac_low, 0.2, 1e-12);
    ck_assert_near(st.clip_frac_high, 0.2, 1e-12);
    ck_assert_near(st.ratio_max, 1.5, 1e-6);
    ck_assert_near(st.ratio_mean, (1.5 + 0.5 + 0.5 + 1.5 + 1.1) / 5, 1e-6);
    ck_assert_int_eq(st.tokens, 5);
}
END_TEST

START_TEST(test_clip_higher_asymmetry)
{
    /* r = 1.25 with A = 1: inside the upper bound 1.28 (DAPO) -> gradient -1.25,
     * but beyond 1.2 with a symmetric 0.2 -> clipped, gradient 0.
     * r = 0.75 with A = -1: below 0.8 in both -> clipped, gradient 0. */
    float old[2] = {-1, -1}, logp[2] = {-1 + logf(1.25f), -1 + logf(0.75f)}, coef[2];
    const float adv[2] = {1, -1};
    const uint8_t mask[2] = {1, 1};
    qd_grpo_batch b = {.B = 2, .T = 1, .logp = logp, .logp_old = old, .adv = adv, .mask = mask};
    qd_grpo_params p = dapo_params();
    qd_grpo_stats st;
    ck_assert_int_eq(qd_grpo_loss(coef, &st, &b, &p), QD_OK);
    ck_assert_near(coef[0], -1.25 / 2, 1e-6);
    ck_assert_float_eq(coef[1], 0.0f);
    ck_assert_near(st.clip_frac_high, 0.0, 0);
    ck_assert_near(st.clip_frac_low, 0.5, 0);
    p.clip_high = 0.2;
    ck_assert_int_eq(qd_grpo_loss(coef, &st, &b, &p), QD_OK);
    ck_assert_float_eq(coef[0], 0.0f);
    ck_assert_near(st.clip_frac_high, 0.5, 0);
    /* loss: symmetric (-1.2 + 0.8)/2 = -0.2; DAPO (-1.25 + 0.8)/2 = -0.225 */
    ck_assert_near(st.loss, -0.2, 1e-6);
}
END_TEST

START_TEST(test_loss_aggregation)
{
    /* seq 0: 3 tokens, A = 1; seq 1: 1 token (2 padding), A = -2; r = 1, so the
     * token loss is -A: -1 -1 -1 | 2.
     * token_mean:          (-3 + 2) / 4 = -0.25;   coef -1/4 | 2/4
     * seq_mean_token_sum:  (-3 + 2) / 2 = -0.5;    coef -1/2 | 2/2
     * seq_mean_token_mean: (-1 + 2) / 2 =  0.5;    coef -1/6 | 2/2 */
    float logp[6] = {-1, -2, -3, -1, 0, 0}, coef[6];
    const float adv[2] = {1, -2};
    const uint8_t mask[6] = {1, 1, 1, 1, 0, 0};
    qd_grpo_batch b = {.B = 2, .T = 3, .logp = logp, .logp_old = logp, .adv = adv, .mask = mask};
    qd_grpo_params p = dapo_params();
    qd_grpo_stats st;
    const struct { qd_loss_agg agg; double loss, c0, c1; } cases[] = {
        {QD_AGG_TOKEN_MEAN, -0.25, -0.25, 0.5},
        {QD_AGG_SEQ_MEAN_TOKEN_SUM, -0.5, -0.5, 1.0},
        {QD_AGG_SEQ_MEAN_TOKEN_MEAN, 0.5, -1.0 / 6, 1.0},
    };
    for (int c = 0; c < 3; c++) {
        p.agg = cases[c].agg;
        ck_assert_int_eq(qd_grpo_loss(coef, &st, &b, &p), QD_OK);
        ck_assert_near(st.loss, cases[c].loss, 1e-7);
        for (int t = 0; t < 3; t++)
            ck_assert_near(coef[t], cases[c].c0, 1e-7);
        ck_assert_near(coef[3], cases[c].c1, 1e-7);
        ck_assert_float_eq(coef[4], 0.0f);
        ck_assert_float_eq(coef[5], 0.0f);
    }
    /* A micro-batch of a step of 8 tokens: token_mean divides by 8, not 4. */
    p.agg = QD_AGG_TOKEN_MEAN;
    p.norm = 8;
    ck_assert_int_eq(qd_grpo_loss(coef, &st, &b, &p), QD_OK);
    ck_assert_near(st.loss, -1.0 / 8, 1e-7);
    ck_assert_near(coef[3], 2.0 / 8, 1e-7);
}
END_TEST

/* A batch whose log-probs are multiples of 2^-12 (so logp +- 2^-10 is exact in
 * float) and whose ratios stay away from the clip edges (no kink within the
 * finite-difference step). */
static void random_batch(float *logp, float *old, float *roll, float *ref, float *adv, uint8_t *mask, int B, int T)
{
    rng_state = 42;
    for (int s = 0; s < B; s++) {
        adv[s] = (float)(4 * rng_uniform() - 2);
        for (int t = 0; t < T; t++) {
            int i = s * T + t;
            mask[i] = t < T - s % 3;
            old[i] = (float)(-floor(rng_uniform() * 4 * 4096) / 4096);
            roll[i] = (float)(old[i] - floor((rng_uniform() - 0.5) * 2 * 4096) / 4096);
            ref[i] = (float)(old[i] - floor((rng_uniform() - 0.5) * 4096) / 4096);
            double lr;
            do {
                lr = floor((rng_uniform() - 0.5) * 0.8 * 4096) / 4096;
            } while (fabs(lr - log(0.8)) < 0.01 || fabs(lr - log(1.28)) < 0.01);
            logp[i] = (float)(old[i] + lr);
        }
    }
}

START_TEST(test_grad_finite_difference)
{
    enum { B = 6, T = 5 };
    float logp[B * T], old[B * T], roll[B * T], ref[B * T], adv[B], coef[B * T];
    uint8_t mask[B * T];
    random_batch(logp, old, roll, ref, adv, mask, B, T);
    qd_grpo_batch b = {B, T, logp, old, roll, ref, adv, mask};
    const double h = 1.0 / 1024;
    int clipped = 0, capped = 0;
    for (int agg = 0; agg < 3; agg++)
        for (int kl = 0; kl < 3; kl++)
            for (int tis = 0; tis < 3; tis++) {
                qd_grpo_params p = dapo_params();
                p.agg = (qd_loss_agg)agg, p.kl_type = (qd_kl_type)kl, p.tis = (qd_tis_kind)tis;
                p.kl_coef = 0.3, p.tis_cap = 1.5;
                qd_grpo_stats st, sp, sm;
                ck_assert_int_eq(qd_grpo_loss(coef, &st, &b, &p), QD_OK);
                clipped += st.clip_frac > 0;
                capped += st.tis_clipped_frac > 0;
                for (int i = 0; i < B * T; i++) {
                    if (!mask[i])
                        continue;
                    float keep = logp[i];
                    logp[i] = (float)(keep + h);
                    ck_assert_int_eq(qd_grpo_loss(NULL, &sp, &b, &p), QD_OK);
                    logp[i] = (float)(keep - h);
                    ck_assert_int_eq(qd_grpo_loss(NULL, &sm, &b, &p), QD_OK);
                    logp[i] = keep;
                    double fd = (sp.loss - sm.loss) / (2 * h);
                    ck_assert_msg(fabs(fd - coef[i]) <= 1e-5 + 1e-5 * fabs(fd),
                                  "agg %d kl %d tis %d token %d: coef %.9g, finite difference %.9g", agg, kl, tis,
                                  i, coef[i], fd);
                }
            }
    /* The batch exercises the clip and the cap (or the test would prove less). */
    ck_assert_int_gt(clipped, 0);
    ck_assert_int_gt(capped, 0);
}
END_TEST

START_TEST(test_tis_and_masked)
{
    /* r = 1 (logp = logp_old), A = 1: pg = -1 per token. Token 0 has
     * logp_old - logp_rollout = log 3 -> rho = 3 > C = 2; token 1 has rho = 0.5.
     * tis:    w = min(rho, 2) = 2, 0.5 -> loss (-2 - 0.5)/2 = -1.25, coef -1, -0.25
     * masked: w = 0 (dropped), 0.5   -> loss (0 - 0.5)/2 = -0.25, coef 0, -0.25 */
    float old[2] = {-1, -2}, roll[2] = {-1 - logf(3), -2 - logf(0.5f)}, coef[2];
    const float adv[1] = {1};
    const uint8_t mask[2] = {1, 1};
    qd_grpo_batch b = {.B = 1, .T = 2, .logp = old, .logp_old = old, .logp_rollout = roll, .adv = adv, .mask = mask};
    qd_grpo_params p = dapo_params();
    qd_grpo_stats st;
    p.tis = QD_TIS_TRUNC;
    ck_assert_int_eq(qd_grpo_loss(coef, &st, &b, &p), QD_OK);
    ck_assert_near(st.loss, -1.25, 1e-6);
    ck_assert_near(coef[0], -1.0, 1e-6);
    ck_assert_near(coef[1], -0.25, 1e-6);
    ck_assert_near(st.tis_mean, 1.25, 1e-6);
    ck_assert_near(st.tis_clipped_frac, 0.5, 0);
    p.tis = QD_TIS_MASKED;
    ck_assert_int_eq(qd_grpo_loss(coef, &st, &b, &p), QD_OK);
    ck_assert_near(st.loss, -0.25, 1e-6);
    ck_assert_float_eq(coef[0], 0.0f);
    ck_assert_near(coef[1], -0.25, 1e-6);
    ck_assert_near(st.tis_mean, 0.25, 1e-6);
    /* Without TIS the rollout log-probs are not read: loss (-1 - 1)/2 = -1. */
    p.tis = QD_TIS_NONE;
    b.logp_rollout = NULL;
    ck_assert_int_eq(qd_grpo_loss(coef, &st, &b, &p), QD_OK);
    ck_assert_near(st.loss, -1.0, 1e-7);
    p.tis = QD_TIS_TRUNC;
    ck_assert_int_eq(qd_grpo_loss(coef, &st, &b, &p), QD_ERR_ARG);
}
END_TEST

START_TEST(test_kl_estimators)
{
    double g;
    /* k3 with d = logp - ref = -log 2: exp(log 2) - log 2 - 1 = 2 - 0.6931471806 - 1
     * = 0.3068528194; derivative 1 - exp(-d) = 1 - 2 = -1. */
    ck_assert_near(qd_grpo_kl(QD_KL_K3, -log(2.0), &g), 0.3068528194, 1e-10);
    ck_assert_near(g, -1.0, 1e-12);
    /* d = 1: exp(-1) + 1 - 1 = 0.3678794412; derivative 1 - 0.3678794412 = 0.6321205588. */
    ck_assert_near(qd_grpo_kl(QD_KL_K3, 1.0, &g), 0.3678794412, 1e-10);
    ck_assert_near(g, 0.6321205588, 1e-10);
    ck_assert_near(qd_grpo_kl(QD_KL_K3, 0.0, &g), 0.0, 0);
    ck_assert_near(g, 0.0, 0);
    /* k1 = d (derivative 1), k2 = d^2/2 (derivative d) at d = 0.5: 0.5 and 0.125. */
    ck_assert_near(qd_grpo_kl(QD_KL_K1, 0.5, &g), 0.5, 0);
    ck_assert_near(g, 1.0, 0);
    ck_assert_near(qd_grpo_kl(QD_KL_K2, 0.5, &g), 0.125, 0);
    ck_assert_near(g, 0.5, 0);
    /* In the loss with A = 0 only the KL term is left: tokens with d = -log 2 and 1,
     * token_mean: kl = (0.3068528194 + 0.3678794412)/2 = 0.3373661303,
     * loss = 0.1 * kl = 0.03373661303; coef = 0.1 * (-1, 0.6321205588) / 2. */
    float logp[2] = {-1, -1}, ref[2] = {-1 + logf(2), -2}, coef[2];
    const float adv[1] = {0};
    const uint8_t mask[2] = {1, 1};
    qd_grpo_batch b = {.B = 1, .T = 2, .logp = logp, .logp_old = logp, .logp_ref = ref, .adv = adv, .mask = mask};
    qd_grpo_params p = dapo_params();
    p.kl_coef = 0.1;
    qd_grpo_stats st;
    ck_assert_int_eq(qd_grpo_loss(coef, &st, &b, &p), QD_OK);
    ck_assert_near(st.kl, 0.3373661303, 1e-7);
    ck_assert_near(st.loss, 0.03373661303, 1e-8);
    ck_assert_near(coef[0], -0.05, 1e-7);
    ck_assert_near(coef[1], 0.03160602794, 1e-7);
}
END_TEST

START_TEST(test_loss_nonfinite)
{
    float logp[2] = {-1, NAN}, old[2] = {-1, -1}, coef[2];
    const float adv[1] = {1};
    uint8_t mask[2] = {1, 1};
    qd_grpo_batch b = {.B = 1, .T = 2, .logp = logp, .logp_old = old, .adv = adv, .mask = mask};
    qd_grpo_params p = dapo_params();
    qd_grpo_stats st;
    ck_assert_int_eq(qd_grpo_loss(coef, &st, &b, &p), QD_ERR_NONFINITE);
    ck_assert_ptr_nonnull(strstr(qd_last_error(), "logp[0, 1]"));
    mask[1] = 0; /* padding is never read */
    ck_assert_int_eq(qd_grpo_loss(coef, &st, &b, &p), QD_OK);
    logp[1] = 800; /* exp(801) overflows double */
    mask[1] = 1;
    ck_assert_int_eq(qd_grpo_loss(coef, &st, &b, &p), QD_ERR_NONFINITE);
    ck_assert_ptr_nonnull(strstr(qd_last_error(), "overflows"));
}
END_TEST

/* ---- sampling-side helpers and gap metrics */

START_TEST(test_dynamic_sampling)
{
    const float score[12] = {1, 1, 1, 0, 0, 0, 1, 0, 1, 0, 0, 1};
    uint8_t keep[4];
    ck_assert_int_eq(qd_grpo_filter_groups(keep, score, 4, 3), 2);
    ck_assert_int_eq(keep[0], 0); /* all right */
    ck_assert_int_eq(keep[1], 0); /* all wrong */
    ck_assert_int_eq(keep[2], 1);
    ck_assert_int_eq(keep[3], 1);
}
END_TEST

START_TEST(test_overlong_penalty)
{
    /* max 20, buffer 4: free up to 16, then (16 - len)/4: 17 -> -0.25, 18 -> -0.5;
     * -1 at 20 and beyond. */
    ck_assert_near(qd_grpo_overlong_penalty(16, 20, 4, 1.0), 0.0, 0);
    ck_assert_near(qd_grpo_overlong_penalty(17, 20, 4, 1.0), -0.25, 1e-15);
    ck_assert_near(qd_grpo_overlong_penalty(18, 20, 4, 2.0), -1.0, 1e-15);
    ck_assert_near(qd_grpo_overlong_penalty(20, 20, 4, 1.0), -1.0, 0);
    ck_assert_near(qd_grpo_overlong_penalty(25, 20, 4, 1.0), -1.0, 0);
    ck_assert_near(qd_grpo_overlong_penalty(25, 20, 0, 1.0), 0.0, 0);
}
END_TEST

START_TEST(test_gap_metrics)
{
    /* p_trainer = .1 .2 .3 .4, p_rollout = .2 .1 .4 .3 (a 5th token is padding with NaN).
     * Pearson: centred x = -.15 -.05 .05 .15, y = -.05 -.15 .15 .05;
     *   sum xy = .0075 * 4 = .03, sum x^2 = sum y^2 = .05 -> r = .03/.05 = 0.6.
     * |log pt - log pr| = log 2, log 2, log 4/3, log 4/3:
     *   mean (log 2 + log 4/3)/2 = 0.4904146, max log 2 = 0.6931472.
     * k3 with r = pt/pr = .5 2 .75 4/3: sum(r - 1 - log r) = sum(r) - 4 - log(prod r)
     *   = 4.583333 - 4 - log 1 -> mean 0.1458333. */
    const float pt[5] = {0.1f, 0.2f, 0.3f, 0.4f, 0}, pr[5] = {0.2f, 0.1f, 0.4f, 0.3f, 0};
    float lt[5], lr[5], ent[5] = {1, 2, 3, 6, NAN};
    for (int i = 0; i < 4; i++)
        lt[i] = logf(pt[i]), lr[i] = logf(pr[i]);
    lt[4] = lr[4] = NAN;
    const uint8_t mask[5] = {1, 1, 1, 1, 0};
    qd_gap_stats g;
    ck_assert_int_eq(qd_grpo_gap(&g, lt, lr, ent, mask, 1, 5), QD_OK);
    ck_assert_int_eq(g.tokens, 4);
    ck_assert_near(g.pearson, 0.6, 1e-6);
    ck_assert_near(g.mean_abs, (log(2.0) + log(4.0 / 3)) / 2, 1e-6);
    ck_assert_near(g.max_abs, log(2.0), 1e-6);
    ck_assert_near(g.k3_kl, (0.5 + 2 + 0.75 + 4.0 / 3 - 4) / 4, 1e-6);
    ck_assert_near(g.entropy, 3.0, 1e-12);
    /* Identical log-probs: zero gap, correlation 1; no entropy given -> NaN. */
    ck_assert_int_eq(qd_grpo_gap(&g, lt, lt, NULL, mask, 2, 2), QD_OK);
    ck_assert_near(g.mean_abs, 0, 0);
    ck_assert_near(g.k3_kl, 0, 0);
    ck_assert_near(g.pearson, 1.0, 1e-12);
    ck_assert(isnan(g.entropy));
    /* A NaN at a response token is an error naming it. */
    lr[2] = NAN;
    ck_assert_int_eq(qd_grpo_gap(&g, lt, lr, NULL, mask, 1, 5), QD_ERR_NONFINITE);
    ck_assert_ptr_nonnull(strstr(qd_last_error(), "logp_rollout[0, 2]"));
}
END_TEST

/* Reads n numbers of the array member key of doc into out (float). */
static void fixture_floats(float *out, const json_t *doc, const char *key, size_t n)
{
    const json_t *a = json_object_get(doc, key);
    ck_assert_msg(json_is_array(a) && json_array_size(a) == n, "fixture: %s", key);
    for (size_t i = 0; i < n; i++)
        out[i] = (float)json_number_value(json_array_get(a, i));
}

START_TEST(test_numpy_reference)
{
    /* tests/fixtures/grpo_ref.json from tests/ref/grpo_ref.py: numpy's unbiased
     * std, verl-style vectorized losses, gradients by central differences in
     * float64, np.corrcoef. */
    json_error_t err;
    json_t *doc = json_load_file(qd_test_path("tests/fixtures/grpo_ref.json"), 0, &err);
    ck_assert_msg(doc != NULL, "grpo_ref.json: %s", err.text);
    enum { B = 8, G = 4, T = 6, N = B * T };
    ck_assert_int_eq(json_integer_value(json_object_get(doc, "B")), B);
    ck_assert_int_eq(json_integer_value(json_object_get(doc, "T")), T);
    float reward[B], adv_ref[B], adv[B], logp[N], old[N], roll[N], ref[N], maskf[N], coef[N], want[N];
    uint8_t mask[N];
    fixture_floats(reward, doc, "reward", B);
    fixture_floats(adv_ref, doc, "adv", B);
    fixture_floats(logp, doc, "logp", N);
    fixture_floats(old, doc, "logp_old", N);
    fixture_floats(roll, doc, "logp_rollout", N);
    fixture_floats(ref, doc, "logp_ref", N);
    fixture_floats(maskf, doc, "mask", N);
    for (int i = 0; i < N; i++)
        mask[i] = maskf[i] != 0;
    ck_assert_int_eq(qd_grpo_advantages(adv, reward, B / G, G, QD_ADV_GRPO, 1e-6), QD_OK);
    for (int i = 0; i < B; i++)
        ck_assert_near(adv[i], adv_ref[i], 1e-6);
    qd_grpo_batch b = {B, T, logp, old, roll, ref, adv_ref, mask};
    const json_t *cases = json_object_get(doc, "cases"), *c;
    size_t k;
    ck_assert_int_eq(json_array_size(cases), 18);
    json_array_foreach(cases, k, c) {
        qd_grpo_params p = dapo_params();
        p.tis_cap = 1.5;
        p.agg = (qd_loss_agg)qd_grpo_loss_agg_parse(json_string_value(json_object_get(c, "agg")));
        p.tis = (qd_tis_kind)qd_grpo_tis_parse(json_string_value(json_object_get(c, "tis")));
        p.kl_coef = json_number_value(json_object_get(c, "kl_coef"));
        qd_grpo_stats st;
        ck_assert_int_eq(qd_grpo_loss(coef, &st, &b, &p), QD_OK);
        ck_assert_near(st.loss, json_number_value(json_object_get(c, "loss")), 1e-9);
        if (k == 0)
            ck_assert_near(st.clip_frac, json_number_value(json_object_get(doc, "clip_frac")), 1e-12);
        fixture_floats(want, c, "coef", N);
        for (int i = 0; i < N; i++)
            ck_assert_msg(fabs(coef[i] - want[i]) <= 1e-6, "case %zu token %d: coef %.9g, numpy %.9g", k, i,
                          coef[i], want[i]);
    }
    qd_gap_stats g;
    const json_t *gap = json_object_get(doc, "gap");
    ck_assert_int_eq(qd_grpo_gap(&g, logp, roll, NULL, mask, B, T), QD_OK);
    ck_assert_near(g.mean_abs, json_number_value(json_object_get(gap, "mean_abs")), 1e-12);
    ck_assert_near(g.max_abs, json_number_value(json_object_get(gap, "max_abs")), 1e-12);
    ck_assert_near(g.k3_kl, json_number_value(json_object_get(gap, "k3_kl")), 1e-12);
    ck_assert_near(g.pearson, json_number_value(json_object_get(gap, "pearson")), 1e-12);
    json_decref(doc);
}
END_TEST

START_TEST(test_lr_schedule)
{
    /* peak 1e-3, warmup 4, 14 steps, min ratio 0.1. Warmup: s = 0 -> 1/4 peak,
     * s = 3 -> peak. After it p = (s - 4)/10: s = 6 -> p = 0.2:
     *   linear 1 - 0.9 * 0.2 = 0.82; cosine 0.1 + 0.9 * (1 + cos(0.2 pi))/2
     *   = 0.1 + 0.45 * 1.809016994 = 0.9140576475; s = 14 -> p = 1: 0.1 for both. */
    ck_assert_near(qd_grpo_lr(QD_LR_COSINE, 1e-3, 0.1, 4, 14, 0), 2.5e-4, 1e-15);
    ck_assert_near(qd_grpo_lr(QD_LR_COSINE, 1e-3, 0.1, 4, 14, 3), 1e-3, 1e-15);
    ck_assert_near(qd_grpo_lr(QD_LR_COSINE, 1e-3, 0.1, 4, 14, 4), 1e-3, 1e-15);
    ck_assert_near(qd_grpo_lr(QD_LR_COSINE, 1e-3, 0.1, 4, 14, 6), 0.9140576475e-3, 1e-12);
    ck_assert_near(qd_grpo_lr(QD_LR_LINEAR, 1e-3, 0.1, 4, 14, 6), 0.82e-3, 1e-15);
    ck_assert_near(qd_grpo_lr(QD_LR_COSINE, 1e-3, 0.1, 4, 14, 14), 1e-4, 1e-15);
    ck_assert_near(qd_grpo_lr(QD_LR_LINEAR, 1e-3, 0.1, 4, 14, 20), 1e-4, 1e-15);
    ck_assert_near(qd_grpo_lr(QD_LR_CONSTANT, 1e-3, 0.1, 0, 14, 9), 1e-3, 0);
    ck_assert_int_eq(qd_grpo_lr_schedule_parse("cosine"), QD_LR_COSINE);
    ck_assert_int_eq(qd_grpo_lr_schedule_parse("exp"), -1);
}
END_TEST

/* ---- config */

START_TEST(test_config_defaults)
{
    qd_config *cfg = qd_config_new(); /* NULL if any default failed its own checks */
    ck_assert_ptr_nonnull(cfg);
    ck_assert_double_eq(qd_config_knobs(cfg)->algo.clip_low, 0.2);
    ck_assert_double_eq(qd_config_knobs(cfg)->algo.clip_high, 0.28);
    ck_assert_str_eq(qd_config_knobs(cfg)->algo.loss_agg, "token_mean");
    ck_assert_str_eq(qd_config_knobs(cfg)->algo.kl_type, "k3");
    ck_assert_str_eq(qd_config_knobs(cfg)->rollout.recipe, "quads");
    ck_assert_int_eq(qd_config_knobs(cfg)->rollout.group_size, 8);
    ck_assert(!qd_config_knobs(cfg)->algo.dynamic_sampling);
    ck_assert_int_eq(qd_config_validate(cfg), QD_OK);
    qd_grpo_params p;
    qd_grpo_params_from_config(&p, cfg);
    ck_assert_int_eq(p.agg, QD_AGG_TOKEN_MEAN);
    ck_assert_int_eq(p.kl_type, QD_KL_K3);
    ck_assert_int_eq(p.tis, QD_TIS_NONE);
    /* The schema as JSON lists every knob with its default and type. */
    size_t n;
    qd_config_schema(&n);
    json_t *schema = qd_config_schema_json();
    ck_assert_int_eq(json_object_size(schema), n);
    json_t *ch = json_object_get(schema, "algo.clip_high");
    ck_assert_str_eq(json_string_value(json_object_get(ch, "type")), "float");
    ck_assert_double_eq(json_real_value(json_object_get(ch, "default")), 0.28);
    ck_assert(json_is_false(json_object_get(ch, "max_exclusive")));
    ck_assert(json_is_true(json_object_get(json_object_get(schema, "trainer.beta1"), "max_exclusive")));
    json_decref(schema);
    qd_config_free(cfg);
}
END_TEST

START_TEST(test_config_enums_match_grpo)
{
    /* Every choice the config admits has its grpo enum (params_from_config relies on it). */
    const struct { const char *key; int (*parse)(const char *); } maps[] = {
        {"algo.advantage", qd_grpo_adv_kind_parse}, {"algo.loss_agg", qd_grpo_loss_agg_parse},
        {"algo.kl_type", qd_grpo_kl_type_parse}, {"algo.tis", qd_grpo_tis_parse},
        {"trainer.lr_schedule", qd_grpo_lr_schedule_parse},
    };
    size_t n;
    const qd_cfg_knob *k = qd_config_schema(&n);
    for (size_t m = 0; m < sizeof maps / sizeof maps[0]; m++) {
        size_t i = 0;
        while (i < n && strcmp(k[i].key, maps[m].key) != 0)
            i++;
        ck_assert_int_lt(i, n);
        char choices[256];
        snprintf(choices, sizeof choices, "%s", k[i].choices);
        int count = 0;
        for (char *save, *c = strtok_r(choices, "|", &save); c; c = strtok_r(NULL, "|", &save), count++)
            ck_assert_msg(maps[m].parse(c) == count, "%s: %s", maps[m].key, c);
        ck_assert_int_ge(count, 2);
    }
}
END_TEST

START_TEST(test_config_file)
{
    qd_config *cfg = qd_config_new();
    qd_test_write_file(tmp_path("c.json"), "{\"trainer\": {\"lr\": 3e-6, \"warmup_steps\": 5},\n"
                                   " \"algo.loss_agg\": \"seq_mean_token_mean\",\n"
                                   " \"algo\": {\"dynamic_sampling\": true, \"clip_high\": 1},\n"
                                   " \"run\": {\"name\": \"x\"}}");
    ck_assert_int_eq(qd_config_load_file(cfg, tmp_path("c.json")), QD_OK);
    ck_assert_double_eq(qd_config_knobs(cfg)->trainer.lr, 3e-6);
    ck_assert_int_eq(qd_config_knobs(cfg)->trainer.warmup_steps, 5);
    ck_assert_str_eq(qd_config_knobs(cfg)->algo.loss_agg, "seq_mean_token_mean");
    ck_assert(qd_config_knobs(cfg)->algo.dynamic_sampling);
    ck_assert_double_eq(qd_config_knobs(cfg)->algo.clip_high, 1.0); /* an integer is a fine float */
    ck_assert_str_eq(qd_config_knobs(cfg)->run.name, "x");
    ck_assert_double_eq(qd_config_knobs(cfg)->algo.clip_low, 0.2); /* untouched default */
    qd_config_free(cfg);
}
END_TEST

/* Loading text must fail with status want and a message holding every needle. */
static void expect_file_error(const char *text, qd_status want, const char *n1, const char *n2)
{
    qd_config *cfg = qd_config_new();
    const char *path = tmp_path("bad.json");
    qd_test_write_file(path, text);
    ck_assert_int_eq(qd_config_load_file(cfg, path), want);
    const char *msg = qd_last_error();
    ck_assert_msg(strncmp(msg, path, strlen(path)) == 0, "message does not start with the file: %s", msg);
    ck_assert_msg(strstr(msg, n1) != NULL, "'%s' not in: %s", n1, msg);
    ck_assert_msg(!n2 || strstr(msg, n2) != NULL, "'%s' not in: %s", n2, msg);
    qd_config_free(cfg);
}

START_TEST(test_config_file_errors)
{
    expect_file_error("{\"trainer\": {\"lrr\": 1e-6}}", QD_ERR_ARG, "trainer.lrr: unknown key",
                      "did you mean trainer.lr?");
    expect_file_error("{\"nosuch\": {\"x\": 1}}", QD_ERR_ARG, "nosuch: unknown key", NULL);
    expect_file_error("{\"rollout\": {\"group_size\": \"eight\"}}", QD_ERR_ARG,
                      "rollout.group_size: expected an integer, got a string", NULL);
    expect_file_error("{\"rollout\": {\"group_size\": 8.5}}", QD_ERR_ARG, "rollout.group_size",
                      "got a real number");
    expect_file_error("{\"algo\": {\"dynamic_sampling\": 1}}", QD_ERR_ARG, "algo.dynamic_sampling",
                      "expected a boolean");
    expect_file_error("{\"algo\": {\"loss_agg\": \"mean\"}}", QD_ERR_ARG, "algo.loss_agg: 'mean' is not one of",
                      "token_mean|");
    expect_file_error("{\"algo\": {\"clip_low\": 1.5}}", QD_ERR_ARG, "algo.clip_low: 1.5 is out of range [0, 1]",
                      NULL);
    expect_file_error("{\"trainer\": 3}", QD_ERR_ARG, "trainer: expected an object", NULL);
    expect_file_error("{\"run\": {\"steps\": 3,}}", QD_ERR_FORMAT, ":1:", "malformed JSON");
    expect_file_error("[1, 2]", QD_ERR_FORMAT, "expected a JSON object", NULL);
    expect_file_error("{\"run\": {\"steps\": 3, \"steps\": 4}}", QD_ERR_FORMAT, "malformed JSON", NULL);
    expect_file_error("{\"run\": {\"name\": \"../escaped\"}}", QD_ERR_ARG, "run.name: '../escaped' is not a plain name",
                      NULL);
}
END_TEST

/* `quads rl --config FIFO` is refused at once; open(2) used to block forever. */
START_TEST(test_config_file_fifo)
{
    qd_config *cfg = qd_config_new();
    const char *path = tmp_path("fifo.json");
    ck_assert_int_eq(mkfifo(path, 0600), 0);
    ck_assert_int_eq(qd_config_load_file(cfg, path), QD_ERR_IO);
    ck_assert_msg(strstr(qd_last_error(), path) && strstr(qd_last_error(), "not a regular file"), "%s",
                  qd_last_error());
    unlink(path);
    qd_config_free(cfg);
}
END_TEST

START_TEST(test_config_overrides)
{
    qd_config *cfg = qd_config_new();
    ck_assert_int_eq(qd_config_set(cfg, "trainer.lr=1e-6"), QD_OK);
    ck_assert_double_eq(qd_config_knobs(cfg)->trainer.lr, 1e-6);
    ck_assert_int_eq(qd_config_set(cfg, "rollout.group_size=16"), QD_OK);
    ck_assert_int_eq(qd_config_knobs(cfg)->rollout.group_size, 16);
    ck_assert_int_eq(qd_config_set(cfg, "algo.dynamic_sampling=true"), QD_OK);
    ck_assert(qd_config_knobs(cfg)->algo.dynamic_sampling);
    ck_assert_int_eq(qd_config_set(cfg, "model.path=a=b c"), QD_OK); /* only the first '=' splits */
    ck_assert_str_eq(qd_config_knobs(cfg)->model.path, "a=b c");
    ck_assert_int_eq(qd_config_set(cfg, "algo.tis=masked"), QD_OK);
    ck_assert_str_eq(qd_config_knobs(cfg)->algo.tis, "masked");
    const struct { const char *set, *msg; } bad[] = {
        {"trainer.lr=abc", "--set: trainer.lr: expected a number, got 'abc'"},
        {"trainer.lr=", "--set: trainer.lr: expected a number, got ''"},
        {"trainer.lr=nan", "--set: trainer.lr: expected a finite number"},
        {"trainer.lr=-1", "--set: trainer.lr: -1 is out of range [0, 1]"},
        {"rollout.top_p=0", "--set: rollout.top_p: 0 is out of range (0, 1]"},
        {"rollout.group_size=1.5", "--set: rollout.group_size: expected an integer, got '1.5'"},
        {"rollout.group_size=1", "--set: rollout.group_size: 1 is out of range [2, 4096]"},
        {"algo.dynamic_sampling=yes", "--set: algo.dynamic_sampling: expected true or false, got 'yes'"},
        {"rollout.recipe=nvfp5", "--set: rollout.recipe: 'nvfp5' is not one of bf16|fp8|"},
        {"foo.bar=1", "--set: foo.bar: unknown key"},
        {"trainer.lr", "--set: 'trainer.lr': expected KEY=VALUE"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        ck_assert_int_eq(qd_config_set(cfg, bad[i].set), QD_ERR_ARG);
        ck_assert_msg(strncmp(qd_last_error(), bad[i].msg, strlen(bad[i].msg)) == 0, "%s: got '%s'", bad[i].set,
                      qd_last_error());
    }
    /* Failed overrides left the values alone. */
    ck_assert_double_eq(qd_config_knobs(cfg)->trainer.lr, 1e-6);
    ck_assert_int_eq(qd_config_knobs(cfg)->rollout.group_size, 16);
    qd_config_free(cfg);
}
END_TEST

/* run.name becomes a path component (runs/NAME): a name with a separator,
 * "." or ".." would put the run elsewhere (issue 14). */
START_TEST(test_config_run_name)
{
    qd_config *cfg = qd_config_new();
    static const char *const bad[] = {"..", ".", "../escaped", "/tmp/x", "a/b", "a b", "x\n", "~"};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        ck_assert_int_eq(qd_config_set_str(cfg, "run.name", bad[i], "--set"), QD_ERR_ARG);
        ck_assert_msg(strstr(qd_last_error(), "--set: run.name: '") == qd_last_error(), "%s", qd_last_error());
        ck_assert_ptr_nonnull(strstr(qd_last_error(), "is not a plain name"));
    }
    ck_assert_str_eq(qd_config_knobs(cfg)->run.name, "quads"); /* refused values left it alone */
    ck_assert_int_eq(qd_config_set(cfg, "run.name=run-1_b.2"), QD_OK);
    char dir[64];
    ck_assert_int_eq(qd_rl_run_dir(cfg, dir, sizeof dir), QD_OK);
    ck_assert_str_eq(dir, "runs/run-1_b.2");
    ck_assert_int_eq(qd_config_set(cfg, "run.name="), QD_OK); /* empty: a timestamp */
    ck_assert_int_eq(qd_config_set(cfg, "run.dir=../elsewhere/x"), QD_OK); /* run.dir is a path */
    qd_config_free(cfg);
}
END_TEST

/* Knob values that made step 1 NaN (AdamW's bias correction 1 - beta^t = 0,
 * an eps that rounds to 0 in float, a group std of 0 with adv_eps 0) are
 * refused where they are set, naming the key (issue 14). */
START_TEST(test_config_nan_knobs)
{
    qd_config *cfg = qd_config_new();
    const struct { const char *set, *msg; } bad[] = {
        {"trainer.beta1=1", "--set: trainer.beta1: 1 is out of range [0, 1)"},
        {"trainer.beta2=1", "--set: trainer.beta2: 1 is out of range [0, 1)"},
        {"trainer.eps=1e-300", "--set: trainer.eps: 1e-300 is out of range [1.0000000000000001e-30, 1]"},
        {"trainer.eps=0", "--set: trainer.eps: 0 is out of range"},
        {"algo.adv_eps=0", "--set: algo.adv_eps: 0 is out of range (0, 1]"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        ck_assert_int_eq(qd_config_set(cfg, bad[i].set), QD_ERR_ARG);
        ck_assert_msg(strncmp(qd_last_error(), bad[i].msg, strlen(bad[i].msg)) == 0, "%s: got '%s'", bad[i].set,
                      qd_last_error());
    }
    ck_assert_int_eq(qd_config_set(cfg, "trainer.beta2=0.99999"), QD_OK);
    ck_assert_int_eq(qd_config_set(cfg, "trainer.eps=1e-30"), QD_OK);
    ck_assert_int_eq(qd_config_set(cfg, "algo.adv_eps=1e-300"), QD_OK); /* double arithmetic: fine */
    ck_assert_int_eq(qd_config_validate(cfg), QD_OK);
    qd_config_free(cfg);
}
END_TEST

/* Knob products that overflowed the loop's int arithmetic (a step's tokens,
 * data positions, optimizer steps) fail validation naming the keys. */
START_TEST(test_config_overflow)
{
    const struct { const char *set, *msg; } bad[] = {
        {"rollout.prompts_per_step=1000000000", "config: rollout.prompts_per_step 1000000000 x rollout.group_size 8"},
        {"rollout.max_tokens=1000000000", "(data.max_prompt_tokens 128 + rollout.max_tokens 1000000000)"},
        {"trainer.micro_batch=100000000", "config: trainer.micro_batch 100000000 x (data.max_prompt_tokens"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        qd_config *cfg = qd_config_new();
        ck_assert_int_eq(qd_config_set(cfg, bad[i].set), QD_OK);
        ck_assert_int_eq(qd_config_validate(cfg), QD_ERR_ARG);
        ck_assert_msg(strstr(qd_last_error(), bad[i].msg) != NULL, "%s: got '%s'", bad[i].set, qd_last_error());
        qd_config_free(cfg);
    }
    qd_config *cfg = qd_config_new();
    ck_assert_int_eq(qd_config_set(cfg, "run.steps=1000000000"), QD_OK);
    ck_assert_int_eq(qd_config_set(cfg, "rollout.prompts_per_step=100000"), QD_OK);
    ck_assert_int_eq(qd_config_set(cfg, "rollout.group_size=2"), QD_OK); /* 4e14 data positions */
    ck_assert_int_eq(qd_config_validate(cfg), QD_ERR_ARG);
    ck_assert_ptr_nonnull(strstr(qd_last_error(), "config: run.steps 1000000000 x rollout.prompts_per_step 100000 x "
                                                  "algo.max_gen_batches 4 = 4e+14 prompts, more than 2^48"));
    ck_assert_int_eq(qd_config_set(cfg, "run.steps=600000000"), QD_OK);
    ck_assert_int_eq(qd_config_set(cfg, "algo.max_gen_batches=1"), QD_OK);
    ck_assert_int_eq(qd_config_set(cfg, "rollout.prompts_per_step=2"), QD_OK);
    ck_assert_int_eq(qd_config_set(cfg, "trainer.mini_batches=2"), QD_OK); /* 1.2e9 optimizer steps */
    ck_assert_int_eq(qd_config_validate(cfg), QD_ERR_ARG);
    ck_assert_ptr_nonnull(strstr(qd_last_error(), "config: run.steps 600000000 x trainer.mini_batches 2"));
    ck_assert_int_eq(qd_config_set(cfg, "trainer.mini_batches=1"), QD_OK);
    ck_assert_int_eq(qd_config_validate(cfg), QD_OK);
    qd_config_free(cfg);
    /* a missing file is missing, not malformed */
    cfg = qd_config_new();
    ck_assert_int_eq(qd_config_load_file(cfg, "/nonexistent/config.json"), QD_ERR_IO);
    ck_assert_str_eq(qd_last_error(), "/nonexistent/config.json: cannot open: No such file or directory");
    qd_config_free(cfg);
}
END_TEST

START_TEST(test_config_validate)
{
    qd_config *cfg = qd_config_new();
    ck_assert_int_eq(qd_config_set(cfg, "rollout.max_tokens=64"), QD_OK);
    ck_assert_int_eq(qd_config_set(cfg, "algo.overlong_buffer_len=64"), QD_OK); /* = max_tokens 64 */
    ck_assert_int_eq(qd_config_validate(cfg), QD_ERR_ARG);
    ck_assert_ptr_nonnull(strstr(qd_last_error(), "algo.overlong_buffer_len"));
    ck_assert_int_eq(qd_config_set(cfg, "algo.overlong_buffer_len=16"), QD_OK);
    ck_assert_int_eq(qd_config_set(cfg, "trainer.mini_batches=3"), QD_OK); /* 8 prompts */
    ck_assert_int_eq(qd_config_validate(cfg), QD_ERR_ARG);
    ck_assert_ptr_nonnull(strstr(qd_last_error(), "trainer.mini_batches"));
    ck_assert_int_eq(qd_config_set(cfg, "trainer.mini_batches=4"), QD_OK);
    ck_assert_int_eq(qd_config_validate(cfg), QD_OK);
    qd_config_free(cfg);
}
END_TEST

START_TEST(test_config_save_and_summary)
{
    qd_config *cfg = qd_config_new(), *back = qd_config_new();
    ck_assert_int_eq(qd_config_set(cfg, "trainer.lr=3.3e-7"), QD_OK);
    ck_assert_int_eq(qd_config_set(cfg, "rollout.prompts_per_step=4"), QD_OK);
    ck_assert_int_eq(qd_config_set(cfg, "rollout.max_tokens=64"), QD_OK);
    ck_assert_int_eq(qd_config_set(cfg, "data.task=say \"hi\"\\n"), QD_OK); /* escaped on the way out */
    ck_assert_int_eq(qd_config_save(cfg, tmp_path("config.json")), QD_OK);
    ck_assert_int_eq(qd_test_dir_entries(tmpdir), 1); /* no temp file left */
    const char *text = qd_test_read_file(tmp_path("config.json"));
    ck_assert_int_eq(text[strlen(text) - 1], '\n');
    ck_assert_ptr_nonnull(strstr(text, "\"trainer\": {"));
    /* Shortest round-trip reals: 3.3e-07, not 3.2999999999999999e-07. */
    ck_assert_ptr_nonnull(strstr(text, "    \"lr\": 3.3e-07,\n"));
    ck_assert_ptr_nonnull(strstr(text, "    \"clip_low\": 0.2,\n"));
    ck_assert_ptr_nonnull(strstr(text, "    \"temperature\": 1.0,\n"));
    ck_assert_ptr_nonnull(strstr(text, "    \"name\": \"quads\",\n"));
    ck_assert_int_eq(qd_config_load_file(back, tmp_path("config.json")), QD_OK);
    json_t *a = qd_config_to_json(cfg), *b = qd_config_to_json(back);
    ck_assert(json_equal(a, b));
    ck_assert_double_eq(qd_config_knobs(back)->trainer.lr, 3.3e-7); /* bit-exact round trip */
    json_decref(a);
    json_decref(b);
    /* 4 prompts x 8 = 32 samples; 32 x 64 = 2048 response tokens; 32 x (128 + 64)
     * = 6144 with prompts; ceil(32 / 8) = 4 micro-batches. */
    qd_config_batch bt;
    qd_config_derive(cfg, &bt);
    ck_assert_int_eq(bt.samples, 32);
    ck_assert_int_eq(bt.max_response_tokens, 2048);
    ck_assert_int_eq(bt.max_tokens, 6144);
    ck_assert_int_eq(bt.micro_batches, 4);
    char sum[1024];
    qd_config_summary(cfg, sum, sizeof sum);
    ck_assert_ptr_nonnull(strstr(sum, "4 prompts x 8 = 32 samples, <= 2048 response tokens (<= 6144 with prompts)"));
    ck_assert_ptr_nonnull(strstr(sum, "clip [0.8, 1.28]"));
    qd_config_free(cfg);
    qd_config_free(back);
}
END_TEST

/* ---- checkpoints (the atomic writes themselves are tested in test_quant.c) */

START_TEST(test_ckpt_rotate)
{
    char path[512];
    int64_t latest;
    ck_assert_int_eq(qd_ckpt_latest(tmpdir, &latest), QD_OK);
    ck_assert_int_eq(latest, -1);
    for (int s = 10; s <= 50; s += 10) {
        ck_assert_int_eq(qd_ckpt_path(path, sizeof path, tmpdir, s), QD_OK);
        ck_assert_int_eq(qd_mkdirs(path), QD_OK);
        strcat(path, "/weights.bin");
        ck_assert_int_eq(qd_atomic_write(path, "w", 1), QD_OK);
    }
    ck_assert_str_eq(strrchr(path, '/') - 13, "step_00000050/weights.bin");
    ck_assert_int_eq(qd_mkdirs(tmp_path("step_00000060.tmp")), QD_OK); /* a half-written one */
    qd_test_write_file(tmp_path("metrics.jsonl"), "");
    int removed;
    ck_assert_int_eq(qd_ckpt_rotate(tmpdir, 2, &removed), QD_OK);
    ck_assert_int_eq(removed, 3);
    ck_assert_int_eq(access(tmp_path("step_00000030"), F_OK), -1);
    ck_assert_int_eq(access(tmp_path("step_00000040/weights.bin"), F_OK), 0);
    ck_assert_int_eq(access(tmp_path("step_00000050"), F_OK), 0);
    ck_assert_int_eq(qd_test_dir_entries(tmpdir), 4); /* 40, 50, the .tmp, metrics.jsonl */
    ck_assert_int_eq(qd_ckpt_latest(tmpdir, &latest), QD_OK);
    ck_assert_int_eq(latest, 50);
    ck_assert_int_eq(qd_ckpt_rotate(tmpdir, 0, NULL), QD_ERR_ARG);
    ck_assert_int_eq(qd_ckpt_path(path, sizeof path, tmpdir, -1), QD_ERR_ARG);
}
END_TEST

/* ---- metrics */

static void append_steps(const char *path, int from, int to)
{
    qd_metrics *m;
    ck_assert_int_eq(qd_metrics_open(&m, path), QD_OK);
    for (int s = from; s <= to; s++) {
        json_t *o = json_pack("{s:i, s:f, s:{s:f}}", "step", s, "reward", 0.1 * s, "gap", "mean_abs", 0.01 * s);
        qd_metrics_set(o, "pass@1", s == 2 ? NAN : 0.5);
        ck_assert_int_eq(qd_metrics_append(m, o), QD_OK);
        json_decref(o);
    }
    json_t *nostep = json_pack("{s:f}", "reward", 1.0);
    ck_assert_int_eq(qd_metrics_append(m, nostep), QD_ERR_ARG);
    json_decref(nostep);
    qd_metrics_close(m);
}

START_TEST(test_metrics_series)
{
    const char *p = tmp_path("metrics.jsonl");
    append_steps(p, 1, 5);
    double *x, *y;
    int64_t n;
    ck_assert_int_eq(qd_metrics_read_series(p, "reward", &x, &y, &n), QD_OK);
    ck_assert_int_eq(n, 5);
    ck_assert_double_eq(x[4], 5);
    ck_assert_near(y[4], 0.5, 1e-12);
    free(x), free(y);
    ck_assert_int_eq(qd_metrics_read_series(p, "gap.mean_abs", &x, &y, &n), QD_OK);
    ck_assert_int_eq(n, 5);
    ck_assert_near(y[2], 0.03, 1e-12);
    free(x), free(y);
    /* NaN was written as null and is skipped: steps 1 3 4 5. */
    ck_assert_ptr_nonnull(strstr(qd_test_read_file(p), "\"pass@1\":null"));
    ck_assert_int_eq(qd_metrics_read_series(p, "pass@1", &x, &y, &n), QD_OK);
    ck_assert_int_eq(n, 4);
    ck_assert_double_eq(x[1], 3);
    free(x), free(y);
}
END_TEST

START_TEST(test_metrics_truncate)
{
    char p[256];
    snprintf(p, sizeof p, "%s", tmp_path("metrics.jsonl"));
    append_steps(p, 1, 5);
    FILE *f = fopen(p, "a");
    fputs("{\"step\": 6, \"rew", f); /* a line torn by a crash */
    fclose(f);
    ck_assert_int_eq(qd_metrics_truncate(p, 3), QD_OK);
    ck_assert_int_eq(qd_test_dir_entries(tmpdir), 1);
    double *x, *y;
    int64_t n;
    ck_assert_int_eq(qd_metrics_read_series(p, "reward", &x, &y, &n), QD_OK);
    ck_assert_int_eq(n, 3);
    ck_assert_double_eq(x[2], 3);
    free(x), free(y);
    /* The resumed run appends steps 4..5 again: one line per step, in order. */
    append_steps(p, 4, 5);
    ck_assert_int_eq(qd_metrics_read_series(p, "reward", &x, &y, &n), QD_OK);
    ck_assert_int_eq(n, 5);
    for (int i = 0; i < 5; i++)
        ck_assert_double_eq(x[i], i + 1);
    free(x), free(y);
    ck_assert_int_eq(qd_metrics_truncate(p, 0), QD_OK);
    ck_assert_str_eq(qd_test_read_file(p), "");
    ck_assert_int_eq(qd_metrics_truncate(tmp_path("missing.jsonl"), 3), QD_OK);
    /* A malformed line in the middle is an error naming the line; the file stays. */
    qd_test_write_file(p, "{\"step\": 1}\nnot json\n{\"step\": 2}\n");
    ck_assert_int_eq(qd_metrics_truncate(p, 1), QD_ERR_FORMAT);
    ck_assert_msg(strstr(qd_last_error(), "metrics.jsonl:2:") != NULL, "%s", qd_last_error());
    ck_assert_str_eq(qd_test_read_file(p), "{\"step\": 1}\nnot json\n{\"step\": 2}\n");
    qd_test_write_file(p, "{\"step\": 1}\n{\"step\": \"2\"}\n");
    ck_assert_int_eq(qd_metrics_truncate(p, 1), QD_ERR_FORMAT);
    ck_assert_ptr_nonnull(strstr(qd_last_error(), "metrics.jsonl:2: field \"step\""));
}
END_TEST

START_TEST(test_progress_line)
{
    /* 10 steps in 20 s -> 2 s a step; 40 steps left -> 80 s = 0:01:20. */
    qd_progress p = {.step = 10, .steps = 50, .steps_done = 10, .elapsed_s = 20, .reward = 0.4125,
                     .gap = 0.00312, .tokens_per_s = 1234.4};
    char line[256];
    qd_progress_format(line, sizeof line, &p);
    ck_assert_str_eq(line, "step 10/50  reward 0.412  gap 0.0031  1234 tok/s  ETA 0:01:20");
    char *buf;
    size_t len;
    FILE *f = open_memstream(&buf, &len);
    qd_progress_write(f, false, &p);
    fclose(f);
    ck_assert_str_eq(buf, "step 10/50  reward 0.412  gap 0.0031  1234 tok/s  ETA 0:01:20\n");
    free(buf);
    f = open_memstream(&buf, &len);
    qd_progress_write(f, true, &p);
    p.step = 50;
    qd_progress_write(f, true, &p);
    fclose(f);
    ck_assert_int_eq(buf[0], '\r');
    ck_assert_int_eq(count_substr(buf, "\033[K"), 2);
    ck_assert_int_eq(count_substr(buf, "\n"), 1); /* only after the last step */
    free(buf);
    /* a phase: the step in progress, the phase and the time it took last time,
     * on a terminal only */
    p.step = 10;
    qd_progress_phase(&p, QD_PHASE_TRAIN, 100.0);
    qd_progress_format(line, sizeof line, &p);
    ck_assert_str_eq(line, "step 11/50 train ETA ?  reward 0.412  gap 0.0031  1234 tok/s  ETA 0:01:20");
    qd_progress_phase(&p, QD_PHASE_SYNC, 103.4);
    qd_progress_phase(&p, QD_PHASE_NONE, 104.0);
    qd_progress_phase(&p, QD_PHASE_TRAIN, 110.0);
    qd_progress_format(line, sizeof line, &p);
    ck_assert_str_eq(line, "step 11/50 train ETA 0:00:03  reward 0.412  gap 0.0031  1234 tok/s  ETA 0:01:20");
    f = open_memstream(&buf, &len);
    qd_progress_write(f, false, &p);
    fclose(f);
    ck_assert_str_eq(buf, ""); /* logs get no phase lines */
    free(buf);
    f = open_memstream(&buf, &len);
    qd_progress_write(f, true, &p);
    fclose(f);
    ck_assert_ptr_nonnull(strstr(buf, "\rstep 11/50 train ETA 0:00:03"));
    ck_assert_int_eq(count_substr(buf, "\n"), 0);
    free(buf);
    ck_assert(p.phase_s[QD_PHASE_SYNC] > 0.59 && p.phase_s[QD_PHASE_SYNC] < 0.61);
}
END_TEST

/* ---- SVG */

/* A small well-formedness check: every <name ...> is closed by </name> in
 * order or self-closed, the prolog is <?...?>, attribute values are quoted. */
static int svg_well_formed(const char *s)
{
    const char *stack[64];
    size_t lens[64];
    int depth = 0, roots = 0;
    for (const char *p = strchr(s, '<'); p; p = strchr(p, '<')) {
        const char *end = strchr(p, '>');
        if (!end)
            return 0;
        if (p[1] == '?') {
            p = end;
            continue;
        }
        int closing = p[1] == '/';
        const char *name = p + 1 + closing;
        size_t n = strcspn(name, " />");
        if (closing && (depth == 0 || lens[depth - 1] != n || strncmp(stack[depth - 1], name, n) != 0))
            return 0;
        if (closing)
            depth--;
        else if (end[-1] != '/') {
            if (depth == 64)
                return 0;
            roots += depth == 0;
            stack[depth] = name, lens[depth++] = n;
        }
        int quotes = 0;
        for (const char *q = p; q < end; q++)
            quotes += *q == '"';
        if (quotes % 2)
            return 0;
        p = end;
    }
    return depth == 0 && roots == 1;
}

START_TEST(test_svg_plot)
{
    const double x[5] = {0, 10, 20, 30, 40}, y1[5] = {0.1, 0.2, NAN, 0.4, 0.5}, y2[5] = {0.3, 0.3, 0.2, 0.1, 0};
    const qd_svg_series s[2] = {{.name = "quads <rac & aqat>", .x = x, .y = y1, .n = 5},
                                {.name = "bf16", .x = x, .y = y2, .n = 5}};
    qd_svg_plot plot = {"reward", "step", "mean reward", 0, 0};
    char *svg;
    ck_assert_int_eq(qd_svg_render(&svg, &plot, s, 2), QD_OK);
    ck_assert(svg_well_formed(svg));
    ck_assert_int_eq(strncmp(svg, "<?xml", 5), 0);
    ck_assert_ptr_nonnull(strstr(svg, "<svg xmlns=\"http://www.w3.org/2000/svg\""));
    ck_assert_int_eq(count_substr(svg, "<polyline"), 3); /* series 1 breaks at its NaN */
    ck_assert_ptr_nonnull(strstr(svg, ">quads &lt;rac &amp; aqat&gt;</text>"));
    ck_assert_ptr_nonnull(strstr(svg, ">bf16</text>"));
    ck_assert_ptr_nonnull(strstr(svg, ">mean reward</text>"));
    ck_assert_ptr_nonnull(strstr(svg, ">40</text>")); /* an x tick */
    ck_assert_ptr_nonnull(strstr(svg, ">0.5</text>")); /* a y tick */
    ck_assert_ptr_null(strstr(svg, "nan"));
    ck_assert_ptr_null(strstr(svg, "inf"));
    ck_assert(!svg_well_formed("<svg><g></svg></g>"));
    free(svg);
    const double bad[2] = {NAN, NAN};
    const qd_svg_series none = {.name = "x", .x = x, .y = bad, .n = 2};
    ck_assert_int_eq(qd_svg_render(&svg, &plot, &none, 1), QD_ERR_ARG);
    ck_assert_ptr_null(svg);
}
END_TEST

/* A band (the spread over seeds): one polygon per stretch of finite lo and
 * hi, along hi and back along lo, drawn before the lines; it widens the y
 * axis to hold it. */
START_TEST(test_svg_band)
{
    const double x[4] = {0, 1, 2, 3}, y[4] = {1, 1, 1, 1}, lo[4] = {0, 0, NAN, 0}, hi[4] = {2, 2, 2, 2};
    const qd_svg_series s = {.name = "quads (3 seeds)", .x = x, .y = y, .n = 4, .lo = lo, .hi = hi};
    qd_svg_plot plot = {"pass", "step", "pass@1", 640, 400};
    char *svg;
    ck_assert_int_eq(qd_svg_render(&svg, &plot, &s, 1), QD_OK);
    ck_assert(svg_well_formed(svg));
    ck_assert_int_eq(count_substr(svg, "<polygon class=\"band\""), 2);
    /* x 0..3 over pixels 64..490, y 0..2 over 352..32: the first stretch is steps 0 and 1 */
    ck_assert_msg(strstr(svg, "points=\"64.00,32.00 206.00,32.00 206.00,352.00 64.00,352.00\""), "%s", svg);
    ck_assert_msg(strstr(svg, "points=\"490.00,32.00 490.00,352.00\""), "%s", svg);
    ck_assert(strstr(svg, "<polygon") < strstr(svg, "<polyline"));
    ck_assert_ptr_nonnull(strstr(svg, ">2</text>")); /* the y axis reaches hi */
    free(svg);
}
END_TEST

START_TEST(test_svg_ticks)
{
    double first, step;
    /* [0, 1] in at most 6 ticks: raw step 0.2 -> 0.2, ticks 0 .. 1 (6). */
    ck_assert_int_eq(qd_svg_ticks(0, 1, 6, &first, &step), 6);
    ck_assert_near(step, 0.2, 1e-12);
    ck_assert_near(first, 0, 0);
    /* [0, 47] in at most 8: raw 6.7 -> 1, 2, 5 give 48, 25, 11 ticks; 10 gives 0..50 (6). */
    ck_assert_int_eq(qd_svg_ticks(0, 47, 8, &first, &step), 6);
    ck_assert_near(step, 10, 0);
    /* [-0.013, 0.021] in at most 6: raw 0.0068 -> 0.01, from -0.02 to 0.03 (6). */
    ck_assert_int_eq(qd_svg_ticks(-0.013, 0.021, 6, &first, &step), 6);
    ck_assert_near(step, 0.01, 1e-15);
    ck_assert_near(first, -0.02, 1e-15);
}
END_TEST

START_TEST(test_svg_from_metrics)
{
    char p[256];
    snprintf(p, sizeof p, "%s", tmp_path("metrics.jsonl"));
    append_steps(p, 1, 5);
    double *x, *y;
    int64_t n;
    ck_assert_int_eq(qd_metrics_read_series(p, "reward", &x, &y, &n), QD_OK);
    qd_svg_series s = {.name = "run", .x = x, .y = y, .n = n};
    qd_svg_plot plot = {"reward", "step", "reward", 800, 300};
    ck_assert_int_eq(qd_svg_write(tmp_path("reward.svg"), &plot, &s, 1), QD_OK);
    const char *svg = qd_test_read_file(tmp_path("reward.svg"));
    ck_assert(svg_well_formed(svg));
    ck_assert_ptr_nonnull(strstr(svg, "width=\"800\" height=\"300\""));
    ck_assert_int_eq(qd_test_dir_entries(tmpdir), 2);
    free(x), free(y);
    ck_assert_int_eq(qd_metrics_read_series(tmp_path("none.jsonl"), "reward", &x, &y, &n), QD_ERR_IO);
    /* Two runs in one plot: a legend entry and a line each (pass@1 has a null at step 2). */
    char other[256];
    snprintf(other, sizeof other, "%s", tmp_path("b.jsonl"));
    append_steps(other, 1, 3);
    const char *const files[2] = {p, other}, *const names[2] = {"run a", "run b"};
    plot.title = "pass@1";
    ck_assert_int_eq(qd_svg_write_metric(tmp_path("pass.svg"), &plot, "pass@1", files, names, 2), QD_OK);
    svg = qd_test_read_file(tmp_path("pass.svg"));
    ck_assert(svg_well_formed(svg));
    ck_assert_ptr_nonnull(strstr(svg, ">run a</text>"));
    ck_assert_ptr_nonnull(strstr(svg, ">run b</text>"));
    ck_assert_int_eq(count_substr(svg, "<polyline"), 2);
    snprintf(other, sizeof other, "%s", tmp_path("none.jsonl"));
    ck_assert_int_eq(qd_svg_write_metric(tmp_path("x.svg"), &plot, "pass@1", files, names, 2), QD_ERR_IO);
    ck_assert_ptr_nonnull(strstr(qd_last_error(), "none.jsonl"));
}
END_TEST

/* ---- --backend and --mode through the quads program ---------------------- */

/* quads ARGS (printf-style) with stdout and stderr into out; the exit status. */
static int quads(char *out, size_t n, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static int quads(char *out, size_t n, const char *fmt, ...)
{
    char args[3072];
    va_list ap;
    va_start(ap, fmt);
    int w = vsnprintf(args, sizeof args, fmt, ap);
    va_end(ap);
    ck_assert_msg(w >= 0 && (size_t)w < sizeof args, "arguments too long");
    return qd_test_run_quads(args, out, n);
}

/* The bytes of path (malloc'd), *n their count. */
static char *slurp(const char *path, size_t *n)
{
    FILE *f = fopen(path, "rb");
    ck_assert_msg(f != NULL, "%s: cannot open", path);
    ck_assert_int_eq(fseek(f, 0, SEEK_END), 0);
    long len = ftell(f);
    ck_assert_int_ge(len, 0);
    rewind(f);
    char *buf = malloc((size_t)len + 1);
    ck_assert_int_eq(fread(buf, 1, (size_t)len, f), (size_t)len);
    fclose(f);
    *n = (size_t)len;
    return buf;
}

static int same_bytes(const char *a, const char *b)
{
    size_t na, nb;
    char *x = slurp(a, &na), *y = slurp(b, &nb);
    int same = na == nb && memcmp(x, y, na) == 0;
    free(x), free(y);
    return same;
}

/* The commands that take --backend and --mode, each with its other options
 * set so that only those two can be wrong. */
static void command_lines(char lines[4][1024])
{
    const char *m = qd_test_path("models/tiny");
    snprintf(lines[0], 1024, "forward --model '%s' --ids 1,2,3", m);
    snprintf(lines[1], 1024, "generate --model '%s' --prompt 'Q: 1+2\nA: ' --max-tokens 2", m);
    snprintf(lines[2], 1024, "eval --model '%s' --benchmark arith1 --limit 1 --max-tokens 2 --out '%s'", m,
             tmp_path("eval"));
    snprintf(lines[3], 1024, "rl --set model.path='%s' --set run.dir='%s'", m, tmp_path("run"));
}

/* Bad values are refused before any work, the message naming the option and
 * the valid values (exit 2, the usage errors' status); so is fast mode on the
 * CPU backend; --help lists both options. */
START_TEST(test_cli_backend_mode_refused)
{
    char lines[4][1024], out[1 << 14];
    command_lines(lines);
    for (int i = 0; i < 4; i++) {
        const char *l = lines[i];
        int rl = i == 3;
        ck_assert_int_eq(quads(out, sizeof out, "%s --backend tpu", l), 2);
        ck_assert_msg(strstr(out, "--backend: ") && strstr(out, "'tpu'") &&
                          strstr(out, rl ? "auto|cpu|cuda" : "(auto, cpu, cuda)"), "%s: %s", l, out);
        ck_assert_int_eq(quads(out, sizeof out, "%s --mode quick", l), 2);
        ck_assert_msg(strstr(out, "--mode: ") && strstr(out, "'quick'") &&
                          strstr(out, rl ? "exact|fast" : "(exact, fast)"), "%s: %s", l, out);
        ck_assert_int_eq(quads(out, sizeof out, "%s --mode fast --backend cpu", l), 2);
        ck_assert_msg(strstr(out, rl ? "rollout.mode: fast needs rollout.backend cuda or auto" : "--mode fast: ") &&
                          strstr(out, "exact mode only"), "%s: %s", l, out);
        /* --help: the command's first word, then --help */
        char word[16];
        snprintf(word, sizeof word, "%.*s", (int)strcspn(l, " "), l);
        ck_assert_int_eq(quads(out, sizeof out, "%s --help", word), 0);
        ck_assert_msg(strstr(out, "--backend B") && strstr(out, "--mode M"), "%s --help: %s", word, out);
    }
    /* the config keys themselves, and nothing written */
    ck_assert_int_eq(quads(out, sizeof out, "%s --set rollout.mode=fast --backend cpu", lines[3]), 2);
    ck_assert_ptr_nonnull(strstr(out, "quads rl: config: rollout.mode: fast needs rollout.backend cuda or auto"));
    ck_assert_int_eq(quads(out, sizeof out, "%s --set rollout.backend=cpu --mode fast", lines[3]), 2);
    ck_assert_ptr_nonnull(strstr(out, "rollout.mode: fast needs"));
    ck_assert_int_eq(quads(out, sizeof out, "%s --set rollout.mode=fastest", lines[3]), 2);
    ck_assert_ptr_nonnull(strstr(out, "--set: rollout.mode: 'fastest' is not one of exact|fast"));
    ck_assert_int_eq(qd_test_dir_entries(tmpdir), 0);
    qd_config *c = qd_config_new();
    ck_assert_int_eq(qd_config_validate(c), QD_OK);
    ck_assert_int_eq(qd_config_set(c, "rollout.mode=fast"), QD_OK);
    ck_assert_int_eq(qd_config_validate(c), QD_OK); /* auto may pick CUDA */
    ck_assert_int_eq(qd_config_set(c, "rollout.backend=cpu"), QD_OK);
    ck_assert_int_eq(qd_config_validate(c), QD_ERR_ARG);
    qd_config_free(c);
}
END_TEST

/* forward on models/tiny: --backend cpu --mode exact prints the same bytes
 * and dumps the same logits as no option (auto is the CPU here; where it is
 * CUDA, exact mode gives the CPU's bits too, NUMERICS.md). */
START_TEST(test_cli_cpu_exact_is_default)
{
    char out[1 << 14], out2[1 << 14], a[256], b[256];
    const char *m = qd_test_path("models/tiny"), *ids = "3,17,60,1,44,44,9,0,63,271";
    snprintf(a, sizeof a, "%s", tmp_path("a.bin"));
    snprintf(b, sizeof b, "%s", tmp_path("b.bin"));
    for (int p = 0; p < 2; p++) {
        const char *prec = p ? "nvfp4" : "fp32";
        ck_assert_int_eq(quads(out, sizeof out, "forward --model '%s' --ids %s --precision %s --threads 2 "
                               "--dump-logits '%s'", m, ids, prec, a), 0);
        ck_assert_int_eq(quads(out2, sizeof out2, "forward --model '%s' --ids %s --precision %s --threads 2 "
                               "--backend cpu --mode exact --dump-logits '%s'", m, ids, prec, b), 0);
        ck_assert_ptr_nonnull(strstr(out, "\"logprobs\": [-"));
        ck_assert_str_eq(out, out2);
        ck_assert(same_bytes(a, b));
        size_t n;
        free(slurp(a, &n));
        ck_assert_uint_eq(n, 10 * 272 * sizeof(float)); /* [T, V] float32 */
    }
}
END_TEST

/* Metrics of the run in dir without the timings, as compact JSON text (malloc'd). */
static char *metrics_text(const char *dir)
{
    char p[512];
    snprintf(p, sizeof p, "%s/metrics.jsonl", dir);
    json_t *a = qd_test_load_jsonl(p);
    ck_assert_ptr_nonnull(a);
    size_t i;
    json_t *o;
    json_array_foreach(a, i, o) json_object_del(o, "time");
    char *t = json_dumps(a, JSON_COMPACT | JSON_REAL_PRECISION(17));
    json_decref(a);
    return t;
}

/* --backend cuda: without a CUDA device (or built without CUDA) every command
 * exits 1 with the backend's reason, which names CUDA, and writes nothing;
 * with one, forward and generate in exact mode print the CPU's bytes, rl
 * writes the CPU's metrics, and fast mode prints finite log-probs. --mode
 * fast reaches the backend: without CUDA, auto is the CPU, which refuses it. */
START_TEST(test_cli_cuda_clean)
{
    char lines[4][1024], out[1 << 15], cpu[1 << 15];
    command_lines(lines);
    const char *small = "--set run.steps=1 --set eval.every=1 --set eval.limit=2 --set rollout.group_size=2 "
                        "--set rollout.prompts_per_step=1 --set rollout.max_tokens=2 --set trainer.micro_batch=2 "
                        "--set run.threads=1 --quiet";
    strcat(lines[1], " --json --threads 1");
    strcat(lines[3], " ");
    strcat(lines[3], small);
    int have_cuda = 0;
    for (int i = 0; i < 4; i++) {
        int rc = quads(out, sizeof out, "%s --backend cuda", lines[i]);
        have_cuda |= i == 0 && rc == 0;
        if (rc != 0) {
            ck_assert_msg(rc == 1 && strcasestr(out, "cuda"), "%s --backend cuda: exit %d: %s", lines[i], rc, out);
            ck_assert_int_eq(qd_test_dir_entries(tmpdir), 0);
            continue;
        }
        if (i == 2)
            continue; /* eval: its report holds timings; forward and generate check the numbers */
        if (i == 3) {
            char *gpu = metrics_text(tmp_path("run"));
            qd_test_rm_tree(tmp_path("run"));
            ck_assert_int_eq(quads(cpu, sizeof cpu, "%s --backend cpu", lines[i]), 0);
            char *ref = metrics_text(tmp_path("run"));
            ck_assert_str_eq(gpu, ref);
            free(gpu), free(ref);
            continue;
        }
        ck_assert_int_eq(quads(cpu, sizeof cpu, "%s --backend cpu", lines[i]), 0);
        ck_assert_str_eq(out, cpu);
    }
    int rc = quads(out, sizeof out, "%s --backend cuda --mode fast", lines[0]);
    if (rc != 0)
        ck_assert_msg(rc == 1 && strcasestr(out, "cuda"), "forward --mode fast: exit %d: %s", rc, out);
    else {
        json_t *j = json_loads(out, 0, NULL), *lp = json_object_get(j, "logprobs");
        ck_assert_int_eq(json_array_size(lp), 2);
        for (size_t t = 0; t < 2; t++)
            ck_assert(json_is_real(json_array_get(lp, t)) && json_real_value(json_array_get(lp, t)) < 0);
        json_decref(j);
    }
    qd_test_rm_tree(tmp_path("run"));
    for (int i = 0; i < 4; i++) {
        rc = quads(out, sizeof out, "%s --mode fast", lines[i]);
        if (!have_cuda)
            ck_assert_msg(rc == 1 && strstr(out, "cpu backend: mode 'fast'"), "%s --mode fast: exit %d: %s",
                          lines[i], rc, out);
        else if (rc != 0)
            ck_assert_msg(rc == 1 && strcasestr(out, "cuda"), "%s --mode fast: exit %d: %s", lines[i], rc, out);
    }
}
END_TEST

Suite *suite_orchestrator(void)
{
    Suite *s = suite_create("orchestrator");
    TCase *math = tcase_create("grpo");
    tcase_add_test(math, test_advantages_grpo);
    tcase_add_test(math, test_advantages_errors);
    tcase_add_test(math, test_ppo_clip_hand);
    tcase_add_test(math, test_clip_higher_asymmetry);
    tcase_add_test(math, test_loss_aggregation);
    tcase_add_test(math, test_grad_finite_difference);
    tcase_add_test(math, test_tis_and_masked);
    tcase_add_test(math, test_kl_estimators);
    tcase_add_test(math, test_loss_nonfinite);
    tcase_add_test(math, test_dynamic_sampling);
    tcase_add_test(math, test_overlong_penalty);
    tcase_add_test(math, test_gap_metrics);
    tcase_add_test(math, test_numpy_reference);
    tcase_add_test(math, test_lr_schedule);
    suite_add_tcase(s, math);
    TCase *files = tcase_create("files");
    tcase_add_checked_fixture(files, tmp_setup, tmp_teardown);
    tcase_add_test(files, test_config_defaults);
    tcase_add_test(files, test_config_enums_match_grpo);
    tcase_add_test(files, test_config_file);
    tcase_add_test(files, test_config_file_errors);
    tcase_add_test(files, test_config_file_fifo);
    tcase_add_test(files, test_config_overrides);
    tcase_add_test(files, test_config_validate);
    tcase_add_test(files, test_config_run_name);
    tcase_add_test(files, test_config_nan_knobs);
    tcase_add_test(files, test_config_overflow);
    tcase_add_test(files, test_config_save_and_summary);
    tcase_add_test(files, test_ckpt_rotate);
    tcase_add_test(files, test_metrics_series);
    tcase_add_test(files, test_metrics_truncate);
    tcase_add_test(files, test_progress_line);
    tcase_add_test(files, test_svg_plot);
    tcase_add_test(files, test_svg_band);
    tcase_add_test(files, test_svg_ticks);
    tcase_add_test(files, test_svg_from_metrics);
    suite_add_tcase(s, files);
    TCase *cli = tcase_create("cli_backend");
    tcase_add_checked_fixture(cli, tmp_setup, tmp_teardown);
    tcase_set_timeout(cli, 120);
    tcase_add_test(cli, test_cli_backend_mode_refused);
    tcase_add_test(cli, test_cli_cpu_exact_is_default);
    tcase_add_test(cli, test_cli_cuda_clean);
    suite_add_tcase(s, cli);
    return s;
}
