/* The knob table, loading (JSON file, --set) with typed validation into the
 * typed struct, the JSON dump and the derived batch numbers. */
#define _GNU_SOURCE
#include <errno.h>
#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "orchestrator/rl_config.h"
#include "benchmarks/dataset.h"
#include "quant/fileio.h"

#define BIG 1e9 /* upper bound for counts: large enough for any run, small enough to catch typos */
#define RECIPES "bf16|fp8|nvfp4|nvfp4-aqat|nvfp4-rac|quads|nvfp4-sym-qat|nvfp4-replay|quads-replay"

/* Designated initializers: a row names the field of qd_knobs it fills, so a
 * reordered struct cannot shift a value into another knob. */
#define KNOB(k, t, field) .key = k, .type = t, .off = offsetof(qd_knobs, field)

/* Every knob. Defaults are written as their --set text so that they go through
 * the same parser and range checks as user values (a test checks that). */
static const qd_cfg_knob knobs[] = {
    {KNOB("run.name", QD_CFG_STRING, run.name), .def = "quads", .name = true,
     .doc = "run name; the run directory defaults to ./runs/NAME"},
    {KNOB("run.dir", QD_CFG_STRING, run.dir), .def = "", .doc = "run directory; empty means ./runs/<run.name>"},
    {KNOB("run.seed", QD_CFG_INT, run.seed), .def = "1", .min = 0, .max = 2147483647,
     .doc = "seed of data order, sampling and initialization"},
    {KNOB("run.steps", QD_CFG_INT, run.steps), .def = "150", .min = 1, .max = BIG,
     .doc = "RL steps (one rollout batch and its optimizer updates each)"},
    {KNOB("run.threads", QD_CFG_INT, run.threads), .def = "0", .min = 0, .max = 4096,
     .doc = "OpenMP threads of the CPU backend; 0 = all cores"},
    {KNOB("model.path", QD_CFG_STRING, model.path), .def = "",
     .doc = "Hugging Face model directory; empty means the embedded tiny model"},
    {KNOB("rollout.recipe", QD_CFG_ENUM, rollout.recipe), .def = "quads", .choices = RECIPES,
     .doc = "precision recipe of rollout and trainer (ARCHITECTURE.md)"},
    {KNOB("rollout.backend", QD_CFG_ENUM, rollout.backend), .def = "auto", .choices = "auto|cpu|cuda",
     .doc = "backend of both instances; auto = CUDA if present, else CPU (quads rl --backend)"},
    {KNOB("rollout.mode", QD_CFG_ENUM, rollout.mode), .def = "exact", .choices = "exact|fast",
     .doc = "mode of both instances: exact (the CPU's bits) or fast kernels, CUDA only (NUMERICS.md §7; quads rl --mode)"},
    {KNOB("rollout.temperature", QD_CFG_FLOAT, rollout.temperature), .def = "1.0", .min = 0, .max = 100, .min_open = true,
     .doc = "sampling temperature of the rollout"},
    {KNOB("rollout.top_p", QD_CFG_FLOAT, rollout.top_p), .def = "1.0", .min = 0, .max = 1, .min_open = true,
     .doc = "nucleus sampling mass; 1 = off"},
    {KNOB("rollout.top_k", QD_CFG_INT, rollout.top_k), .def = "0", .min = 0, .max = BIG,
     .doc = "sample among the k most likely tokens; 0 = off"},
    {KNOB("rollout.max_tokens", QD_CFG_INT, rollout.max_tokens), .def = "8", .min = 1, .max = BIG,
     .doc = "maximum response length in tokens (the tiny model's answers take at most 6)"},
    {KNOB("rollout.group_size", QD_CFG_INT, rollout.group_size), .def = "8", .min = 2, .max = 4096,
     .doc = "G: completions per prompt (>= 2: a group of one has no baseline)"},
    {KNOB("rollout.prompts_per_step", QD_CFG_INT, rollout.prompts_per_step), .def = "8", .min = 1, .max = BIG,
     .doc = "prompts per RL step"},
    {KNOB("trainer.lr", QD_CFG_FLOAT, trainer.lr), .def = "1e-4", .min = 0, .max = 1,
     .doc = "AdamW peak learning rate"},
    {KNOB("trainer.lr_schedule", QD_CFG_ENUM, trainer.lr_schedule), .def = "constant", .choices = "constant|cosine|linear",
     .doc = "learning rate after warmup"},
    {KNOB("trainer.min_lr_ratio", QD_CFG_FLOAT, trainer.min_lr_ratio), .def = "0.0", .min = 0, .max = 1,
     .doc = "final lr / peak lr of the cosine and linear schedules"},
    {KNOB("trainer.warmup_steps", QD_CFG_INT, trainer.warmup_steps), .def = "0", .min = 0, .max = BIG,
     .doc = "linear warmup from 0 over this many optimizer steps"},
    {KNOB("trainer.weight_decay", QD_CFG_FLOAT, trainer.weight_decay), .def = "0.01", .min = 0, .max = 1,
     .doc = "AdamW decoupled weight decay"},
    /* beta = 1 makes AdamW's bias correction 1 - beta^t zero (NaN at step 1);
     * an eps below float's normal range rounds to 0 (0/0 where v is 0) */
    {KNOB("trainer.beta1", QD_CFG_FLOAT, trainer.beta1), .def = "0.9", .min = 0, .max = 1, .max_open = true,
     .doc = "AdamW beta1"},
    {KNOB("trainer.beta2", QD_CFG_FLOAT, trainer.beta2), .def = "0.999", .min = 0, .max = 1, .max_open = true,
     .doc = "AdamW beta2"},
    {KNOB("trainer.eps", QD_CFG_FLOAT, trainer.eps), .def = "1e-8", .min = 1e-30, .max = 1, .doc = "AdamW epsilon"},
    {KNOB("trainer.grad_clip", QD_CFG_FLOAT, trainer.grad_clip), .def = "1.0", .min = 0, .max = 1e9,
     .doc = "clip the global gradient norm to this; 0 = off"},
    {KNOB("trainer.micro_batch", QD_CFG_INT, trainer.micro_batch), .def = "8", .min = 1, .max = BIG,
     .doc = "sequences per forward/backward pass"},
    {KNOB("trainer.mini_batches", QD_CFG_INT, trainer.mini_batches), .def = "1", .min = 1, .max = 4096,
     .doc = "optimizer updates per RL step (the batch split by prompts)"},
    {KNOB("trainer.recompute", QD_CFG_BOOL, trainer.recompute), .def = "false",
     .doc = "hold one layer's activations, recomputed in the backward (less memory, more forward work, the same "
            "numbers)"},
    {KNOB("algo.advantage", QD_CFG_ENUM, algo.advantage), .def = "grpo", .choices = "grpo|dr_grpo",
     .doc = "grpo: (r - mean)/(std + eps); dr_grpo: r - mean"},
    {KNOB("algo.adv_eps", QD_CFG_FLOAT, algo.adv_eps), .def = "1e-6", .min = 0, .max = 1, .min_open = true,
     .doc = "eps added to the group std (> 0: a group of equal rewards has std 0)"},
    {KNOB("algo.clip_low", QD_CFG_FLOAT, algo.clip_low), .def = "0.2", .min = 0, .max = 1,
     .doc = "PPO ratio lower clip: 1 - clip_low"},
    {KNOB("algo.clip_high", QD_CFG_FLOAT, algo.clip_high), .def = "0.28", .min = 0, .max = 100,
     .doc = "PPO ratio upper clip: 1 + clip_high (DAPO clip-higher)"},
    {KNOB("algo.loss_agg", QD_CFG_ENUM, algo.loss_agg), .def = "token_mean", .choices = "token_mean|seq_mean_token_sum|seq_mean_token_mean",
     .doc = "how token losses become the batch loss (token_mean as DAPO)"},
    {KNOB("algo.kl_coef", QD_CFG_FLOAT, algo.kl_coef), .def = "0.0", .min = 0, .max = 100,
     .doc = "weight of the KL penalty to the reference; 0 = off"},
    {KNOB("algo.kl_type", QD_CFG_ENUM, algo.kl_type), .def = "k3", .choices = "k1|k2|k3",
     .doc = "KL estimator (Schulman's k1, k2, k3)"},
    {KNOB("algo.dynamic_sampling", QD_CFG_BOOL, algo.dynamic_sampling), .def = "false",
     .doc = "drop groups whose samples are all right or all wrong (DAPO)"},
    {KNOB("algo.max_gen_batches", QD_CFG_INT, algo.max_gen_batches), .def = "4", .min = 1, .max = 1000,
     .doc = "rollout batches tried to fill a step under dynamic sampling"},
    {KNOB("algo.overlong_buffer_len", QD_CFG_INT, algo.overlong_buffer_len), .def = "0", .min = 0, .max = BIG,
     .doc = "DAPO soft overlong punishment window in tokens; 0 = off"},
    {KNOB("algo.overlong_penalty", QD_CFG_FLOAT, algo.overlong_penalty), .def = "1.0", .min = 0, .max = 100,
     .doc = "penalty at and beyond rollout.max_tokens"},
    {KNOB("algo.tis", QD_CFG_ENUM, algo.tis), .def = "none", .choices = "none|tis|masked",
     .doc = "rollout-trainer importance weights: truncated (tis) or masked above the cap"},
    {KNOB("algo.tis_cap", QD_CFG_FLOAT, algo.tis_cap), .def = "2.0", .min = 1, .max = 1e6,
     .doc = "C: cap of the token importance weight"},
    {KNOB("rac.ratio", QD_CFG_FLOAT, rac.ratio), .def = "0.25", .min = 0, .max = 1,
     .doc = "fraction of input channels RAC augments (rounded down to 16s: on 64-wide layers below 0.25 none)"},
    {KNOB("rac.refresh", QD_CFG_INT, rac.refresh), .def = "1", .min = 0, .max = BIG,
     .doc = "re-pick RAC channels every N weight syncs; 0 = never"},
    {KNOB("data.task", QD_CFG_STRING, data.task), .def = "arith",
     .doc = "training task: the synthetic arithmetic (arith, arith1..arith4, optionally :MAX_OPERAND) or a "
            "benchmark of quads bench list (fetched or cached; eval.limit problems, 256 when 0, held out; "
            "lcb-v*: code rewards from the sandbox, reward.*)"},
    {KNOB("data.benchmark", QD_CFG_STRING, data.benchmark), .def = "",
     .doc = "must be empty: quads rl evaluates on the task's held-out split (quads eval runs benchmarks)"},
    {KNOB("data.from", QD_CFG_STRING, data.from), .def = "",
     .doc = "a benchmark task with dates (lcb-v*: contest_date): only problems dated on or after this "
            "YYYY-MM-DD; empty = no bound"},
    {KNOB("data.to", QD_CFG_STRING, data.to), .def = "",
     .doc = "the same: only problems dated on or before this YYYY-MM-DD (inclusive, as LiveCodeBench)"},
    {KNOB("data.max_prompt_tokens", QD_CFG_INT, data.max_prompt_tokens), .def = "128", .min = 1, .max = BIG,
     .doc = "problems whose prompt has more tokens are skipped (training and held-out)"},
    {KNOB("data.shuffle", QD_CFG_BOOL, data.shuffle), .def = "true",
     .doc = "shuffle the training prompts each epoch (seeded)"},
    {KNOB("reward.code_jobs", QD_CFG_INT, reward.code_jobs), .def = "0", .min = 0, .max = 4096,
     .doc = "code tasks (lcb-v*): sandboxed tests run at once; 0 = the CPUs online"},
    {KNOB("reward.code_timeout_s", QD_CFG_FLOAT, reward.code_timeout_s), .def = "6", .min = 0, .max = 1e6,
     .min_open = true, .doc = "code tasks: wall and CPU seconds of each test (LiveCodeBench: 6)"},
    {KNOB("reward.code_memory_mb", QD_CFG_INT, reward.code_memory_mb), .def = "4096", .min = 16, .max = 1048576,
     .doc = "code tasks: address space of each test, MiB"},
    {KNOB("eval.every", QD_CFG_INT, eval.every), .def = "50", .min = 0, .max = BIG,
     .doc = "held-out eval every N steps (and before and after); 0 = off"},
    {KNOB("eval.samples", QD_CFG_INT, eval.samples), .def = "1", .min = 1, .max = 4096,
     .doc = "completions per eval prompt (pass@1 averaged over them)"},
    {KNOB("eval.limit", QD_CFG_INT, eval.limit), .def = "256", .min = 0, .max = BIG, .doc = "eval prompts; 0 = all"},
    {KNOB("eval.seed", QD_CFG_INT, eval.seed), .def = "1", .min = 0, .max = 2147483647,
     .doc = "seed of the held-out problems and of eval sampling (not run.seed: every run is graded on the same set)"},
    {KNOB("eval.precision", QD_CFG_ENUM, eval.precision), .def = "rollout", .choices = "rollout|trainer",
     .doc = "held-out eval on the rollout instance (the recipe's inference numerics) or on the trainer"},
    {KNOB("eval.temperature", QD_CFG_FLOAT, eval.temperature), .def = "0.0", .min = 0, .max = 100,
     .doc = "eval sampling temperature; 0 = greedy"},
    {KNOB("eval.bf16", QD_CFG_BOOL, eval.bf16), .def = "false",
     .doc = "also evaluate the first and the last eval's weights with the bf16 recipe's rollout (eval.bf16.* in "
            "the metrics; quads compare turns it on)"},
    {KNOB("checkpoint.every", QD_CFG_INT, checkpoint.every), .def = "10", .min = 0, .max = BIG,
     .doc = "checkpoint every N steps; 0 = only at the end"},
    {KNOB("checkpoint.keep_last", QD_CFG_INT, checkpoint.keep_last), .def = "2", .min = 1, .max = 1000,
     .doc = "checkpoints kept (older step_XXXXXXXX removed)"},
    {KNOB("log.tensorboard", QD_CFG_BOOL, log.tensorboard), .def = "true",
     .doc = "write RUN/tb/: TensorBoard event files with every number of metrics.jsonl and the config as text"},
    {KNOB("dist.checksum_every", QD_CFG_INT, dist.checksum_every), .def = "10", .min = 0, .max = BIG,
     .doc = "data parallel: compare a checksum of the master weights across ranks every N steps (and at the last); 0 = off"},
    {KNOB("dist.timeout_s", QD_CFG_FLOAT, dist.timeout_s), .def = "1800", .min = 0, .max = 1e6, .min_open = true,
     .doc = "data parallel: seconds a rank waits for the others in a collective (must exceed rank 0's eval and " "checkpoint time and any rollout imbalance)"},
};
#define N_KNOBS (sizeof knobs / sizeof knobs[0])

