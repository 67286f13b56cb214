/* String normalizations of the reference graders: Hendrycks MATH
 * (_strip_string / is_equiv) and Minerva's normalize_final_answer. Each is a
 * re-implementation of the published algorithm, step for step, so that our
 * "math" grader accepts at least what those graders accept. */
#include <ctype.h>
#include <stdlib.h>
#include <string.h>
#include "rewards/internal.h"
#include "rewards/rewards.h"

/* "\frac12" -> "\frac{1}{2}", "\frac1{72}" -> "\frac{1}{72}". Returns false
 * where the reference raises (a "\frac" with fewer than two characters). */
static bool fix_fracs(char **s)
{
    const char *src = *s, *p = strstr(src, "\\frac");
    if (!p)
        return true;
    qd_rw_buf b = {0};
    qd_rw_buf_putn(&b, src, (size_t)(p - src));
    while (p) {
        const char *sub = p + 5, *next = strstr(sub, "\\frac");
        size_t n = next ? (size_t)(next - sub) : strlen(sub);
        qd_rw_buf_puts(&b, "\\frac");
        if (n >= 1 && sub[0] == '{') {
            qd_rw_buf_putn(&b, sub, n);
        } else if (n < 2) {
            free(qd_rw_buf_steal(&b)); /* reference: IndexError/assert -> unchanged */
            return n == 1 ? true : false;
        } else if (sub[1] != '{') {
            char t[8] = {'{', sub[0], '}', '{', sub[1], '}', 0};
            qd_rw_buf_puts(&b, t);
            qd_rw_buf_putn(&b, sub + 2, n - 2);
        } else {
            char t[4] = {'{', sub[0], '}', 0};
            qd_rw_buf_puts(&b, t);
            qd_rw_buf_putn(&b, sub + 1, n - 1);
        }
        p = next;
    }
    free(*s);
    *s = qd_rw_buf_steal(&b);
    return true;
}

/* "\sqrt3" -> "\sqrt{3}" (one character only, as in the reference). */
static bool fix_sqrt(char **s)
{
    const char *src = *s, *p = strstr(src, "\\sqrt");
    if (!p)
        return true;
    qd_rw_buf b = {0};
    qd_rw_buf_putn(&b, src, (size_t)(p - src));
    while (p) {
        const char *sub = p + 5, *next = strstr(sub, "\\sqrt");
        size_t n = next ? (size_t)(next - sub) : strlen(sub);
        if (n == 0) {
            free(qd_rw_buf_steal(&b));
            return false; /* reference: split[0] of an empty piece raises */
        }
        qd_rw_buf_puts(&b, "\\sqrt");
        if (sub[0] != '{') {
            char t[4] = {'{', sub[0], '}', 0};
            qd_rw_buf_puts(&b, t);
            qd_rw_buf_putn(&b, sub + 1, n - 1);
        } else {
            qd_rw_buf_putn(&b, sub, n);
        }
        p = next;
    }
    free(*s);
    *s = qd_rw_buf_steal(&b);
    return true;
}

/* "a/b" with integers a, b (nothing else) -> "\frac{a}{b}". */
static void fix_a_slash_b(char **s)
{
    const char *slash = strchr(*s, '/');
    if (!slash || strchr(slash + 1, '/'))
        return;
    const char *a = *s, *b = slash + 1;
    size_t na = (size_t)(slash - a), nb = strlen(b);
    if (!na || !nb)
        return;
    for (size_t i = 0; i < na; i++)
        if (!isdigit((unsigned char)a[i]) && !(i == 0 && a[i] == '-' && na > 1))
            return;
    for (size_t i = 0; i < nb; i++)
        if (!isdigit((unsigned char)b[i]) && !(i == 0 && b[i] == '-' && nb > 1))
            return;
    /* the reference round-trips through int(): leading zeros would differ */
    if ((na > 1 && a[0] == '0') || (nb > 1 && b[0] == '0'))
        return;
    qd_rw_buf o = {0};
    qd_rw_buf_puts(&o, "\\frac{");
    qd_rw_buf_putn(&o, a, na);
    qd_rw_buf_puts(&o, "}{");
    qd_rw_buf_putn(&o, b, nb);
    qd_rw_buf_puts(&o, "}");
    free(*s);
    *s = qd_rw_buf_steal(&o);
}

