/* Decoding LiveCodeBench tests (lcb.h): base64, zlib, a pickled string read
 * opcode by opcode (never unpickled), JSON. */
#define _GNU_SOURCE
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <zlib.h>
#include "benchmarks/lcb.h"

static int b64_value(unsigned char c)
{
    if (c >= 'A' && c <= 'Z')
        return c - 'A';
    if (c >= 'a' && c <= 'z')
        return c - 'a' + 26;
    if (c >= '0' && c <= '9')
        return c - '0' + 52;
    return c == '+' ? 62 : c == '/' ? 63 : -1;
}

/* Python's base64.b64decode (validate=False): characters outside the
 * alphabet are skipped, and the padding must be complete. */
static qd_status b64_decode(const char *s, size_t n, const char *name, unsigned char **out, size_t *out_len)
{
    unsigned char *o = malloc(n / 4 * 3 + 3);
    if (!o)
        return qd_error(QD_ERR_NOMEM, "%s: out of memory", name);
    size_t k = 0, q = 0, pads = 0;
    uint32_t acc = 0;
    for (size_t i = 0; i < n; i++) {
        int v = b64_value((unsigned char)s[i]);
        if (s[i] == '=') {
            pads++;
            continue;
        }
        if (v < 0 || pads)
            continue; /* skipped, as Python does; data after padding is ignored too */
        acc = acc << 6 | (uint32_t)v;
        if (++q % 4 == 0) {
            o[k++] = (unsigned char)(acc >> 16);
            o[k++] = (unsigned char)(acc >> 8);
            o[k++] = (unsigned char)acc;
            acc = 0;
        }
    }
    size_t rest = q % 4;
    if (rest == 1 || (rest && pads < 4 - rest)) {
        free(o);
        return qd_error(QD_ERR_FORMAT, "%s: not base64 (%zu characters%s)", name, q,
                        rest == 1 ? ", one too many" : ", incorrect padding");
    }
    if (rest == 2)
        o[k++] = (unsigned char)(acc >> 4);
    if (rest == 3) {
        o[k++] = (unsigned char)(acc >> 10);
        o[k++] = (unsigned char)(acc >> 2);
    }
    *out = o;
    *out_len = k;
    return QD_OK;
}

/* One whole zlib stream, at most QD_LCB_MAX_TESTS_BYTES out (a small input
 * must not inflate without bound), nothing after it. */
static qd_status inflate_all(const unsigned char *in, size_t n, const char *name, unsigned char **out, size_t *out_len)
{
    z_stream z;
    memset(&z, 0, sizeof z);
    if (inflateInit(&z) != Z_OK)
        return qd_error(QD_ERR_NOMEM, "%s: zlib: cannot start", name);
    unsigned char *buf = NULL;
    size_t cap = 0, len = 0, left = n;
    qd_status st = QD_OK;
    z.next_in = (unsigned char *)in;
    for (;;) {
        if (len == cap) {
            if (cap == QD_LCB_MAX_TESTS_BYTES) {
                st = qd_error(QD_ERR_FORMAT, "%s: zlib data inflates past %zu bytes", name, QD_LCB_MAX_TESTS_BYTES);
                break;
            }
            size_t nc = cap ? 2 * cap : 4 * n + 1024;
            nc = nc < QD_LCB_MAX_TESTS_BYTES ? nc : QD_LCB_MAX_TESTS_BYTES;
            unsigned char *nb = realloc(buf, nc + 1);
            if (!nb) {
                st = qd_error(QD_ERR_NOMEM, "%s: out of memory inflating", name);
                break;
            }
            buf = nb;
            cap = nc;
        }
        uInt in_chunk = left > UINT32_MAX ? UINT32_MAX : (uInt)left;
        uInt out_chunk = cap - len > UINT32_MAX ? UINT32_MAX : (uInt)(cap - len);
        z.avail_in = in_chunk;
        z.next_out = buf + len;
        z.avail_out = out_chunk;
        int rc = inflate(&z, Z_NO_FLUSH);
        left -= in_chunk - z.avail_in;
        len += out_chunk - z.avail_out;
        if (rc == Z_STREAM_END)
            break;
        if ((rc == Z_OK || rc == Z_BUF_ERROR) && (z.avail_out == 0 || left > 0))
            continue; /* more room needed, or more input to feed */
        st = qd_error(QD_ERR_FORMAT, "%s: not zlib data, or truncated (%s)", name,
                      z.msg ? z.msg : "the stream ends early");
        break;
    }
    if (st == QD_OK && left)
        st = qd_error(QD_ERR_FORMAT, "%s: %zu bytes after the end of the zlib stream", name, left);
    inflateEnd(&z);
    if (st != QD_OK) {
        free(buf);
        return st;
    }
    *out = buf;
    *out_len = len;
    return QD_OK;
}