struct qd_config {
    qd_knobs k; /* STRING and ENUM values malloc'ed */
};

/* Where knob i lives in cfg. */
static void *slot(qd_config *cfg, size_t i) { return (char *)&cfg->k + knobs[i].off; }
static const void *cslot(const qd_config *cfg, size_t i) { return (const char *)&cfg->k + knobs[i].off; }

const qd_cfg_knob *qd_config_schema(size_t *n)
{
    *n = N_KNOBS;
    return knobs;
}

static int find_knob(const char *key)
{
    for (size_t i = 0; i < N_KNOBS; i++)
        if (strcmp(knobs[i].key, key) == 0)
            return (int)i;
    return -1;
}

/* Is key a section (a proper prefix of some knob followed by '.')? */
static bool is_section(const char *key)
{
    size_t n = strlen(key);
    for (size_t i = 0; i < N_KNOBS; i++)
        if (strncmp(knobs[i].key, key, n) == 0 && knobs[i].key[n] == '.')
            return true;
    return false;
}

static size_t edit_distance(const char *a, const char *b)
{
    size_t la = strlen(a), lb = strlen(b), row[128];
    if (lb >= 128)
        return (size_t)-1;
    for (size_t j = 0; j <= lb; j++)
        row[j] = j;
    for (size_t i = 1; i <= la; i++) {
        size_t diag = row[0];
        row[0] = i;
        for (size_t j = 1; j <= lb; j++) {
            size_t up = row[j], best = diag + (a[i - 1] != b[j - 1]);
            if (up + 1 < best)
                best = up + 1;
            if (row[j - 1] + 1 < best)
                best = row[j - 1] + 1;
            diag = up;
            row[j] = best;
        }
    }
    return row[lb];
}

