/* quads bench: the benchmark registry, its cache, and a look at any benchmark. */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <jansson.h>
#include "orchestrator/commands.h"
#include "benchmarks/registry.h"
#include "benchmarks/synth.h"

static void usage(FILE *f)
{
    fprintf(f,
        "usage: quads bench list [--verbose]\n"
        "       quads bench fetch [--offline] NAME...\n"
        "       quads bench show [--offline] [--limit N] [--from YYYY-MM-DD] [--to YYYY-MM-DD] NAME\n"
        "       quads bench show [--offline] [--limit N] (--file PATH | --url URL)\n"
        "                        [--field KEY=FIELD]... [--style plain|gsm8k|boxed|set|code]\n"
        "       quads bench show [--limit N] [--split train|test] [--seed S] [--count N] SYNTHETIC\n\n"
        "  KEY is problem, answer, solution or id; FIELD a field path such as prompt.0.content\n"
        "  (empty: none, e.g. --field problem= for an answer key).\n"
        "  Files are JSON arrays, JSONL (whatever the extension) or CSV with a header.\n"
        "Environment: QUADS_CACHE (default ~/.cache/quads), QUADS_OFFLINE=1,\n"
        "  HF_ENDPOINT (default https://huggingface.co),\n"
        "  HF_DATASETS_SERVER (default https://datasets-server.huggingface.co).\n");
}

static int fail(void)
{
    fprintf(stderr, "quads bench: %s\n", qd_last_error());
    return 1;
}

static const char *source_name(const qd_bench_info *b)
{
    return b->source == QD_SRC_FILE ? "file" : b->source == QD_SRC_ROWS ? "rows" : "synthetic";
}

static int cmd_list(int argc, char **argv)
{
    int verbose = argc > 1 && (!strcmp(argv[1], "-v") || !strcmp(argv[1], "--verbose"));
    size_t n;
    const qd_bench_info *r = qd_bench_registry(&n);
    printf("%-14s %-9s %-6s %-7s %-7s %s\n", "NAME", "SOURCE", "ROWS", "SHA256", "CACHED", "LOCATION");
    for (size_t i = 0; i < n; i++) {
        const qd_bench_info *b = &r[i];
        char path[4096], loc[512], rows[24] = "-";
        struct stat sb;
        int cached = b->source != QD_SRC_SYNTH && qd_bench_cache_path(b, path, sizeof path) == QD_OK && !stat(path, &sb);
        if (b->rows)
            snprintf(rows, sizeof rows, "%zu", b->rows);
        if (b->source == QD_SRC_FILE && b->parts)
            snprintf(loc, sizeof loc, "%s@%.12s:%s..%s", b->repo, b->revision, b->parts[0], b->parts[b->nparts - 1]);
        else if (b->source == QD_SRC_FILE)
            snprintf(loc, sizeof loc, "%s@%.12s:%s", b->repo, b->revision, b->path);
        else if (b->source == QD_SRC_ROWS)
            snprintf(loc, sizeof loc, "%s [%s/%s]", b->repo, b->config, b->split);
        else
            snprintf(loc, sizeof loc, "%s", b->title);
        printf("%-14s %-9s %-6s %-7s %-7s %s\n", b->name, source_name(b), rows,
               b->sha256 ? "pinned" : "-", b->source == QD_SRC_SYNTH ? "-" : cached ? "yes" : "no", loc);
        if (verbose)
            printf("%14s %s; answer field '%s' (%s); %s\n", "", b->title, b->fields.answer ? b->fields.answer : "-",
                   qd_bench_style_name(b->fields.style), b->note);
    }
    return 0;
}

