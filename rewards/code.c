/* Grading model-written code as LiveCodeBench grades it (code.h). */
#define _GNU_SOURCE
#include "rewards/code.h"

#include <ctype.h>
#include <math.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "rewards/sandbox.h"

#define EXIT_MEMORY 71  /* the harness caught MemoryError */
#define EXIT_RUNTIME 72 /* the harness caught any other exception */

const char *qd_code_verdict_name(qd_code_verdict v)
{
    static const char *const names[] = {"accepted", "wrong_answer", "time_limit", "memory_limit",
                                        "runtime_error", "no_code", "sandbox_error"};
    return (unsigned)v < sizeof names / sizeof names[0] ? names[v] : "?";
}

qd_code_opts qd_code_opts_default(void)
{
    return (qd_code_opts){.test_s = 6.0, .problem_s = 0, .mem_bytes = (size_t)4 << 30, .jobs = 1};
}

/* ---- the harness that runs in the sandbox. The module names are LCB's
 * import_string: every solution sees their contents without importing them.
 * FUNC_NAME (set above this text) None runs the solution as a program;
 * otherwise the arguments come one JSON value per stdin line, the solution's
 * own prints go to /dev/null, and the result goes to the real stdout as "R"
 * + JSON, or "U" + its type when JSON cannot hold it (Python's == with a
 * JSON value is then False: a tuple inside a list, a set, an object). */
static const char harness_body[] =
    "import json, os, sys, traceback\n"
    "MODULES = ('string', 're', 'datetime', 'collections', 'heapq', 'bisect', 'copy', 'math',\n"
    "           'random', 'statistics', 'itertools', 'functools', 'operator', 'io', 'sys', 'json',\n"
    "           'builtins', 'typing')\n"
    "def fresh_globals(name):\n"
    "    g = {'__name__': name, '__builtins__': __builtins__}\n"
    "    for m in MODULES:\n"
    "        exec('from %s import *' % m, g)\n"
    "    for m in MODULES[:-2]:\n"
    "        exec('import ' + m, g)\n"
    "    sys.setrecursionlimit(50000)\n"
    "    return g\n"
    "class Unrepresentable(Exception):\n"
    "    pass\n"
    "def plain(x):\n"
    "    if x is None:\n"
    "        return None\n"
    "    if isinstance(x, bool):\n"
    "        return bool(x)\n"
    "    if isinstance(x, str):\n"
    "        return str(x)\n"
    "    if isinstance(x, int):\n"
    "        return int(x)\n"
    "    if isinstance(x, float):\n"
    "        if x != x or x in (float('inf'), float('-inf')):\n"
    "            raise Unrepresentable('float ' + repr(x))\n"
    "        return float(x)\n"
    "    if isinstance(x, list):\n"
    "        return [plain(v) for v in x]\n"
    "    if isinstance(x, dict):\n"
    "        if not all(isinstance(k, str) for k in x):\n"
    "            raise Unrepresentable('dict with non-string keys')\n"
    "        return {str(k): plain(v) for k, v in x.items()}\n"
    "    raise Unrepresentable(type(x).__name__)\n"
    "def write_all(fd, data):\n"
    "    while data:\n"
    "        data = data[os.write(fd, data):]\n"
    "def main():\n"
    "    with open('solution.py', encoding='utf-8', errors='surrogateescape') as f:\n"
    "        src = f.read()\n"
    "    if FUNC_NAME is None:\n"
    "        g = fresh_globals('__main__')\n"
    "        try:\n"
    "            exec(compile(src, 'solution.py', 'exec'), g)\n"
    "        except SystemExit:\n"
    "            pass\n"
    "        sys.stdout.flush()\n"
    "        return\n"
    "    args = [json.loads(line) for line in sys.stdin.read().split('\\n')]\n"
    "    real = os.dup(1)\n"
    "    os.dup2(os.open(os.devnull, os.O_WRONLY), 1)\n"
    "    g = fresh_globals('tmp_sol')\n"
    "    exec(compile(src, 'solution.py', 'exec'), g)\n"
    "    fn = getattr(g['Solution'](), FUNC_NAME) if 'class Solution' in src else g[FUNC_NAME]\n"
    "    pred = fn(*args)\n"
    "    if isinstance(pred, tuple):\n"
    "        pred = list(pred)\n"
    "    try:\n"
    "        out = 'R' + json.dumps(plain(pred), allow_nan=False)\n"
    "    except Unrepresentable as e:\n"
    "        out = 'U' + str(e)\n"
    "    sys.stdout.flush()\n"
    "    write_all(real, out.encode('utf-8', 'surrogatepass'))\n"
    "try:\n"
    "    main()\n"
    "except MemoryError:\n"
    "    os._exit(71)\n"
    "except BaseException:\n"
    "    traceback.print_exc()\n"
    "    sys.stderr.flush()\n"
    "    os._exit(72)\n";

