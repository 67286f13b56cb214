/* Loading benchmark files into qd_bench_record (see dataset.h). */
#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>
#include <jansson.h>
#include "benchmarks/dataset.h"
#include "benchmarks/lcb.h"
#include "quant/fileio.h"

static char *dup_range(const char *s, size_t n)
{
    char *r = malloc(n + 1);
    if (r) {
        memcpy(r, s, n);
        r[n] = '\0';
    }
    return r;
}

/* Copy without leading/trailing whitespace. */
static char *dup_trimmed(const char *s, size_t n)
{
    while (n > 0 && isspace((unsigned char)*s))
        s++, n--;
    while (n > 0 && isspace((unsigned char)s[n - 1]))
        n--;
    return dup_range(s, n);
}

/* Answers such as OlympiadBench's "$2n-2$" carry math delimiters that are not
 * part of the answer: drop one enclosing pair when no other '$' is inside. */
static char *answer_text(const char *s)
{
    char *t = dup_trimmed(s, strlen(s));
    size_t n = t ? strlen(t) : 0;
    if (n >= 2 && t[0] == '$' && t[n - 1] == '$' && !memchr(t + 1, '$', n - 2)) {
        char *u = dup_trimmed(t + 1, n - 2);
        free(t);
        return u;
    }
    return t;
}

/* Shortest decimal that reads back as v; integral values without ".0"
 * (AMC answers are stored as 27.0 in some copies and 27 in others). */
static char *number_text(double v)
{
    char buf[64];
    if (v == floor(v) && fabs(v) < 1e15) {
        snprintf(buf, sizeof buf, "%.0f", v);
        return strdup(buf);
    }
    for (int p = 1; p <= 17; p++) {
        snprintf(buf, sizeof buf, "%.*g", p, v);
        if (strtod(buf, NULL) == v)
            break;
    }
    return strdup(buf);
}

/* A scalar JSON value as text; NULL (with *bad set) for null, bool, object, array. */
static char *scalar_text(const json_t *v, int *bad)
{
    *bad = 0;
    if (json_is_string(v))
        return answer_text(json_string_value(v));
    if (json_is_integer(v)) {
        char buf[32];
        snprintf(buf, sizeof buf, "%lld", (long long)json_integer_value(v));
        return strdup(buf);
    }
    if (json_is_real(v))
        return number_text(json_real_value(v));
    *bad = 1;
    return NULL;
}

static const char *not_scalar_why(const json_t *v)
{
    switch (json_typeof(v)) {
    case JSON_OBJECT: return "is an object, not a string or number";
    case JSON_TRUE: case JSON_FALSE: return "is a boolean, not a string or number";
    default: return "is null";
    }
}

/* Follows a '.'-separated path of keys and array indexes; NULL if absent. */
static const json_t *get_path(const json_t *v, const char *path)
{
    while (v && *path) {
        if (json_is_object(v)) {
            const json_t *whole = json_object_get(v, path);
            if (whole)
                return whole;
        }
        const char *dot = strchr(path, '.');
        size_t n = dot ? (size_t)(dot - path) : strlen(path);
        char key[256];
        if (n >= sizeof key)
            return NULL;
        memcpy(key, path, n);
        key[n] = '\0';
        if (json_is_object(v)) {
            v = json_object_get(v, key);
        } else if (json_is_array(v)) {
            char *end;
            unsigned long i = strtoul(key, &end, 10);
            v = (*key && !*end) ? json_array_get(v, i) : NULL;
        } else {
            return NULL;
        }
        path += n + (dot != NULL);
    }
    return v;
}

/* The last occurrence of needle in text (overlapping ones count), NULL if none. */
static const char *last_of(const char *text, const char *needle)
{
    const char *last = NULL;
    for (const char *p = text; (p = strstr(p, needle)); p++)
        last = p;
    return last;
}

