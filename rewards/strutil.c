/* Small string helpers for rewards/ (growable buffer, replace, trim). */
#include <ctype.h>
#include <stdlib.h>
#include <string.h>
#include "rewards/internal.h"

void qd_rw_buf_putn(qd_rw_buf *b, const char *s, size_t n)
{
    if (b->len + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 64;
        while (cap < b->len + n + 1)
            cap *= 2;
        char *p = realloc(b->s, cap);
        if (!p)
            abort(); /* answer strings are small; out of memory here is fatal */
        b->s = p;
        b->cap = cap;
    }
    memcpy(b->s + b->len, s, n);
    b->len += n;
    b->s[b->len] = '\0';
}

void qd_rw_buf_puts(qd_rw_buf *b, const char *s) { qd_rw_buf_putn(b, s, strlen(s)); }
void qd_rw_buf_putc(qd_rw_buf *b, char c) { qd_rw_buf_putn(b, &c, 1); }

char *qd_rw_buf_steal(qd_rw_buf *b)
{
    if (!b->s)
        qd_rw_buf_putn(b, "", 0);
    char *s = b->s;
    b->s = NULL;
    b->len = b->cap = 0;
    return s;
}

char *qd_rw_strndup(const char *s, size_t n)
{
    qd_rw_buf b = {0};
    qd_rw_buf_putn(&b, s, n);
    return qd_rw_buf_steal(&b);
}

char *qd_rw_replace(const char *s, const char *from, const char *to)
{
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