/* "10\text{ units}" -> "10"; more than one "\text{ " raises in the reference. */
static bool remove_right_units(char **s)
{
    const char *p = strstr(*s, "\\text{ ");
    if (!p)
        return true;
    if (strstr(p + 1, "\\text{ "))
        return false;
    char *r = qd_rw_strndup(*s, (size_t)(p - *s));
    free(*s);
    *s = r;
    return true;
}

/* "k = 5" -> " 5": one '=' whose left side is at most two characters. */
static void drop_short_lhs(char **s)
{
    const char *eq = strchr(*s, '=');
    if (!eq || strchr(eq + 1, '=') || eq - *s > 2)
        return;
    char *r = qd_rw_strndup(eq + 1, strlen(eq + 1));
    free(*s);
    *s = r;
}

char *qd_rewards_strip_hendrycks(const char *in)
{
    static const char *const rep[][2] = {
        {"\n", ""}, {"\\!", ""}, {"\\\\", "\\"}, {"tfrac", "frac"}, {"dfrac", "frac"},
        {"\\left", ""}, {"\\right", ""}, {"^{\\circ}", ""}, {"^\\circ", ""}, {"\\$", ""},
    };
    /* every step maps a NULL s (out of memory) to NULL */
    char *s = qd_rw_strndup(in, strlen(in));
    for (size_t i = 0; i < sizeof rep / sizeof rep[0]; i++)
        qd_rw_replace_inplace(&s, rep[i][0], rep[i][1]);
    if (!s || !remove_right_units(&s))
        goto fail;
    qd_rw_replace_inplace(&s, "\\%", "");
    qd_rw_replace_inplace(&s, " .", " 0.");
    qd_rw_replace_inplace(&s, "{.", "{0.");
    if (!s || !s[0])
        return s;
    if (s[0] == '.') {
        qd_rw_buf b = {0};
        qd_rw_buf_putc(&b, '0');
        qd_rw_buf_puts(&b, s);
        free(s);
        s = qd_rw_buf_steal(&b);
    }
    if (s)
        drop_short_lhs(&s);
    if (!s || !fix_sqrt(&s))
        goto fail;
    qd_rw_replace_inplace(&s, " ", "");
    if (!s || !fix_fracs(&s) || !s)
        goto fail;
    if (!strcmp(s, "0.5")) {
        free(s);
        s = qd_rw_strndup("\\frac{1}{2}", 11);
    }
    if (s)
        fix_a_slash_b(&s);
    return s;
fail:
    free(s);
    return NULL;
}

bool qd_rewards_equiv_hendrycks(const char *a, const char *b)
{
    if (!a || !b)
        return !a && !b;
    char *sa = qd_rewards_strip_hendrycks(a), *sb = qd_rewards_strip_hendrycks(b);
    bool eq = (sa && sb) ? !strcmp(sa, sb) : !strcmp(a, b);
    free(sa);
    free(sb);
    return eq;
}

/* re.sub(r"(\\NAME\{)(.*?)(\})", r"\2"): unwrap every \NAME{...} at its first '}'. */
static void unwrap_lazy(char **s, const char *name)
{
    if (!*s)
        return;
    qd_rw_buf b = {0};
    const char *p = *s, *q;
    size_t nl = strlen(name);
    while ((q = strstr(p, name))) {
        const char *close = strchr(q + nl, '}');
        if (!close)
            break;
        qd_rw_buf_putn(&b, p, (size_t)(q - p));
        qd_rw_buf_putn(&b, q + nl, (size_t)(close - q - nl));
        p = close + 1;
    }
    qd_rw_buf_puts(&b, p);
    free(*s);
    *s = qd_rw_buf_steal(&b);
}

