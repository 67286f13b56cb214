/* The problems of an RL run (rl_data.h). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "orchestrator/rl_data.h"
#include "benchmarks/registry.h"
#include "benchmarks/synth.h"
#include "orchestrator/task.h"
#include "quant/splitmix64.h"

#define TRAIN_POOL 4096 /* synthetic training problems drawn (fewer when the split is smaller) */

static uint64_t mix64(uint64_t x) { return qd_splitmix64_mix(x + QD_SPLITMIX64_GAMMA); }

/* Prefixes the current message with "where: " (copied first: qd_error writes
 * the buffer qd_last_error reads). */
static qd_status prefixed(qd_status st, const char *where)
{
    char msg[1024];
    snprintf(msg, sizeof msg, "%s", qd_last_error());
    return qd_error(st, "%s: %s", where, msg);
}

/* The synthetic task's training pool and held-out split. */
static qd_status load_synth(qd_rl_data *d, const qd_knobs *k, uint64_t seed, qd_synth_opts *so)
{
    so->seed = seed;
    size_t n = TRAIN_POOL;
    qd_status st;
    while ((st = qd_synth_generate(so, QD_SPLIT_TRAIN, n, &d->train)) == QD_ERR_ARG && n > 16)
        n /= 2;
    if (st)
        return st;
    n = k->eval.limit > 0 ? (size_t)k->eval.limit : 256;
    so->seed = (uint64_t)k->eval.seed; /* one held-out set for every run seed */
    while ((st = qd_synth_generate(so, QD_SPLIT_TEST, n, &d->test)) == QD_ERR_ARG && n > 1)
        n /= 2;
    return st;
}

/* Drops the problems of set whose prompt has more than data.max_prompt_tokens
 * tokens (*dropped counts them); ids and len (may be NULL) receive the prompt
 * ids and lengths of those kept, *longest (may be NULL) the most tokens of one. */
static qd_status keep_short(const qd_knobs *k, const qd_tokenizer *tok, qd_bench_set *set, int32_t ***ids, int **len,
                            size_t *dropped, int *longest)
{
    qd_bench_set out = {.rec = malloc(sizeof(qd_bench_record) * (set->n + 1))};
    qd_bench_set drop = {.rec = malloc(sizeof(qd_bench_record) * (set->n + 1))};
    int32_t **pid = ids ? calloc(set->n + 1, sizeof *pid) : NULL;
    int *pl = len ? calloc(set->n + 1, sizeof *pl) : NULL;
    if (!out.rec || !drop.rec || (ids && !pid) || (len && !pl)) {
        free(out.rec), free(drop.rec), free(pid), free(pl);
        return qd_error(QD_ERR_NOMEM, "prompts");
    }
    qd_status st = QD_OK;
    for (size_t i = 0; i < set->n && !st; i++) {
        int32_t *p;
        size_t nids, np;
        st = qd_task_encode(tok, set->rec[i].problem, NULL, &p, &nids, &np);
        if (st)
            break;
        if ((int64_t)np > k->data.max_prompt_tokens) {
            drop.rec[drop.n++] = set->rec[i];
            free(p);
            continue;
        }
        if (longest && (int)np > *longest)
            *longest = (int)np;
        if (pid)
            pid[out.n] = p, pl[out.n] = (int)np;
        else
            free(p);
        out.rec[out.n++] = set->rec[i];
    }
    for (size_t i = out.n + drop.n; i < set->n; i++) /* after an error: freed with the rest */
        drop.rec[drop.n++] = set->rec[i];
    free(set->rec);
    *set = out;
    *dropped += drop.n;
    qd_bench_set_free(&drop);
    if (ids)
        *ids = pid, *len = pl;
    return st;
}

/* A benchmark of the registry as the task: fetched into the cache (or read
 * from it under QUADS_OFFLINE=1), its problems with prompts that fit
 * data.max_prompt_tokens split by a shuffle seeded with eval.seed (the same
 * split for every run): eval.limit problems (256 when 0; at most half) held
 * out, the rest for training. */
