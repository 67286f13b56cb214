/* bench_load: checkpoint loading speed from a warm page cache.
 *
 *   bench/bench_load [--gb X | --a3b-layers L] [--shards N] [--dir DIR] [--reps R] [--only before|after]
 *                    [--fresh 0|1] [--backend cpu|cuda]
 *
 * Writes (once; kept for later runs) a BF16 Qwen3-MoE checkpoint of about X GB
 * (default 1; or the a3b shape of bench_backend at L layers: L = 4 is 6.2 GB,
 * 3.1B parameters) in N shards with model.safetensors.index.json and config.json
 * under DIR (default /tmp/quads-bench-load-XGB-N: a model folder that quads
 * forward --model DIR loads too), reads every shard once to warm the page cache,
 * then loads it into a float32 buffer R times (default 3) two ways and prints
 * bytes, seconds and GB/s of the fastest of R side by side, with its CPU time
 * (all threads; GB per CPU second is what a loaded machine still shows):
 *   before  the loader as it was until issue 16: one thread, tensor by tensor,
 *           qd_safetensors_to_f32 then a separate finiteness pass;
 *   after   qd_checkpoint_load (chunks of every tensor of every shard in
 *           parallel, conversion and finiteness check in one pass).
 * Both buffers must be equal bit for bit (exit 1 otherwise). --only runs one
 * of the two (one buffer: half the memory, no comparison). --fresh 1 adds
 * single loads by the after loader into fresh memory (the first touch
 * included, as in quads forward and quads rl), plain, with MADV_HUGEPAGE
 * twice, plain again. --backend B then times what quads forward does after
 * the load on backend B, step by step (backend_steps). GB = 1e9 bytes of
 * the checkpoint's tensors. Threads: OMP_NUM_THREADS (default all cores). */
#include <math.h>
#include <omp.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/time.h>
#include "backends/backend.h"
#include "backends/layout.h"
#include "bench/bench_a3b.h"
#include "bench/bench_util.h"
#include "models/checkpoint.h"
#include "models/safetensors.h"
#include "quant/fileio.h"
#include "quant/numerics.h"
#include "quant/quant.h"

/* A Qwen3-MoE with the 30B-A3B's layer shapes (hidden 2048, experts of 768)
 * but 32 experts (0.3 GB a layer), with as many layers as make about gb GB of
 * BF16. */
static qd_model_config bench_config(double gb)
{
    qd_model_config c;
    qd_bench_a3b_config(&c, 1);
    c.num_experts = 32, c.num_experts_per_tok = 4;
    c.vocab_size = 32768, c.max_position_embeddings = 4096;
    double per_layer = 2.0 * (2048.0 * 32 * 3 * 768 + 2048.0 * 32 + 2048.0 * 4096 * 2 + 2048.0 * 512 * 2);
    double fixed = 2.0 * 2 * 32768 * 2048;
    c.num_hidden_layers = (int)fmax(1, round((gb * 1e9 - fixed) / per_layer));
    return c;
}

static int file_exists(const char *p)
{
    struct stat sb;
    return stat(p, &sb) == 0;
}

/* Shard s of n: the tensors [i0, i1) of the layout, every tensor borrowing
 * one buffer of finite random BF16 values (the speed does not depend on them). */
static qd_status write_shard(const char *path, const qd_model_layout *L, int i0, int i1, const uint16_t *vals)
{
    qd_safetensors_writer *w = NULL;
    qd_status st = qd_safetensors_writer_new(&w);
    for (int i = i0; i < i1 && !st; i++) {
        const qd_param_info *p = &L->info[i];
        int64_t shape[2] = {p->rows, p->cols};
        int vec = p->rows == 1 && qd_str_ends_with(p->name, "norm.weight");
        st = qd_safetensors_writer_add(w, p->name, QD_ST_BF16, vec ? 1 : 2, vec ? shape + 1 : shape, vals);
    }
    if (!st)
        st = qd_safetensors_writer_write(w, path);
    qd_safetensors_writer_free(w);
    return st;
}

