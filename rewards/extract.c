/* Final-answer extraction from model outputs and gold solutions:
 * \boxed{}/\fbox{} (nested braces, "\boxed 5"), "#### N", "Answer: ...",
 * "the final answer is ...", the last LaTeX math span, the last number.
 * Only the text after "</think>" is considered when it is present. */
#include <ctype.h>
#include <stdlib.h>
#include <string.h>
#include "rewards/internal.h"
#include "rewards/rewards.h"

const char *qd_rewards_after_think(const char *text)
{
    const char *p = text, *q, *last = NULL;
    while ((q = strstr(p, "</think>"))) {
        last = q + 8;
        p = last;
    }
    return last ? last : text;
}

typedef struct {
    size_t start, end; /* span of the whole \boxed{...} in the text */
    size_t cs, ce;     /* span of its content */
} box_span;

/* close[i] = index just past the '}' matching a '{' at i, 0 when unmatched:
 * one pass with a stack, so that many unclosed boxes stay linear. NULL when
 * out of memory. */
static size_t *brace_table(const char *text, size_t n)
{
    size_t *close = qd_rw_calloc(n + 1, sizeof *close), *stack = qd_rw_malloc((n + 1) * sizeof *stack), top = 0;
    if (!close || !stack) {
        free(close);
        free(stack);
        return NULL;
    }
    for (size_t i = 0; i < n; i++) {
        if (text[i] == '\\' && text[i + 1]) { /* \{ and \} are literal braces */
            i++;
            continue;
        }
        if (text[i] == '{')
            stack[top++] = i;
        else if (text[i] == '}' && top)
            close[stack[--top]] = i + 1;
    }
    free(stack);
    return close;
}

/* Parses a box command at text[i] (pointing at '\\') that ends by text[lim];
 * 0 when it is none. The content is text[*cs, *ce). */
static size_t parse_box(const char *text, const size_t *close_of, size_t i, size_t lim, size_t *cs, size_t *ce)
{
    size_t n = qd_rw_starts(text + i, "\\boxed") ? 6 : qd_rw_starts(text + i, "\\fbox") ? 5 : 0;
    if (!n || i + n > lim)
        return 0;
    size_t j = i + n;
    if (j < lim && isalpha((unsigned char)text[j]))
        return 0; /* \boxedsomething is another command */
    while (j < lim && text[j] == ' ')
        j++;
    if (j < lim && text[j] == '{') {
        size_t close = close_of[j];
        if (!close || close > lim)
            return 0;
        *cs = j + 1;
        *ce = close - 1;
        return close;
    }
    if (j == i + n)
        return 0; /* "\boxed" followed directly by something else */
    size_t k = j; /* "\boxed 5$." form: up to whitespace or '$' */
    while (k < lim && !isspace((unsigned char)text[k]) && text[k] != '$')
        k++;
    size_t e = k;
    while (e > j && text[e - 1] == '.')
        e--;
    if (e == j)
        return 0;
    *cs = j;
    *ce = e;
    return k;
}

/* The box command at text[i] ("\\boxed", a backslash doubled by an escaping
 * layer, counts too); 0 when there is none. */
static size_t box_at(const char *text, const size_t *close_of, size_t i, size_t lim, size_t *cs, size_t *ce)
{
    size_t at = text[i] == '\\' && i + 1 < lim && text[i + 1] == '\\' ? i + 1 : i;
    return text[at] == '\\' ? parse_box(text, close_of, at, lim, cs, ce) : 0;
}

/* Innermost content of text[cs, ce) stripped of boxes that span it whole
 * (\boxed{\boxed{3}} -> 3), trimmed. Linear in the length: the brace table
 * of the text serves every level, since a matched pair encloses balanced
 * braces. Only the content of a "\boxed 5" form, which is not delimited by
 * braces, needs a table of its own (at most once: that content has no
 * spaces, so no further such form fits inside). */
