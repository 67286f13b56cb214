/* The per-op check across backends (ggml's test-backend-ops, for
 * backends/ops.h): every op case of tests/op_cases.c on the CUDA ops against
 * the CPU ops (backends/cpu/cpu_ops.c, the definitions), same inputs.
 *   exact mode: every output byte for byte;
 *   fast mode:  the ops fast mode may change (NUMERICS.md §7: the float and
 *               FP8 products through cuBLASLt, the experts' through cuBLAS,
 *               W4A4 through the native Blackwell MMA where present, fused
 *               attention) within the bound of their slot, max |cuda - cpu| /
 *               max |cpu| over each output; every other op byte for byte;
 *   fast16:     fast mode as the BF16 recipes make it (every float product
 *               with BF16 operands, attention's in TF32), the slots it changes.
 * Prints one row per case and mode; exits 1 on any failure.
 *     tests/gpu/check_ops [SEEDS]      (default 3 seeds a case) */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "tests/op_cases.h"

/* fast mode's bounds, by slot (relative to the output's largest magnitude):
 * float32 GEMMs with K <= 72 (cuBLASLt's float path, about sqrt(K) u; matmul_w16 too; the
 * experts' through cuBLAS, K <= 256, float32 or BF16 operands that are BF16 values), FP8
 * through cuBLASLt's FP8 GEMM (another accumulation order over exact E4M3
 * products and scales), attention with the hardware exp (its backward case
 * starts from fast attention's probabilities) */
static double fast_bound(const char *slot)
{
    if (!strcmp(slot, "matmul") || !strcmp(slot, "matmul_w16") || !strcmp(slot, "matmul_backward") ||
        !strcmp(slot, "matmul_grouped") || !strcmp(slot, "head_backward"))
        return 1e-5;
    /* fp8_gemm_grouped: the experts' FP8 on the tensor cores (fast mode's default;
     * cuda_fp8.cu), the exact products summed in another order, 128 at a time */
    if (!strcmp(slot, "fp8_gemm") || !strcmp(slot, "fp8_gemm_grouped") || !strcmp(slot, "w4a4_gemm") ||
        !strcmp(slot, "w4a4_gemm_multi"))
        return 1e-3;
    if (!strcmp(slot, "attend") || !strcmp(slot, "attend_backward")) /* the backward reads fast attend's probabilities */
        return 1e-5;
    /* dw's rows summed in chunks, not in one chain: each order's float32
     * rounding error is about sqrt(rows) * 2^-24 of the sum's size (3e-6 at
     * the cases' 3000 rows); every other output keeps its bits */
    if (!strcmp(slot, "rmsnorm_backward"))
        return 1e-5;
    /* one pass over the row (online max, the sum in another order, logp =
     * x - lse): each of those a few float32 roundings of the row's lse or
     * softmax, relative to the outputs' largest magnitude */
    if (!strcmp(slot, "logprob"))
        return 1e-5;
    return -1;
}

/* fast16's: every float product reads its operands as BF16 (8 significant
 * bits, rounded to nearest: a relative change of at most 2^-9 an element,
 * none for a BF16 value), so a sum of random-sign terms moves by about 2^-8
 * of its typical size; 4 * 2^-8 leaves room for the largest of many outputs.
 * Attention's: the fused prefill kernels (cuda_flash.cu; the cases marked
 * flash) read q, k, v, P, dout and dS as BF16: the matmuls' 4 * 2^-8; their
 * att is their own (the log-sum-exp the backward reads), not compared. The
 * other attention cases (decode, head dims of 16, no room for the scratch) go
 * through TF32 products (at most 2^-11 an element): 4 * 2^-10, att compared.
 * (QUADS_FAST_BF16=0 puts every product back on TF32 or float32: inside the
 * same bounds.) */
static double fast16_bound(const qd_op_case_info *ci)
{
    const char *slot = ci->slot;
    if (!strcmp(slot, "matmul") || !strcmp(slot, "matmul_grouped") || !strcmp(slot, "matmul_backward") ||
        !strcmp(slot, "head_backward")) /* the lm_head's: its dy (dlogits) as BF16 bits */
        return 4.0 / 256;
    if (!strcmp(slot, "attend") || !strcmp(slot, "attend_backward"))
        return ci->flash ? 4.0 / 256 : 4.0 / 1024;
    return -1;
}