char *qd_bench_last_boxed(const char *text)
{
    /* Hendrycks MATH's last_boxed_only_string: the last "\boxed", else the
     * last "\fbox", up to the brace that closes the first one opened. */
    const char *start = last_of(text, "\\boxed");
    if (!start)
        start = last_of(text, "\\fbox");
    if (!start)
        return NULL;
    int open = 0;
    const char *end = NULL;
    for (const char *p = start; *p && !end; p++) {
        if (*p == '{')
            open++;
        else if (*p == '}' && --open == 0)
            end = p;
    }
    /* remove_boxed accepts only the exact form "\boxed{...}". */
    if (!end || strncmp(start, "\\boxed{", 7) || end < start + 6)
        return NULL;
    return dup_range(start + 7, (size_t)(end - start - 7));
}

/* GSM8K: "... #### 1,234" -> "1234" (grade_school_math/dataset.py extract_answer). */
static char *gsm8k_answer(const char *s, char **solution)
{
    const char *mark = last_of(s, "####");
    if (!mark)
        return NULL;
    char *a = dup_trimmed(mark + 4, strlen(mark + 4));
    if (!a)
        return NULL;
    char *w = a;
    for (const char *r = a; *r; r++)
        if (*r != ',')
            *w++ = *r;
    *w = '\0';
    if (solution && !*solution)
        *solution = dup_trimmed(s, (size_t)(mark - s));
    return a;
}

typedef struct {
    const char *name;
    size_t index;
    size_t line; /* 0 when unknown (JSON arrays) */
} where;

/* What a parse keeps: the fields, within a date window. */
typedef struct {
    const qd_bench_fields *f;
    qd_bench_window win; /* all NULL: no window */
} spec;

static qd_status field_error(const where *w, const char *field, const char *what)
{
    if (w->line)
        return qd_error(QD_ERR_FORMAT, "%s: line %zu: field '%s' %s", w->name, w->line, field, what);
    return qd_error(QD_ERR_FORMAT, "%s: record %zu: field '%s' %s", w->name, w->index, field, what);
}

/* Optional text field: solution or id; integers allowed (ids often are). */
static qd_status opt_text(const json_t *obj, const char *path, const where *w, char **out)
{
    *out = NULL;
    const json_t *v = path ? get_path(obj, path) : NULL;
    if (!v || json_is_null(v))
        return QD_OK;
    if (json_is_array(v)) { /* OlympiadBench keeps solutions as an array of strings */
        size_t n = json_array_size(v);
        return n ? opt_text(v, "0", w, out) : QD_OK;
    }
    int bad;
    *out = scalar_text(v, &bad);
    if (bad)
        return field_error(w, path, "is not text");
    if (!*out)
        return qd_error(QD_ERR_NOMEM, "%s: out of memory", w->name);
    if (!**out) { /* evalchemy's AIME 2025 has "solution": "" */
        free(*out);
        *out = NULL;
    }
    return QD_OK;
}

static qd_status plain_answer(const json_t *v, const where *w, const char *field, qd_bench_record *r)
{
    int bad;
    if (!json_is_array(v)) {
        r->answer = scalar_text(v, &bad);
        return bad ? field_error(w, field, not_scalar_why(v)) : QD_OK;
    }
    size_t n = json_array_size(v);
    if (n == 0)
        return field_error(w, field, "is an empty array");
    r->answer = scalar_text(json_array_get(v, 0), &bad);
    if (bad)
        return field_error(w, field, "has a non-scalar element");
    r->alt = calloc(n - 1 ? n - 1 : 1, sizeof *r->alt);
    for (size_t i = 1; i < n && r->alt; i++) {
        r->alt[r->n_alt] = scalar_text(json_array_get(v, i), &bad);
        if (bad)
            return field_error(w, field, "has a non-scalar element");
        r->n_alt++;
    }
    return QD_OK;
}