static int cmd_fetch(int argc, char **argv, qd_fetch_opts *o)
{
    int named = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--offline")) {
            o->offline = 1;
            continue;
        }
        const qd_bench_info *b = qd_bench_find(argv[i]);
        if (!b || b->source == QD_SRC_SYNTH) {
            fprintf(stderr, "quads bench: '%s' is not a downloadable benchmark (see 'quads bench list')\n", argv[i]);
            return 2;
        }
        named++;
        char path[4096];
        qd_bench_set s;
        /* counted, not kept: an empty date window where records have dates (code rows are large) */
        const char *from = b->date_field ? "9999" : NULL, *to = b->date_field ? "0000" : NULL;
        if (qd_bench_load_window(b, o, from, to, &s) != QD_OK || qd_bench_cache_path(b, path, sizeof path) != QD_OK)
            return fail();
        printf("%s\t%s\t%zu records\n", b->name, path, s.read);
        qd_bench_set_free(&s);
    }
    if (!named) {
        usage(stderr);
        return 2;
    }
    return 0;
}

static void print_record(const qd_bench_record *r)
{
    json_t *o = json_object();
    json_object_set_new(o, "id", json_string(r->id));
    json_object_set_new(o, "problem", json_string(r->problem));
    json_object_set_new(o, "answer", json_string(r->answer));
    if (r->date)
        json_object_set_new(o, "date", json_string(r->date));
    if (r->solution)
        json_object_set_new(o, "solution", json_string(r->solution));
    if (r->n_alt) {
        json_t *a = json_array();
        for (size_t i = 0; i < r->n_alt; i++)
            json_array_append_new(a, json_string(r->alt[i]));
        json_object_set_new(o, "alt", a);
    }
    char *s = json_dumps(o, JSON_COMPACT | JSON_ENSURE_ASCII);
    puts(s ? s : "{}");
    free(s);
    json_decref(o);
}

typedef struct {
    const char *name, *file, *url;
    const char *from, *to; /* contest-date window (YYYY-MM-DD, inclusive) */
    qd_bench_fields fields;
    uint64_t limit; /* UINT64_MAX: all */
    qd_synth_opts synth;
    qd_split split;
    size_t count;
} show_args;

static int set_field(qd_bench_fields *f, const char *kv)
{
    /* An empty FIELD drops an optional key (answer-key files have no problem). */
    const char *eq = strchr(kv, '=');
    if (!eq || (!eq[1] && !strncmp(kv, "answer=", 7)))
        return 0;
    size_t k = (size_t)(eq - kv);
    const char **slot = !strncmp(kv, "problem", k) && k == 7 ? &f->problem
                      : !strncmp(kv, "answer", k) && k == 6 ? &f->answer
                      : !strncmp(kv, "solution", k) && k == 8 ? &f->solution
                      : !strncmp(kv, "id", k) && k == 2 ? &f->id : NULL;
    if (slot)
        *slot = eq[1] ? eq + 1 : NULL;
    return slot != NULL;
}

