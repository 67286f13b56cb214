/* The knob table, loading (JSON file, --set) with typed validation, getters,
 * the JSON dump and the derived batch numbers. */
#define _GNU_SOURCE
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "orchestrator/rl_config.h"
#include "quant/fileio.h"

#define BIG 1e9 /* upper bound for counts: large enough for any run, small enough to catch typos */
#define RECIPES "bf16|fp8|nvfp4|nvfp4-aqat|nvfp4-rac|quads|nvfp4-sym-qat"

/* Every knob. Defaults are written as their --set text so that they go through
 * the same parser and range checks as user values (a test checks that). */
static const qd_cfg_knob knobs[] = {
    {"run.name", QD_CFG_STRING, "quads", 0, 0, 0, NULL, "run name; the run directory defaults to ./runs/NAME"},
    {"run.dir", QD_CFG_STRING, "", 0, 0, 0, NULL, "run directory; empty means ./runs/<run.name>"},
    {"run.seed", QD_CFG_INT, "1", 0, 2147483647, 0, NULL, "seed of data order, sampling and initialization"},
    {"run.steps", QD_CFG_INT, "150", 1, BIG, 0, NULL, "RL steps (one rollout batch and its optimizer updates each)"},
    {"run.threads", QD_CFG_INT, "0", 0, 4096, 0, NULL, "OpenMP threads of the CPU backend; 0 = all cores"},
    {"model.path", QD_CFG_STRING, "", 0, 0, 0, NULL, "Hugging Face model directory; empty means the embedded tiny model"},
    {"rollout.recipe", QD_CFG_ENUM, "quads", 0, 0, 0, RECIPES, "precision recipe of rollout and trainer (ARCHITECTURE.md)"},
    {"rollout.backend", QD_CFG_ENUM, "auto", 0, 0, 0, "auto|cpu|cuda",
     "backend of both instances; auto = CUDA if present, else CPU (quads rl --backend)"},
    {"rollout.mode", QD_CFG_ENUM, "exact", 0, 0, 0, "exact|fast",
     "mode of both instances: exact (the CPU's bits) or fast kernels, CUDA only (NUMERICS.md §7; quads rl --mode)"},
    {"rollout.temperature", QD_CFG_FLOAT, "1.0", 0, 100, 1, NULL, "sampling temperature of the rollout"},
    {"rollout.top_p", QD_CFG_FLOAT, "1.0", 0, 1, 1, NULL, "nucleus sampling mass; 1 = off"},
    {"rollout.top_k", QD_CFG_INT, "0", 0, BIG, 0, NULL, "sample among the k most likely tokens; 0 = off"},
    {"rollout.max_tokens", QD_CFG_INT, "8", 1, BIG, 0, NULL, "maximum response length in tokens (the tiny model's answers take at most 6)"},
    {"rollout.group_size", QD_CFG_INT, "8", 2, 4096, 0, NULL, "G: completions per prompt (>= 2: a group of one has no baseline)"},
    {"rollout.prompts_per_step", QD_CFG_INT, "8", 1, BIG, 0, NULL, "prompts per RL step"},
    {"trainer.lr", QD_CFG_FLOAT, "1e-4", 0, 1, 0, NULL, "AdamW peak learning rate"},
    {"trainer.lr_schedule", QD_CFG_ENUM, "constant", 0, 0, 0, "constant|cosine|linear", "learning rate after warmup"},
    {"trainer.min_lr_ratio", QD_CFG_FLOAT, "0.0", 0, 1, 0, NULL, "final lr / peak lr of the cosine and linear schedules"},
    {"trainer.warmup_steps", QD_CFG_INT, "0", 0, BIG, 0, NULL, "linear warmup from 0 over this many optimizer steps"},
    {"trainer.weight_decay", QD_CFG_FLOAT, "0.01", 0, 1, 0, NULL, "AdamW decoupled weight decay"},
    {"trainer.beta1", QD_CFG_FLOAT, "0.9", 0, 1, 0, NULL, "AdamW beta1"},
    {"trainer.beta2", QD_CFG_FLOAT, "0.999", 0, 1, 0, NULL, "AdamW beta2"},
    {"trainer.eps", QD_CFG_FLOAT, "1e-8", 0, 1, 1, NULL, "AdamW epsilon"},
    {"trainer.grad_clip", QD_CFG_FLOAT, "1.0", 0, 1e9, 0, NULL, "clip the global gradient norm to this; 0 = off"},
    {"trainer.micro_batch", QD_CFG_INT, "8", 1, BIG, 0, NULL, "sequences per forward/backward pass"},
    {"trainer.mini_batches", QD_CFG_INT, "1", 1, 4096, 0, NULL, "optimizer updates per RL step (the batch split by prompts)"},
    {"algo.advantage", QD_CFG_ENUM, "grpo", 0, 0, 0, "grpo|dr_grpo", "grpo: (r - mean)/(std + eps); dr_grpo: r - mean"},
    {"algo.adv_eps", QD_CFG_FLOAT, "1e-6", 0, 1, 0, NULL, "eps added to the group std"},
    {"algo.clip_low", QD_CFG_FLOAT, "0.2", 0, 1, 0, NULL, "PPO ratio lower clip: 1 - clip_low"},
    {"algo.clip_high", QD_CFG_FLOAT, "0.28", 0, 100, 0, NULL, "PPO ratio upper clip: 1 + clip_high (DAPO clip-higher)"},
    {"algo.loss_agg", QD_CFG_ENUM, "token_mean", 0, 0, 0, "token_mean|seq_mean_token_sum|seq_mean_token_mean",
     "how token losses become the batch loss (token_mean as DAPO)"},
    {"algo.kl_coef", QD_CFG_FLOAT, "0.0", 0, 100, 0, NULL, "weight of the KL penalty to the reference; 0 = off"},
    {"algo.kl_type", QD_CFG_ENUM, "k3", 0, 0, 0, "k1|k2|k3", "KL estimator (Schulman's k1, k2, k3)"},
    {"algo.dynamic_sampling", QD_CFG_BOOL, "false", 0, 0, 0, NULL, "drop groups whose samples are all right or all wrong (DAPO)"},
    {"algo.max_gen_batches", QD_CFG_INT, "4", 1, 1000, 0, NULL, "rollout batches tried to fill a step under dynamic sampling"},
    {"algo.overlong_buffer_len", QD_CFG_INT, "0", 0, BIG, 0, NULL, "DAPO soft overlong punishment window in tokens; 0 = off"},
    {"algo.overlong_penalty", QD_CFG_FLOAT, "1.0", 0, 100, 0, NULL, "penalty at and beyond rollout.max_tokens"},
    {"algo.tis", QD_CFG_ENUM, "none", 0, 0, 0, "none|tis|masked",
     "rollout-trainer importance weights: truncated (tis) or masked above the cap"},
    {"algo.tis_cap", QD_CFG_FLOAT, "2.0", 1, 1e6, 0, NULL, "C: cap of the token importance weight"},
    {"rac.ratio", QD_CFG_FLOAT, "0.25", 0, 1, 0, NULL,
     "fraction of input channels RAC augments (rounded down to 16s: on 64-wide layers below 0.25 none)"},
    {"rac.refresh", QD_CFG_INT, "1", 0, BIG, 0, NULL, "re-pick RAC channels every N weight syncs; 0 = never"},
    {"data.task", QD_CFG_STRING, "arith", 0, 0, 0, NULL, "training task: a built-in synthetic task or a benchmark name"},
    {"data.benchmark", QD_CFG_STRING, "", 0, 0, 0, NULL, "held-out eval set; empty = the task's held-out split"},
    {"data.max_prompt_tokens", QD_CFG_INT, "128", 1, BIG, 0, NULL, "prompts longer than this are skipped"},
    {"data.shuffle", QD_CFG_BOOL, "true", 0, 0, 0, NULL, "shuffle the training prompts each epoch (seeded)"},
    {"eval.every", QD_CFG_INT, "50", 0, BIG, 0, NULL, "held-out eval every N steps (and before and after); 0 = off"},
    {"eval.samples", QD_CFG_INT, "1", 1, 4096, 0, NULL, "completions per eval prompt (pass@1 averaged over them)"},
    {"eval.limit", QD_CFG_INT, "256", 0, BIG, 0, NULL, "eval prompts; 0 = all"},
    {"eval.seed", QD_CFG_INT, "1", 0, 2147483647, 0, NULL,
     "seed of the held-out problems and of eval sampling (not run.seed: every run is graded on the same set)"},
    {"eval.precision", QD_CFG_ENUM, "rollout", 0, 0, 0, "rollout|trainer",
     "held-out eval on the rollout instance (the recipe's inference numerics) or on the trainer"},
    {"eval.temperature", QD_CFG_FLOAT, "0.0", 0, 100, 0, NULL, "eval sampling temperature; 0 = greedy"},
    {"checkpoint.every", QD_CFG_INT, "10", 0, BIG, 0, NULL, "checkpoint every N steps; 0 = only at the end"},
    {"checkpoint.keep_last", QD_CFG_INT, "2", 1, 1000, 0, NULL, "checkpoints kept (older step_XXXXXXXX removed)"},
    {"dist.checksum_every", QD_CFG_INT, "10", 0, BIG, 0, NULL,
     "data parallel: compare a checksum of the master weights across ranks every N steps (and at the last); 0 = off"},
    {"dist.timeout_s", QD_CFG_FLOAT, "1800", 0, 1e6, 1, NULL,
     "data parallel: seconds a rank waits for the others in a collective (must exceed rank 0's eval and "
     "checkpoint time and any rollout imbalance)"},
};
#define N_KNOBS (sizeof knobs / sizeof knobs[0])