/* A comma outside every bracket: "a, b" is a list, "(a, b)" and "\\{a, b\\}" are not. */
static int top_level_comma(const char *s)
{
    int depth = 0;
    for (const char *c = s; *c; c++) {
        if (*c == '\\' && (c[1] == '{' || c[1] == '}')) {
            depth += c[1] == '{' ? 1 : -1;
            c++;
        } else if (*c == '\\' && c[1]) {
            c++;
        } else if (strchr("{([", *c)) {
            depth++;
        } else if (strchr("})]", *c)) {
            depth--;
        } else if (*c == ',' && depth == 0) {
            return 1;
        }
    }
    return 0;
}

/* QD_ANSWER_SET: a listed answer as a set (its order is free). */
static qd_status as_set(char **a)
{
    if (!*a || !top_level_comma(*a))
        return QD_OK;
    size_t n = strlen(*a) + 5;
    char *w = malloc(n);
    if (!w)
        return qd_error(QD_ERR_NOMEM, "out of memory");
    snprintf(w, n, "\\{%s\\}", *a);
    free(*a);
    *a = w;
    return QD_OK;
}

/* ---- code rows (LiveCodeBench's fields) */

static void code_free(qd_bench_code *c)
{
    if (!c)
        return;
    free(c->question);
    free(c->starter_code);
    free(c->func_name);
    free(c->platform);
    free(c->public_tests);
    free(c->private_tests);
    free(c);
}

/* A field of a code row as text: a string as it is, a list or an object as
 * compact JSON (a copy of the row may hold them decoded); NULL when absent
 * or null. */
static qd_status code_text(const json_t *obj, const char *key, const where *w, char **out)
{
    const json_t *v = json_object_get(obj, key);
    *out = NULL;
    if (!v || json_is_null(v))
        return QD_OK;
    if (json_is_string(v))
        *out = strdup(json_string_value(v));
    else if (json_is_array(v) || json_is_object(v))
        *out = json_dumps(v, JSON_COMPACT);
    else
        return field_error(w, key, "is not a string, a list or an object");
    return *out ? QD_OK : qd_error(QD_ERR_NOMEM, "%s: out of memory", w->name);
}

/* An optional string field of a code row ("" when absent or null). */
static qd_status code_string(const json_t *obj, const char *key, const where *w, char **out)
{
    const json_t *v = json_object_get(obj, key);
    *out = NULL;
    if (v && !json_is_null(v) && !json_is_string(v))
        return field_error(w, key, "is not a string");
    *out = strdup(json_is_string(v) ? json_string_value(v) : "");
    return *out ? QD_OK : qd_error(QD_ERR_NOMEM, "%s: out of memory", w->name);
}

/* metadata (an object, or a string holding one, as on the hub): its func_name. */
static qd_status code_func_name(const json_t *obj, const where *w, char **out)
{
    const json_t *v = json_object_get(obj, "metadata");
    json_t *parsed = NULL;
    *out = NULL;
    if (json_is_string(v) && !(parsed = json_loads(json_string_value(v), 0, NULL)))
        return field_error(w, "metadata", "is a string that does not hold a JSON object");
    if (parsed)
        v = parsed;
    qd_status st = QD_OK;
    const json_t *fn = json_object_get(v, "func_name");
    if (v && !json_is_null(v) && !json_is_object(v))
        st = field_error(w, "metadata", "is not a JSON object");
    else if (fn && !json_is_null(fn) && !json_is_string(fn))
        st = field_error(w, "metadata.func_name", "is not a string");
    else if (json_is_string(fn) && !(*out = strdup(json_string_value(fn))))
        st = qd_error(QD_ERR_NOMEM, "%s: out of memory", w->name);
    json_decref(parsed);
    return st;
}

/* The public tests must read as tests (the private ones are decoded only
 * to grade: they are large). */