static qd_status unknown_key(const char *source, const char *key)
{
    size_t best = (size_t)-1, at = 0;
    for (size_t i = 0; i < N_KNOBS; i++) {
        size_t d = edit_distance(key, knobs[i].key);
        if (d < best)
            best = d, at = i;
    }
    if (best <= 3)
        return qd_error(QD_ERR_ARG, "%s: %s: unknown key (did you mean %s?)", source, key, knobs[at].key);
    return qd_error(QD_ERR_ARG, "%s: %s: unknown key", source, key);
}

static qd_status check_range(const qd_cfg_knob *k, double x, const char *source)
{
    bool low = k->min_open ? x <= k->min : x < k->min, high = k->max_open ? x >= k->max : x > k->max;
    if (low || high)
        return qd_error(QD_ERR_ARG, "%s: %s: %.17g is out of range %c%.17g, %.17g%c", source, k->key, x,
                        k->min_open ? '(' : '[', k->min, k->max, k->max_open ? ')' : ']');
    return QD_OK;
}

/* A name that is used as a path component must be one: no separator, no
 * "." or "..", nothing a shell or a file system treats specially. */
static qd_status check_name(const qd_cfg_knob *k, const char *s, const char *source)
{
    bool ok = strcmp(s, ".") != 0 && strcmp(s, "..") != 0 && strlen(s) <= 200;
    for (const char *p = s; ok && *p; p++)
        ok = (*p >= 'a' && *p <= 'z') || (*p >= 'A' && *p <= 'Z') || (*p >= '0' && *p <= '9') || *p == '-' ||
             *p == '_' || *p == '.';
    if (!ok)
        return qd_error(QD_ERR_ARG, "%s: %s: '%s' is not a plain name (letters, digits, '-', '_' and '.', at most "
                                    "200, not '.' or '..'; put a path in run.dir)", source, k->key, s);
    return QD_OK;
}