static uint64_t le(const unsigned char *p, int bytes)
{
    uint64_t v = 0;
    for (int i = bytes - 1; i >= 0; i--)
        v = v << 8 | p[i];
    return v;
}

qd_status qd_lcb_unpickle_str(const unsigned char *p, size_t n, const char *name, char **out, size_t *out_len)
{
    char *str = NULL;
    size_t slen = 0, i = 0;
    qd_status st = QD_OK;
    for (;;) {
        if (i >= n) {
            st = qd_error(QD_ERR_FORMAT, "%s: pickle truncated at byte %zu (no STOP)", name, i);
            break;
        }
        size_t at = i;
        unsigned char op = p[i++];
        int width = op == 0x8c ? 1 : op == 0x58 ? 4 : op == 0x8d ? 8 : op == 0x95 ? 8 : op == 0x80 ? 1 : 0;
        if (width && n - i < (size_t)width) {
            st = qd_error(QD_ERR_FORMAT, "%s: pickle truncated in opcode 0x%02x at byte %zu", name, op, at);
            break;
        }
        uint64_t arg = width ? le(p + i, width) : 0;
        i += (size_t)width;
        if (op == 0x80) { /* PROTO */
            if (at != 0 || arg < 2 || arg > 5) {
                st = qd_error(QD_ERR_FORMAT, "%s: pickle PROTO %u at byte %zu (protocol 2-5 at the start only)", name,
                              (unsigned)arg, at);
                break;
            }
        } else if (op == 0x95) { /* FRAME: a length hint for buffered readers */
            if (arg > n - i) {
                st = qd_error(QD_ERR_FORMAT, "%s: pickle FRAME of %llu bytes at byte %zu, only %zu follow", name,
                              (unsigned long long)arg, at, n - i);
                break;
            }
        } else if (op == 0x8c || op == 0x58 || op == 0x8d) { /* SHORT_BINUNICODE, BINUNICODE, BINUNICODE8 */
            if (str) {
                st = qd_error(QD_ERR_FORMAT, "%s: pickle holds more than one string (byte %zu)", name, at);
                break;
            }
            if (arg > n - i || arg > QD_LCB_MAX_TESTS_BYTES) {
                st = qd_error(QD_ERR_FORMAT, "%s: pickle string of %llu bytes at byte %zu, only %zu follow", name,
                              (unsigned long long)arg, at, n - i);
                break;
            }
            slen = (size_t)arg;
            str = malloc(slen + 1);
            if (!str) {
                st = qd_error(QD_ERR_NOMEM, "%s: out of memory", name);
                break;
            }
            memcpy(str, p + i, slen);
            str[slen] = '\0';
            i += slen;
        } else if (op == 0x94) { /* MEMOIZE: remembers the top of the stack; nothing to do */
            if (!str) {
                st = qd_error(QD_ERR_FORMAT, "%s: pickle MEMOIZE with an empty stack at byte %zu", name, at);
                break;
            }
        } else if (op == 0x2e) { /* STOP */
            if (!str)
                st = qd_error(QD_ERR_FORMAT, "%s: pickle STOP with an empty stack at byte %zu", name, at);
            else if (i != n)
                st = qd_error(QD_ERR_FORMAT, "%s: %zu bytes after the pickle's STOP", name, n - i);
            break;
        } else {
            st = qd_error(QD_ERR_FORMAT, "%s: pickle opcode 0x%02x at byte %zu refused: only a pickled string "
                          "(PROTO, FRAME, SHORT_BINUNICODE, BINUNICODE, BINUNICODE8, MEMOIZE, STOP) is read",
                          name, op, at);
            break;
        }
    }
    if (st != QD_OK) {
        free(str);
        return st;
    }
    *out = str;
    *out_len = slen;
    return QD_OK;
}