static char *unnest(const char *text, const size_t *close_of, size_t cs, size_t ce)
{
    size_t *own = NULL;
    for (;;) {
        while (cs < ce && isspace((unsigned char)text[cs]))
            cs++;
        while (ce > cs && isspace((unsigned char)text[ce - 1]))
            ce--;
        size_t a, b;
        if (cs == ce || box_at(text, close_of, cs, ce, &a, &b) != ce)
            break;
        if (text[a - 1] != '{') { /* a "\boxed 5" form */
            free(own);
            own = brace_table(text + a, b - a);
            if (!own)
                return NULL;
            text += a;
            close_of = own;
            ce = b - a;
            cs = 0;
            continue;
        }
        cs = a;
        ce = b;
    }
    char *r = qd_rw_strndup(text + cs, ce - cs);
    free(own);
    return r;
}

/* All outermost boxes of text, in order, the last `cap` of them. Returns
 * their number; contents are left to the caller (unnest). */
static int find_boxes(const char *text, const size_t *close_of, box_span *out, int cap)
{
    int n = 0;
    size_t len = strlen(text);
    for (size_t i = 0; i < len;) {
        size_t cs, ce, end = box_at(text, close_of, i, len, &cs, &ce);
        if (!end) {
            i++;
            continue;
        }
        if (n == cap) { /* keep the last `cap` boxes */
            memmove(out, out + 1, sizeof(box_span) * (size_t)(cap - 1));
            n--;
        }
        out[n++] = (box_span){i, end, cs, ce};
        i = end;
    }
    return n;
}

char *qd_rewards_last_boxed(const char *text)
{
    box_span b[1];
    size_t *close_of = brace_table(text, strlen(text));
    if (!close_of)
        return NULL;
    char *r = find_boxes(text, close_of, b, 1) ? unnest(text, close_of, b[0].cs, b[0].ce) : NULL;
    free(close_of);
    return r;
}

/* Only separators between two boxes: "\boxed{1}, \boxed{2}" and
 * "\(\boxed{1}\) and \(\boxed{-2}\)" list several answers. */
static bool only_separators(const char *s, size_t n)
{
    static const char *const seps[] = {"\\text{ and }", "\\text{and}", "\\quad", "\\(", "\\)",
                                       "\\[", "\\]", "and", "or", "$", ",", ";", " ", "\n",
                                       "\\,", "\\;", "\\ "};
    size_t i = 0;
    while (i < n) {
        size_t k = 0;
        for (size_t j = 0; j < sizeof seps / sizeof seps[0] && !k; j++)
            if (strlen(seps[j]) <= n - i && qd_rw_starts(s + i, seps[j]))
                k = strlen(seps[j]);
        if (!k)
            return false;
        i += k;
    }
    return true;
}

#define MAX_BOXES 64

/* The last box, or the last group of boxes listed together as a set; *pos
 * receives the start of the group. */
static char *boxed_answer(const char *text, size_t *pos)
{
    box_span b[MAX_BOXES];
    size_t *close_of = brace_table(text, strlen(text));
    if (!close_of)
        return NULL;
    int n = find_boxes(text, close_of, b, MAX_BOXES);
    if (!n) {
        free(close_of);
        return NULL;
    }
    int first = n - 1;
    while (first > 0 && only_separators(text + b[first - 1].end, b[first].start - b[first - 1].end))
        first--;
    *pos = b[first].start;
    char *res;
    if (first == n - 1) {
        res = unnest(text, close_of, b[n - 1].cs, b[n - 1].ce);
    } else {
        qd_rw_buf o = {0};
        qd_rw_buf_puts(&o, "\\{");
        for (int i = first; i < n; i++) {
            char *c = unnest(text, close_of, b[i].cs, b[i].ce);
            qd_rw_buf_puts(&o, i > first ? "," : "");
            qd_rw_buf_puts(&o, c);
            free(c);
        }
        qd_rw_buf_puts(&o, "\\}");
        res = qd_rw_buf_steal(&o);
    }
    free(close_of);
    return res;
}

/* A math span opening at text[i]: sets the content range, returns the end.
 * unclosed[d] remembers a delimiter never closed before the end of the text,
 * so that a text full of unclosed openers is still scanned in linear time. */