static char *make_harness(const char *func_name)
{
    char *lit = NULL;
    if (func_name) {
        json_t *s = json_string(func_name);
        lit = s ? json_dumps(s, JSON_ENCODE_ANY | JSON_ENSURE_ASCII) : NULL;
        json_decref(s);
        if (!lit)
            return NULL;
    }
    char *h = NULL;
    if (asprintf(&h, "FUNC_NAME = %s\n%s", lit ? lit : "None", harness_body) < 0)
        h = NULL;
    free(lit);
    return h;
}

/* ---- extraction */

char *qd_code_extract(const char *output)
{
    /* Line starts of the last two lines containing ``` */
    const char *fence[2] = {NULL, NULL};
    for (const char *line = output; line;) {
        const char *nl = strchr(line, '\n');
        size_t len = nl ? (size_t)(nl - line) : strlen(line);
        if (memmem(line, len, "```", 3)) {
            fence[0] = fence[1];
            fence[1] = line;
        }
        line = nl ? nl + 1 : NULL;
    }
    if (!fence[0])
        return NULL;
    const char *start = strchr(fence[0], '\n') + 1; /* fence[0] is not the last line */
    size_t len = fence[1] > start ? (size_t)(fence[1] - start - 1) : 0;
    return strndup(start, len);
}

/* ---- LCB's stdout comparison */

/* Python's str.strip()/split() whitespace, ASCII part (docs/sandbox.md). */
static bool py_space(unsigned char c) { return c == ' ' || (c >= '\t' && c <= '\r') || (c >= 0x1c && c <= 0x1f); }

typedef struct {
    const char *p;
    size_t n;
} span;

static span strip(span s)
{
    while (s.n && py_space((unsigned char)s.p[0]))
        s.p++, s.n--;
    while (s.n && py_space((unsigned char)s.p[s.n - 1]))
        s.n--;
    return s;
}

/* A Python Decimal read from a token, as sign, digits without leading or
 * trailing zeros, and exponent; kind 0 finite, 1 infinite, 2 NaN. */
typedef struct {
    int kind;
    bool neg;
    char *digits; /* owned */
    long long exp;
} decimal;

static bool ieq(span s, const char *word)
{
    return strlen(word) == s.n && !strncasecmp(s.p, word, s.n);
}

static bool decimal_parse_clean(span s, decimal *d);

/* Python's Decimal(str) drops every underscore before it parses ("_1",
 * "1__0" and "in_f" are numbers to it). */
static bool decimal_parse(span s, decimal *d)
{
    memset(d, 0, sizeof *d);
    char *clean = malloc(s.n + 1);
    if (!clean)
        return false;
    size_t n = 0;
    for (size_t i = 0; i < s.n; i++)
        if (s.p[i] != '_')
            clean[n++] = s.p[i];
    bool ok = decimal_parse_clean((span){clean, n}, d);
    free(clean);
    return ok;
}