static qd_status code_check_public(const qd_bench_code *c, const where *w)
{
    char name[1024];
    json_t *tests;
    if (!c->public_tests)
        return field_error(w, "public_test_cases", "missing");
    if (w->line)
        snprintf(name, sizeof name, "%s: line %zu: field 'public_test_cases'", w->name, w->line);
    else
        snprintf(name, sizeof name, "%s: record %zu: field 'public_test_cases'", w->name, w->index);
    qd_status st = qd_lcb_parse_tests(c->public_tests, strlen(c->public_tests), name, &tests);
    json_decref(st ? NULL : tests);
    return st;
}

/* QD_ANSWER_CODE: the record's problem (the question) becomes LiveCodeBench's
 * prompt; the question, the tests and what grading needs go to r->code. */
static qd_status read_code(const json_t *obj, const where *w, qd_bench_record *r)
{
    qd_bench_code *c = calloc(1, sizeof *c);
    r->answer = strdup("");
    if (!c || !r->answer) {
        free(c);
        return qd_error(QD_ERR_NOMEM, "%s: out of memory", w->name);
    }
    r->code = c;
    c->question = r->problem;
    r->problem = NULL;
    qd_status st = code_text(obj, "public_test_cases", w, &c->public_tests);
    if (!st)
        st = code_check_public(c, w);
    if (!st)
        st = code_text(obj, "private_test_cases", w, &c->private_tests);
    if (!st && c->private_tests && !*c->private_tests) {
        free(c->private_tests);
        c->private_tests = NULL;
    }
    if (!st)
        st = code_string(obj, "starter_code", w, &c->starter_code);
    if (!st)
        st = code_string(obj, "platform", w, &c->platform);
    if (!st)
        st = code_func_name(obj, w, &c->func_name);
    if (!st && !(r->problem = qd_lcb_prompt(c->question, c->starter_code)))
        st = qd_error(QD_ERR_NOMEM, "%s: out of memory", w->name);
    return st;
}

static qd_status read_answer(const json_t *obj, const qd_bench_fields *f, const where *w, qd_bench_record *r)
{
    if (f->style == QD_ANSWER_CODE)
        return read_code(obj, w, r);
    const json_t *v = get_path(obj, f->answer);
    if (!v)
        return field_error(w, f->answer, "missing");
    if (json_is_null(v))
        return field_error(w, f->answer, "is null");
    if (f->style == QD_ANSWER_PLAIN)
        return plain_answer(v, w, f->answer, r);
    if (f->style == QD_ANSWER_SET) {
        qd_status st = plain_answer(v, w, f->answer, r);
        for (size_t i = 0; st == QD_OK && i <= r->n_alt; i++)
            st = as_set(i ? &r->alt[i - 1] : &r->answer);
        return st;
    }
    if (!json_is_string(v))
        return field_error(w, f->answer, "is not a string");
    const char *s = json_string_value(v);
    if (f->style == QD_ANSWER_GSM8K) {
        r->answer = gsm8k_answer(s, &r->solution);
        return r->answer ? QD_OK : field_error(w, f->answer, "has no '#### answer' line");
    }
    char *boxed = qd_bench_last_boxed(s);
    if (!boxed)
        return field_error(w, f->answer, "has no \\boxed{} answer");
    r->answer = answer_text(boxed);
    free(boxed);
    return QD_OK;
}

static void record_free(qd_bench_record *r)
{
    free(r->id);
    free(r->problem);
    free(r->answer);
    free(r->solution);
    for (size_t i = 0; i < r->n_alt; i++)
        free(r->alt[i]);
    free(r->alt);
    free(r->date);
    code_free(r->code);
    memset(r, 0, sizeof *r);
}

