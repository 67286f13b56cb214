/* The problems of an RL run (data.task): the synthetic task's training pool
 * and held-out split, or a benchmark of the registry (benchmarks/registry.h),
 * its problems dated in [data.from, data.to] when set (LiveCodeBench's
 * contest_date), fetched into the cache, or read from it under QUADS_OFFLINE=1, and split by
 * a shuffle seeded with eval.seed into eval.limit held-out problems (256 when
 * 0, at most half) and the training rest. Problems whose prompt has more than
 * data.max_prompt_tokens tokens are skipped on both sides. */
#ifndef QD_RL_DATA_H
#define QD_RL_DATA_H
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include "benchmarks/dataset.h"
#include "models/tokenizer.h"
#include "orchestrator/rl_config.h"
#include "quant/status.h"

typedef struct {
    qd_bench_set train, test;
    int32_t **pids;       /* (train.n) prompt ids (qd_task_encode), owned */
    int *plen;            /* (train.n) their lengths */
    size_t total, dropped; /* problems loaded, and skipped for their prompt's length */
    int longest;          /* tokens of the longest prompt kept (either split) */
    bool code;            /* code problems (a LiveCodeBench task): graded in the sandbox */
} qd_rl_data;

/* Loads data.task (seed: run.seed, the synthetic pool's). Errors name the key
 * ("config: data.task: ..."). Free with qd_rl_data_free, also after an error. */
qd_status qd_rl_data_load(qd_rl_data *d, const qd_knobs *k, const qd_tokenizer *tok, uint64_t seed);
void qd_rl_data_free(qd_rl_data *d);

#endif
