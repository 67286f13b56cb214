/* On the GPU machine: the CUDA backend's forward against the CPU backend's,
 * bit for bit (NUMERICS.md §6, exact mode). For each checkpoint folder (the
 * arguments, default the five test checkpoints and models/tiny), recipes fp32
 * and bf16, batches of 3 sequences of different lengths and of 1 sequence, and
 * the 3-sequence batch again at temperature 0.7: one table row with the max
 * abs difference of log-probs and logits and whether every bit is equal.
 * Exit 0 when all are, 1 on a mismatch, 2 on an error (no device, bad file).
 *     tests/gpu/check_backend [MODEL_DIR ...]      run from the source root */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
extern "C" {
#include "backends/backend.h"
#include "models/checkpoint.h"
#include "quant/status.h"
}

static const char *default_dirs[] = {
    "tests/fixtures/hf_models/qwen3_dense",       "tests/fixtures/hf_models/qwen3moe_gqa_untied",
    "tests/fixtures/hf_models/qwen3moe_mha_tied_nonorm", "tests/fixtures/hf_models/qwen3moe_mlponly0",
    "tests/fixtures/hf_models/qwen3moe_mqa_sparse2", "models/tiny",
};

typedef struct {
    double dlogp, dlogits;
    int equal;
} diff;

/* Max abs difference of n floats and whether every bit pattern matches. */
static void compare(diff *d, const float *a, const float *b, size_t n, double *maxd)
{
    *maxd = 0.0;
    for (size_t i = 0; i < n; i++) {
        double e = fabs((double)a[i] - (double)b[i]);
        if (e > *maxd || e != e)
            *maxd = e;
        if (memcmp(&a[i], &b[i], sizeof(float)) != 0)
            d->equal = 0;
    }
}

/* Same table, names and offsets: the checkpoint loads into both alike. */
static int same_params(qd_backend *a, qd_backend *b)
{
    int na = 0, nb = 0;
    const qd_param_info *pa = qd_backend_params(a, &na), *pb = qd_backend_params(b, &nb);
    if (na != nb || qd_backend_num_floats(a) != qd_backend_num_floats(b))
        return 0;
    for (int i = 0; i < na; i++)
        if (strcmp(pa[i].name, pb[i].name) || pa[i].rows != pb[i].rows || pa[i].cols != pb[i].cols ||
            pa[i].offset != pb[i].offset)
            return 0;
    return 1;
}

/* One batch on both backends. Lengths len[0..B-1], tokens from a fixed LCG. */
static qd_status run_batch(diff *d, qd_backend *cpu, qd_backend *gpu, int V, int B, const int32_t *len,
                           float temp)
{
    int T = 0;
    for (int b = 0; b < B; b++)
        T = len[b] > T ? len[b] : T;
    size_t nl = (size_t)B * T * V;
    int32_t *tok = (int32_t *)calloc((size_t)B * T, sizeof(int32_t));
    float *lp[2] = {(float *)malloc(sizeof(float) * B * T), (float *)malloc(sizeof(float) * B * T)};
    float *lg[2] = {(float *)malloc(sizeof(float) * nl), (float *)malloc(sizeof(float) * nl)};
    qd_status st = QD_OK;
    if (!tok || !lp[0] || !lp[1] || !lg[0] || !lg[1])
        st = qd_error(QD_ERR_NOMEM, "check_backend: batch buffers");
    uint32_t s = 12345u;
    for (int i = 0; !st && i < B * T; i++) {
        s = s * 1664525u + 1013904223u;
        tok[i] = (int32_t)((s >> 8) % (uint32_t)V);
    }
    qd_batch bt = {B, T, tok, len, temp};
    if (!st)
        st = qd_backend_forward(cpu, &bt, lp[0], lg[0]);
    if (!st)
        st = qd_backend_forward(gpu, &bt, lp[1], lg[1]);
    if (!st) {
        d->equal = 1;
        compare(d, lp[0], lp[1], (size_t)B * T, &d->dlogp);
        compare(d, lg[0], lg[1], nl, &d->dlogits);
    }
    free(tok);
    for (int i = 0; i < 2; i++) {
        free(lp[i]);
        free(lg[i]);
    }
    return st;
}

