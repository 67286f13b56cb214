/* The run configuration: one table of every knob (dotted key, type, default,
 * range or allowed values, one-line doc), a JSON file loaded over the
 * defaults, `--set a.b=value` overrides, and the resolved config dumped as JSON
 * (RUN/config.json). Unknown keys, wrong types and out-of-range values are
 * errors whose message names the source (file name or "--set") and the key.
 * The values are read as a typed struct (qd_config_knobs): a misspelled knob
 * in code is a compile error, not a lookup that fails at run time. */
#ifndef QD_RL_CONFIG_H
#define QD_RL_CONFIG_H
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <jansson.h>
#include "quant/status.h"

typedef enum { QD_CFG_INT, QD_CFG_FLOAT, QD_CFG_BOOL, QD_CFG_STRING, QD_CFG_ENUM } qd_cfg_type;

/* Every knob's value, by section (strings and enums owned by the config). */
typedef struct {
    struct {
        const char *name, *dir;
        int64_t seed, steps, threads;
    } run;
    struct {
        const char *path;
    } model;
    struct {
        const char *recipe, *backend, *mode;
        double temperature, top_p;
        int64_t top_k, max_tokens, group_size, prompts_per_step;
    } rollout;
    struct {
        double lr;
        const char *lr_schedule;
        double min_lr_ratio;
        int64_t warmup_steps;
        double weight_decay, beta1, beta2, eps, grad_clip;
        int64_t micro_batch, mini_batches;
        bool recompute;
    } trainer;
    struct {
        const char *advantage;
        double adv_eps, clip_low, clip_high;
        const char *loss_agg;
        double kl_coef;
        const char *kl_type;
        bool dynamic_sampling;
        int64_t max_gen_batches, overlong_buffer_len;
        double overlong_penalty;
        const char *tis;
        double tis_cap;
    } algo;
    struct {
        double ratio;
        int64_t refresh;
    } rac;
    struct {
        const char *task, *benchmark, *from, *to;
        int64_t max_prompt_tokens;
        bool shuffle;
    } data;
    struct {
        int64_t code_jobs, code_memory_mb;
        double code_timeout_s;
    } reward;
    struct {
        int64_t every, samples, limit, seed;
        const char *precision;
        double temperature;
        bool bf16;
    } eval;
    struct {
        int64_t every, keep_last;
    } checkpoint;
    struct {
        bool tensorboard;
    } log;
    struct {
        int64_t checksum_every;
        double timeout_s;
    } dist;
} qd_knobs;

/* One knob. Ranges are inclusive; min_open (max_open) makes min (max)
 * exclusive. choices is a '|'-separated list for QD_CFG_ENUM; name makes a
 * STRING a plain name (letters, digits, '-', '_', '.'; not "." or ".."). */
typedef struct {
    const char *key;     /* "section.name" */
    qd_cfg_type type;
    size_t off;          /* where the value lives in qd_knobs */
    const char *def;     /* default, written as a --set value would be */
    double min, max;     /* INT and FLOAT only */
    bool min_open, max_open;
    const char *choices; /* ENUM only */
    bool name;           /* STRING only */
    const char *doc;
} qd_cfg_knob;

typedef struct qd_config qd_config;

/* The schema table (every knob, in documentation order) and its length. */
const qd_cfg_knob *qd_config_schema(size_t *n);
/* The schema as JSON: {"key": {"type", "default", "min", "max", "choices", "doc"}}
 * (new reference). */
json_t *qd_config_schema_json(void);

/* A config holding every default (NULL on out of memory). Free with qd_config_free. */
qd_config *qd_config_new(void);
void qd_config_free(qd_config *cfg);

/* Reads a JSON object from path over cfg. Sections nest ({"trainer": {"lr": 1e-6}});
 * a dotted name at any level is accepted too ({"trainer.lr": 1e-6}). On error cfg
 * may hold part of the file's values; messages read "PATH: KEY: ...". */
qd_status qd_config_load_file(qd_config *cfg, const char *path);
/* Applies the members of a JSON object; source names it in messages. */
qd_status qd_config_load_json(qd_config *cfg, const json_t *obj, const char *source);
/* Applies one "a.b=value" override, value parsed per the key's type
 * (messages read "--set: KEY: ..."). */
qd_status qd_config_set(qd_config *cfg, const char *assignment);
/* Sets key from its text form; source names the origin in messages. */
qd_status qd_config_set_str(qd_config *cfg, const char *key, const char *value, const char *source);
/* Checks rules that span several knobs (e.g. the overlong buffer must fit in
 * rollout.max_tokens; the batch of a step and the counters of a run must fit
 * the int arithmetic of the loop). Call after the last load/set. */
qd_status qd_config_validate(const qd_config *cfg);

/* The values (owned by cfg; a string is valid until its key is set again). */
const qd_knobs *qd_config_knobs(const qd_config *cfg);
/* A copy of cfg (NULL on out of memory). */
qd_config *qd_config_dup(const qd_config *cfg);

/* The resolved config as nested JSON objects (new reference; NULL on out of memory). */
json_t *qd_config_to_json(const qd_config *cfg);
/* Writes the resolved config to path atomically (indented JSON, trailing newline). */
qd_status qd_config_save(const qd_config *cfg, const char *path);

/* The batch numbers a config implies for one RL step. */
typedef struct {
    int64_t prompts;           /* rollout.prompts_per_step */
    int64_t samples;           /* prompts * rollout.group_size */
    int64_t max_response_tokens; /* samples * rollout.max_tokens: the generation bound */
    int64_t max_tokens;        /* samples * (data.max_prompt_tokens + rollout.max_tokens) */
    int64_t micro_batches;     /* forward/backward passes a step: ceil(samples / micro_batch) */
    int64_t optimizer_steps;   /* trainer.mini_batches */
} qd_config_batch;

void qd_config_derive(const qd_config *cfg, qd_config_batch *b);
/* A few human-readable lines (run, model, recipe, batch numbers) into buf;
 * returns the length snprintf would have written. */
int qd_config_summary(const qd_config *cfg, char *buf, size_t n);

#endif