static bool in_choices(const char *choices, const char *s)
{
    size_t n = strlen(s);
    for (const char *p = choices; p; p = strchr(p, '|'), p = p ? p + 1 : NULL)
        if (strncmp(p, s, n) == 0 && (p[n] == '|' || p[n] == '\0'))
            return n > 0;
    return false;
}

static qd_status set_string(qd_config *cfg, size_t i, const char *s, const char *source)
{
    const qd_cfg_knob *k = &knobs[i];
    if (k->type == QD_CFG_ENUM && !in_choices(k->choices, s))
        return qd_error(QD_ERR_ARG, "%s: %s: '%s' is not one of %s", source, k->key, s, k->choices);
    qd_status st = k->name && *s ? check_name(k, s, source) : QD_OK;
    if (st)
        return st;
    char *copy = strdup(s), **v = slot(cfg, i);
    if (!copy)
        return qd_error(QD_ERR_NOMEM, "%s: %s", source, k->key);
    free(*v);
    *v = copy;
    return QD_OK;
}

static qd_status set_int(qd_config *cfg, size_t i, int64_t x, const char *source)
{
    qd_status st = check_range(&knobs[i], (double)x, source);
    if (st == QD_OK)
        *(int64_t *)slot(cfg, i) = x;
    return st;
}

