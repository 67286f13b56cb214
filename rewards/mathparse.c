/* A small LaTeX/plain-text answer parser: numbers, fractions, roots,
 * arithmetic with implicit multiplication, functions, tuples, intervals,
 * sets, matrices, unions and relations. It is not a CAS: equiv.c compares
 * the trees exactly (rationals) or by evaluation. */
#include <ctype.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "rewards/internal.h"

/* ---- arena */

qd_rw_node *qd_rw_new(qd_rw_arena *a, qd_rw_kind kind)
{
    qd_rw_node *n = qd_rw_calloc(1, sizeof *n);
    if (!n)
        return NULL;
    n->kind = kind;
    n->arena = a;
    n->next_alloc = a->nodes;
    a->nodes = n;
    return n;
}

bool qd_rw_add_kid(qd_rw_node *n, qd_rw_node *kid)
{
    qd_rw_node **k = qd_rw_realloc(n->kids, sizeof *k * (size_t)(n->nkids + 1));
    if (!k)
        return false;
    n->kids = k;
    n->kids[n->nkids++] = kid;
    return true;
}

void qd_rw_arena_free(qd_rw_arena *a)
{
    while (a->nodes) {
        qd_rw_node *n = a->nodes;
        a->nodes = n->next_alloc;
        free(n->kids);
        free(n->ops);
        if (n->qstate)
            mpq_clear(n->q);
        free(n);
    }
}

/* ---- tokens */

typedef enum {
    T_END, T_NUM, T_VAR, T_WORD, T_TEXT, T_FUNC, T_FRAC, T_SQRT, T_BINOM, T_CHAR,
    T_REL, T_PM, T_CUP, T_INF, T_LSET, T_RSET, T_ROWSEP, T_BEGIN, T_ENDENV,
} tok_type;

typedef struct {
    tok_type t;
    char c;         /* T_CHAR: the character; T_REL: the operator */
    char s[64];     /* text of NUM/VAR/WORD/TEXT/FUNC */
} token;

typedef struct {
    token *toks;
    int n, cap, pos;
    int depth; /* nesting of parse_seq: bounded so no input exhausts the stack */
    bool err;
    qd_rw_arena *arena;
} parser;

static void push(parser *p, tok_type t, char c, const char *s, size_t n)
{
    if (p->n == p->cap) {
        int cap = p->cap ? 2 * p->cap : 32;
        token *nt = qd_rw_realloc(p->toks, sizeof *nt * (size_t)cap);
        if (!nt) {
            p->err = true; /* the parse fails; the tokens so far are freed with p */
            return;
        }
        p->toks = nt;
        p->cap = cap;
    }
    token *k = &p->toks[p->n++];
    k->t = t;
    k->c = c;
    if (n >= sizeof k->s)
        n = sizeof k->s - 1, p->err = true;
    memcpy(k->s, s ? s : "", s ? n : 0);
    k->s[s ? n : 0] = '\0';
}

static const char *const functions[] = {"sin", "cos", "tan", "sec", "csc", "cot", "arcsin",
                                        "arccos", "arctan", "sinh", "cosh", "tanh", "ln",
                                        "log", "exp", "sqrt", NULL};

static bool in_list(const char *const *list, const char *s)
{
    for (; *list; list++)
        if (!strcmp(*list, s))
            return true;
    return false;
}

/* Reads a {...} group at s[*i] (after spaces); its content in out. */
static bool read_group(const char *s, size_t *i, char *out, size_t cap)
{
    while (s[*i] == ' ')
        (*i)++;
    if (s[*i] != '{')
        return false;
    size_t close = qd_rw_match_brace(s, *i);
    if (!close || close - *i - 2 >= cap)
        return false;
    memcpy(out, s + *i + 1, close - *i - 2);
    out[close - *i - 2] = '\0';
    *i = close;
    return true;
}

static const struct {
    const char *name;
    char op;
} rel_cmds[] = {{"le", 'l'}, {"leq", 'l'}, {"leqslant", 'l'}, {"ge", 'g'}, {"geq", 'g'},
                {"geqslant", 'g'}, {"lt", '<'}, {"gt", '>'}, {"ne", 'n'}, {"neq", 'n'},
                {"approx", '~'}, {"simeq", '~'}, {"in", 'i'}};

static const char *const text_cmds[] = {"text", "textbf", "mbox", "mathrm", "textnormal",
                                        "textit", "mathit", "operatorname", "textrm", "emph",
                                        "textsf", "mathsf", NULL};
static const char *const wrap_cmds[] = {"overline", "vec", "hat", "bar", "widehat", "mathbb",
                                        "mathcal", "underline", "tilde", "mathbf", "boldsymbol",
                                        "overrightarrow", "widetilde", NULL};