static bool decimal_parse_clean(span s, decimal *d)
{
    size_t i = 0;
    if (i < s.n && (s.p[i] == '+' || s.p[i] == '-'))
        d->neg = s.p[i++] == '-';
    span rest = {s.p + i, s.n - i};
    if (ieq(rest, "inf") || ieq(rest, "infinity")) {
        d->kind = 1;
        return true;
    }
    if (rest.n >= 3 && (!strncasecmp(rest.p, "nan", 3) || (rest.n >= 4 && !strncasecmp(rest.p, "snan", 4)))) {
        size_t k = tolower((unsigned char)rest.p[0]) == 's' ? 4 : 3;
        for (; k < rest.n; k++)
            if (!isdigit((unsigned char)rest.p[k]))
                return false;
        d->kind = 2;
        return true;
    }
    d->digits = malloc(s.n + 1);
    if (!d->digits)
        return false;
    size_t nd = 0;
    long long frac = 0;
    bool dot = false, any = false;
    for (; i < s.n; i++) {
        char c = s.p[i];
        if (isdigit((unsigned char)c)) {
            d->digits[nd++] = c;
            frac += dot;
            any = true;
        } else if (c == '.' && !dot)
            dot = true;
        else
            break;
    }
    if (!any)
        return false;
    long long e = 0;
    if (i < s.n) {
        if (s.p[i] != 'e' && s.p[i] != 'E')
            return false;
        i++;
        bool eneg = false;
        if (i < s.n && (s.p[i] == '+' || s.p[i] == '-'))
            eneg = s.p[i++] == '-';
        if (i == s.n)
            return false;
        for (; i < s.n; i++) {
            if (!isdigit((unsigned char)s.p[i]) || e > (long long)1e15)
                return false; /* exponents past 1e15: out of what this compares exactly */
            e = e * 10 + (s.p[i] - '0');
        }
        e = eneg ? -e : e;
    }
    size_t lead = 0;
    while (lead < nd && d->digits[lead] == '0')
        lead++;
    memmove(d->digits, d->digits + lead, nd - lead);
    nd -= lead;
    while (nd && d->digits[nd - 1] == '0')
        nd--, e++;
    d->digits[nd] = '\0';
    d->exp = e - frac;
    return true;
}

static bool decimal_equal(const decimal *a, const decimal *b)
{
    if (a->kind == 2 || b->kind == 2)
        return false;
    if (a->kind != b->kind)
        return false;
    if (a->kind == 1)
        return a->neg == b->neg;
    if (!a->digits[0] && !b->digits[0])
        return true; /* 0 = -0 = 0.000 */
    return a->neg == b->neg && a->exp == b->exp && !strcmp(a->digits, b->digits);
}

/* Splits a line on whitespace into tokens (at most cap; returns the count, or -1 when more). */
static int tokens(span line, span *tok, int cap)
{
    int n = 0;
    size_t i = 0;
    while (i < line.n) {
        while (i < line.n && py_space((unsigned char)line.p[i]))
            i++;
        if (i == line.n)
            break;
        size_t j = i;
        while (j < line.n && !py_space((unsigned char)line.p[j]))
            j++;
        if (n == cap)
            return -1;
        tok[n++] = (span){line.p + i, j - i};
        i = j;
    }
    return n;
}

static bool decimal_lines_equal(span a, span b)
{
    size_t cap = a.n / 2 + 2;
    span *ta = malloc(cap * sizeof *ta), *tb = malloc((b.n / 2 + 2) * sizeof *tb);
    bool ok = false;
    int na, nb;
    if (!ta || !tb || (na = tokens(a, ta, (int)cap)) < 0 || (nb = tokens(b, tb, (int)(b.n / 2 + 2))) < 0 ||
        na != nb)
        goto done;
    ok = true;
    for (int i = 0; i < na && ok; i++) {
        decimal x, y;
        bool px = decimal_parse(ta[i], &x), py = px && decimal_parse(tb[i], &y);
        ok = px && py && decimal_equal(&x, &y);
        free(x.digits);
        if (px)
            free(y.digits);
    }
done:
    free(ta);
    free(tb);
    return ok;
}