static qd_status set_float(qd_config *cfg, size_t i, double x, const char *source)
{
    if (!isfinite(x))
        return qd_error(QD_ERR_ARG, "%s: %s: expected a finite number", source, knobs[i].key);
    qd_status st = check_range(&knobs[i], x, source);
    if (st == QD_OK)
        *(double *)slot(cfg, i) = x;
    return st;
}

static const char *type_name(qd_cfg_type t)
{
    static const char *const names[] = {"an integer", "a number", "a boolean", "a string", "a string"};
    return names[t];
}

static const char *json_type_name(const json_t *j)
{
    switch (json_typeof(j)) {
    case JSON_OBJECT: return "an object";
    case JSON_ARRAY: return "an array";
    case JSON_STRING: return "a string";
    case JSON_INTEGER: return "an integer";
    case JSON_REAL: return "a real number";
    case JSON_TRUE: case JSON_FALSE: return "a boolean";
    default: return "null";
    }
}

static qd_status set_json(qd_config *cfg, int i, const json_t *j, const char *source)
{
    const qd_cfg_knob *k = &knobs[i];
    bool ok = (k->type == QD_CFG_INT && json_is_integer(j)) || (k->type == QD_CFG_FLOAT && json_is_number(j)) ||
              (k->type == QD_CFG_BOOL && json_is_boolean(j)) ||
              ((k->type == QD_CFG_STRING || k->type == QD_CFG_ENUM) && json_is_string(j));
    if (!ok)
        return qd_error(QD_ERR_ARG, "%s: %s: expected %s, got %s", source, k->key, type_name(k->type),
                        json_type_name(j));
    switch (k->type) {
    case QD_CFG_INT: return set_int(cfg, (size_t)i, json_integer_value(j), source);
    case QD_CFG_FLOAT: return set_float(cfg, (size_t)i, json_number_value(j), source);
    case QD_CFG_BOOL: *(bool *)slot(cfg, (size_t)i) = json_is_true(j); return QD_OK;
    default: return set_string(cfg, (size_t)i, json_string_value(j), source);
    }
}

static qd_status parse_bool(bool *b, const char *s)
{
    if (strcmp(s, "true") == 0 || strcmp(s, "1") == 0)
        *b = true;
    else if (strcmp(s, "false") == 0 || strcmp(s, "0") == 0)
        *b = false;
    else
        return QD_ERR_ARG;
    return QD_OK;
}

qd_status qd_config_set_str(qd_config *cfg, const char *key, const char *s, const char *source)
{
    int i = find_knob(key);
    if (i < 0)
        return unknown_key(source, key);
    const qd_cfg_knob *k = &knobs[i];
    char *end = NULL;
    errno = 0;
    switch (k->type) {
    case QD_CFG_INT: {
        long long x = strtoll(s, &end, 10);
        if (*s == '\0' || *end != '\0' || errno == ERANGE)
            return qd_error(QD_ERR_ARG, "%s: %s: expected an integer, got '%s'", source, key, s);
        return set_int(cfg, (size_t)i, x, source);
    }
    case QD_CFG_FLOAT: {
        double x = strtod(s, &end);
        if (*s == '\0' || *end != '\0' || errno == ERANGE)
            return qd_error(QD_ERR_ARG, "%s: %s: expected a number, got '%s'", source, key, s);
        return set_float(cfg, (size_t)i, x, source);
    }
    case QD_CFG_BOOL:
        if (parse_bool(slot(cfg, (size_t)i), s) != QD_OK)
            return qd_error(QD_ERR_ARG, "%s: %s: expected true or false, got '%s'", source, key, s);
        return QD_OK;
    default:
        return set_string(cfg, (size_t)i, s, source);
    }
}

qd_status qd_config_set(qd_config *cfg, const char *assignment)
{
    const char *eq = strchr(assignment, '=');
    char key[256];
    if (!eq || eq == assignment || (size_t)(eq - assignment) >= sizeof key)
        return qd_error(QD_ERR_ARG, "--set: '%s': expected KEY=VALUE (e.g. trainer.lr=1e-6)", assignment);
    memcpy(key, assignment, (size_t)(eq - assignment));
    key[eq - assignment] = '\0';
    return qd_config_set_str(cfg, key, eq + 1, "--set");
}