static qd_status load_benchmark(qd_rl_data *d, const qd_knobs *k, const qd_tokenizer *tok, const qd_bench_info *b)
{
    qd_fetch_opts fo;
    qd_fetch_opts_default(&fo);
    qd_bench_set all;
    const char *from = *k->data.from ? k->data.from : NULL, *to = *k->data.to ? k->data.to : NULL;
    qd_status st = qd_bench_load_window(b, &fo, from, to, &all);
    if (st)
        return prefixed(st, from || to ? "config: data.task, data.from, data.to" : "config: data.task");
    d->code = b->fields.style == QD_ANSWER_CODE;
    if (!all.n) {
        st = qd_error(QD_ERR_ARG, "config: data.from, data.to: none of the %zu problems of %s is dated in [%s, %s]",
                      all.read, b->name, from ? from : "-", to ? to : "-");
        qd_bench_set_free(&all);
        return st;
    }
    st = keep_short(k, tok, &all, NULL, NULL, &d->dropped, NULL);
    if (st) {
        qd_bench_set_free(&all);
        return st;
    }
    size_t n = all.n, lim = k->eval.limit > 0 ? (size_t)k->eval.limit : 256, nt = lim < n / 2 ? lim : n / 2;
    size_t *idx = malloc(sizeof(size_t) * (n + 1));
    d->test.rec = malloc(sizeof(qd_bench_record) * (nt + 1));
    d->train.rec = malloc(sizeof(qd_bench_record) * (n - nt + 1));
    if (!idx || !d->test.rec || !d->train.rec) {
        free(idx);
        qd_bench_set_free(&all);
        return qd_error(QD_ERR_NOMEM, "%s", b->name);
    }
    for (size_t i = 0; i < n; i++)
        idx[i] = i;
    uint64_t h = mix64((uint64_t)k->eval.seed ^ 0xbe4c5e7ull);
    for (size_t i = n; i > 1; i--) {
        h = mix64(h);
        size_t j = (size_t)(h % i), t = idx[i - 1];
        idx[i - 1] = idx[j], idx[j] = t;
    }
    for (size_t i = 0; i < n; i++) /* the records move; their strings now belong to train and test */
        if (i < nt)
            d->test.rec[d->test.n++] = all.rec[idx[i]];
        else
            d->train.rec[d->train.n++] = all.rec[idx[i]];
    free(all.rec), free(idx);
    return QD_OK;
}

qd_status qd_rl_data_load(qd_rl_data *d, const qd_knobs *k, const qd_tokenizer *tok, uint64_t seed)
{
    qd_synth_opts so = {0};
    *d = (qd_rl_data){0};
    if (*k->data.benchmark)
        return qd_error(QD_ERR_UNSUPPORTED, "config: data.benchmark: '%s': quads rl evaluates on the task's "
                                            "held-out split only (leave it empty; use quads eval for benchmarks)",
                        k->data.benchmark);
    const qd_bench_info *b = qd_bench_find(k->data.task);
    qd_status st = qd_task_parse(k->data.task, &so); /* arith names are the task's, not the registry's */
    if (!st && (*k->data.from || *k->data.to))
        return qd_error(QD_ERR_ARG, "config: data.from, data.to: the synthetic task %s has no dates (leave them "
                                    "empty)", k->data.task);
    if (!st)
        st = load_synth(d, k, seed, &so);
    else if (b && b->source != QD_SRC_SYNTH)
        st = load_benchmark(d, k, tok, b);
    else
        return prefixed(st, "config: data.task");
    d->total = d->dropped + d->train.n + d->test.n;
    if (!st)
        st = keep_short(k, tok, &d->train, &d->pids, &d->plen, &d->dropped, &d->longest);
    if (!st)
        st = keep_short(k, tok, &d->test, NULL, NULL, &d->dropped, &d->longest);
    if (!st && (!d->train.n || !d->test.n))
        st = qd_error(QD_ERR_ARG, "config: data.max_prompt_tokens: %lld: every %s prompt of %s is longer",
                      (long long)k->data.max_prompt_tokens, d->train.n ? "held-out" : "training", k->data.task);
    return st;
}

void qd_rl_data_free(qd_rl_data *d)
{
    for (size_t i = 0; d->pids && i < d->train.n; i++)
        free(d->pids[i]);
    free(d->pids), free(d->plen);
    qd_bench_set_free(&d->train);
    qd_bench_set_free(&d->test);
    *d = (qd_rl_data){0};
}