static size_t math_span_from(const char *text, size_t i, size_t *cs, size_t *ce, bool unclosed[4])
{
    static const char *const del[][2] = {{"$$", "$$"}, {"\\[", "\\]"}, {"\\(", "\\)"}, {"$", "$"}};
    for (size_t d = 0; d < 4; d++) {
        size_t ol = strlen(del[d][0]);
        if (!qd_rw_starts(text + i, del[d][0]) || (i > 0 && text[i - 1] == '\\' && d == 3))
            continue;
        bool inline_ = d >= 2; /* \( \) and $ spans stay on one line */
        if (unclosed[d])
            return 0;
        for (size_t j = i + ol; text[j]; j++) {
            if (inline_ && text[j] == '\n')
                return 0;
            if (text[j] == '\\' && d == 3 && text[j + 1] == '$') {
                j++;
                continue;
            }
            if (qd_rw_starts(text + j, del[d][1]) && !(d == 3 && text[j - 1] == '\\')) {
                *cs = i + ol;
                *ce = j;
                return j + strlen(del[d][1]);
            }
        }
        unclosed[d] = true;
        return 0;
    }
    return 0;
}

typedef struct {
    size_t start, end, cs, ce;
} span;

#define MAX_SPANS 256

/* All math spans of text[0..n), in order (the last MAX_SPANS). */
static int list_spans(const char *text, size_t n, span *out)
{
    int k = 0;
    bool unclosed[4] = {false, false, false, false};
    for (size_t i = 0; i < n && text[i];) {
        size_t cs, ce, end = (text[i] == '$' || text[i] == '\\') ? math_span_from(text, i, &cs, &ce, unclosed) : 0;
        if (!end || end > n) {
            i++;
            continue;
        }
        if (k == MAX_SPANS) {
            memmove(out, out + 1, sizeof *out * (MAX_SPANS - 1));
            k--;
        }
        out[k++] = (span){i, end, cs, ce};
        i = end;
    }
    return k;
}

/* Spans [first, last] joined: one content, or a set "\{a,b\}" when several
 * answers are listed together ("$1$ and $2$"). */
static char *join_spans(const char *text, const span *sp, int first, int last)
{
    if (first == last)
        return qd_rw_strndup(text + sp[first].cs, sp[first].ce - sp[first].cs);
    qd_rw_buf o = {0};
    qd_rw_buf_puts(&o, "\\{");
    for (int i = first; i <= last; i++) {
        qd_rw_buf_puts(&o, i > first ? "," : "");
        qd_rw_buf_putn(&o, text + sp[i].cs, sp[i].ce - sp[i].cs);
    }
    qd_rw_buf_puts(&o, "\\}");
    return qd_rw_buf_steal(&o);
}

/* The last math span of text[0..n) with the spans listed just before it;
 * *end receives the end of the last span. */
static char *last_span_group(const char *text, size_t n, size_t *end)
{
    span sp[MAX_SPANS];
    int k = list_spans(text, n, sp);
    if (!k)
        return NULL;
    int first = k - 1;
    while (first > 0 && only_separators(text + sp[first - 1].end, sp[first].start - sp[first - 1].end))
        first--;
    *end = sp[k - 1].end;
    return join_spans(text, sp, first, k - 1);
}

/* The math span opening text (and those listed right after it). */
static char *leading_span_group(const char *text, size_t n)
{
    span sp[MAX_SPANS];
    int k = list_spans(text, n, sp);
    if (!k || sp[0].start != 0)
        return NULL;
    int last = 0;
    while (last + 1 < k && only_separators(text + sp[last].end, sp[last + 1].start - sp[last].end))
        last++;
    return join_spans(text, sp, 0, last);
}