/* The output named skip (NULL: none) left out of the comparison in both results. */
static void leave_out(qd_op_result *r, const char *skip)
{
    for (int k = 0; skip && k < r->nout; k++)
        if (!strcmp(r->out[k].name, skip))
            r->out[k].bytes = 0;
}

static int check(int i, void *cpu, void *cuda, const qd_ops *co, uint64_t seed, const char *mode, double bound,
                 const char *skip)
{
    qd_op_case_info ci = qd_op_case(i);
    qd_op_result a, b;
    if (qd_op_case_run(i, qd_cpu_ops(), cpu, seed, &a) != QD_OK) {
        printf("| %-30s | %-6s | %4llu | CPU failed: %s\n", ci.name, mode, (unsigned long long)seed, qd_last_error());
        return 0;
    }
    if (qd_op_case_run(i, co, cuda, seed, &b) != QD_OK) {
        printf("| %-30s | %-6s | %4llu | CUDA failed: %s\n", ci.name, mode, (unsigned long long)seed,
               qd_last_error());
        qd_op_result_free(&a);
        return 0;
    }
    double err;
    char what[64];
    leave_out(&a, skip);
    leave_out(&b, skip);
    int ok = qd_op_result_compare(&b, &a, bound, &err, what);
    printf("| %-30s | %-6s | %4llu | %-17s | %10.3e | %9.1e | %s %s\n", ci.name, mode, (unsigned long long)seed,
           ci.slot, err, bound < 0 ? 0.0 : bound, ok ? (err == 0 ? "bits equal" : "within") : "FAIL", ok ? "" : what);
    qd_op_result_free(&a);
    qd_op_result_free(&b);
    return ok;
}

int main(int argc, char **argv)
{
    int seeds = argc > 1 ? atoi(argv[1]) : 3, fails = 0, rows = 0;
    void *cpu = qd_cpu_dev_new(0);
    void *exact = qd_cuda_dev_new(QD_MODE_EXACT, QD_PREC_F32), *fast = qd_cuda_dev_new(QD_MODE_FAST, QD_PREC_F32);
    void *fast16 = qd_cuda_dev_new(QD_MODE_FAST, QD_PREC_BF16);
    if (!cpu || !exact || !fast || !fast16) {
        fprintf(stderr, "check_ops: %s\n", qd_last_error());
        return 1;
    }
    printf("| case                           | mode   | seed | slot              | max rel err |     bound | result\n");
    printf("|--------------------------------|--------|------|-------------------|------------|-----------|-------\n");
    for (int i = 0; i < qd_op_case_count(); i++)
        for (uint64_t s = 1; s <= (uint64_t)seeds; s++) {
            qd_op_case_info ci = qd_op_case(i);
            fails += !check(i, cpu, exact, qd_cuda_ops(), s, "exact", -1, NULL);
            fails += !check(i, cpu, fast, qd_cuda_ops(), s, "fast", ci.fast_differs ? fast_bound(ci.slot) : -1,
                            NULL);
            rows += 2;
            /* not the subnormal products' case under fast16: the BF16 tensor
             * cores may flush a product below 2^-126 to zero, which fast mode
             * accepts (a model's products are nowhere near) */
            if (ci.fast_differs && fast16_bound(&ci) >= 0 && !strstr(ci.name, "tiny products")) {
                fails += !check(i, cpu, fast16, qd_cuda_ops(), s, "fast16", fast16_bound(&ci),
                                ci.flash ? "att" : NULL);
                rows++;
            }
        }
    printf("check_ops: %d cases x %d seeds, exact and fast (fast16 where it differs) = %d rows, %d failure(s): %s\n",
           qd_op_case_count(), seeds, rows, fails, fails ? "FAIL" : "PASS");
    qd_cuda_dev_free(exact);
    qd_cuda_dev_free(fast);
    qd_cuda_dev_free(fast16);
    free(cpu);
    return fails ? 1 : 0;
}