static const char *const fail_cmds[] = {"dots", "ldots", "cdots", "vdots", "cap", "setminus",
                                        "lfloor", "rfloor", "lceil", "rceil", "mid", "sum",
                                        "prod", "int", "lim", "to", "rightarrow", "Rightarrow",
                                        "implies", "iff", "forall", "exists", "nabla", NULL};
static const char *const skip_cmds[] = {"boxed", "fbox", "displaystyle", "quad", "qquad",
                                        "left", "right", "big", "Big", "bigl", "bigr", "Bigl",
                                        "Bigr", "limits", "nolimits", NULL};
static const char *const matrix_envs[] = {"pmatrix", "bmatrix", "matrix", "vmatrix", "Bmatrix",
                                          "array", "smallmatrix", NULL};

/* One backslash command at s[*i] (pointing after the backslash). */
static void lex_command(parser *p, const char *s, size_t *i)
{
    char name[32];
    size_t n = 0;
    while (isalpha((unsigned char)s[*i]) && n < sizeof name - 1)
        name[n++] = s[(*i)++];
    name[n] = '\0';
    if (!n) {
        char c = s[*i];
        if (!c) { /* a lone backslash at the end */
            p->err = true;
            return;
        }
        (*i)++;
        if (c == '{')
            push(p, T_LSET, 0, NULL, 0);
        else if (c == '}')
            push(p, T_RSET, 0, NULL, 0);
        else if (c == '\\')
            push(p, T_ROWSEP, 0, NULL, 0);
        else if (!strchr(",;:! %$|#&", c))
            p->err = true;
        return;
    }
    char grp[256];
    for (size_t k = 0; k < sizeof rel_cmds / sizeof rel_cmds[0]; k++)
        if (!strcmp(name, rel_cmds[k].name)) {
            push(p, T_REL, rel_cmds[k].op, NULL, 0);
            return;
        }
    if (in_list(text_cmds, name)) {
        if (!read_group(s, i, grp, sizeof grp))
            p->err = true;
        else
            push(p, T_TEXT, 0, grp, strlen(grp));
    } else if (in_list(wrap_cmds, name)) {
        if (!read_group(s, i, grp, sizeof grp))
            p->err = true;
        else
            push(p, T_VAR, 0, grp, strlen(grp));
    } else if (in_list(skip_cmds, name)) {
        return;
    } else if (!strcmp(name, "frac")) {
        push(p, T_FRAC, 0, NULL, 0);
    } else if (!strcmp(name, "sqrt")) {
        push(p, T_SQRT, 0, NULL, 0);
    } else if (!strcmp(name, "binom")) {
        push(p, T_BINOM, 0, NULL, 0);
    } else if (in_list(functions, name)) {
        push(p, T_FUNC, 0, name, n);
    } else if (!strcmp(name, "pm") || !strcmp(name, "mp")) {
        push(p, T_PM, 0, NULL, 0);
    } else if (!strcmp(name, "cdot") || !strcmp(name, "times") || !strcmp(name, "ast")) {
        push(p, T_CHAR, '*', NULL, 0);
    } else if (!strcmp(name, "div")) {
        push(p, T_CHAR, '/', NULL, 0);
    } else if (!strcmp(name, "cup")) {
        push(p, T_CUP, 0, NULL, 0);
    } else if (!strcmp(name, "infty") || !strcmp(name, "infinity")) {
        push(p, T_INF, 0, NULL, 0);
    } else if (!strcmp(name, "langle")) {
        push(p, T_CHAR, '(', NULL, 0);
    } else if (!strcmp(name, "rangle")) {
        push(p, T_CHAR, ')', NULL, 0);
    } else if (!strcmp(name, "begin") || !strcmp(name, "end")) {
        if (!read_group(s, i, grp, sizeof grp) || !in_list(matrix_envs, grp)) {
            p->err = true;
            return;
        }
        if (!strcmp(name, "begin") && !strcmp(grp, "array"))
            read_group(s, i, grp, sizeof grp); /* column spec */
        push(p, name[0] == 'b' ? T_BEGIN : T_ENDENV, 0, NULL, 0);
    } else if (in_list(fail_cmds, name)) {
        p->err = true; /* beyond this parser: compared as strings only */
    } else {
        push(p, T_VAR, 0, name, n); /* \alpha, \pi, \theta, ... */
    }
}