static qd_status write_checkpoint(const char *dir, const qd_model_layout *L, int shards)
{
    size_t maxn = 0;
    for (int i = 0; i < L->ninfo; i++)
        maxn = fmax(maxn, (size_t)(L->info[i].rows * L->info[i].cols));
    uint16_t *vals = malloc(maxn * sizeof *vals);
    if (!vals)
        return qd_error(QD_ERR_NOMEM, "values");
    uint64_t s = 1;
    for (size_t i = 0; i < maxn; i++) {
        s = s * 6364136223846793005ull + 1442695040888963407ull;
        vals[i] = qd_bf16_from_f32(((float)(s >> 40) / (float)(1 << 24) - 0.5f) * 0.05f);
    }
    qd_status st = qd_mkdirs(dir);
    json_t *map = json_object();
    for (int k = 0; k < shards && !st; k++) {
        char name[64], path[4200];
        snprintf(name, sizeof name, "model-%05d-of-%05d.safetensors", k + 1, shards);
        snprintf(path, sizeof path, "%s/%s", dir, name);
        int i0 = (int)((long long)L->ninfo * k / shards), i1 = (int)((long long)L->ninfo * (k + 1) / shards);
        for (int i = i0; i < i1; i++)
            json_object_set_new(map, L->info[i].name, json_string(name));
        st = write_shard(path, L, i0, i1, vals);
    }
    free(vals);
    char path[4200];
    snprintf(path, sizeof path, "%s/model.safetensors.index.json", dir);
    json_t *idx = json_pack("{s:{}, s:o}", "metadata", "weight_map", map);
    char *text = idx ? json_dumps(idx, JSON_INDENT(1)) : NULL;
    if (!st)
        st = text ? qd_atomic_write(path, text, strlen(text)) : qd_error(QD_ERR_NOMEM, "index");
    free(text);
    json_decref(idx);
    return st;
}

/* Reads every byte of the checkpoint once (the page cache is then warm);
 * returns the files' total size. */
static size_t warm(const char *dir)
{
    qd_safetensors *f;
    if (qd_safetensors_open(&f, dir))
        return 0;
    size_t bytes = 0;
    volatile uint8_t sink = 0; /* the reads must happen */
    for (size_t i = 0; i < qd_safetensors_count(f); i++) {
        const qd_st_tensor *t = qd_safetensors_at(f, i);
        for (size_t k = 0; k < t->nbytes; k += 4096)
            sink ^= ((const uint8_t *)t->data)[k];
        bytes += t->nbytes; /* tensor bytes: the headers are a few KB more */
    }
    qd_safetensors_close(f);
    return bytes;
}

/* The loader before issue 16, kept here as the baseline. */
static qd_status load_before(const char *dir, const qd_param_info *params, int n, float *out)
{
    qd_safetensors *f = NULL;
    qd_status st = qd_safetensors_open(&f, dir);
    for (int i = 0; i < n && !st; i++) {
        const qd_st_tensor *t = qd_safetensors_find(f, params[i].name);
        st = t ? qd_safetensors_to_f32(out + params[i].offset, t) : QD_ERR_FORMAT;
        for (int64_t k = 0; !st && k < t->numel; k++)
            if (!isfinite(out[params[i].offset + k]))
                st = QD_ERR_NONFINITE;
    }
    qd_safetensors_close(f);
    return st;
}

typedef qd_status (*loader)(const char *, const qd_param_info *, int, float *);

typedef struct {
    double wall, user, sys; /* seconds of the fastest rep: wall clock, CPU in user and kernel mode (all threads) */
} timing;

static double tv_s(struct timeval t) { return (double)t.tv_sec + 1e-6 * (double)t.tv_usec; }

/* The fastest of reps loads into out (touched before: the first touch of
 * fresh memory is the allocator's cost, not the loader's, and on a VM that
 * returns freed memory to its host it dominates everything else). */
static timing time_load(loader fn, const char *dir, const qd_model_layout *L, int reps, float *out)
{
    timing best = {INFINITY, 0, 0};
    memset(out, 0, L->nfloats * sizeof(float));
    for (int r = 0; r < reps; r++) {
        struct rusage u0, u1;
        getrusage(RUSAGE_SELF, &u0);
        double t0 = qd_bench_now();
        qd_status st = fn(dir, L->info, L->ninfo, out);
        double t = qd_bench_now() - t0;
        getrusage(RUSAGE_SELF, &u1);
        if (st) {
            fprintf(stderr, "bench_load: %s\n", qd_last_error());
            exit(1);
        }
        if (t < best.wall)
            best = (timing){t, tv_s(u1.ru_utime) - tv_s(u0.ru_utime), tv_s(u1.ru_stime) - tv_s(u0.ru_stime)};
    }
    return best;
}

/* One load into fresh memory (malloc'ed, first touched by the loader, freed
 * after: what quads forward and quads rl do), with MADV_HUGEPAGE on it when hp
 * (one fault per 2 MB where transparent huge pages are "madvise"). It must
 * equal ref (when not NULL). One shot, not the fastest of reps: a repeat
 * reuses what the last one freed, which a VM may still back. */