qd_status qd_lcb_parse_tests(const char *text, size_t len, const char *name, json_t **tests)
{
    json_error_t err;
    json_t *a = json_loadb(text, len, 0, &err);
    if (!a)
        return qd_error(QD_ERR_FORMAT, "%s: invalid JSON: %s", name, err.text);
    qd_status st = json_is_array(a) ? QD_OK : qd_error(QD_ERR_FORMAT, "%s: not a JSON array of tests", name);
    for (size_t i = 0; st == QD_OK && i < json_array_size(a); i++) {
        json_t *t = json_array_get(a, i);
        const char *type = json_string_value(json_object_get(t, "testtype"));
        if (!json_is_object(t))
            st = qd_error(QD_ERR_FORMAT, "%s: test %zu is not an object", name, i);
        else if (!json_is_string(json_object_get(t, "input")))
            st = qd_error(QD_ERR_FORMAT, "%s: test %zu: field 'input' is not a string", name, i);
        else if (!json_is_string(json_object_get(t, "output")))
            st = qd_error(QD_ERR_FORMAT, "%s: test %zu: field 'output' is not a string", name, i);
        else if (!type || (strcmp(type, "stdin") && strcmp(type, "functional")))
            st = qd_error(QD_ERR_FORMAT, "%s: test %zu: field 'testtype' is not \"stdin\" or \"functional\"", name, i);
    }
    if (st != QD_OK) {
        json_decref(a);
        return st;
    }
    *tests = a;
    return QD_OK;
}

qd_status qd_lcb_decode_private_tests(const char *field, size_t len, const char *name, json_t **tests)
{
    *tests = NULL;
    /* LiveCodeBench tries json.loads first: a plain JSON list is the older form. */
    json_t *plain = json_loadb(field, len, JSON_DECODE_ANY, NULL);
    if (plain) {
        json_decref(plain);
        return qd_lcb_parse_tests(field, len, name, tests);
    }
    unsigned char *z = NULL, *pk = NULL;
    size_t zn = 0, pn = 0, sn = 0;
    char *s = NULL;
    qd_status st = b64_decode(field, len, name, &z, &zn);
    if (st == QD_OK)
        st = inflate_all(z, zn, name, &pk, &pn);
    if (st == QD_OK)
        st = qd_lcb_unpickle_str(pk, pn, name, &s, &sn);
    if (st == QD_OK)
        st = qd_lcb_parse_tests(s, sn, name, tests);
    free(z);
    free(pk);
    free(s);
    return st;
}

char *qd_lcb_prompt(const char *question, const char *starter_code)
{
    char *p = NULL;
    int n;
    if (starter_code && *starter_code)
        n = asprintf(&p, "### Question:\n%s\n\n### Format: You will use the following starter code to write the "
                         "solution to the problem and enclose your code within delimiters.\n```python\n%s\n```\n\n"
                         "### Answer: (use the provided format with backticks)\n\n", question, starter_code);
    else
        n = asprintf(&p, "### Question:\n%s\n\n### Format: Read the inputs from stdin solve the problem and write the "
                         "answer to stdout (do not directly test on the sample inputs). Enclose your code within "
                         "delimiters as follows. Ensure that when the python program runs, it reads the inputs, runs "
                         "the algorithm and writes output to STDOUT.\n```python\n# YOUR CODE HERE\n```\n\n"
                         "### Answer: (use the provided format with backticks)\n\n", question);
    return n < 0 ? NULL : p;
}

qd_status qd_lcb_problem(const qd_bench_code *c, const char *name, qd_code_problem *p)
{
    char where[512];
    json_t *tests = NULL, *row = json_object();
    memset(p, 0, sizeof *p);
    if (!row)
        return qd_error(QD_ERR_NOMEM, "%s: out of memory", name);
    snprintf(where, sizeof where, "%s: public_test_cases", name);
    qd_status st = qd_lcb_parse_tests(c->public_tests, strlen(c->public_tests), where, &tests);
    if (!st && json_object_set_new(row, "public_test_cases", tests))
        st = qd_error(QD_ERR_NOMEM, "%s: out of memory", name);
    snprintf(where, sizeof where, "%s: private_test_cases", name);
    if (!st && c->private_tests &&
        !(st = qd_lcb_decode_private_tests(c->private_tests, strlen(c->private_tests), where, &tests)) &&
        json_object_set_new(row, "private_test_cases", tests))
        st = qd_error(QD_ERR_NOMEM, "%s: out of memory", name);
    if (!st && c->func_name && json_object_set_new(row, "metadata", json_pack("{s:s}", "func_name", c->func_name)))
        st = qd_error(QD_ERR_NOMEM, "%s: out of memory", name);
    if (!st)
        st = qd_code_problem_from_json(row, name, p);
    json_decref(row);
    return st;
}