static qd_status open_pair(qd_backend **cpu, qd_backend **gpu, const char *dir, const qd_model_config *cfg,
                           qd_recipe r)
{
    qd_backend_options opt;
    memset(&opt, 0, sizeof opt);
    opt.recipe = r;
    opt.role = QD_ROLE_ROLLOUT;
    *cpu = qd_backend_cpu_init(cfg, &opt);
    if (!*cpu)
        return QD_ERR_ARG;
    *gpu = qd_backend_cuda_init(cfg, &opt);  /* a direct reference: links the CUDA backend in */
    if (!*gpu)
        return QD_ERR_DEVICE;
    if (!same_params(*cpu, *gpu))
        return qd_error(QD_ERR_FORMAT, "%s: the CUDA parameter table differs from the CPU's", dir);
    size_t n = qd_backend_num_floats(*cpu);
    int np = 0;
    const qd_param_info *pi = qd_backend_params(*cpu, &np);
    float *w = (float *)malloc(sizeof(float) * n);
    if (!w)
        return qd_error(QD_ERR_NOMEM, "check_backend: %zu weights", n);
    qd_status st = qd_checkpoint_load(dir, pi, np, w);
    if (!st)
        st = qd_backend_set_weights(*cpu, w, n);
    if (!st)
        st = qd_backend_set_weights(*gpu, w, n);
    free(w);
    return st;
}

/* All rows of one model; returns 0 all equal, 1 a mismatch, 2 an error. */
static int check_model(const char *dir)
{
    qd_model_config cfg;
    if (qd_checkpoint_read_config(dir, &cfg)) {
        fprintf(stderr, "check_backend: %s\n", qd_last_error());
        return 2;
    }
    const char *name = strrchr(dir, '/') ? strrchr(dir, '/') + 1 : dir;
    int Tm = cfg.max_position_embeddings < 13 ? cfg.max_position_embeddings : 13;
    int32_t len3[3] = {Tm - 4 > 0 ? Tm - 4 : 1, Tm, Tm / 2 > 0 ? Tm / 2 : 1}, len1[1] = {Tm};
    struct { int B; const int32_t *len; float temp; } cases[] = {{3, len3, 0.0f}, {1, len1, 0.0f},
                                                                 {3, len3, 0.7f}};
    qd_recipe recipes[] = {QD_RECIPE_FP32, QD_RECIPE_BF16};
    int rc = 0;
    for (int r = 0; r < 2 && rc < 2; r++) {
        qd_backend *cpu = NULL, *gpu = NULL;
        qd_status st = open_pair(&cpu, &gpu, dir, &cfg, recipes[r]);
        for (int k = 0; k < 3 && !st; k++) {
            diff d = {0, 0, 1};
            st = run_batch(&d, cpu, gpu, cfg.vocab_size, cases[k].B, cases[k].len, cases[k].temp);
            if (!st)
                printf("%-26s %-5s %5d %5.2f %14.3g %14.3g   %s\n", name, qd_recipe_name(recipes[r]), cases[k].B,
                       cases[k].temp > 0 ? cases[k].temp : 1.0, d.dlogp, d.dlogits, d.equal ? "yes" : "NO");
            if (!st && !d.equal)
                rc = 1;
        }
        if (st) {
            fprintf(stderr, "check_backend: %s (%s): %s\n", name, qd_recipe_name(recipes[r]), qd_last_error());
            rc = 2;
        }
        if (cpu)
            qd_backend_free(cpu);
        if (gpu)
            qd_backend_free(gpu);
    }
    return rc;
}

int main(int argc, char **argv)
{
    int n = argc > 1 ? argc - 1 : (int)(sizeof default_dirs / sizeof default_dirs[0]);
    int worst = 0;
    printf("%-26s %-5s %5s %5s %14s %14s   %s\n", "model", "recipe", "batch", "temp", "max|dlogp|",
           "max|dlogits|", "bits equal");
    for (int i = 0; i < n; i++) {
        int rc = check_model(argc > 1 ? argv[i + 1] : default_dirs[i]);
        worst = rc > worst ? rc : worst;
    }
    printf("check_backend: %s\n", worst == 0 ? "PASS" : worst == 1 ? "FAIL (bits differ)" : "ERROR");
    return worst;
}