/* Start of a number at s[i]: not glued to a preceding letter. */
static size_t number_at(const char *s, size_t i, size_t n)
{
    if (i > 0 && (isalpha((unsigned char)s[i - 1]) || s[i - 1] == '_' || isdigit((unsigned char)s[i - 1])))
        return 0;
    size_t j = i;
    if (s[j] == '-' && j + 1 < n && (isdigit((unsigned char)s[j + 1]) || s[j + 1] == '.'))
        j++;
    size_t d0 = j;
    while (j < n && (isdigit((unsigned char)s[j]) ||
                     ((s[j] == ',' || s[j] == '.') && j + 1 < n && isdigit((unsigned char)s[j + 1]) && j > d0) ||
                     (s[j] == '.' && j == d0 && j + 1 < n && isdigit((unsigned char)s[j + 1]))))
        j++;
    if (j + 1 < n && s[j] == '/' && isdigit((unsigned char)s[j + 1]) && j > d0) /* 2/3 */
        for (j++; j < n && isdigit((unsigned char)s[j]);)
            j++;
    bool any = false;
    for (size_t k = d0; k < j; k++)
        any = any || isdigit((unsigned char)s[k]);
    return any ? j : 0;
}

/* The last number of s[0..n) ("1,000.99", "-5", ".4", "2/3"), or NULL;
 * *pos (when given) receives its start. */
static char *last_number_at(const char *s, size_t n, size_t *pos)
{
    char *res = NULL;
    for (size_t i = 0; i < n;) {
        size_t e = (isdigit((unsigned char)s[i]) || s[i] == '-' || s[i] == '.') ? number_at(s, i, n) : 0;
        if (!e) {
            i++;
            continue;
        }
        free(res);
        res = qd_rw_strndup(s + i, e - i);
        if (pos)
            *pos = i;
        i = e;
    }
    return res;
}

static char *last_number(const char *s, size_t n) { return last_number_at(s, n, NULL); }

/* Case-insensitive strstr returning the last match. */
static const char *last_ci(const char *s, const char *pat)
{
    const char *last = NULL;
    size_t pl = strlen(pat);
    for (const char *p = s; *p; p++)
        if (!strncasecmp(p, pat, pl))
            last = p;
    return last;
}

/* End of the sentence starting at s: ". " / ".\n" / end of line. */
static size_t sentence_len(const char *s)
{
    size_t i = 0;
    for (; s[i] && s[i] != '\n'; i++)
        if (s[i] == '.' && (s[i + 1] == ' ' || s[i + 1] == '\0' || s[i + 1] == '\n') && i > 0)
            break;
    return i;
}

/* After the last "answer is" / "Answer:": the math span(s) it opens with,
 * else the last number or math span of the sentence. *pos receives the
 * position of the phrase. */
static char *phrase_answer(const char *text, size_t *pos)
{
    static const char *const pats[] = {"final answer is", "answer is", "answer:"};
    const char *best = NULL;
    size_t bl = 0;
    for (size_t k = 0; k < 3; k++) {
        const char *p = last_ci(text, pats[k]);
        if (p && (!best || p > best + bl)) {
            best = p;
            bl = strlen(pats[k]);
        }
    }
    if (!best)
        return NULL;
    *pos = (size_t)(best - text);
    const char *s = best + bl;
    for (;;) { /* spaces, colons and quotes, also escaped ones */
        if (*s == ' ' || *s == ':' || *s == '"')
            s++;
        else if (s[0] == '\\' && s[1] == '"')
            s += 2;
        else
            break;
    }
    char *m = leading_span_group(s, strlen(s));
    if (m)
        return m;
    size_t n = sentence_len(s);
    char *num = last_number(s, n);
    if (num)
        return num;
    size_t dummy;
    return last_span_group(s, n, &dummy); /* "so our answer is correct." has none */
}

/* Prose rather than a bare answer: two or more words of two or more letters
 * outside LaTeX commands ("and"/"or" between answers do not count). */
static bool is_prose(const char *s)
{
    int words = 0;
    for (size_t i = 0; s[i];) {
        if (s[i] == '\\') { /* a command name is not a word, nor an environment's */
            size_t c = ++i;
            while (isalpha((unsigned char)s[i]))
                i++;
            bool env = (i - c == 5 && !strncmp(s + c, "begin", 5)) || (i - c == 3 && !strncmp(s + c, "end", 3));
            if (env && s[i] == '{')
                i += strcspn(s + i, "}");
            continue;
        }
        if (!isalpha((unsigned char)s[i])) {
            i++;
            continue;
        }
        size_t j = i;
        while (isalpha((unsigned char)s[j]))
            j++;
        bool joiner = (j - i == 3 && !strncmp(s + i, "and", 3)) || (j - i == 2 && !strncmp(s + i, "or", 2));
        if (j - i >= 2 && !joiner)
            words++;
        i = j;
    }
    return words >= 2;
}