typedef struct {
    int64_t i;
    double f;
    bool b;
    char *s; /* STRING and ENUM, owned */
} value;

struct qd_config {
    value v[N_KNOBS];
};

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
    bool low = k->min_open ? x <= k->min : x < k->min;
    if (low || x > k->max)
        return qd_error(QD_ERR_ARG, "%s: %s: %.17g is out of range %c%.17g, %.17g]", source, k->key, x,
                        k->min_open ? '(' : '[', k->min, k->max);
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

static qd_status set_string(value *v, const qd_cfg_knob *k, const char *s, const char *source)
{
    if (k->type == QD_CFG_ENUM && !in_choices(k->choices, s))
        return qd_error(QD_ERR_ARG, "%s: %s: '%s' is not one of %s", source, k->key, s, k->choices);
    char *copy = strdup(s);
    if (!copy)
        return qd_error(QD_ERR_NOMEM, "%s: %s", source, k->key);
    free(v->s);
    v->s = copy;
    return QD_OK;
}

static qd_status set_int(value *v, const qd_cfg_knob *k, int64_t x, const char *source)
{
    qd_status st = check_range(k, (double)x, source);
    if (st == QD_OK)
        v->i = x;
    return st;
}

static qd_status set_float(value *v, const qd_cfg_knob *k, double x, const char *source)
{
    if (!isfinite(x))
        return qd_error(QD_ERR_ARG, "%s: %s: expected a finite number", source, k->key);
    qd_status st = check_range(k, x, source);
    if (st == QD_OK)
        v->f = x;
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
    value *v = &cfg->v[i];
    bool ok = (k->type == QD_CFG_INT && json_is_integer(j)) || (k->type == QD_CFG_FLOAT && json_is_number(j)) ||
              (k->type == QD_CFG_BOOL && json_is_boolean(j)) ||
              ((k->type == QD_CFG_STRING || k->type == QD_CFG_ENUM) && json_is_string(j));
    if (!ok)
        return qd_error(QD_ERR_ARG, "%s: %s: expected %s, got %s", source, k->key, type_name(k->type),
                        json_type_name(j));
    switch (k->type) {
    case QD_CFG_INT: return set_int(v, k, json_integer_value(j), source);
    case QD_CFG_FLOAT: return set_float(v, k, json_number_value(j), source);
    case QD_CFG_BOOL: v->b = json_is_true(j); return QD_OK;
    default: return set_string(v, k, json_string_value(j), source);
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
    value *v = &cfg->v[i];
    char *end = NULL;
    errno = 0;
    switch (k->type) {
    case QD_CFG_INT: {
        long long x = strtoll(s, &end, 10);
        if (*s == '\0' || *end != '\0' || errno == ERANGE)
            return qd_error(QD_ERR_ARG, "%s: %s: expected an integer, got '%s'", source, key, s);
        return set_int(v, k, x, source);
    }
    case QD_CFG_FLOAT: {
        double x = strtod(s, &end);
        if (*s == '\0' || *end != '\0' || errno == ERANGE)
            return qd_error(QD_ERR_ARG, "%s: %s: expected a number, got '%s'", source, key, s);
        return set_float(v, k, x, source);
    }
    case QD_CFG_BOOL:
        if (parse_bool(&v->b, s) != QD_OK)
            return qd_error(QD_ERR_ARG, "%s: %s: expected true or false, got '%s'", source, key, s);
        return QD_OK;
    default:
        return set_string(v, k, s, source);
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
        free(cfg->v[i].s);
    free(cfg);
}

/* The value of key, aborting if it is not a knob of type t (ENUM reads as STRING). */
static const value *get(const qd_config *cfg, const char *key, qd_cfg_type t)
{
    int i = find_knob(key);
    qd_cfg_type kt = i < 0 ? t : knobs[i].type == QD_CFG_ENUM ? QD_CFG_STRING : knobs[i].type;
    if (i < 0 || kt != t) {
        fprintf(stderr, "qd_config: %s: %s\n", key, i < 0 ? "no such knob" : "read with the wrong type");
        abort();
    }
    return &cfg->v[i];
}

int64_t qd_config_int(const qd_config *cfg, const char *key) { return get(cfg, key, QD_CFG_INT)->i; }
double qd_config_float(const qd_config *cfg, const char *key) { return get(cfg, key, QD_CFG_FLOAT)->f; }
bool qd_config_bool(const qd_config *cfg, const char *key) { return get(cfg, key, QD_CFG_BOOL)->b; }
const char *qd_config_str(const qd_config *cfg, const char *key) { return get(cfg, key, QD_CFG_STRING)->s; }

qd_status qd_config_validate(const qd_config *cfg)
{
    int64_t max_tokens = qd_config_int(cfg, "rollout.max_tokens");
    int64_t buffer = qd_config_int(cfg, "algo.overlong_buffer_len");
    int64_t prompts = qd_config_int(cfg, "rollout.prompts_per_step");
    int64_t minis = qd_config_int(cfg, "trainer.mini_batches");
    if (buffer >= max_tokens)
        return qd_error(QD_ERR_ARG, "config: algo.overlong_buffer_len: %lld must be < rollout.max_tokens (%lld)",
                        (long long)buffer, (long long)max_tokens);
    if (prompts % minis != 0)
        return qd_error(QD_ERR_ARG,
                        "config: trainer.mini_batches: %lld does not divide rollout.prompts_per_step (%lld)",
                        (long long)minis, (long long)prompts);
    if (!strcmp(qd_config_str(cfg, "rollout.mode"), "fast") && !strcmp(qd_config_str(cfg, "rollout.backend"), "cpu"))
        return qd_error(QD_ERR_ARG, "config: rollout.mode: fast needs rollout.backend cuda or auto (the cpu "
                                    "backend runs exact mode only)");
    return QD_OK;
}

static json_t *knob_json(const qd_config *cfg, size_t i)
{
    const value *v = &cfg->v[i];
    switch (knobs[i].type) {
    case QD_CFG_INT: return json_integer(v->i);
    case QD_CFG_FLOAT: return json_real(v->f);
    case QD_CFG_BOOL: return json_boolean(v->b);
    default: return json_string(v->s);
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
    const value *v = &cfg->v[i];
    switch (knobs[i].type) {
    case QD_CFG_INT: snprintf(buf, sizeof buf, "%lld", (long long)v->i); return strdup(buf);
    case QD_CFG_FLOAT: format_real(buf, sizeof buf, v->f); return strdup(buf);
    case QD_CFG_BOOL: return strdup(v->b ? "true" : "false");
    default: {
        json_t *j = json_string(v->s);
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
    int64_t G = qd_config_int(cfg, "rollout.group_size");
    int64_t resp = qd_config_int(cfg, "rollout.max_tokens");
    int64_t micro = qd_config_int(cfg, "trainer.micro_batch");
    b->prompts = qd_config_int(cfg, "rollout.prompts_per_step");
    b->samples = b->prompts * G;
    b->max_response_tokens = b->samples * resp;
    b->max_tokens = b->samples * (qd_config_int(cfg, "data.max_prompt_tokens") + resp);
    b->micro_batches = (b->samples + micro - 1) / micro;
    b->optimizer_steps = qd_config_int(cfg, "trainer.mini_batches");
}

int qd_config_summary(const qd_config *cfg, char *buf, size_t n)
{
    qd_config_batch b;
    qd_config_derive(cfg, &b);
    const char *model = qd_config_str(cfg, "model.path");
    return snprintf(buf, n,
                    "run %s: %lld steps, seed %lld\n"
                    "model %s, recipe %s, backend %s (%s)\n"
                    "algo %s, clip [%g, %g], loss %s, kl %g, tis %s\n"
                    "a step: %lld prompts x %lld = %lld samples, <= %lld response tokens (<= %lld with prompts), "
                    "%lld micro-batches, %lld optimizer updates\n",
                    qd_config_str(cfg, "run.name"), (long long)qd_config_int(cfg, "run.steps"),
                    (long long)qd_config_int(cfg, "run.seed"), *model ? model : "(embedded tiny)",
                    qd_config_str(cfg, "rollout.recipe"), qd_config_str(cfg, "rollout.backend"),
                    qd_config_str(cfg, "rollout.mode"), qd_config_str(cfg, "algo.advantage"),
                    1.0 - qd_config_float(cfg, "algo.clip_low"), 1.0 + qd_config_float(cfg, "algo.clip_high"),
                    qd_config_str(cfg, "algo.loss_agg"), qd_config_float(cfg, "algo.kl_coef"),
                    qd_config_str(cfg, "algo.tis"), (long long)b.prompts,
                    (long long)qd_config_int(cfg, "rollout.group_size"), (long long)b.samples,
                    (long long)b.max_response_tokens, (long long)b.max_tokens, (long long)b.micro_batches,
                    (long long)b.optimizer_steps);
}