/* The next line of s (split on '\n'), stripped; false when s is used up. */
static bool next_line(span *s, bool *more, span *line)
{
    if (!*more)
        return false;
    const char *nl = memchr(s->p, '\n', s->n);
    size_t len = nl ? (size_t)(nl - s->p) : s->n;
    *line = strip((span){s->p, len});
    *more = nl != NULL;
    if (nl) {
        s->p = nl + 1;
        s->n -= len + 1;
    }
    return true;
}

bool qd_code_stdout_equal(const char *got, const char *expected)
{
    span a = strip((span){got, strlen(got)}), b = strip((span){expected, strlen(expected)});
    bool ma = true, mb = true;
    span la, lb;
    for (;;) {
        bool ha = next_line(&a, &ma, &la), hb = next_line(&b, &mb, &lb);
        if (ha != hb)
            return false; /* different line counts */
        if (!ha)
            return true;
        if (la.n == lb.n && !memcmp(la.p, lb.p, la.n))
            continue;
        if (!decimal_lines_equal(la, lb))
            return false;
    }
}

/* ---- Python == on JSON values */

static bool is_num(const json_t *v) { return json_is_number(v) || json_is_boolean(v); }

static bool num_equal(const json_t *a, const json_t *b)
{
    if (json_is_real(a) && json_is_real(b))
        return json_real_value(a) == json_real_value(b);
    if (json_is_real(a)) {
        const json_t *t = a;
        a = b;
        b = t;
    }
    long long i = json_is_boolean(a) ? json_is_true(a) : json_integer_value(a);
    if (!json_is_real(b))
        return i == (json_is_boolean(b) ? json_is_true(b) : json_integer_value(b));
    double r = json_real_value(b);
    /* exact: r must be an integer inside the range of long long */
    return r == floor(r) && r >= -9223372036854775808.0 && r < 9223372036854775808.0 && (long long)r == i;
}

bool qd_code_json_equal(const json_t *a, const json_t *b)
{
    if (is_num(a) && is_num(b))
        return num_equal(a, b);
    if (json_typeof(a) != json_typeof(b))
        return false;
    switch (json_typeof(a)) {
    case JSON_NULL:
        return true;
    case JSON_STRING:
        return json_string_length(a) == json_string_length(b) &&
               !memcmp(json_string_value(a), json_string_value(b), json_string_length(a));
    case JSON_ARRAY:
        if (json_array_size(a) != json_array_size(b))
            return false;
        for (size_t i = 0; i < json_array_size(a); i++)
            if (!qd_code_json_equal(json_array_get(a, i), json_array_get(b, i)))
                return false;
        return true;
    case JSON_OBJECT: {
        if (json_object_size(a) != json_object_size(b))
            return false;
        const char *k;
        json_t *v;
        json_object_foreach((json_t *)a, k, v) {
            json_t *w = json_object_get(b, k);
            if (!w || !qd_code_json_equal(v, w))
                return false;
        }
        return true;
    }
    default:
        return false;
    }
}

/* ---- problems */

void qd_code_problem_free(qd_code_problem *p)
{
    for (int i = 0; i < p->ntests; i++) {
        free(p->tests[i].input);
        free(p->tests[i].output);
    }
    free(p->tests);
    free(p->func_name);
    memset(p, 0, sizeof *p);
}