/* Parses show's options; returns 0 when they are bad. */
static int parse_show(int argc, char **argv, show_args *a, qd_fetch_opts *o)
{
    for (int i = 1; i < argc; i++) {
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        int takes = 1;
        if (!strcmp(argv[i], "--offline"))
            o->offline = 1, takes = 0;
        else if (!strcmp(argv[i], "--file") && v)
            a->file = v;
        else if (!strcmp(argv[i], "--url") && v)
            a->url = v;
        else if ((!strcmp(argv[i], "--from") || !strcmp(argv[i], "--to")) && v) {
            if (!qd_bench_date_ok(v))
                return fprintf(stderr, "quads bench: %s %s: expected a date YYYY-MM-DD\n", argv[i], v), 0;
            *(argv[i][2] == 'f' ? &a->from : &a->to) = v;
        }
        else if (!strcmp(argv[i], "--field") && v) {
            if (!set_field(&a->fields, v))
                return fprintf(stderr, "quads bench: --field %s: expected problem|answer|solution|id=FIELD\n", v), 0;
        } else if (!strcmp(argv[i], "--style") && v) {
            if (qd_bench_style_parse(v, &a->fields.style) != QD_OK)
                return fprintf(stderr, "quads bench: %s\n", qd_last_error()), 0;
        } else if (!strcmp(argv[i], "--split") && v) {
            if (qd_synth_split_parse(v, &a->split) != QD_OK)
                return fprintf(stderr, "quads bench: %s\n", qd_last_error()), 0;
        } else if (!strcmp(argv[i], "--limit") && v) {
            if (!qd_cli_uint(v, UINT64_MAX, &a->limit))
                return fprintf(stderr, "quads bench: --limit %s: expected a count\n", v), 0;
        } else if (!strcmp(argv[i], "--seed") && v) {
            if (!qd_cli_uint(v, UINT64_MAX, &a->synth.seed))
                return fprintf(stderr, "quads bench: --seed %s: expected a non-negative integer\n", v), 0;
        } else if (!strcmp(argv[i], "--count") && v) {
            uint64_t c;
            if (!qd_cli_uint(v, UINT64_MAX, &c) || c > 10000000)
                return fprintf(stderr, "quads bench: --count %s: expected 0..10000000\n", v), 0;
            a->count = (size_t)c;
        } else if (argv[i][0] != '-' && !a->name)
            a->name = argv[i], takes = 0;
        else
            return fprintf(stderr, "quads bench: bad option '%s'\n", argv[i]), 0;
        i += takes;
    }
    return (a->name != NULL) + (a->file != NULL) + (a->url != NULL) == 1;
}

static int cmd_show(int argc, char **argv, qd_fetch_opts *o)
{
    show_args a = {.fields = {"problem", "answer", "solution", "id", QD_ANSWER_PLAIN}, .limit = UINT64_MAX, .count = 100};
    if (!parse_show(argc, argv, &a, o)) {
        usage(stderr);
        return 2;
    }
    const qd_bench_info *b = a.name ? qd_bench_find(a.name) : NULL;
    if (a.name && !b) {
        fprintf(stderr, "quads bench: unknown benchmark '%s' (see 'quads bench list')\n", a.name);
        return 2;
    }
    if ((a.from || a.to) && !(b && b->date_field)) {
        fprintf(stderr, "quads bench: --from/--to select by date: only for benchmarks with dates (lcb-v*)\n");
        return 2;
    }
    qd_bench_set s;
    qd_status st;
    if (b && b->source == QD_SRC_SYNTH) {
        a.synth.steps = b->synth_steps;
        a.synth.max_operand = b->synth_max;
        st = qd_synth_generate(&a.synth, a.split, a.count, &s);
    } else if (b) {
        st = qd_bench_load_window(b, o, a.from, a.to, &s);
    } else if (a.file) {
        st = qd_bench_load_file(a.file, &a.fields, &s);
    } else {
        st = qd_bench_load_url(a.url, &a.fields, o, &s);
    }
    if (st != QD_OK)
        return fail();
    for (size_t i = 0; i < s.n && i < a.limit; i++)
        print_record(&s.rec[i]);
    qd_bench_set_free(&s);
    return 0;
}

int qd_cmd_bench(int argc, char **argv)
{
    qd_fetch_opts o;
    qd_fetch_opts_default(&o);
    if (argc < 2 || !strcmp(argv[1], "--help") || !strcmp(argv[1], "-h")) {
        usage(argc < 2 ? stderr : stdout);
        return argc < 2 ? 2 : 0;
    }
    if (!strcmp(argv[1], "list"))
        return cmd_list(argc - 1, argv + 1);
    if (!strcmp(argv[1], "fetch"))
        return cmd_fetch(argc - 1, argv + 1, &o);
    if (!strcmp(argv[1], "show"))
        return cmd_show(argc - 1, argv + 1, &o);
    fprintf(stderr, "quads bench: unknown subcommand '%s'\n\n", argv[1]);
    usage(stderr);
    return 2;
}