static void lex(parser *p, const char *s)
{
    for (size_t i = 0; s[i] && !p->err;) {
        unsigned char c = (unsigned char)s[i];
        if (isspace(c)) {
            i++;
        } else if (isdigit(c) || (c == '.' && isdigit((unsigned char)s[i + 1]))) {
            size_t j = i;
            while (isdigit((unsigned char)s[j]))
                j++;
            if (s[j] == '.' && isdigit((unsigned char)s[j + 1]))
                for (j++; isdigit((unsigned char)s[j]);)
                    j++;
            if ((s[j] == 'e' || s[j] == 'E') &&
                (isdigit((unsigned char)s[j + 1]) ||
                 ((s[j + 1] == '-' || s[j + 1] == '+') && isdigit((unsigned char)s[j + 2])))) {
                j += 2; /* scientific notation: 1.5e3, 2E-4 */
                while (isdigit((unsigned char)s[j]))
                    j++;
            }
            if (s[j] == '_' && (isdigit((unsigned char)s[j + 1]) || s[j + 1] == '{')) {
                size_t k = j + 1; /* 204_5: a number in base 5, kept as written */
                char grp[32];
                if (s[k] != '{')
                    k++;
                else if (!read_group(s, &k, grp, sizeof grp))
                    p->err = true;
                push(p, T_TEXT, 0, s + i, k - i);
                i = k;
                continue;
            }
            push(p, T_NUM, 0, s + i, j - i);
            i = j;
        } else if (isalpha(c)) {
            size_t j = i;
            while (isalpha((unsigned char)s[j]))
                j++;
            push(p, j - i == 1 ? T_VAR : T_WORD, 0, s + i, j - i);
            i = j;
        } else if (c == '\\') {
            i++;
            lex_command(p, s, &i);
        } else if ((c == '<' || c == '>' || c == '!') && s[i + 1] == '=') {
            push(p, T_REL, c == '<' ? 'l' : c == '>' ? 'g' : 'n', NULL, 0);
            i += 2;
        } else if (c == '<' || c == '>' || c == '=') {
            push(p, T_REL, (char)c, NULL, 0);
            i++;
        } else if (strchr("+-*/^_!,;()[]{}|&:", c)) {
            push(p, T_CHAR, (char)c, NULL, 0);
            i++;
        } else if (c == '.' && !s[i + 1]) {
            i++; /* a final full stop */
        } else {
            p->err = true;
        }
    }
    push(p, T_END, 0, NULL, 0);
}

/* ---- parser */

/* The current token; T_END (the last one) once the input is used up. */
static token *peek(parser *p) { return &p->toks[p->pos < p->n ? p->pos : p->n - 1]; }
static bool is_char(parser *p, char c) { return peek(p)->t == T_CHAR && peek(p)->c == c; }

static bool accept(parser *p, char c)
{
    if (!is_char(p, c))
        return false;
    p->pos++;
    return true;
}

static qd_rw_node *fail(parser *p)
{
    p->err = true;
    return NULL;
}

/* The arena's allocations for the parser: out of memory fails the parse. */
static qd_rw_node *new_node(parser *p, qd_rw_kind k)
{
    qd_rw_node *n = qd_rw_new(p->arena, k);
    return n ? n : fail(p);
}

static bool add_kid(parser *p, qd_rw_node *n, qd_rw_node *kid)
{
    if (qd_rw_add_kid(n, kid))
        return true;
    fail(p);
    return false;
}

static qd_rw_node *node2(parser *p, qd_rw_kind k, qd_rw_node *a, qd_rw_node *b)
{
    if (!a || (!b && k != QD_RW_NEG && k != QD_RW_FACT && k != QD_RW_FUNC))
        return fail(p);
    qd_rw_node *n = new_node(p, k);
    if (!n || !add_kid(p, n, a) || (b && !add_kid(p, n, b)))
        return NULL;
    return n;
}

static qd_rw_node *parse_seq(parser *p);
static qd_rw_node *parse_additive(parser *p);
static qd_rw_node *parse_unary(parser *p);
static qd_rw_node *parse_power(parser *p);

/* A literal: exact num/den when it fits in 64 bits (1.25e-3 included); the
 * text is kept for exact comparison of larger ones. */
static qd_rw_node *number_node(parser *p, const char *s)
{
    qd_rw_node *n = new_node(p, QD_RW_NUM);
    if (!n)
        return NULL;
    snprintf(n->name, sizeof n->name, "%s", s); /* tokens are shorter: see push() */
    n->val = strtod(s, NULL);
    size_t mant = strcspn(s, "eE");
    const char *dot = memchr(s, '.', mant);
    n->decimals = dot ? (int)(mant - (size_t)(dot - s) - 1) : 0;
    long exp10 = s[mant] ? strtol(s + mant + 1, NULL, 10) : 0;
    __int128 num = 0, den = 1;
    bool ok = mant <= 18 && exp10 > -19 && exp10 < 19;
    for (size_t i = 0; ok && i < mant; i++) {
        if (s[i] == '.')
            continue;
        num = num * 10 + (s[i] - '0');
        if (dot && s + i > dot)
            den *= 10;
    }
    for (long e = 0; ok && e < (exp10 > 0 ? exp10 : -exp10); e++)
        *(exp10 > 0 ? &num : &den) *= 10;
    ok = ok && num <= INT64_MAX && den <= INT64_MAX;
    if (s[mant])
        n->decimals = 0; /* 1.5e3 is not a rounded decimal */
    n->exact = ok;
    n->num = (int64_t)num;
    n->den = (int64_t)den;
    return n;
}