/* A field that is a JSON value of type `type`, or a string holding one. */
static qd_status json_field(const json_t *row, const char *where, const char *field, json_type type,
                            json_t **out)
{
    json_t *v = json_object_get(row, field);
    *out = NULL;
    if (!v)
        return QD_OK;
    if (json_typeof(v) == type) {
        *out = json_incref(v);
        return QD_OK;
    }
    if (!json_is_string(v))
        return qd_error(QD_ERR_FORMAT, "%s: field '%s' is neither a JSON %s nor a string holding one",
                        where, field, type == JSON_ARRAY ? "list" : "object");
    json_error_t jerr;
    json_t *parsed = json_loads(json_string_value(v), JSON_DECODE_ANY, &jerr);
    if (!parsed) {
        const char *s = json_string_value(v);
        s += strspn(s, " \t\r\n");
        if (!strcmp(field, "private_test_cases") && *s && *s != '[')
            return qd_error(QD_ERR_FORMAT,
                            "%s: field '%s' is encoded (base64 of zlib of a pickle, as on the hub); "
                            "decode it to a JSON list first", where, field);
        return qd_error(QD_ERR_FORMAT, "%s: field '%s' is not JSON: %s", where, field, jerr.text);
    }
    if (json_typeof(parsed) != type) {
        json_decref(parsed);
        return qd_error(QD_ERR_FORMAT, "%s: field '%s' does not hold a JSON %s", where, field,
                        type == JSON_ARRAY ? "list" : "object");
    }
    *out = parsed;
    return QD_OK;
}

static qd_status add_tests(qd_code_problem *p, const json_t *list, const char *where, const char *field)
{
    size_t n = json_array_size(list);
    qd_code_test *t = realloc(p->tests, (size_t)(p->ntests + (int)n + 1) * sizeof *t);
    if (!t)
        return qd_error(QD_ERR_NOMEM, "%s: no memory for the tests", where);
    p->tests = t;
    for (size_t i = 0; i < n; i++) {
        json_t *e = json_array_get(list, i);
        json_t *in = json_object_get(e, "input"), *out = json_object_get(e, "output");
        if (!json_is_string(in) || !json_is_string(out))
            return qd_error(QD_ERR_FORMAT, "%s: field '%s'[%zu]: needs string 'input' and 'output'",
                            where, field, i);
        t[p->ntests].input = strdup(json_string_value(in));
        t[p->ntests].output = strdup(json_string_value(out));
        p->ntests++;
        if (!t[p->ntests - 1].input || !t[p->ntests - 1].output)
            return qd_error(QD_ERR_NOMEM, "%s: no memory for the tests", where);
    }
    return QD_OK;
}

qd_status qd_code_problem_from_json(const json_t *row, const char *where, qd_code_problem *p)
{
    memset(p, 0, sizeof *p);
    if (!json_is_object(row))
        return qd_error(QD_ERR_FORMAT, "%s: the problem is not a JSON object", where);
    json_t *pub = NULL, *priv = NULL, *meta = NULL;
    qd_status st;
    if ((st = json_field(row, where, "public_test_cases", JSON_ARRAY, &pub)) ||
        (st = json_field(row, where, "private_test_cases", JSON_ARRAY, &priv)) ||
        (st = json_field(row, where, "metadata", JSON_OBJECT, &meta)))
        goto done;
    if (!pub && !priv) {
        st = qd_error(QD_ERR_FORMAT, "%s: field 'public_test_cases' is missing", where);
        goto done;
    }
    if ((pub && (st = add_tests(p, pub, where, "public_test_cases"))) ||
        (priv && (st = add_tests(p, priv, where, "private_test_cases"))))
        goto done;
    if (p->ntests == 0) {
        st = qd_error(QD_ERR_FORMAT, "%s: the problem has no tests", where);
        goto done;
    }
    json_t *fn = json_object_get(meta, "func_name");
    if (fn && !json_is_string(fn) && !json_is_null(fn)) {
        st = qd_error(QD_ERR_FORMAT, "%s: field 'metadata'.func_name is not a string", where);
        goto done;
    }
    if (json_is_string(fn) && !(p->func_name = strdup(json_string_value(fn))))
        st = qd_error(QD_ERR_NOMEM, "%s: no memory", where);
done:
    json_decref(pub);
    json_decref(priv);
    json_decref(meta);
    if (st)
        qd_code_problem_free(p);
    return st;
}

/* ---- running one test */