static timing time_fresh(const char *dir, const qd_model_layout *L, int hp, const float *ref)
{
    size_t nb = L->nfloats * sizeof(float);
    struct rusage u0, u1;
    getrusage(RUSAGE_SELF, &u0);
    double t0 = qd_bench_now();
    float *out = malloc(nb);
    if (out && hp) {
        uintptr_t a = ((uintptr_t)out + 4095) & ~(uintptr_t)4095, e = ((uintptr_t)out + nb) & ~(uintptr_t)4095;
        if (e > a && madvise((void *)a, e - a, MADV_HUGEPAGE))
            perror("bench_load: madvise(MADV_HUGEPAGE)");
    }
    qd_status st = out ? qd_checkpoint_load(dir, L->info, L->ninfo, out) : qd_error(QD_ERR_NOMEM, "fresh buffer");
    double t = qd_bench_now() - t0;
    getrusage(RUSAGE_SELF, &u1);
    if (st || (ref && memcmp(out, ref, nb))) {
        fprintf(stderr, "bench_load: fresh load: %s\n", st ? qd_last_error() : "differs from the first load");
        exit(1);
    }
    free(out);
    return (timing){t, tv_s(u1.ru_utime) - tv_s(u0.ru_utime), tv_s(u1.ru_stime) - tv_s(u0.ru_stime)};
}

static double since(double *t0)
{
    double t = qd_bench_now(), d = t - *t0;
    *t0 = t;
    return d;
}

/* What quads forward does after the load, step by step, with the weights w
 * loaded: the backend (fp32 recipe, rollout role, as quads forward), the
 * finiteness check set_weights makes (timed alone, and the serial qd_amax it
 * replaced), set_weights (check, upload, weight sync), a forward of 27
 * tokens with log-probs and logits to the host, and the free. */
static int backend_steps(const char *name, const qd_model_config *cfg, const float *w, size_t nf)
{
    double t0 = qd_bench_now(), dt[6];
    float amax;
    qd_backend_options opt = {.recipe = QD_RECIPE_FP32, .role = QD_ROLE_ROLLOUT};
    qd_backend *b = qd_backend_init_by_name(name, cfg, &opt);
    dt[0] = since(&t0);
    qd_status st = b ? QD_OK : qd_error(QD_ERR_ARG, "%s", qd_last_error());
    if (!st && qd_backend_num_floats(b) != nf)
        st = qd_error(QD_ERR_SHAPE, "backend %s: %zu floats, the checkpoint %zu", name, qd_backend_num_floats(b), nf);
    if (!st && qd_amax(&amax, w, (int64_t)nf))
        st = QD_ERR_NONFINITE;
    dt[1] = since(&t0);
    if (!st && qd_first_nonfinite(w, (int64_t)nf) >= 0)
        st = QD_ERR_NONFINITE;
    dt[2] = since(&t0);
    if (!st)
        st = qd_backend_set_weights(b, w, nf);
    dt[3] = since(&t0);
    int32_t ids[27], len = 27;
    for (int i = 0; i < 27; i++)
        ids[i] = i + 1;
    float *logp = malloc(sizeof(float) * 27), *logits = malloc(sizeof(float) * 27 * (size_t)cfg->vocab_size);
    qd_batch batch = {.B = 1, .T = 27, .tokens = ids, .lengths = &len, .temperature = 1.0f};
    if (!st)
        st = logp && logits ? qd_backend_forward(b, &batch, logp, logits) : qd_error(QD_ERR_NOMEM, "logits");
    dt[4] = since(&t0);
    qd_backend_free(b);
    dt[5] = since(&t0);
    free(logp), free(logits);
    if (st) {
        fprintf(stderr, "bench_load: backend %s: %s\n", name, qd_last_error());
        return 1;
    }
    static const char *const what[6] = {
        "backend init (device, memory plan, allocations)",
        "finiteness check of the weights: serial qd_amax (set_weights before)",
        "finiteness check of the weights: qd_first_nonfinite (set_weights now)",
        "qd_backend_set_weights (check, upload, weight sync)",
        "forward of 27 tokens, log-probs and logits to the host",
        "qd_backend_free",
    };
    printf("\n| quads forward after the load, backend %s | seconds |\n|---|---|\n", name);
    for (int i = 0; i < 6; i++)
        printf("| %s | %.3f |\n", what[i], dt[i]);
    return 0;
}