/* A {...} argument or a single token (\frac12, \sqrt3, x^2). */
static qd_rw_node *parse_arg(parser *p)
{
    if (accept(p, '{')) {
        qd_rw_node *e = parse_seq(p);
        if (!accept(p, '}'))
            return fail(p);
        return e;
    }
    token *t = peek(p);
    if (t->t == T_NUM && strlen(t->s) > 1 && !strchr(t->s, '.')) {
        /* \frac12: only the first digit is the argument */
        char d[2] = {t->s[0], 0};
        memmove(t->s, t->s + 1, strlen(t->s));
        return number_node(p, d);
    }
    if (t->t == T_CHAR && t->c == '-') {
        p->pos++;
        return node2(p, QD_RW_NEG, parse_arg(p), NULL);
    }
    return parse_power(p);
}

/* Elements of a bracket up to the closing token; kind decided by the caller. */
static qd_rw_node *parse_bracketed(parser *p, char open)
{
    qd_rw_node *inner = parse_seq(p);
    if (!inner)
        return fail(p);
    token *t = peek(p);
    char close = t->t == T_CHAR ? t->c : 0;
    if (close != ')' && close != ']')
        return fail(p);
    p->pos++;
    if (inner->kind != QD_RW_LIST && open == '(' && close == ')')
        return inner; /* plain grouping */
    if (inner->kind != QD_RW_LIST && open == '[' && close == ']')
        return inner;
    qd_rw_node *tu = new_node(p, QD_RW_TUPLE);
    if (!tu)
        return NULL;
    tu->open = open;
    tu->close = close;
    if (inner->kind == QD_RW_LIST) {
        tu->kids = inner->kids;
        tu->nkids = inner->nkids;
        inner->kids = NULL;
        inner->nkids = 0;
    } else if (!add_kid(p, tu, inner)) {
        return NULL;
    }
    return tu;
}

static qd_rw_node *parse_matrix(parser *p)
{
    qd_rw_node *m = new_node(p, QD_RW_MATRIX);
    if (!m)
        return NULL;
    int cols = 0, rowcells = 0;
    for (;;) {
        token *t = peek(p);
        if (t->t == T_ENDENV) {
            p->pos++;
            break;
        }
        if (t->t == T_ROWSEP) {
            p->pos++;
            if (rowcells == 0)
                continue; /* a trailing or empty row */
            if (cols && rowcells != cols)
                return fail(p);
            cols = rowcells;
            rowcells = 0;
            m->rows++;
            continue;
        }
        if (t->t == T_END)
            return fail(p);
        qd_rw_node *cell = parse_additive(p);
        if (!cell || !add_kid(p, m, cell))
            return fail(p);
        rowcells++;
        if (!accept(p, '&') && peek(p)->t != T_ROWSEP && peek(p)->t != T_ENDENV)
            return fail(p);
    }
    if (rowcells) {
        if (cols && rowcells != cols)
            return fail(p);
        cols = rowcells;
        m->rows++;
    }
    m->cols = cols;
    return m->rows ? m : fail(p);
}

static qd_rw_node *var_node(parser *p, const char *name)
{
    qd_rw_node *v = new_node(p, QD_RW_VAR);
    if (!v)
        return NULL;
    snprintf(v->name, sizeof v->name, "%s", name);
    return v;
}

/* A run of letters: a word answer, or a product of one-letter symbols (xy). */
static qd_rw_node *word_node(parser *p, const char *w)
{
    qd_rw_node *acc = NULL;
    for (const char *c = w; *c; c++) {
        char s[2] = {*c, 0};
        qd_rw_node *v = var_node(p, s);
        acc = acc ? node2(p, QD_RW_MUL, acc, v) : v;
    }
    return acc;
}

static qd_rw_node *text_node(parser *p, const char *raw)
{
    char buf[64];
    size_t n = 0;
    for (const char *c = raw; *c && n < sizeof buf - 1; c++)
        if (!isspace((unsigned char)*c) && *c != '(' && *c != ')')
            buf[n++] = *c;
    buf[n] = '\0';
    if (n == 1 && isalpha((unsigned char)buf[0]))
        return var_node(p, buf); /* \text{C}, \mathrm{e}: a symbol */
    qd_rw_node *t = new_node(p, QD_RW_TEXT);
    if (!t)
        return NULL;
    snprintf(t->name, sizeof t->name, "%s", buf);
    return t;
}