/* printf into a new string; NULL when out of memory (asprintf leaves its
 * pointer undefined then). */
static char *fmt(const char *f, ...) __attribute__((format(printf, 1, 2)));
static char *fmt(const char *f, ...)
{
    va_list ap;
    va_start(ap, f);
    char *s;
    if (vasprintf(&s, f, ap) < 0)
        s = NULL;
    va_end(ap);
    return s;
}

static char *tail_of(const char *s, size_t len, size_t keep)
{
    return strdup(len > keep ? s + len - keep : s);
}

static qd_code_verdict judge_output(const qd_code_problem *p, int j, const qd_sandbox_result *r,
                                    char **detail)
{
    const char *expected = p->tests[j].output;
    if (!p->func_name) {
        if (qd_code_stdout_equal(r->out, expected))
            return QD_CODE_ACCEPTED;
        *detail = fmt("test %d: wrong answer", j + 1);
        return QD_CODE_WRONG_ANSWER;
    }
    if (r->out[0] == 'U') {
        *detail = fmt("test %d: wrong answer: returned a %.100s, which no JSON value equals", j + 1,
                 r->out + 1);
        return QD_CODE_WRONG_ANSWER;
    }
    if (r->out[0] != 'R') {
        *detail = fmt("test %d: the harness returned no result", j + 1);
        return QD_CODE_RUNTIME_ERROR;
    }
    json_error_t jerr;
    json_t *want = json_loads(expected, JSON_DECODE_ANY, &jerr);
    if (!want) {
        *detail = fmt("test %d: the expected output is not JSON this grader reads: %s", j + 1, jerr.text);
        return QD_CODE_SANDBOX_ERROR;
    }
    json_t *got = json_loads(r->out + 1, JSON_DECODE_ANY | JSON_ALLOW_NUL, &jerr);
    bool ok = got && qd_code_json_equal(got, want);
    json_decref(got);
    json_decref(want);
    if (ok)
        return QD_CODE_ACCEPTED;
    if (got)
        *detail = fmt("test %d: wrong answer", j + 1);
    else
        *detail = fmt("test %d: wrong answer (result not readable: %s)", j + 1, jerr.text);
    return QD_CODE_WRONG_ANSWER;
}

static qd_code_verdict run_test(const qd_code_opts *o, const char *harness, const char *code,
                                const qd_code_problem *p, int j, char **detail, double *wall)
{
    qd_sandbox_limits lim = qd_sandbox_limits_default();
    lim.wall_s = o->test_s;
    lim.cpu_s = (int)ceil(o->test_s);
    lim.mem_bytes = o->mem_bytes;
    qd_sandbox_file files[2] = {{"harness.py", harness, strlen(harness)}, {"solution.py", code, strlen(code)}};
    qd_sandbox_result r;
    const char *in = p->tests[j].input;
    *detail = NULL;
    *wall = 0;
    if (qd_sandbox_run(&lim, files, 2, "harness.py", in, strlen(in), &r)) {
        *detail = strdup(qd_last_error());
        return QD_CODE_SANDBOX_ERROR;
    }
    *wall = r.wall_s;
    qd_code_verdict v = QD_CODE_RUNTIME_ERROR;
    switch (r.outcome) {
    case QD_SANDBOX_TIMEOUT:
        v = QD_CODE_TIME_LIMIT;
        *detail = fmt("test %d: time limit (%g s)", j + 1, o->test_s);
        break;
    case QD_SANDBOX_OUTPUT_LIMIT:
        *detail = fmt("test %d: output limit (%zu bytes)", j + 1, lim.output_bytes);
        break;
    case QD_SANDBOX_SIGNALED:
        *detail = fmt("test %d: killed by signal %d", j + 1, r.signal);
        break;
    case QD_SANDBOX_EXITED:
        if (r.exit_code == 0) {
            v = judge_output(p, j, &r, detail);
            break;
        }
        /* Python itself exits 1 on a MemoryError it cannot hand to the harness */
        if (r.exit_code == EXIT_MEMORY || (r.exit_code == 1 && strstr(r.err, "MemoryError")))
            v = QD_CODE_MEMORY_LIMIT;
        char *t = tail_of(r.err, r.err_len, 300);
        *detail = fmt("test %d: %s (exit %d): %s", j + 1,
                 v == QD_CODE_MEMORY_LIMIT ? "memory limit" : "runtime error", r.exit_code, t ? t : "");
        free(t);
        break;
    }
    qd_sandbox_result_free(&r);
    return v;
}