/* Applies obj's members under prefix ("" at the top). */
static qd_status load_object(qd_config *cfg, const json_t *obj, const char *prefix, const char *source)
{
    const char *name;
    json_t *val;
    json_object_foreach((json_t *)obj, name, val) {
        char key[256];
        if (snprintf(key, sizeof key, "%s%s%s", prefix, *prefix ? "." : "", name) >= (int)sizeof key)
            return qd_error(QD_ERR_ARG, "%s: key too long: %.64s...", source, key);
        int i = find_knob(key);
        qd_status st;
        if (i >= 0)
            st = set_json(cfg, i, val, source);
        else if (is_section(key) && json_is_object(val))
            st = load_object(cfg, val, key, source);
        else if (is_section(key))
            st = qd_error(QD_ERR_ARG, "%s: %s: expected an object (a section), got %s", source, key,
                          json_type_name(val));
        else
            st = unknown_key(source, key);
        if (st != QD_OK)
            return st;
    }
    return QD_OK;
}

qd_status qd_config_load_json(qd_config *cfg, const json_t *obj, const char *source)
{
    if (!json_is_object(obj))
        return qd_error(QD_ERR_FORMAT, "%s: expected a JSON object at the top, got %s", source, json_type_name(obj));
    return load_object(cfg, obj, "", source);
}

qd_status qd_config_load_file(qd_config *cfg, const char *path)
{
    json_error_t err;
    FILE *f;
    qd_status st = qd_fopen_regular(path, &f);
    if (st)
        return st;
    json_t *root = json_loadf(f, JSON_REJECT_DUPLICATES, &err);
    fclose(f);
    if (!root)
        return qd_error(QD_ERR_FORMAT, "%s:%d:%d: malformed JSON: %s", path, err.line, err.column, err.text);
    st = qd_config_load_json(cfg, root, path);
    json_decref(root);
    return st;
}

qd_config *qd_config_new(void)
{
    qd_config *cfg = calloc(1, sizeof *cfg);
    for (size_t i = 0; cfg && i < N_KNOBS; i++) {
        if (qd_config_set_str(cfg, knobs[i].key, knobs[i].def, "defaults") != QD_OK) {
            qd_config_free(cfg);
            return NULL;
        }
    }
    return cfg;
}

void qd_config_free(qd_config *cfg)
{
    if (!cfg)
        return;
    for (size_t i = 0; i < N_KNOBS; i++)
        if (knobs[i].type == QD_CFG_STRING || knobs[i].type == QD_CFG_ENUM)
            free(*(char **)slot(cfg, i));
    free(cfg);
}

const qd_knobs *qd_config_knobs(const qd_config *cfg) { return &cfg->k; }

qd_config *qd_config_dup(const qd_config *cfg)
{
    qd_config *c = malloc(sizeof *c);
    if (!c)
        return NULL;
    *c = *cfg;
    bool ok = true;
    for (size_t i = 0; i < N_KNOBS; i++)
        if (knobs[i].type == QD_CFG_STRING || knobs[i].type == QD_CFG_ENUM) {
            char **v = slot(c, i);
            *v = ok ? strdup(*v) : NULL;
            ok = ok && *v;
        }
    if (!ok) {
        qd_config_free(c);
        return NULL;
    }
    return c;
}

/* The loop indexes a step's tokens and counts data positions and optimizer
 * steps in int and int64 arithmetic: the products of the knobs must stay
 * below these (2^30 tokens a step is ~5x the largest published RL batches). */
#define MAX_STEP_TOKENS 1073741824.0 /* 2^30 */
#define MAX_DATA_POS 281474976710656.0 /* 2^48, as checkpoints (ckpt.h) */
#define MAX_OPT_STEPS 1073741824.0   /* 2^30, as checkpoints */