static qd_rw_node *parse_atom(parser *p)
{
    token *t = peek(p);
    if (t->t == T_END)
        return fail(p);
    p->pos++;
    switch (t->t) {
    case T_NUM:
        return number_node(p, t->s);
    case T_VAR:
        return var_node(p, t->s);
    case T_WORD:
        if (in_list(functions, t->s)) {
            char name[64];
            snprintf(name, sizeof name, "%s", t->s);
            qd_rw_node *f = node2(p, QD_RW_FUNC, is_char(p, '(') ? parse_atom(p) : parse_power(p), NULL);
            if (f)
                strcpy(f->name, name);
            return f;
        }
        return word_node(p, t->s);
    case T_TEXT:
        return text_node(p, t->s);
    case T_INF:
        return new_node(p, QD_RW_INF);
    case T_FRAC: {
        qd_rw_node *a = parse_arg(p), *b = a ? parse_arg(p) : NULL;
        return node2(p, QD_RW_DIV, a, b);
    }
    case T_BINOM: {
        qd_rw_node *a = parse_arg(p), *b = a ? parse_arg(p) : NULL;
        qd_rw_node *f = node2(p, QD_RW_FUNC, a, b);
        if (f)
            strcpy(f->name, "binom");
        return f;
    }
    case T_SQRT: {
        qd_rw_node *idx = NULL;
        if (accept(p, '[')) {
            idx = parse_additive(p);
            if (!accept(p, ']'))
                return fail(p);
        }
        qd_rw_node *f = node2(p, QD_RW_FUNC, parse_arg(p), idx);
        if (f)
            strcpy(f->name, idx ? "root" : "sqrt");
        return f;
    }
    case T_FUNC: {
        char name[64];
        snprintf(name, sizeof name, "%s", t->s);
        qd_rw_node *pw = NULL;
        if (accept(p, '^')) /* \sin^2 x = (\sin x)^2 */
            pw = parse_arg(p);
        qd_rw_node *f = node2(p, QD_RW_FUNC, is_char(p, '(') ? parse_atom(p) : parse_power(p), NULL);
        if (f)
            strcpy(f->name, name);
        return pw ? node2(p, QD_RW_POW, f, pw) : f;
    }
    case T_LSET: {
        qd_rw_node *inner = parse_seq(p);
        if (!inner || peek(p)->t != T_RSET)
            return fail(p);
        p->pos++;
        qd_rw_node *s = new_node(p, QD_RW_SET);
        if (!s)
            return NULL;
        if (inner->kind != QD_RW_LIST)
            return add_kid(p, s, inner) ? s : NULL;
        for (int i = 0; i < inner->nkids; i++)
            if (!add_kid(p, s, inner->kids[i]))
                return NULL;
        return s;
    }
    case T_BEGIN:
        return parse_matrix(p);
    case T_CHAR:
        if (t->c == '(' || t->c == '[')
            return parse_bracketed(p, t->c);
        if (t->c == '{') {
            qd_rw_node *e = parse_seq(p);
            return accept(p, '}') ? e : fail(p);
        }
        if (t->c == '|') {
            qd_rw_node *e = parse_additive(p);
            qd_rw_node *f = accept(p, '|') ? node2(p, QD_RW_FUNC, e, NULL) : fail(p);
            if (f)
                strcpy(f->name, "abs");
            return f;
        }
        return fail(p);
    default:
        return fail(p);
    }
}

static const char *const unit_words[] = {
    "percent", "percentage", "pct", "cm", "mm", "km", "m", "miles", "mile", "meters", "meter", "metres",
    "feet", "foot", "ft", "inches", "inch", "in", "units", "unit", "degrees", "degree", "deg",
    "dollars", "dollar", "cents", "cent", "hours", "hour", "minutes", "minute", "seconds",
    "second", "days", "day", "years", "year", "mph", "kg", "g", "grams", "gram", "pounds",
    "lb", "lbs", "ways", "points", "students", "square", "sq", "cubic", "liters", "ml", "s",
    "mi", "yards", "yd", "euros", "people", "times", "per", "th", "st", "nd", "rd", NULL};