static void row(const char *name, size_t bytes, timing t)
{
    printf("| %s | %zu | %.3f | %.2f | %.2f + %.2f | %.2f |\n", name, bytes, t.wall, bytes / t.wall / 1e9, t.user,
           t.sys, bytes / (t.user + t.sys) / 1e9);
}

int main(int argc, char **argv)
{
    double gb = 1.0;
    int shards = 1, reps = 3, a3b = 0, fresh = 0;
    char dir[4096] = "";
    const char *only = "", *backend = "";
    int bad = argc % 2 == 0; /* options come in pairs */
    for (int i = 1; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "--gb"))
            gb = atof(argv[i + 1]);
        else if (!strcmp(argv[i], "--shards"))
            shards = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--dir"))
            snprintf(dir, sizeof dir, "%s", argv[i + 1]);
        else if (!strcmp(argv[i], "--reps"))
            reps = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--only"))
            only = argv[i + 1];
        else if (!strcmp(argv[i], "--a3b-layers"))
            a3b = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--fresh"))
            fresh = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--backend"))
            backend = argv[i + 1];
        else
            bad = 1;
    }
    if (bad || gb <= 0 || shards < 1 || reps < 1 || a3b < 0 || a3b > 48 || (fresh != 0 && fresh != 1) ||
        (*only && strcmp(only, "before") && strcmp(only, "after")) || (*backend && !strcmp(only, "before"))) {
        fprintf(stderr, "usage: bench_load [--gb X > 0 | --a3b-layers L in 1..48] [--shards N >= 1] [--dir DIR] "
                        "[--reps R >= 1] [--only before|after] [--fresh 0|1] [--backend cpu|cuda]\n");
        return 2;
    }
    if (!*dir && a3b)
        snprintf(dir, sizeof dir, "/tmp/quads-bench-load-a3b-L%d-%d", a3b, shards);
    else if (!*dir)
        snprintf(dir, sizeof dir, "/tmp/quads-bench-load-%gGB-%d", gb, shards);
    qd_model_config cfg;
    if (a3b)
        qd_bench_a3b_config(&cfg, a3b);
    else
        cfg = bench_config(gb);
    qd_model_layout L;
    if (qd_model_layout_init(&L, &cfg)) {
        fprintf(stderr, "bench_load: %s\n", qd_last_error());
        return 1;
    }
    char idx[4200], cfgp[4200];
    snprintf(idx, sizeof idx, "%s/model.safetensors.index.json", dir);
    snprintf(cfgp, sizeof cfgp, "%s/config.json", dir);
    if ((!file_exists(idx) && write_checkpoint(dir, &L, shards)) ||
        (!file_exists(cfgp) && qd_checkpoint_write_config(dir, &cfg, QD_ST_BF16))) {
        fprintf(stderr, "bench_load: %s\n", qd_last_error());
        return 1;
    }
    size_t bytes = warm(dir);
    int before = strcmp(only, "after") != 0, after = strcmp(only, "before") != 0;
    float *a = before ? malloc(L.nfloats * sizeof(float)) : NULL, *b = after ? malloc(L.nfloats * sizeof(float)) : NULL;
    if ((before && !a) || (after && !b)) {
        fprintf(stderr, "bench_load: out of memory for %d x %zu floats\n", before + after, L.nfloats);
        return 1;
    }
    printf("checkpoint: %s (%d layers, %d tensors, %d shard%s), %d threads, fastest of %d\n", dir,
           cfg.num_hidden_layers, L.ninfo, shards, shards > 1 ? "s" : "", omp_get_max_threads(), reps);
    printf("| loader | bytes | seconds | GB/s | CPU s (user + sys) | GB per CPU s |\n|---|---|---|---|---|---|\n");
    if (before)
        row("before (serial)", bytes, time_load(load_before, dir, &L, reps, a));
    if (after)
        row("after (qd_checkpoint_load)", bytes, time_load(qd_checkpoint_load, dir, &L, reps, b));
    for (int k = 0; after && fresh && k < 4; k++) { /* plain, huge, huge, plain: both orders */
        int hp = k == 1 || k == 2;
        row(hp ? "after, into fresh memory, MADV_HUGEPAGE (once)" : "after, into fresh memory (once)", bytes,
            time_fresh(dir, &L, hp, b));
    }
    int same = !before || !after || memcmp(a, b, L.nfloats * sizeof(float)) == 0;
    if (before && after)
        printf("float32 buffers %s\n", same ? "equal bit for bit" : "DIFFER");
    if (same && *backend && backend_steps(backend, &cfg, b, L.nfloats))
        same = 0;
    free(a), free(b);
    qd_model_layout_free(&L);
    return same ? 0 : 1;
}