static qd_status read_record(const json_t *obj, const qd_bench_fields *f, const where *w, qd_bench_record *r)
{
    memset(r, 0, sizeof *r);
    if (!json_is_object(obj))
        return w->line ? qd_error(QD_ERR_FORMAT, "%s: line %zu: not a JSON object", w->name, w->line)
                       : qd_error(QD_ERR_FORMAT, "%s: record %zu: not a JSON object", w->name, w->index);
    if (f->problem) {
        const json_t *p = get_path(obj, f->problem);
        if (!p)
            return field_error(w, f->problem, "missing");
        if (!json_is_string(p))
            return field_error(w, f->problem, "is not a string");
        r->problem = strdup(json_string_value(p));
    } else {
        r->problem = strdup("");
    }
    qd_status st = opt_text(obj, f->solution, w, &r->solution);
    if (st == QD_OK)
        st = read_answer(obj, f, w, r);
    if (st == QD_OK)
        st = opt_text(obj, f->id, w, &r->id);
    if (st == QD_OK && !r->id) {
        char buf[32];
        snprintf(buf, sizeof buf, "%zu", w->index);
        r->id = strdup(buf);
    }
    if (st == QD_OK && (!r->problem || !r->answer || !r->id))
        st = qd_error(QD_ERR_NOMEM, "%s: out of memory", w->name);
    if (st != QD_OK)
        record_free(r);
    return st;
}

int qd_bench_date_ok(const char *s)
{
    for (int i = 0; i < 10; i++)
        if (i == 4 || i == 7 ? s[i] != '-' : !isdigit((unsigned char)s[i]))
            return 0;
    return s[10] == '\0';
}

/* Is the record inside the date window (always, without one)? *date gets
 * the date field's text. */
static qd_status in_window(const json_t *obj, const qd_bench_window *win, const where *w, char **date, int *keep)
{
    *date = NULL;
    *keep = 1;
    const json_t *v = win->field ? get_path(obj, win->field) : NULL;
    if (v && !json_is_string(v))
        return field_error(w, win->field, "is not a date string");
    if (v && !(*date = strdup(json_string_value(v))))
        return qd_error(QD_ERR_NOMEM, "%s: out of memory", w->name);
    if (!win->from && !win->to)
        return QD_OK;
    char day[11] = "";
    if (*date)
        snprintf(day, sizeof day, "%s", *date);
    *keep = *date && (!win->from || strcmp(day, win->from) >= 0) && (!win->to || strcmp(day, win->to) <= 0);
    return QD_OK;
}

static qd_status push(qd_bench_set *s, size_t *cap, const json_t *obj, const spec *sp, const where *w)
{
    s->read++;
    char *date;
    int keep;
    qd_status st = in_window(obj, &sp->win, w, &date, &keep);
    if (st != QD_OK || !keep) {
        free(date);
        return st;
    }
    if (s->n == *cap) {
        size_t nc = *cap ? 2 * *cap : 64;
        qd_bench_record *nr = realloc(s->rec, nc * sizeof *nr);
        if (!nr) {
            free(date);
            return qd_error(QD_ERR_NOMEM, "%s: out of memory", w->name);
        }
        s->rec = nr;
        *cap = nc;
    }
    st = read_record(obj, sp->f, w, &s->rec[s->n]);
    if (st == QD_OK)
        s->rec[s->n++].date = date;
    else
        free(date);
    return st;
}

static qd_status parse_array(const char *text, size_t len, const char *name, const spec *sp, qd_bench_set *out)
{
    json_error_t err;
    json_t *root = json_loadb(text, len, 0, &err);
    if (!root)
        return qd_error(QD_ERR_FORMAT, "%s: line %d: invalid JSON: %s", name, err.line, err.text);
    qd_status st = json_is_array(root) ? QD_OK : qd_error(QD_ERR_FORMAT, "%s: top level is not an array", name);
    size_t cap = 0;
    for (size_t i = 0; st == QD_OK && i < json_array_size(root); i++) {
        where w = {name, i, 0};
        st = push(out, &cap, json_array_get(root, i), sp, &w);
    }
    json_decref(root);
    return st;
}

