/* Op cases in the style of ggml's test-backend-ops: every slot of
 * backends/ops.h run on random inputs through a given ops table, its outputs
 * brought back to the host. The same case with the same seed on two backends
 * (or two thread counts) must give the same bytes in exact mode, so a
 * mismatch names the op. Used by tests/test_ops.c (the CPU at 1 and 3
 * threads, in make check) and tests/gpu/check_ops.cu (CPU vs CUDA, exact and
 * fast). */
#ifndef QD_TEST_OP_CASES_H
#define QD_TEST_OP_CASES_H

#include <stddef.h>
#include <stdint.h>
#include "backends/ops.h"

/* One output of a case, on the host: bytes, and how to compare them within a
 * bound (f: float32, d: double, i: int32, b: raw bytes). */
typedef struct {
    char name[32];
    char kind;
    void *data;
    size_t bytes;
} qd_op_output;

typedef struct {
    qd_op_output out[24];
    int nout;
} qd_op_result;

typedef struct {
    const char *name;      /* "<slot> <shape>" */
    const char *slot;      /* the ops.h slot it exercises */
    int fast_differs;      /* fast mode may change the bits (NUMERICS.md §7) */
    int flash;             /* a prefill attention fast mode's BF16 recipes run on the fused
                            * BF16 kernels (cuda_flash.cu: head dims 64 and 128, room in att
                            * and ds for their scratch); the other attention cases take TF32 */
} qd_op_case_info;

/* The number of cases and their names. */
int qd_op_case_count(void);
qd_op_case_info qd_op_case(int i);

/* Runs case i with inputs drawn from seed; res receives its outputs
 * (free with qd_op_result_free). */
qd_status qd_op_case_run(int i, const qd_ops *ops, void *dev, uint64_t seed, qd_op_result *res);
void qd_op_result_free(qd_op_result *res);

/* Compares two results of one case: exact (bound < 0) byte for byte, else
 * float/double outputs by max |a-b| / max(max|b|, tiny) <= bound and the rest
 * byte for byte. Returns 1 when equal; *err the worst relative error; what
 * (64 bytes) names the first differing output. */
int qd_op_result_compare(const qd_op_result *a, const qd_op_result *b, double bound, double *err, char *what);

#endif