qd_status qd_config_validate(const qd_config *cfg)
{
    const qd_knobs *k = &cfg->k;
    int64_t M = k->rollout.max_tokens, P = k->rollout.prompts_per_step, G = k->rollout.group_size;
    int64_t maxp = k->data.max_prompt_tokens;
    if (k->algo.overlong_buffer_len >= M)
        return qd_error(QD_ERR_ARG, "config: algo.overlong_buffer_len: %lld must be < rollout.max_tokens (%lld)",
                        (long long)k->algo.overlong_buffer_len, (long long)M);
    if (P % k->trainer.mini_batches != 0)
        return qd_error(QD_ERR_ARG,
                        "config: trainer.mini_batches: %lld does not divide rollout.prompts_per_step (%lld)",
                        (long long)k->trainer.mini_batches, (long long)P);
    const char *dates[2][2] = {{"data.from", k->data.from}, {"data.to", k->data.to}};
    for (int i = 0; i < 2; i++)
        if (*dates[i][1] && !qd_bench_date_ok(dates[i][1]))
            return qd_error(QD_ERR_ARG, "config: %s: '%s': expected a date YYYY-MM-DD or empty", dates[i][0],
                            dates[i][1]);
    if (*k->data.from && *k->data.to && strcmp(k->data.from, k->data.to) > 0)
        return qd_error(QD_ERR_ARG, "config: data.from: %s is after data.to %s", k->data.from, k->data.to);
    if (!strcmp(k->rollout.mode, "fast") && !strcmp(k->rollout.backend, "cpu"))
        return qd_error(QD_ERR_ARG, "config: rollout.mode: fast needs rollout.backend cuda or auto (the cpu "
                                    "backend runs exact mode only)");
    double tokens = (double)P * (double)G * (double)(maxp + M);
    if (tokens > MAX_STEP_TOKENS)
        return qd_error(QD_ERR_ARG, "config: rollout.prompts_per_step %lld x rollout.group_size %lld x "
                                    "(data.max_prompt_tokens %lld + rollout.max_tokens %lld) = %.4g tokens a step, "
                                    "more than 2^30: lower one of them", (long long)P, (long long)G, (long long)maxp,
                        (long long)M, tokens);
    double micro = (double)k->trainer.micro_batch * (double)(maxp + M);
    if (micro > MAX_STEP_TOKENS)
        return qd_error(QD_ERR_ARG, "config: trainer.micro_batch %lld x (data.max_prompt_tokens %lld + "
                                    "rollout.max_tokens %lld) = %.4g tokens a pass, more than 2^30",
                        (long long)k->trainer.micro_batch, (long long)maxp, (long long)M, micro);
    double pos = (double)k->run.steps * (double)P * (double)k->algo.max_gen_batches;
    if (pos > MAX_DATA_POS)
        return qd_error(QD_ERR_ARG, "config: run.steps %lld x rollout.prompts_per_step %lld x algo.max_gen_batches "
                                    "%lld = %.4g prompts, more than 2^48", (long long)k->run.steps, (long long)P,
                        (long long)k->algo.max_gen_batches, pos);
    double opt = (double)k->run.steps * (double)k->trainer.mini_batches;
    if (opt > MAX_OPT_STEPS)
        return qd_error(QD_ERR_ARG, "config: run.steps %lld x trainer.mini_batches %lld = %.4g optimizer steps, "
                                    "more than 2^30", (long long)k->run.steps, (long long)k->trainer.mini_batches, opt);
    return QD_OK;
}

static json_t *knob_json(const qd_config *cfg, size_t i)
{
    const void *v = cslot(cfg, i);
    switch (knobs[i].type) {
    case QD_CFG_INT: return json_integer(*(const int64_t *)v);
    case QD_CFG_FLOAT: return json_real(*(const double *)v);
    case QD_CFG_BOOL: return json_boolean(*(const bool *)v);
    default: return json_string(*(const char *const *)v);
    }
}

/* Sets root[section][name] = val (stolen), creating the section object. */
static int put_dotted(json_t *root, const char *key, json_t *val)
{
    const char *dot = strchr(key, '.');
    char section[64];
    snprintf(section, sizeof section, "%.*s", (int)(dot - key), key);
    json_t *sec = json_object_get(root, section);
    if (!sec && json_object_set_new(root, section, sec = json_object()) != 0)
        return json_decref(val), -1;
    return json_object_set_new(sec, dot + 1, val);
}

json_t *qd_config_to_json(const qd_config *cfg)
{
    json_t *root = json_object();
    for (size_t i = 0; root && i < N_KNOBS; i++) {
        json_t *val = knob_json(cfg, i);
        if (!val || put_dotted(root, knobs[i].key, val) != 0) {
            json_decref(root);
            return NULL;
        }
    }
    return root;
}

json_t *qd_config_schema_json(void)
{
    json_t *root = json_object();
    qd_config *defaults = qd_config_new();
    static const char *const types[] = {"int", "float", "bool", "string", "enum"};
    for (size_t i = 0; root && defaults && i < N_KNOBS; i++) {
        const qd_cfg_knob *k = &knobs[i];
        json_t *o = json_pack("{s:s, s:o, s:s}", "type", types[k->type], "default", knob_json(defaults, i),
                              "doc", k->doc);
        if (o && (k->type == QD_CFG_INT || k->type == QD_CFG_FLOAT)) {
            json_object_set_new(o, "min", json_real(k->min));
            json_object_set_new(o, "max", json_real(k->max));
            json_object_set_new(o, "min_exclusive", json_boolean(k->min_open));
            json_object_set_new(o, "max_exclusive", json_boolean(k->max_open));
        }
        if (o && k->type == QD_CFG_ENUM)
            json_object_set_new(o, "choices", json_string(k->choices));
        if (!o || json_object_set_new(root, k->key, o) != 0) {
            json_decref(root);
            root = NULL;
        }
    }
    qd_config_free(defaults);
    return root;
}