/* ---- grading samples with a pool of workers over all (sample, test) pairs */

typedef struct {
    const qd_code_opts *o;
    const qd_code_problem *const *problems;
    char **code, **harness;
    int n;
    int *first_fail;          /* lowest failing test index; ntests when none */
    qd_code_verdict *verdict; /* of first_fail */
    char **detail;
    double *used_s;
    unsigned char **passed; /* per test: 1 when it ran and passed */
    int cur_i, cur_j;
    pthread_mutex_t mu;
} batch;

static double budget(const batch *b, int i)
{
    const qd_code_opts *o = b->o;
    return o->problem_s > 0 ? o->problem_s : (o->test_s + 1) * b->problems[i]->ntests + 5;
}

/* Records a failure of test j of sample i (the lowest one wins). */
static void record_fail(batch *b, int i, int j, qd_code_verdict v, char *detail)
{
    if (j < b->first_fail[i]) {
        b->first_fail[i] = j;
        b->verdict[i] = v;
        free(b->detail[i]);
        b->detail[i] = detail;
    } else
        free(detail);
}

/* The next test to run, under the lock; false when none is left. Tests past
 * a sample's first failure are not run; a sample past its time budget fails
 * its next test with TIME_LIMIT. */
static bool next_item(batch *b, int *oi, int *oj)
{
    while (b->cur_i < b->n) {
        int i = b->cur_i, j = b->cur_j;
        if (!b->code[i] || j >= b->first_fail[i]) {
            b->cur_i++;
            b->cur_j = 0;
            continue;
        }
        b->cur_j++;
        if (b->used_s[i] >= budget(b, i)) {
            char *d = fmt("test %d: the problem's time limit (%g s) is used up", j + 1, budget(b, i));
            record_fail(b, i, j, QD_CODE_TIME_LIMIT, d);
            continue;
        }
        *oi = i;
        *oj = j;
        return true;
    }
    return false;
}

static void *worker(void *arg)
{
    batch *b = arg;
    int i, j;
    pthread_mutex_lock(&b->mu);
    while (next_item(b, &i, &j)) {
        pthread_mutex_unlock(&b->mu);
        char *detail;
        double wall;
        qd_code_verdict v = run_test(b->o, b->harness[i], b->code[i], b->problems[i], j, &detail, &wall);
        pthread_mutex_lock(&b->mu);
        b->used_s[i] += wall;
        if (v == QD_CODE_ACCEPTED) {
            b->passed[i][j] = 1;
            free(detail);
        } else
            record_fail(b, i, j, v, detail);
    }
    pthread_mutex_unlock(&b->mu);
    return NULL;
}

static void batch_free(batch *b)
{
    for (int i = 0; i < b->n; i++) {
        if (b->code)
            free(b->code[i]);
        if (b->harness)
            free(b->harness[i]);
        if (b->detail)
            free(b->detail[i]);
        if (b->passed)
            free(b->passed[i]);
    }
    free(b->code);
    free(b->harness);
    free(b->detail);
    free(b->passed);
    free(b->first_fail);
    free(b->verdict);
    free(b->used_s);
    pthread_mutex_destroy(&b->mu);
}