static qd_status parse_jsonl(const char *text, size_t len, const char *name, const spec *sp, qd_bench_set *out)
{
    size_t cap = 0, line = 0;
    qd_status st = QD_OK;
    for (const char *p = text, *end = text + len; st == QD_OK && p < end; line++) {
        const char *nl = memchr(p, '\n', (size_t)(end - p));
        const char *stop = nl ? nl : end;
        const char *q = p;
        while (q < stop && isspace((unsigned char)*q))
            q++;
        if (q < stop) {
            json_error_t err;
            json_t *obj = json_loadb(p, (size_t)(stop - p), 0, &err);
            if (!obj)
                return qd_error(QD_ERR_FORMAT, "%s: line %zu: invalid JSON: %s", name, line + 1, err.text);
            where w = {name, out->n, line + 1};
            st = push(out, &cap, obj, sp, &w);
            json_decref(obj);
        }
        p = stop + 1;
    }
    return st;
}

/* The cells of one CSV line (RFC 4180 quoting: "a, b" and "" for a quote;
 * a quoted field must end on its line, which holds for the answer keys we
 * read). */
static qd_status csv_cells(const char *p, const char *stop, json_t *cells, const where *w)
{
    for (const char *c = p;;) {
        char *field = malloc((size_t)(stop - c) + 1);
        size_t n = 0;
        if (!field)
            return qd_error(QD_ERR_NOMEM, "%s: out of memory", w->name);
        if (c < stop && *c == '"') {
            for (c++;; c++) {
                if (c == stop) {
                    free(field);
                    return qd_error(QD_ERR_FORMAT, "%s: line %zu: unterminated quoted field", w->name, w->line);
                }
                if (*c == '"' && c + 1 < stop && c[1] == '"')
                    field[n++] = *c++;
                else if (*c == '"')
                    break;
                else
                    field[n++] = *c;
            }
            c++;
            if (c < stop && *c != ',') {
                free(field);
                return qd_error(QD_ERR_FORMAT, "%s: line %zu: text after a quoted field", w->name, w->line);
            }
        } else {
            while (c < stop && *c != ',') {
                if (*c == '"') {
                    free(field);
                    return qd_error(QD_ERR_FORMAT, "%s: line %zu: a quote inside an unquoted field", w->name, w->line);
                }
                field[n++] = *c++;
            }
        }
        json_array_append_new(cells, json_stringn(field, n));
        free(field);
        if (c >= stop)
            return QD_OK;
        c++; /* the comma */
    }
}

/* One CSV line into a JSON object keyed by the header. */
static qd_status csv_row(const char *p, const char *stop, json_t *header, json_t **row, const where *w)
{
    if (stop > p && stop[-1] == '\r')
        stop--;
    json_t *cells = json_array();
    qd_status st = csv_cells(p, stop, cells, w);
    if (st != QD_OK) {
        json_decref(cells);
        return st;
    }
    if (!header) {
        *row = cells;
        return QD_OK;
    }
    if (json_array_size(cells) != json_array_size(header)) {
        st = qd_error(QD_ERR_FORMAT, "%s: line %zu: %zu cells, header has %zu", w->name, w->line,
                      json_array_size(cells), json_array_size(header));
        json_decref(cells);
        return st;
    }
    *row = json_object();
    for (size_t i = 0; i < json_array_size(cells); i++)
        json_object_set(*row, json_string_value(json_array_get(header, i)), json_array_get(cells, i));
    json_decref(cells);
    return QD_OK;
}

static qd_status parse_csv(const char *text, size_t len, const char *name, const spec *sp, qd_bench_set *out)
{
    size_t cap = 0, line = 0;
    json_t *header = NULL;
    qd_status st = QD_OK;
    for (const char *p = text, *end = text + len; st == QD_OK && p < end; line++) {
        const char *nl = memchr(p, '\n', (size_t)(end - p));
        const char *stop = nl ? nl : end;
        if (stop > p && !(stop == p + 1 && *p == '\r')) {
            where w = {name, out->n, line + 1};
            json_t *row = NULL;
            st = csv_row(p, stop, header, &row, &w);
            if (st == QD_OK && !header)
                header = row;
            else if (st == QD_OK) {
                st = push(out, &cap, row, sp, &w);
                json_decref(row);
            }
        }
        p = stop + 1;
    }
    json_decref(header);
    return st;
}