/* Units after a value ("5 cm", "10\text{ units}", "15\mbox{ cm}^2"): dropped. */
static bool skip_units(parser *p)
{
    bool any = false;
    for (;;) {
        token *t = peek(p);
        bool unit = (t->t == T_WORD && in_list(unit_words, t->s)) ||
                    (t->t == T_TEXT && t->s[0] != '\0' && strcmp(t->s, "and") && strcmp(t->s, " and ") &&
                     strcmp(t->s, "or") && strcmp(t->s, " or ") && !isdigit((unsigned char)t->s[0]) &&
                     t->s[0] != '(' && !(strlen(t->s) == 1 && isalpha((unsigned char)t->s[0])));
        if (!unit)
            return any;
        p->pos++;
        any = true;
        if (is_char(p, '^') && p->toks[p->pos + 1].t == T_NUM)
            p->pos += 2;
    }
}

/* The subscript after '_' as text: x_1, x_{n-1}, S_{MBCN}. */
static bool read_subscript(parser *p, char *sub, size_t cap)
{
    token *t = peek(p);
    size_t len = 0;
    if (accept(p, '{')) {
        while (!is_char(p, '}') && peek(p)->t != T_END) {
            token *u = peek(p);
            char one[2] = {u->c, 0};
            len += (size_t)snprintf(sub + len, len < cap ? cap - len : 0, "%s", u->t == T_CHAR ? one : u->s);
            p->pos++;
        }
        return accept(p, '}') && len < cap;
    }
    if (t->t != T_NUM && t->t != T_VAR)
        return false;
    snprintf(sub, cap, "%.1s", t->s); /* x_12 is x_1 times 2 in TeX */
    if (strlen(t->s) > 1)
        memmove(t->s, t->s + 1, strlen(t->s));
    else
        p->pos++;
    return true;
}

static qd_rw_node *parse_postfix(parser *p)
{
    qd_rw_node *a = parse_atom(p);
    while (a && !p->err) {
        if (accept(p, '!')) {
            a = node2(p, QD_RW_FACT, a, NULL);
        } else if (a->kind == QD_RW_VAR && accept(p, '_')) {
            char sub[64] = "";
            if (!read_subscript(p, sub, sizeof sub))
                return fail(p);
            size_t l = strlen(a->name);
            snprintf(a->name + l, sizeof a->name - l, "_%s", sub);
        } else {
            break;
        }
    }
    return a;
}

static qd_rw_node *parse_power(parser *p)
{
    qd_rw_node *base = parse_postfix(p);
    if (base && accept(p, '^'))
        return node2(p, QD_RW_POW, base, parse_arg(p));
    return base;
}

static qd_rw_node *parse_unary(parser *p)
{
    if (accept(p, '-'))
        return node2(p, QD_RW_NEG, parse_unary(p), NULL);
    if (accept(p, '+'))
        return parse_unary(p);
    if (peek(p)->t == T_PM) {
        p->pos++;
        qd_rw_node *b = parse_unary(p);
        if (!b)
            return fail(p);
        qd_rw_node *n = new_node(p, QD_RW_PM);
        return n && add_kid(p, n, NULL) && add_kid(p, n, b) ? n : NULL;
    }
    return parse_power(p);
}

static bool starts_atom(parser *p)
{
    token *t = peek(p);
    switch (t->t) {
    case T_WORD:
        return strcmp(t->s, "and") && strcmp(t->s, "or");
    case T_NUM: case T_VAR: case T_FRAC: case T_SQRT: case T_BINOM: case T_FUNC:
    case T_INF: case T_BEGIN:
        return true;
    case T_TEXT:
        return strlen(t->s) == 1;
    case T_CHAR:
        return t->c == '(' || t->c == '{';
    default:
        return false;
    }
}

static bool integer_literal(const qd_rw_node *e)
{
    return e && e->kind == QD_RW_NUM && e->decimals == 0 && e->exact && e->den == 1;
}

/* Juxtaposition multiplies, except a mixed number: 2\frac{1}{4} = 2 + 1/4. */
static qd_rw_node *implicit_product(parser *p, qd_rw_node *a, qd_rw_node *b, bool b_is_frac)
{
    bool neg = a && a->kind == QD_RW_NEG;
    qd_rw_node *whole = neg ? a->kids[0] : a;
    if (integer_literal(whole) && b && b->kind == QD_RW_DIV && integer_literal(b->kids[0]) &&
        integer_literal(b->kids[1]) && b_is_frac) {
        qd_rw_node *sum = node2(p, QD_RW_ADD, whole, b);
        return neg ? node2(p, QD_RW_NEG, sum, NULL) : sum;
    }
    return node2(p, QD_RW_MUL, a, b);
}

static qd_rw_node *parse_mult(parser *p)
{
    qd_rw_node *a = parse_unary(p);
    while (a && !p->err) {
        if (skip_units(p))
            continue;
        if (accept(p, '*'))
            a = node2(p, QD_RW_MUL, a, parse_unary(p));
        else if (accept(p, '/'))
            a = node2(p, QD_RW_DIV, a, parse_unary(p));
        else if (starts_atom(p)) {
            bool frac = peek(p)->t == T_FRAC;
            a = implicit_product(p, a, parse_power(p), frac);
        }
        else
            break;
    }
    return a;
}