static qd_status batch_init(batch *b, const qd_code_opts *o, const char *const *outputs,
                            const qd_code_problem *const *problems, int n)
{
    memset(b, 0, sizeof *b);
    pthread_mutex_init(&b->mu, NULL);
    b->o = o;
    b->problems = problems;
    b->n = n;
    b->code = calloc((size_t)n, sizeof *b->code);
    b->harness = calloc((size_t)n, sizeof *b->harness);
    b->detail = calloc((size_t)n, sizeof *b->detail);
    b->passed = calloc((size_t)n, sizeof *b->passed);
    b->first_fail = calloc((size_t)n, sizeof *b->first_fail);
    b->verdict = calloc((size_t)n, sizeof *b->verdict);
    b->used_s = calloc((size_t)n, sizeof *b->used_s);
    if (n && (!b->code || !b->harness || !b->detail || !b->passed || !b->first_fail || !b->verdict || !b->used_s))
        return qd_error(QD_ERR_NOMEM, "code grading: no memory");
    for (int i = 0; i < n; i++) {
        const qd_code_problem *p = problems[i];
        if (!p || p->ntests <= 0 || !outputs[i])
            return qd_error(QD_ERR_ARG, "code grading: sample %d has no output or no tests", i);
        b->first_fail[i] = p->ntests;
        b->passed[i] = calloc((size_t)p->ntests, 1);
        b->code[i] = qd_code_extract(outputs[i]);
        if (!b->passed[i])
            return qd_error(QD_ERR_NOMEM, "code grading: no memory");
        if (!b->code[i]) {
            b->first_fail[i] = 0;
            b->verdict[i] = QD_CODE_NO_CODE;
            b->detail[i] = strdup("no code: fewer than two ``` lines");
        } else if (!(b->harness[i] = make_harness(p->func_name)))
            return qd_error(QD_ERR_NOMEM, "code grading: no memory");
    }
    return QD_OK;
}

/* Every sample with code fails its first test with SANDBOX_ERROR. */
static void fail_all(batch *b, const char *why)
{
    for (int i = 0; i < b->n; i++)
        if (b->code[i])
            record_fail(b, i, 0, QD_CODE_SANDBOX_ERROR, strdup(why));
}

qd_status qd_code_grade(const qd_code_opts *opts, const char *const *outputs,
                        const qd_code_problem *const *problems, int n, qd_code_result *res)
{
    if (!(opts->test_s > 0) || opts->jobs < 1 || opts->problem_s < 0)
        return qd_error(QD_ERR_ARG, "code grading: test time limit must be > 0 and jobs >= 1");
    batch b;
    qd_status st = batch_init(&b, opts, outputs, problems, n);
    if (st) {
        batch_free(&b);
        return st;
    }
    if (qd_sandbox_isolation(NULL, NULL))
        fail_all(&b, qd_last_error());
    int items = 0; /* no more workers than tests */
    for (int i = 0; i < n; i++)
        items += b.code[i] ? problems[i]->ntests : 0;
    int nthreads = opts->jobs < items ? opts->jobs : (items > 0 ? items : 1);
    pthread_t *th = nthreads > 1 ? calloc((size_t)nthreads - 1, sizeof *th) : NULL;
    int started = 0;
    for (int t = 0; th && t < nthreads - 1; t++, started++)
        if (pthread_create(&th[t], NULL, worker, &b))
            break;
    worker(&b);
    for (int t = 0; t < started; t++)
        pthread_join(th[t], NULL);
    free(th);
    for (int i = 0; i < n; i++) {
        int f = b.first_fail[i], passed = 0;
        for (int j = 0; j < f; j++)
            passed += b.passed[i][j];
        res[i] = (qd_code_result){.correct = f == problems[i]->ntests, .passed = passed,
                                  .total = problems[i]->ntests,
                                  .verdict = f == problems[i]->ntests ? QD_CODE_ACCEPTED : b.verdict[i],
                                  .detail = b.detail[i]};
        b.detail[i] = NULL;
    }
    batch_free(&b);
    return QD_OK;
}

void qd_code_result_free(qd_code_result *r)
{
    free(r->detail);
    r->detail = NULL;
}
