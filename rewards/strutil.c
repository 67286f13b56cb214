/* Small helpers for rewards/: counted allocation, growable buffer, replace, trim. */
#include <ctype.h>
#include <stdlib.h>
#include <string.h>
#include "rewards/internal.h"

static _Thread_local unsigned long failures;
static _Thread_local long fail_at = -1; /* qd_rw_test_fail_after */
static _Thread_local long made;          /* allocations since the last arming */

/* Counts one allocation; true when the test hook says it must fail. */
static bool injected_failure(void)
{
    made++;
    return fail_at >= 0 && fail_at-- == 0;
}

static void *counted(void *p)
{
    if (!p)
        failures++;
    return p;
}

void *qd_rw_malloc(size_t size) { return counted(injected_failure() ? NULL : malloc(size)); }
void *qd_rw_calloc(size_t n, size_t size) { return counted(injected_failure() ? NULL : calloc(n, size)); }
void *qd_rw_realloc(void *p, size_t size) { return counted(injected_failure() ? NULL : realloc(p, size)); }
unsigned long qd_rw_alloc_failures(void) { return failures; }

long qd_rw_test_fail_after(long n)
{
    long m = made;
    made = 0;
    fail_at = n;
    return m;
}

void qd_rw_buf_putn(qd_rw_buf *b, const char *s, size_t n)
{
    if (b->oom)
        return;
    if (b->len + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 64;
        while (cap < b->len + n + 1)
            cap *= 2;
        char *p = qd_rw_realloc(b->s, cap);
        if (!p) {
            b->oom = true;
            return;
        }
        b->s = p;
        b->cap = cap;
    }
    memcpy(b->s + b->len, s, n);
    b->len += n;
    b->s[b->len] = '\0';
}

void qd_rw_buf_puts(qd_rw_buf *b, const char *s)
{
    if (!s)
        b->oom = true; /* the string a failed helper did not make */
    else
        qd_rw_buf_putn(b, s, strlen(s));
}
void qd_rw_buf_putc(qd_rw_buf *b, char c) { qd_rw_buf_putn(b, &c, 1); }

char *qd_rw_buf_steal(qd_rw_buf *b)
{
    if (!b->s)
        qd_rw_buf_putn(b, "", 0);
    char *s = b->oom ? NULL : b->s;
    if (b->oom)
        free(b->s);
    *b = (qd_rw_buf){0};
    return s;
}

char *qd_rw_strndup(const char *s, size_t n)
{
    if (!s)
        return NULL;
    qd_rw_buf b = {0};
    qd_rw_buf_putn(&b, s, n);
    return qd_rw_buf_steal(&b);
}

char *qd_rw_replace(const char *s, const char *from, const char *to)
{
    if (!s)
        return NULL;
    qd_rw_buf b = {0};
    size_t fl = strlen(from);
    const char *p;
    while (fl && (p = strstr(s, from))) {
        qd_rw_buf_putn(&b, s, (size_t)(p - s));
        qd_rw_buf_puts(&b, to);
        s = p + fl;
    }
    qd_rw_buf_puts(&b, s);
    return qd_rw_buf_steal(&b);
}

void qd_rw_replace_inplace(char **s, const char *from, const char *to)
{
    char *r = qd_rw_replace(*s, from, to);
    free(*s);
    *s = r;
}

char *qd_rw_trim(const char *s)
{
    if (!s)
        return NULL;
    while (isspace((unsigned char)*s))
        s++;
    size_t n = strlen(s);
    while (n && isspace((unsigned char)s[n - 1]))
        n--;
    return qd_rw_strndup(s, n);
}

size_t qd_rw_match_brace(const char *s, size_t open)
{
    int depth = 0;
    for (size_t i = open; s[i]; i++) {
        if (s[i] == '\\' && s[i + 1]) { /* \{ and \} are literal braces */
            i++;
            continue;
        }
        if (s[i] == '{')
            depth++;
        else if (s[i] == '}' && --depth == 0)
            return i + 1;
    }
    return 0;
}

bool qd_rw_starts(const char *s, const char *prefix)
{
    return strncmp(s, prefix, strlen(prefix)) == 0;
}