static qd_rw_node *parse_additive(parser *p)
{
    qd_rw_node *a = parse_mult(p);
    while (a && !p->err) {
        if (accept(p, '+')) {
            a = node2(p, QD_RW_ADD, a, parse_mult(p));
        } else if (accept(p, '-')) {
            a = node2(p, QD_RW_SUB, a, parse_mult(p));
        } else if (peek(p)->t == T_PM) {
            p->pos++;
            a = node2(p, QD_RW_PM, a, parse_mult(p));
        } else {
            break;
        }
    }
    return a;
}

static qd_rw_node *parse_union(parser *p)
{
    qd_rw_node *a = parse_additive(p);
    if (!a || peek(p)->t != T_CUP)
        return a;
    qd_rw_node *u = new_node(p, QD_RW_UNION);
    if (!u || !add_kid(p, u, a))
        return NULL;
    while (peek(p)->t == T_CUP && !p->err) {
        p->pos++;
        qd_rw_node *b = parse_additive(p);
        if (!b || !add_kid(p, u, b))
            return fail(p);
    }
    return u;
}

/* a : b (ratios, clock times) as an ordered pair */
static qd_rw_node *parse_ratio(parser *p)
{
    qd_rw_node *a = parse_union(p);
    if (!a || !is_char(p, ':'))
        return a;
    qd_rw_node *r = new_node(p, QD_RW_TUPLE);
    if (!r || !add_kid(p, r, a))
        return NULL;
    r->open = r->close = ':';
    while (accept(p, ':')) {
        qd_rw_node *b = parse_union(p);
        if (!b || !add_kid(p, r, b))
            return fail(p);
    }
    return r;
}

static qd_rw_node *parse_rel(parser *p)
{
    qd_rw_node *a = parse_ratio(p);
    if (!a || peek(p)->t != T_REL)
        return a;
    qd_rw_node *r = new_node(p, QD_RW_REL);
    if (!r || !add_kid(p, r, a))
        return NULL;
    while (peek(p)->t == T_REL && !p->err) {
        char op = peek(p)->c;
        p->pos++;
        qd_rw_node *b = parse_ratio(p);
        if (!b)
            return fail(p);
        char *ops = qd_rw_realloc(r->ops, (size_t)r->nkids + 1);
        if (!ops)
            return fail(p);
        r->ops = ops;
        r->ops[r->nkids - 1] = op;
        r->ops[r->nkids] = '\0';
        if (!add_kid(p, r, b))
            return NULL;
    }
    return r;
}

/* ';' separates groups ("p=5,q=2; p=7,q=2"); ',', "and", "or" separate items. */
static bool at_separator(parser *p, bool semicolon)
{
    token *t = peek(p);
    if (t->t == T_CHAR && (t->c == ';' || t->c == ','))
        return (t->c == ';') == semicolon;
    if (!semicolon && (t->t == T_WORD || t->t == T_TEXT)) {
        char w[64];
        size_t n = 0;
        for (const char *c = t->s; *c && n < sizeof w - 1; c++)
            if (!isspace((unsigned char)*c))
                w[n++] = *c;
        w[n] = '\0';
        return !strcmp(w, "and") || !strcmp(w, "or");
    }
    return false;
}

#define MAX_DEPTH 64
#define MAX_ANSWER 4096

static qd_rw_node *parse_list(parser *p, bool outer)
{
    qd_rw_node *a = outer ? parse_list(p, false) : parse_rel(p);
    if (!a || !at_separator(p, outer))
        return a;
    qd_rw_node *l = new_node(p, QD_RW_LIST);
    if (!l || !add_kid(p, l, a))
        return NULL;
    while (at_separator(p, outer) && !p->err) {
        while (at_separator(p, outer))
            p->pos++;
        qd_rw_node *b = outer ? parse_list(p, false) : parse_rel(p);
        if (!b || !add_kid(p, l, b))
            return fail(p);
    }
    return l;
}

static qd_rw_node *parse_seq(parser *p)
{
    if (++p->depth > MAX_DEPTH)
        return fail(p);
    qd_rw_node *r = parse_list(p, true);
    p->depth--;
    return r;
}

/* ---- string preparation before lexing */

static bool all_digits(const char *s, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (!isdigit((unsigned char)s[i]))
            return false;
    return n > 0;
}