/* re.sub(r"(frac)([^{])(.)", r"frac{\2}{\3}") and r"(sqrt)([^{])" -> r"sqrt{\2}". */
static void brace_shorthand(char **s, const char *cmd, int nargs)
{
    if (!*s)
        return;
    qd_rw_buf b = {0};
    const char *p = *s, *q;
    size_t cl = strlen(cmd);
    while ((q = strstr(p, cmd))) {
        const char *a = q + cl;
        bool ok = a[0] && a[0] != '{' && (nargs == 1 || a[1]);
        qd_rw_buf_putn(&b, p, (size_t)(a - p));
        if (!ok) {
            p = a;
            continue;
        }
        for (int i = 0; i < nargs; i++) {
            qd_rw_buf_putc(&b, '{');
            qd_rw_buf_putc(&b, a[i]);
            qd_rw_buf_putc(&b, '}');
        }
        p = a + nargs;
    }
    qd_rw_buf_puts(&b, p);
    free(*s);
    *s = qd_rw_buf_steal(&b);
}

/* re.sub(r"(.*?)(\$)(.*?)(\$)(.*)", r"$\3$"): keep the first $...$ span. */
static void first_dollar_span(char **s)
{
    char *a = *s ? strchr(*s, '$') : NULL, *b = a ? strchr(a + 1, '$') : NULL;
    if (!b)
        return;
    char *r = qd_rw_strndup(a, (size_t)(b - a + 1));
    free(*s);
    *s = r;
}

char *qd_rewards_normalize_minerva(const char *in)
{
    static const char *const subs[][2] = {
        {"an ", ""}, {"a ", ""}, {".$", "$"}, {"\\$", ""}, {"\\ ", ""}, {" ", ""},
        {"mbox", "text"}, {",\\text{and}", ","}, {"\\text{and}", ","}, {"\\text{m}", "\\text{}"},
    };
    static const char *const removed[] = {
        "square", "ways", "integers", "dollars", "mph", "inches", "hours", "km", "units",
        "\\ldots", "sue", "points", "feet", "minutes", "digits", "cents", "degrees", "cm",
        "gm", "pounds", "meters", "meals", "edges", "students", "childrentickets",
        "multiples", "\\text{s}", "\\text{.}", "\\text{\ns}", "\\text{}^2", "\\text{}^3",
        "\\text{\n}", "\\text{}", "\\mathrm{th}", "^\\circ", "^{\\circ}", "\\;", ",\\!",
        "{,}", "\"", "\\dots",
    };
    const char *eq = strrchr(in, '=');
    char *s = qd_rw_strndup(eq ? eq + 1 : in, strlen(eq ? eq + 1 : in));
    for (size_t i = 0; i < sizeof subs / sizeof subs[0]; i++)
        qd_rw_replace_inplace(&s, subs[i][0], subs[i][1]);
    for (size_t i = 0; i < sizeof removed / sizeof removed[0]; i++)
        qd_rw_replace_inplace(&s, removed[i], "");
    first_dollar_span(&s); /* these pass a NULL s (out of memory) on */
    unwrap_lazy(&s, "\\text{");
    unwrap_lazy(&s, "\\textbf{");
    unwrap_lazy(&s, "\\overline{");
    if (!s)
        return NULL;
    char *box = strstr(s, "\\boxed{"), *last = strrchr(s, '}');
    if (box && last && last > box + 6) { /* greedy (\\boxed\{)(.*)(\}) */
        memmove(last, last + 1, strlen(last + 1) + 1);
        memmove(box, box + 7, strlen(box + 7) + 1);
    }
    brace_shorthand(&s, "frac", 2);
    brace_shorthand(&s, "sqrt", 1);
    qd_rw_replace_inplace(&s, "$", "");
    char *nocomma = qd_rw_replace(s, ",", "");
    if (!nocomma) {
        free(s);
        return NULL;
    }
    bool digits = nocomma[0] != '\0';
    for (const char *p = nocomma; *p; p++)
        digits = digits && isdigit((unsigned char)*p);
    if (digits) {
        free(s);
        s = nocomma;
    } else {
        free(nocomma);
    }
    char *t = qd_rw_trim(s);
    free(s);
    return t;
}