qd_status qd_bench_parse(const char *text, size_t len, const char *name,
                         const qd_bench_fields *fields, qd_bench_set *out)
{
    return qd_bench_parse_window(text, len, name, fields, NULL, out);
}

qd_status qd_bench_parse_window(const char *text, size_t len, const char *name, const qd_bench_fields *fields,
                                const qd_bench_window *win, qd_bench_set *out)
{
    spec sp = {fields, {NULL, NULL, NULL}};
    if (win)
        sp.win = *win;
    memset(out, 0, sizeof *out);
    if (!fields->answer && fields->style != QD_ANSWER_CODE)
        return qd_error(QD_ERR_ARG, "%s: no answer field named", name);
    if (len >= 3 && !memcmp(text, "\xef\xbb\xbf", 3)) { /* a UTF-8 byte order mark */
        text += 3;
        len -= 3;
    }
    size_t i = 0;
    while (i < len && isspace((unsigned char)text[i]))
        i++;
    qd_status st;
    /* Decide by content, not by name: several ".json" files are JSONL. */
    if (qd_str_ends_with(name, ".csv"))
        st = parse_csv(text, len, name, &sp, out);
    else if (i < len && text[i] == '[')
        st = parse_array(text, len, name, &sp, out);
    else
        st = parse_jsonl(text, len, name, &sp, out);
    if (st == QD_OK && out->read == 0)
        st = qd_error(QD_ERR_FORMAT, "%s: no records", name);
    if (st != QD_OK)
        qd_bench_set_free(out);
    return st;
}

qd_status qd_bench_load_file(const char *path, const qd_bench_fields *fields, qd_bench_set *out)
{
    return qd_bench_load_file_window(path, fields, NULL, out);
}

qd_status qd_bench_load_file_window(const char *path, const qd_bench_fields *fields, const qd_bench_window *win,
                                    qd_bench_set *out)
{
    memset(out, 0, sizeof *out);
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK); /* a FIFO must not block the open */
    struct stat sb;
    if (fd < 0 || fstat(fd, &sb) || !S_ISREG(sb.st_mode)) {
        qd_status st = qd_error(QD_ERR_IO, "%s: %s", path, fd < 0 ? strerror(errno) : "not a regular file");
        if (fd >= 0)
            close(fd);
        return st;
    }
    size_t len = (size_t)sb.st_size;
    void *map = len ? mmap(NULL, len, PROT_READ, MAP_PRIVATE, fd, 0) : NULL;
    close(fd);
    if (len && map == MAP_FAILED)
        return qd_error(QD_ERR_IO, "%s: cannot map: %s", path, strerror(errno));
    qd_status st = qd_bench_parse_window(len ? map : "", len, path, fields, win, out);
    if (len)
        munmap(map, len);
    return st;
}

void qd_bench_set_free(qd_bench_set *s)
{
    for (size_t i = 0; i < s->n; i++)
        record_free(&s->rec[i]);
    free(s->rec);
    s->rec = NULL;
    s->n = 0;
    s->read = 0;
}

static const char *const style_names[] = {"plain", "gsm8k", "boxed", "set", "code"};

qd_status qd_bench_style_parse(const char *s, qd_answer_style *out)
{
    for (int i = 0; i < 5; i++)
        if (!strcmp(s, style_names[i])) {
            *out = (qd_answer_style)i;
            return QD_OK;
        }
    return qd_error(QD_ERR_ARG, "answer style '%s': expected plain, gsm8k, boxed, set or code", s);
}

const char *qd_bench_style_name(qd_answer_style s)
{
    return (unsigned)s < 5 ? style_names[s] : "plain";
}