/* The shortest %g text of x that reads back as x, with ".0" when it would read
 * as an integer (so 1e-5 is written "1e-05", not "1.0000000000000001e-05"). */
static void format_real(char *buf, size_t n, double x)
{
    for (int prec = 1; prec <= 17; prec++) {
        snprintf(buf, n, "%.*g", prec, x);
        if (strtod(buf, NULL) == x)
            break;
    }
    if (strcspn(buf, ".en") == strlen(buf))
        strncat(buf, ".0", n - strlen(buf) - 1);
}

/* One knob's value as JSON text (strings escaped by jansson); NULL on out of memory. */
static char *value_text(const qd_config *cfg, size_t i)
{
    char buf[64];
    const void *v = cslot(cfg, i);
    switch (knobs[i].type) {
    case QD_CFG_INT: snprintf(buf, sizeof buf, "%lld", (long long)*(const int64_t *)v); return strdup(buf);
    case QD_CFG_FLOAT: format_real(buf, sizeof buf, *(const double *)v); return strdup(buf);
    case QD_CFG_BOOL: return strdup(*(const bool *)v ? "true" : "false");
    default: {
        json_t *j = json_string(*(const char *const *)v);
        char *text = j ? json_dumps(j, JSON_ENCODE_ANY) : NULL;
        json_decref(j);
        return text;
    }
    }
}

/* Writes the resolved config to f as indented JSON, sections in schema order
 * (a qd_fill_fn: write errors are caught by qd_atomic_write_with). */
static qd_status write_config(FILE *f, const char *path, void *ctx)
{
    const qd_config *cfg = ctx;
    fputs("{", f);
    for (size_t i = 0; i < N_KNOBS; i++) {
        const char *dot = strchr(knobs[i].key, '.');
        int sec_len = (int)(dot - knobs[i].key);
        int new_section = i == 0 || strncmp(knobs[i - 1].key, knobs[i].key, (size_t)sec_len + 1) != 0;
        char *val = value_text(cfg, i);
        if (!val)
            return qd_error(QD_ERR_NOMEM, "%s: serializing config", path);
        if (new_section)
            fprintf(f, "%s\n  \"%.*s\": {\n", i ? "\n  }," : "", sec_len, knobs[i].key);
        else
            fputs(",\n", f);
        fprintf(f, "    \"%s\": %s", dot + 1, val);
        free(val);
    }
    fputs("\n  }\n}\n", f);
    return QD_OK;
}

qd_status qd_config_save(const qd_config *cfg, const char *path)
{
    return qd_atomic_write_with(path, write_config, (void *)cfg);
}

void qd_config_derive(const qd_config *cfg, qd_config_batch *b)
{
    const qd_knobs *k = &cfg->k;
    int64_t resp = k->rollout.max_tokens, micro = k->trainer.micro_batch;
    *b = (qd_config_batch){
        .prompts = k->rollout.prompts_per_step,
        .samples = k->rollout.prompts_per_step * k->rollout.group_size,
        .optimizer_steps = k->trainer.mini_batches,
    };
    b->max_response_tokens = b->samples * resp;
    b->max_tokens = b->samples * (k->data.max_prompt_tokens + resp);
    b->micro_batches = (b->samples + micro - 1) / micro;
}

int qd_config_summary(const qd_config *cfg, char *buf, size_t n)
{
    const qd_knobs *k = &cfg->k;
    qd_config_batch b;
    qd_config_derive(cfg, &b);
    return snprintf(buf, n,
                    "run %s: %lld steps, seed %lld\n"
                    "model %s, recipe %s, backend %s (%s)\n"
                    "algo %s, clip [%g, %g], loss %s, kl %g, tis %s\n"
                    "a step: %lld prompts x %lld = %lld samples, <= %lld response tokens (<= %lld with prompts), "
                    "%lld micro-batches, %lld optimizer updates\n",
                    k->run.name, (long long)k->run.steps, (long long)k->run.seed,
                    *k->model.path ? k->model.path : "(embedded tiny)", k->rollout.recipe, k->rollout.backend,
                    k->rollout.mode, k->algo.advantage, 1.0 - k->algo.clip_low, 1.0 + k->algo.clip_high,
                    k->algo.loss_agg, k->algo.kl_coef, k->algo.tis, (long long)b.prompts,
                    (long long)k->rollout.group_size, (long long)b.samples, (long long)b.max_response_tokens,
                    (long long)b.max_tokens, (long long)b.micro_batches, (long long)b.optimizer_steps);
}