/* An unescaped '$' or a \( / \[ opener. */
static bool has_delimiters(const char *s)
{
    for (size_t i = 0; s[i]; i++) {
        if (s[i] == '\\' && (s[i + 1] == '(' || s[i + 1] == '['))
            return true;
        if (s[i] == '\\' && s[i + 1])
            i++;
        else if (s[i] == '$')
            return true;
    }
    return false;
}

/* Math-Verify's order: a boxed answer or an "answer is" phrase, the later
 * of the two; else the last math span or the last number, the later of the
 * two; else the whole text when it is a bare answer. */
static char *extract_math(const char *text)
{
    size_t n = strlen(text), pb = 0, pp = 0, ps = 0, pn = 0;
    char *b = boxed_answer(text, &pb), *ph = phrase_answer(text, &pp);
    char *a = b && ph ? (pp > pb ? ph : b) : b ? b : ph;
    free(a == b ? ph : b);
    if (!a && !is_prose(text) && !has_delimiters(text) && n < 200 && qd_rw_parses(text))
        a = qd_rw_strndup(text, n);
    if (!a) {
        char *m = last_span_group(text, n, &ps), *num = last_number_at(text, n, &pn);
        a = m && num ? (pn >= ps ? num : m) : m ? m : num;
        free(a == m ? num : m);
    }
    if (!a)
        return NULL;
    char *t = qd_rw_trim(a);
    free(a);
    return t;
}

/* GSM8K: "#### N", else an "A:"/"Answer:" line, else \boxed, else the last number. */
static char *extract_gsm8k(const char *text)
{
    const char *p = strstr(text, "####"), *q;
    while (p && (q = strstr(p + 4, "####")))
        p = q;
    char *line = NULL;
    if (p) {
        p += 4;
        line = qd_rw_strndup(p, strcspn(p, "\n"));
    } else if ((p = last_ci(text, "answer:")) || ((p = last_ci(text, "\nA:")) && (p += 1)) ||
               (qd_rw_starts(text, "A:") && (p = text))) {
        p = strchr(p, ':') + 1;
        line = qd_rw_strndup(p, strcspn(p, "\n"));
    } else {
        size_t pos;
        line = boxed_answer(text, &pos);
    }
    const char *src = line ? line : text;
    char *num = last_number(src, strlen(src));
    free(line);
    return num;
}

/* DAPO (verl math_dapo): the last "Answer: ..." line in the final 300 characters. */
static char *extract_dapo(const char *text)
{
    size_t n = strlen(text);
    const char *tail = n > 300 ? text + n - 300 : text;
    const char *p = last_ci(tail, "answer");
    while (p) {
        const char *s = p + 6;
        while (isspace((unsigned char)*s))
            s++;
        if (*s == ':') {
            s++;
            while (isspace((unsigned char)*s) && *s != '\n')
                s++;
            if (*s && *s != '\n')
                return qd_rw_strndup(s, strcspn(s, "\n"));
        }
        const char *prev = NULL;
        for (const char *q = tail; q < p; q++)
            if (!strncasecmp(q, "answer", 6))
                prev = q;
        p = prev;
    }
    return NULL;
}

char *qd_rewards_extract(const char *text, qd_grade_style style)
{
    unsigned long failures = qd_rw_alloc_failures();
    text = qd_rewards_after_think(text);
    char *a = style == QD_GRADE_GSM8K ? extract_gsm8k(text)
            : style == QD_GRADE_DAPO  ? extract_dapo(text)
                                      : extract_math(text);
    if (qd_rw_alloc_failures() != failures) { /* a step fell back: not the answer */
        free(a);
        return NULL;
    }
    return a;
}