/* "7,425,000" / "1 000" -> "7425000"; "1000,99" / "0,111" -> decimal comma. */
static void fix_whole_number(char **s, bool decimal_comma)
{
    char *t = *s;
    size_t n = strlen(t), i = t[0] == '-' ? 1 : 0;
    char sep = 0;
    for (size_t k = i; k < n; k++)
        if (t[k] == ',' || t[k] == ' ') {
            sep = t[k];
            break;
        }
    if (!sep)
        return;
    /* groups of the integer part */
    size_t first = strcspn(t + i, sep == ',' ? "," : " ");
    const char *rest = t + i + first;
    bool thousands = first >= 1 && first <= 3 && all_digits(t + i, first) && t[i] != '0';
    const char *r = rest;
    while (thousands && *r == sep) {
        thousands = all_digits(r + 1, 3) && (r[4] == sep || r[4] == '\0' || r[4] == '.');
        r += 4;
    }
    if (thousands && *r == '.')
        thousands = all_digits(r + 1, strlen(r + 1));
    else if (thousands && *r)
        thousands = false;
    if (thousands) {
        qd_rw_replace_inplace(s, sep == ',' ? "," : " ", "");
        return;
    }
    /* a single decimal comma: not three digits after it, or a leading zero / long integer part */
    size_t after = strlen(rest + 1);
    if (decimal_comma && sep == ',' && all_digits(t + i, first) && all_digits(rest + 1, after) && !strchr(rest + 1, ',') &&
        ((after >= 2 && after != 3) || (t[i] == '0' && first == 1) || first > 3))
        *strchr(t, ',') = '.';
}

static char *prepare(const char *in, bool decimal_comma)
{
    static const char *const rep[][2] = {
        {",\\! ", ","}, {",\\!", ","}, {"\\left", ""}, {"\\right", ""}, {"\\!", ""}, {"~", " "}, {"\\$", ""}, {"$", ""}, {"\\dfrac", "\\frac"}, {"\\tfrac", "\\frac"},
        {"\\cfrac", "\\frac"}, {"\\dbinom", "\\binom"}, {"\\tbinom", "\\binom"},
        {"^{\\circ}", ""}, {"^\\circ", ""}, {"\\circ", ""}, {"\\%", ""}, {"%", ""},
        {"{,}", ""}, {"\n", " "},
    };
    qd_rw_buf b = {0};
    for (const char *c = in; *c; c++)
        if (!((unsigned char)*c & 0x80)) /* drop €, ², ° and the like */
            qd_rw_buf_putc(&b, *c);
    char *s = qd_rw_buf_steal(&b);
    for (size_t i = 0; i < sizeof rep / sizeof rep[0]; i++)
        qd_rw_replace_inplace(&s, rep[i][0], rep[i][1]);
    if (!s)
        return NULL;
    if (!strstr(s, "\\begin")) { /* "\\le" typed with a doubled backslash */
        char *d;
        while ((d = strstr(s, "\\\\")) && isalpha((unsigned char)d[2]))
            memmove(d, d + 1, strlen(d));
    }
    char *t = qd_rw_trim(s);
    free(s);
    if (!t)
        return NULL;
    size_t n = strlen(t);
    while (n && t[n - 1] == '.')
        t[--n] = '\0';
    fix_whole_number(&t, decimal_comma);
    return t;
}

/* Everything is words: a text answer ("Evelyn", "odd"). */
static qd_rw_node *all_words(parser *p)
{
    char buf[64] = "";
    for (int i = 0; i < p->n - 1; i++) {
        token *t = &p->toks[i];
        if (t->t != T_WORD && t->t != T_TEXT && !(t->t == T_VAR && p->n == 2))
            return NULL;
        strncat(buf, t->s, sizeof buf - strlen(buf) - 1);
    }
    if (p->n < 2 || (p->n == 2 && p->toks[0].t == T_VAR))
        return NULL;
    return text_node(p, buf);
}

qd_rw_node *qd_rw_parse(qd_rw_arena *a, const char *answer, bool decimal_comma)
{
    if (strlen(answer) > MAX_ANSWER)
        return NULL; /* not a final answer; left to string comparison */
    char *s = prepare(answer, decimal_comma);
    if (!s)
        return NULL;
    parser p = {.arena = a};
    lex(&p, s);
    free(s);
    qd_rw_node *root = NULL;
    if (!p.err) {
        root = all_words(&p);
        if (!root) {
            root = parse_seq(&p);
            if (p.err || peek(&p)->t != T_END)
                root = NULL;
        }
    }
    free(p.toks);
    return root;
}

bool qd_rw_parses(const char *answer)
{
    qd_rw_arena a = {0};
    bool ok = qd_rw_parse(&a, answer, false) != NULL;
    qd_rw_arena_free(&a);
    return ok;
}
