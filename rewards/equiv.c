/* Equivalence of two extracted answers. Numbers are compared exactly as
 * rationals where every operation stays rational (+ - * / integer powers,
 * square roots of perfect squares); anything with symbols or irrationals is
 * compared by evaluating both sides at the same pseudo-random points (a
 * polynomial-identity style test, not a CAS). Structures (tuples, intervals,
 * sets, matrices, relations) are compared element by element. */
#include <ctype.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include "rewards/internal.h"
#include "rewards/rewards.h"

#define TRIALS 6
#define REL_TOL 1e-9

/* Exact values are rationals of any size (GMP), bounded so that no answer
 * can make a comparison slow or huge: one value holds at most MAX_BITS bits
 * (10^1000000 and 200000! fit), and one comparison spends at most MAX_WORK
 * bits of results. Beyond that a value is not exact, and equal() below
 * never calls two values equal because both overflowed a double. */
#define MAX_BITS (1L << 22)
#define MAX_WORK (1L << 24)

static long qbits(mpq_srcptr q)
{
    return (long)(mpz_sizeinbase(mpq_numref(q), 2) + mpz_sizeinbase(mpq_denref(q), 2));
}

/* Accounts for a result of about `bits` bits; false when over a bound. */
static bool charge(qd_rw_node *e, long bits)
{
    if (bits > MAX_BITS)
        return false;
    e->arena->exact_work += bits;
    return e->arena->exact_work <= MAX_WORK;
}

/* A literal as written ("12", "1.25", "1.5e3", "2E-4"). */
static bool literal_exact(qd_rw_node *e)
{
    const char *s = e->name;
    size_t mant = strcspn(s, "eE");
    long exp10 = s[mant] ? strtol(s + mant + 1, NULL, 10) : 0;
    char digits[64];
    size_t nd = 0;
    long decimals = 0;
    bool dot = false;
    for (size_t i = 0; i < mant && nd < sizeof digits - 1; i++) {
        if (s[i] == '.') {
            dot = true;
        } else if (isdigit((unsigned char)s[i])) {
            digits[nd++] = s[i];
            decimals += dot;
        } else {
            return false;
        }
    }
    digits[nd] = '\0';
    long shift = exp10 - decimals; /* value = digits * 10^shift */
    if (!nd || labs(exp10) > MAX_BITS / 4 || !charge(e, 4 * labs(shift) + 4 * (long)nd))
        return false;
    mpz_set_str(mpq_numref(e->q), digits, 10);
    mpz_ui_pow_ui(shift > 0 ? mpq_numref(e->q) : mpq_denref(e->q), 10, (unsigned long)labs(shift));
    if (shift > 0) {
        mpz_t m;
        mpz_init_set_str(m, digits, 10);
        mpz_mul(mpq_numref(e->q), mpq_numref(e->q), m);
        mpz_clear(m);
    }
    mpq_canonicalize(e->q);
    return true;
}

static mpq_srcptr exact(const qd_rw_node *e);

/* b^k for an integer k. */
static bool pow_exact(qd_rw_node *e, mpq_srcptr b, mpq_srcptr k)
{
    if (mpz_cmp_ui(mpq_denref(k), 1) || !mpz_fits_slong_p(mpq_numref(k)))
        return false;
    long n = mpz_get_si(mpq_numref(k));
    bool unit = !mpz_cmpabs_ui(mpq_numref(b), 1) && !mpz_cmp_ui(mpq_denref(b), 1);
    if (!mpq_sgn(b) && n < 0)
        return false; /* 0^-1 is undefined */
    if (!mpq_sgn(b) || unit) { /* 0^n, 1^n and (-1)^n for any n */
        mpq_set_si(e->q, !mpq_sgn(b) && n ? 0 : (mpq_sgn(b) < 0 && n % 2) ? -1 : 1, 1);
        return true;
    }
    unsigned long m = n < 0 ? -(unsigned long)n : (unsigned long)n;
    long per = qbits(b) - 1; /* bits of b^m are at most m * per (+1 for a denominator of 1) */
    if ((unsigned long)per > (unsigned long)MAX_BITS / (m ? m : 1) || !charge(e, per * (long)m + 1))
        return false;
    mpz_pow_ui(mpq_numref(e->q), mpq_numref(b), m);
    mpz_pow_ui(mpq_denref(e->q), mpq_denref(b), m);
    if (n < 0)
        mpq_inv(e->q, e->q);
    return true;
}

static bool sqrt_exact(qd_rw_node *e, mpq_srcptr a)
{
    if (mpq_sgn(a) < 0 || !mpz_perfect_square_p(mpq_numref(a)) || !mpz_perfect_square_p(mpq_denref(a)))
        return false;
    mpz_sqrt(mpq_numref(e->q), mpq_numref(a));
    mpz_sqrt(mpq_denref(e->q), mpq_denref(a));
    return charge(e, qbits(e->q));
}

static bool fact_exact(qd_rw_node *e, mpq_srcptr a)
{
    if (mpz_cmp_ui(mpq_denref(a), 1) || mpq_sgn(a) < 0 || !mpz_fits_ulong_p(mpq_numref(a)))
        return false;
    unsigned long n = mpz_get_ui(mpq_numref(a));
    if (n > 1000000 || !charge(e, (long)(lgamma((double)n + 1) / M_LN2) + 1))
        return false;
    mpz_fac_ui(mpq_numref(e->q), n);
    return true;
}

/* e's exact value into e->q: + - * / integer powers, square roots of
 * perfect squares, factorials; false when it has none (symbols, irrationals,
 * division by zero) or it is over the bounds. */
static bool compute_exact(qd_rw_node *e)
{
    mpq_srcptr a = e->nkids > 0 && e->kids[0] ? exact(e->kids[0]) : NULL;
    mpq_srcptr b = e->nkids > 1 && e->kids[1] ? exact(e->kids[1]) : NULL;
    switch (e->kind) {
    case QD_RW_NUM:
        return literal_exact(e);
    case QD_RW_NEG:
        if (a)
            mpq_neg(e->q, a);
        return a != NULL;
    case QD_RW_ADD: case QD_RW_SUB: case QD_RW_MUL: case QD_RW_DIV:
        if (!a || !b || (e->kind == QD_RW_DIV && !mpq_sgn(b)) || !charge(e, qbits(a) + qbits(b) + 1))
            return false;
        (e->kind == QD_RW_ADD ? mpq_add : e->kind == QD_RW_SUB ? mpq_sub : e->kind == QD_RW_MUL ? mpq_mul : mpq_div)(e->q, a, b);
        return true;
    case QD_RW_POW:
        return a && b && pow_exact(e, a, b);
    case QD_RW_FUNC:
        return a && e->nkids == 1 && !strcmp(e->name, "sqrt") && sqrt_exact(e, a);
    case QD_RW_FACT:
        return a && fact_exact(e, a);
    default:
        return false;
    }
}

/* The exact rational value of a constant expression, NULL if it has none.
 * Memoized in the node (a cache: values never change), so that evaluating
 * every subtree of a large answer stays linear. */
static mpq_srcptr exact(const qd_rw_node *ce)
{
    qd_rw_node *e = (qd_rw_node *)ce;
    if (!e->qstate) {
        mpq_init(e->q);
        e->qstate = compute_exact(e) ? 1 : -1;
    }
    return e->qstate > 0 ? e->q : NULL;
}

/* A rational as the nearest double: inf or 0 beyond the range, never a
 * platform-dependent result (mpq_get_d leaves overflow to the system). */
static double q_to_double(mpq_srcptr q)
{
    long en, ed;
    double mn = mpz_get_d_2exp(&en, mpq_numref(q)), md = mpz_get_d_2exp(&ed, mpq_denref(q));
    long sh = en - ed;
    return ldexp(mn / md, sh > 100000 ? 100000 : sh < -100000 ? -100000 : (int)sh);
}

/* Deterministic pseudo-random value for a symbol and a trial: trials cycle
 * through [0.3, 2.3), [2.3, 12.3) and [-3, -0.3) so that expressions defined
 * only for large or negative values are still tested somewhere. */
static double var_value(const char *name, int trial)
{
    if (!strcmp(name, "pi"))
        return M_PI;
    uint64_t h = 1469598103934665603ull ^ (uint64_t)(trial + 1) * 0x9E3779B97F4A7C15ull;
    for (const char *c = name; *c; c++)
        h = (h ^ (unsigned char)*c) * 1099511628211ull;
    h ^= h >> 29;
    h *= 0xBF58476D1CE4E5B9ull;
    h ^= h >> 32;
    double u = (double)(h >> 11) / 9007199254740992.0; /* [0, 1) */
    static const double lo[3] = {0.3, 2.3, -3.0}, width[3] = {2.0, 10.0, 2.7};
    return lo[trial % 3] + width[trial % 3] * u;
}

static double eval_func(const char *f, double x, double y)
{
    static const struct {
        const char *name;
        double (*fn)(double);
    } table[] = {{"sqrt", sqrt}, {"sin", sin}, {"cos", cos}, {"tan", tan}, {"arcsin", asin},
                 {"arccos", acos}, {"arctan", atan}, {"sinh", sinh}, {"cosh", cosh},
                 {"tanh", tanh}, {"ln", log}, {"log", log}, {"exp", exp}, {"abs", fabs}};
    for (size_t i = 0; i < sizeof table / sizeof table[0]; i++)
        if (!strcmp(f, table[i].name))
            return table[i].fn(x);
    if (!strcmp(f, "sec"))
        return 1 / cos(x);
    if (!strcmp(f, "csc"))
        return 1 / sin(x);
    if (!strcmp(f, "cot"))
        return 1 / tan(x);
    if (!strcmp(f, "root")) /* \sqrt[y]{x}, real odd roots of negatives included */
        return x < 0 && fmod(y, 2) == 1 ? -pow(-x, 1 / y) : pow(x, 1 / y);
    if (!strcmp(f, "binom"))
        return round(tgamma(x + 1) / (tgamma(y + 1) * tgamma(x - y + 1)));
    return NAN;
}

static double eval_num(const qd_rw_node *e, int trial);

/* b^e over the reals: a negative base with a rational exponent p/q, q odd,
 * is real (x^{2/3} = cbrt(x)^2), where C's pow() gives NaN. 0 to a negative
 * power is undefined (NaN), not infinite. */
static double real_pow(double b, const qd_rw_node *exponent, int trial)
{
    mpq_srcptr r = b < 0 ? exact(exponent) : NULL;
    if (r && mpz_odd_p(mpq_denref(r))) {
        double m = pow(-b, q_to_double(r));
        return mpz_odd_p(mpq_numref(r)) ? -m : m;
    }
    double x = eval_num(exponent, trial);
    return b == 0 && x < 0 ? NAN : pow(b, x);
}

static double eval_num(const qd_rw_node *e, int trial)
{
    mpq_srcptr r = e->kind != QD_RW_NUM ? exact(e) : NULL;
    if (r)
        return q_to_double(r);
    double y;
    switch (e->kind) {
    case QD_RW_NUM:
        return e->val;
    case QD_RW_VAR:
        return var_value(e->name, trial);
    case QD_RW_INF:
        return INFINITY;
    case QD_RW_NEG:
        return -eval_num(e->kids[0], trial);
    case QD_RW_ADD:
        return eval_num(e->kids[0], trial) + eval_num(e->kids[1], trial);
    case QD_RW_SUB:
        return eval_num(e->kids[0], trial) - eval_num(e->kids[1], trial);
    case QD_RW_MUL:
        return eval_num(e->kids[0], trial) * eval_num(e->kids[1], trial);
    case QD_RW_DIV: /* x/0 is undefined, not infinite */
        y = eval_num(e->kids[1], trial);
        return y == 0 ? NAN : eval_num(e->kids[0], trial) / y;
    case QD_RW_POW:
        return real_pow(eval_num(e->kids[0], trial), e->kids[1], trial);
    case QD_RW_FACT:
        return tgamma(eval_num(e->kids[0], trial) + 1);
    case QD_RW_FUNC:
        return eval_func(e->name, eval_num(e->kids[0], trial),
                         e->nkids > 1 ? eval_num(e->kids[1], trial) : 0);
    default:
        return NAN;
    }
}

static bool has_symbols(const qd_rw_node *e)
{
    if (!e)
        return false;
    if (e->kind == QD_RW_VAR && strcmp(e->name, "pi"))
        return true;
    for (int i = 0; i < e->nkids; i++)
        if (has_symbols(e->kids[i]))
            return true;
    return false;
}

/* A decimal literal as written (with at least two decimals), possibly negated. */
static const qd_rw_node *decimal_literal(const qd_rw_node *e)
{
    if (e->kind == QD_RW_NEG)
        e = e->kids[0];
    return e->kind == QD_RW_NUM && e->decimals >= 2 ? e : NULL;
}

/* "2.67" stands for 8/3: where exactly one side is a decimal literal and
 * both are constants, the other side must round to it at its last place.
 * -1 when the rule does not apply. */
static int decimal_rounds_to(const qd_rw_node *g, const qd_rw_node *p)
{
    const qd_rw_node *lg = decimal_literal(g), *lp = decimal_literal(p);
    if ((lg != NULL) == (lp != NULL) || has_symbols(g) || has_symbols(p))
        return -1;
    const qd_rw_node *lit = lg ? lg : lp;
    double lv = eval_num(lg ? g : p, 0), ov = eval_num(lg ? p : g, 0);
    return isfinite(lv) && isfinite(ov) && fabs(lv - ov) <= 0.5 * pow(10, -lit->decimals) + 1e-12 * fabs(ov);
}

/* An arithmetic expression (with ± among its operations when pm). */
static bool scalar_tree(const qd_rw_node *e, bool pm)
{
    switch (e->kind) {
    case QD_RW_NUM: case QD_RW_VAR: case QD_RW_INF: case QD_RW_ADD: case QD_RW_SUB:
    case QD_RW_MUL: case QD_RW_DIV: case QD_RW_POW: case QD_RW_NEG: case QD_RW_FUNC:
    case QD_RW_FACT:
        break;
    case QD_RW_PM:
        if (pm)
            break;
        return false;
    default:
        return false;
    }
    for (int i = 0; i < e->nkids; i++)
        if (e->kids[i] && !scalar_tree(e->kids[i], pm))
            return false;
    return true;
}

static bool is_scalar(const qd_rw_node *e) { return scalar_tree(e, false); }

/* Does the tree hold a node of kind k (\infty, a matrix, a ±)? */
static bool has_kind(const qd_rw_node *e, qd_rw_kind k)
{
    if (!e)
        return false;
    if (e->kind == k)
        return true;
    for (int i = 0; i < e->nkids; i++)
        if (has_kind(e->kids[i], k))
            return true;
    return false;
}

static bool has_inf(const qd_rw_node *e) { return has_kind(e, QD_RW_INF); }

static bool close_enough(double a, double b)
{
    if (isinf(a) || isinf(b))
        return a == b;
    return fabs(a - b) <= REL_TOL * fmax(1.0, fmax(fabs(a), fabs(b)));
}

static bool scalar_eq(const qd_rw_node *g, const qd_rw_node *p)
{
    mpq_srcptr a = exact(g), b = exact(p);
    if (a && b && mpq_equal(a, b))
        return true;
    int rounded = decimal_rounds_to(g, p);
    if (rounded >= 0)
        return rounded;
    if (a && b)
        return false;
    /* An infinite value stands for itself only where \infty is written: two
     * values that both overflow a double are not thereby equal. Points
     * outside both domains (sqrt of a negative, x/0) are skipped. */
    bool inf_ok = has_inf(g) && has_inf(p), constant = !has_symbols(g) && !has_symbols(p);
    int valid = 0;
    for (int t = 0; t < TRIALS; t++) {
        double x = eval_num(g, t), y = eval_num(p, t);
        if ((isnan(x) && isnan(y)) || (isinf(x) && isinf(y) && !inf_ok))
            continue;
        if (isnan(x) || isnan(y) || !close_enough(x, y))
            return false;
        valid++;
        if (constant)
            break;
    }
    return valid > 0;
}

/* Is a constant answer undefined (1/0, 0/0, \sqrt{-1})? It then equals
 * nothing, not even itself. (With symbols, a few sample points outside the
 * domain prove nothing.) */
static bool undefined(const qd_rw_node *e)
{
    return is_scalar(e) && !has_symbols(e) && isnan(eval_num(e, 0));
}

/* ---- structures */

typedef struct {
    qd_rw_arena *arena;
} ctx;

static bool eq(ctx *c, const qd_rw_node *g, const qd_rw_node *p);

/* The nodes built while comparing are NULL when out of memory (or when a
 * part is): the comparison then answers "not equal" and qd_rewards_equiv
 * discards it. */
static qd_rw_node *mk2(ctx *c, qd_rw_kind k, qd_rw_node *a, qd_rw_node *b)
{
    qd_rw_node *n = a ? qd_rw_new(c->arena, k) : NULL;
    if (!n || !qd_rw_add_kid(n, a) || (b && !qd_rw_add_kid(n, b)))
        return NULL;
    return n;
}

/* A name rather than a value: x, (p, q), f(x), \frac{NO}{BO}, S_{MBCN}:S. */
static bool name_like(const qd_rw_node *e)
{
    switch (e->kind) {
    case QD_RW_VAR:
        return true;
    case QD_RW_TEXT:
        return !isdigit((unsigned char)e->name[0]);
    case QD_RW_MUL: case QD_RW_DIV: case QD_RW_TUPLE: case QD_RW_LIST:
        for (int i = 0; i < e->nkids; i++)
            if (!name_like(e->kids[i]))
                return false;
        return true;
    default:
        return false;
    }
}

static bool all_ops(const qd_rw_node *r, const char *allowed)
{
    for (int i = 0; i < r->nkids - 1; i++)
        if (!strchr(allowed, r->ops[i]))
            return false;
    return true;
}

/* "x = a = b ≈ c": the last '=' segment, first part that is not a bare name. */
static const qd_rw_node *chain_value(const qd_rw_node *r)
{
    int start = 0;
    for (int i = 0; i < r->nkids - 1; i++)
        if (r->ops[i] == QD_RW_EQ)
            start = i + 1;
    for (int i = start; i < r->nkids; i++)
        if (!name_like(r->kids[i]))
            return r->kids[i];
    return r->kids[r->nkids - 1];
}

static qd_rw_node *interval(ctx *c, char open, qd_rw_node *lo, qd_rw_node *hi, char close)
{
    qd_rw_node *t = lo && hi ? qd_rw_new(c->arena, QD_RW_TUPLE) : NULL;
    if (!t || !qd_rw_add_kid(t, lo) || !qd_rw_add_kid(t, hi))
        return NULL;
    t->open = open;
    t->close = close;
    return t;
}

static bool is_abs_of_name(const qd_rw_node *e)
{
    return e->kind == QD_RW_FUNC && !strcmp(e->name, "abs") && name_like(e->kids[0]);
}

/* a < x < b (x a name) as the interval (a, b), and a <= |x| <= b (a > 0)
 * as [-b, -a] U [a, b]; NULL when not of that form. */
static qd_rw_node *chain_interval(ctx *c, const qd_rw_node *r)
{
    if (r->nkids != 3 || !(name_like(r->kids[1]) || is_abs_of_name(r->kids[1])))
        return NULL;
    char o1 = r->ops[0], o2 = r->ops[1];
    bool up = strchr("<l", o1) && strchr("<l", o2), down = strchr(">g", o1) && strchr(">g", o2);
    if (!up && !down)
        return NULL;
    qd_rw_node *lo = up ? r->kids[0] : r->kids[2], *hi = up ? r->kids[2] : r->kids[0];
    char olo = up ? o1 : o2, ohi = up ? o2 : o1;
    char open = (olo == 'l' || olo == 'g') ? '[' : '(', close = (ohi == 'l' || ohi == 'g') ? ']' : ')';
    if (!is_abs_of_name(r->kids[1]))
        return interval(c, open, lo, hi, close);
    if (has_symbols(lo) || !(eval_num(lo, 0) > 0))
        return NULL;
    qd_rw_node *neg = interval(c, close == ']' ? '[' : '(', mk2(c, QD_RW_NEG, hi, NULL),
                               mk2(c, QD_RW_NEG, lo, NULL), open == '[' ? ']' : ')');
    qd_rw_node *pos = interval(c, open, lo, hi, close);
    qd_rw_node *u = neg && pos ? qd_rw_new(c->arena, QD_RW_UNION) : NULL;
    if (!u || !qd_rw_add_kid(u, neg) || !qd_rw_add_kid(u, pos))
        return NULL; /* out of memory: taken as "not of that form" */
    return u;
}

/* What a relation stands for when compared with a non-relation. A chain
 * "x = ... = v" means v; "lhs = v" means v when lhs is a name, or (in a
 * prediction) a constant computation. So gold "7 = 11a+c" stays an equation
 * and a predicted "5x - 7y + 4 = 0" is not the number 0. */
static const qd_rw_node *as_value(ctx *c, const qd_rw_node *r, bool is_gold, bool other_rel)
{
    if (r->kind != QD_RW_REL)
        return r;
    if (r->nkids == 2 && r->ops[0] == QD_RW_IN)
        return r->kids[1];
    qd_rw_node *iv = chain_interval(c, r);
    if (iv)
        return iv;
    if (!all_ops(r, "=~"))
        return r;
    if (r->nkids >= 3 || r->ops[0] == QD_RW_APPROX)
        return chain_value(r);
    /* "x = 5" is 5 on either side; a computation "1/2 + 1/3 = 5/6" only in a prediction */
    if (!other_rel && (name_like(r->kids[0]) || (!is_gold && !has_symbols(r->kids[0]))))
        return chain_value(r);
    return r;
}

/* Is d1 = k * d2 for a constant k (k > 0 when `positive`)? */
static bool proportional(ctx *c, qd_rw_node *d1, qd_rw_node *d2, bool positive)
{
    double k0 = NAN;
    for (int t = 0; t < TRIALS; t++) {
        double x = eval_num(d1, t), y = eval_num(d2, t);
        if (isnan(x) || isnan(y) || isinf(x) || isinf(y))
            return false;
        if (fabs(x) < 1e-12 && fabs(y) < 1e-12)
            continue;
        if (fabs(y) < 1e-12)
            return false;
        double k = x / y;
        if (isnan(k0))
            k0 = k;
        else if (!close_enough(k, k0))
            return false;
    }
    (void)c;
    return !isnan(k0) && k0 != 0 && (!positive || k0 > 0);
}

/* One inequality as "d > 0" / "d >= 0" / "d != 0". */
static char ineq_form(ctx *c, const qd_rw_node *r, qd_rw_node **d)
{
    qd_rw_node *a = r->kids[0], *b = r->kids[1];
    switch (r->ops[0]) {
    case QD_RW_LT: *d = mk2(c, QD_RW_SUB, b, a); return '>';
    case QD_RW_LE: *d = mk2(c, QD_RW_SUB, b, a); return 'g';
    case QD_RW_GT: *d = mk2(c, QD_RW_SUB, a, b); return '>';
    case QD_RW_GE: *d = mk2(c, QD_RW_SUB, a, b); return 'g';
    case QD_RW_NE: *d = mk2(c, QD_RW_SUB, a, b); return 'n';
    case QD_RW_EQ: *d = mk2(c, QD_RW_SUB, a, b); return '=';
    default: return 0;
    }
}

static bool rel_eq(ctx *c, const qd_rw_node *g, const qd_rw_node *p)
{
    if (g->nkids == 2 && p->nkids == 2 && g->ops[0] == QD_RW_EQ && p->ops[0] == QD_RW_EQ &&
        name_like(g->kids[0]) && name_like(p->kids[0])) {
        if (g->kids[0]->kind == QD_RW_VAR && p->kids[0]->kind == QD_RW_VAR &&
            strcmp(g->kids[0]->name, p->kids[0]->name))
            return false;
        return eq(c, g->kids[1], p->kids[1]);
    }
    if (g->nkids == 2 && p->nkids == 2 && is_scalar(g->kids[0]) && is_scalar(g->kids[1]) &&
        is_scalar(p->kids[0]) && is_scalar(p->kids[1])) {
        qd_rw_node *dg, *dp;
        char fg = ineq_form(c, g, &dg), fp = ineq_form(c, p, &dp);
        if (!fg || fg != fp || !dg || !dp)
            return false;
        return proportional(c, dg, dp, fg == '>' || fg == 'g');
    }
    if (g->nkids != p->nkids || strcmp(g->ops, p->ops))
        return false;
    for (int i = 0; i < g->nkids; i++)
        if (!eq(c, g->kids[i], p->kids[i]))
            return false;
    return true;
}

static bool text_eq(const qd_rw_node *g, const qd_rw_node *p)
{
    const qd_rw_node *t = g->kind == QD_RW_TEXT ? g : p, *o = t == g ? p : g;
    if (o->kind == QD_RW_TEXT || o->kind == QD_RW_VAR)
        return !strcasecmp(t->name, o->name);
    char *end;
    double v = strtod(t->name, &end), w = is_scalar(o) ? eval_num(o, 0) : NAN;
    return *end == '\0' && end != t->name && is_scalar(o) && !has_symbols(o) && !isnan(w) &&
           (isfinite(w) || has_inf(o)) && close_enough(v, w);
}

/* Elements of a collection; ± and "name = value" elements expanded.
 * -1 when there are more than cap (never compare a truncated list). */
static int elements(ctx *c, const qd_rw_node *e, const qd_rw_node **out, int cap)
{
    if (e->kind == QD_RW_PM) {
        if (cap < 2)
            return -1;
        qd_rw_node *b = e->kids[1], *a = e->kids[0];
        out[0] = a ? mk2(c, QD_RW_ADD, a, b) : b;
        out[1] = a ? mk2(c, QD_RW_SUB, a, b) : mk2(c, QD_RW_NEG, b, NULL);
        return out[0] && out[1] ? 2 : -1;
    }
    int n = 0;
    for (int i = 0; i < e->nkids; i++) {
        const qd_rw_node *k = as_value(c, e->kids[i], true, false);
        int m = 1;
        if (k->kind == QD_RW_PM && e->kind != QD_RW_TUPLE)
            m = elements(c, k, out + n, cap - n);
        else if (n < cap)
            out[n] = k;
        else
            m = -1;
        if (m < 0)
            return -1;
        n += m;
    }
    return n;
}

static bool all_tuples(const qd_rw_node *e)
{
    for (int i = 0; i < e->nkids; i++)
        if (e->kids[i]->kind != QD_RW_TUPLE)
            return false;
    return e->nkids > 0;
}

static bool is_collection(const qd_rw_node *e)
{
    return e->kind == QD_RW_LIST || e->kind == QD_RW_TUPLE || e->kind == QD_RW_SET ||
           e->kind == QD_RW_UNION || e->kind == QD_RW_PM;
}

/* Unordered kinds: sets, ± pairs, unions, lists of tuples (solution sets). */
static bool unordered(const qd_rw_node *e)
{
    return e->kind == QD_RW_SET || e->kind == QD_RW_PM || e->kind == QD_RW_UNION ||
           (e->kind == QD_RW_LIST && all_tuples(e));
}

#define MAX_ELEMS 128

static bool covers(ctx *c, const qd_rw_node **a, int na, const qd_rw_node **b, int nb)
{
    for (int i = 0; i < na; i++) {
        bool found = false;
        for (int j = 0; j < nb && !found; j++)
            found = eq(c, a[i], b[j]);
        if (!found)
            return false;
    }
    return true;
}

/* A set of answers that all equal one value (several boxes of the same
 * answer, in any notation) stands for that value. */
static bool same_as_all(ctx *c, const qd_rw_node *set, const qd_rw_node *v)
{
    const qd_rw_node *el[MAX_ELEMS];
    int n = elements(c, set, el, MAX_ELEMS);
    if (n < 0)
        return false;
    for (int i = 0; i < n; i++)
        if (!eq(c, el[i], v))
            return false;
    return n > 0;
}

static bool coll_eq(ctx *c, const qd_rw_node *g, const qd_rw_node *p)
{
    if (g->kind == QD_RW_SET && !is_collection(p))
        return same_as_all(c, g, p);
    if (p->kind == QD_RW_SET && !is_collection(g))
        return same_as_all(c, p, g);
    if (!is_collection(g) || !is_collection(p))
        return false;
    if (g->kind == QD_RW_TUPLE && p->kind == QD_RW_TUPLE && (g->open != p->open || g->close != p->close))
        return false;
    const qd_rw_node *ge[MAX_ELEMS], *pe[MAX_ELEMS];
    int ng = elements(c, g, ge, MAX_ELEMS), np = elements(c, p, pe, MAX_ELEMS);
    if (ng < 0 || np < 0)
        return false;
    if (unordered(g) || unordered(p))
        return (g->kind != QD_RW_TUPLE && p->kind != QD_RW_TUPLE) && covers(c, ge, ng, pe, np) &&
               covers(c, pe, np, ge, ng);
    if (ng != np)
        return false;
    for (int i = 0; i < ng; i++)
        if (!eq(c, ge[i], pe[i]))
            return false;
    return true;
}

static bool matrix_eq(ctx *c, const qd_rw_node *g, const qd_rw_node *p)
{
    if (g->rows != p->rows || g->cols != p->cols)
        return false;
    for (int i = 0; i < g->nkids; i++)
        if (!eq(c, g->kids[i], p->kids[i]))
            return false;
    return true;
}

#define MAX_CELLS 64

typedef struct {
    int rows, cols;
    double v[MAX_CELLS]; /* (rows, cols) row-major */
} matrix;

static bool has_matrix(const qd_rw_node *e) { return has_kind(e, QD_RW_MATRIX); }

/* Numeric value of a matrix expression: sums, products, scalar multiples. */
static bool mat_eval(const qd_rw_node *e, int trial, matrix *m)
{
    matrix a, b;
    switch (e->kind) {
    case QD_RW_MATRIX:
        if (e->rows * e->cols > MAX_CELLS || e->nkids != e->rows * e->cols)
            return false;
        m->rows = e->rows;
        m->cols = e->cols;
        for (int i = 0; i < e->nkids; i++)
            m->v[i] = eval_num(e->kids[i], trial);
        return true;
    case QD_RW_NEG:
        if (!mat_eval(e->kids[0], trial, m))
            return false;
        for (int i = 0; i < m->rows * m->cols; i++)
            m->v[i] = -m->v[i];
        return true;
    case QD_RW_ADD:
    case QD_RW_SUB:
        if (!mat_eval(e->kids[0], trial, &a) || !mat_eval(e->kids[1], trial, &b) ||
            a.rows != b.rows || a.cols != b.cols)
            return false;
        *m = a;
        for (int i = 0; i < a.rows * a.cols; i++)
            m->v[i] = e->kind == QD_RW_ADD ? a.v[i] + b.v[i] : a.v[i] - b.v[i];
        return true;
    case QD_RW_MUL: {
        bool ma = has_matrix(e->kids[0]), mb = has_matrix(e->kids[1]);
        if (ma != mb) { /* scalar multiple */
            double k = eval_num(ma ? e->kids[1] : e->kids[0], trial);
            if (!mat_eval(ma ? e->kids[0] : e->kids[1], trial, m))
                return false;
            for (int i = 0; i < m->rows * m->cols; i++)
                m->v[i] *= k;
            return true;
        }
        if (!mat_eval(e->kids[0], trial, &a) || !mat_eval(e->kids[1], trial, &b) || a.cols != b.rows ||
            a.rows * b.cols > MAX_CELLS)
            return false;
        m->rows = a.rows;
        m->cols = b.cols;
        for (int i = 0; i < a.rows; i++)
            for (int j = 0; j < b.cols; j++) {
                double acc = 0;
                for (int k = 0; k < a.cols; k++)
                    acc += a.v[i * a.cols + k] * b.v[k * b.cols + j];
                m->v[i * b.cols + j] = acc;
            }
        return true;
    }
    default:
        return false;
    }
}

static bool mat_expr_eq(const qd_rw_node *g, const qd_rw_node *p)
{
    for (int t = 0; t < TRIALS; t++) {
        matrix a, b;
        if (!mat_eval(g, t, &a) || !mat_eval(p, t, &b) || a.rows != b.rows || a.cols != b.cols)
            return false;
        for (int i = 0; i < a.rows * a.cols; i++)
            if (isnan(a.v[i]) || !close_enough(a.v[i], b.v[i]))
                return false;
    }
    return true;
}

static bool has_pm(const qd_rw_node *e) { return has_kind(e, QD_RW_PM); }

/* e with every ± taken as + (sign 1) or - (sign -1); subtrees without one
 * are shared, not copied. */
static qd_rw_node *pm_branch(ctx *c, qd_rw_node *e, int sign)
{
    if (!has_pm(e))
        return e;
    if (e->kind == QD_RW_PM) {
        qd_rw_node *b = pm_branch(c, e->kids[1], sign), *a = e->kids[0] ? pm_branch(c, e->kids[0], sign) : NULL;
        if (!b || (e->kids[0] && !a))
            return NULL;
        return a ? mk2(c, sign > 0 ? QD_RW_ADD : QD_RW_SUB, a, b) : sign > 0 ? b : mk2(c, QD_RW_NEG, b, NULL);
    }
    qd_rw_node *n = qd_rw_new(c->arena, e->kind);
    if (!n)
        return NULL;
    memcpy(n->name, e->name, sizeof n->name);
    n->open = e->open;
    n->close = e->close;
    n->rows = e->rows;
    n->cols = e->cols;
    for (int i = 0; i < e->nkids; i++) {
        qd_rw_node *k = e->kids[i] ? pm_branch(c, e->kids[i], sign) : NULL;
        if ((e->kids[i] && !k) || !qd_rw_add_kid(n, k))
            return NULL;
    }
    return n;
}

/* "\frac{-1 \pm \sqrt{17}}{2}": a ± inside an expression stands for the
 * set of its two values (a ± at the top is a collection already). */
static const qd_rw_node *inner_pm_as_set(ctx *c, const qd_rw_node *e)
{
    if (e->kind == QD_RW_PM || !scalar_tree(e, true) || !has_pm(e))
        return e;
    qd_rw_node *plus = pm_branch(c, (qd_rw_node *)e, 1), *minus = pm_branch(c, (qd_rw_node *)e, -1);
    qd_rw_node *s = plus && minus ? qd_rw_new(c->arena, QD_RW_SET) : NULL;
    if (!s || !qd_rw_add_kid(s, plus) || !qd_rw_add_kid(s, minus))
        return e; /* out of memory: compared unexpanded, and discarded */
    return s;
}

static bool eq(ctx *c, const qd_rw_node *g, const qd_rw_node *p)
{
    g = inner_pm_as_set(c, g);
    p = inner_pm_as_set(c, p);
    if (g->kind == QD_RW_REL || p->kind == QD_RW_REL) {
        bool both = g->kind == QD_RW_REL && p->kind == QD_RW_REL;
        const qd_rw_node *gv = as_value(c, g, true, both), *pv = as_value(c, p, false, both);
        if (both && (gv->kind == QD_RW_REL) != (pv->kind == QD_RW_REL)) { /* one was a chain */
            gv = as_value(c, gv, true, false);
            pv = as_value(c, pv, false, false);
        }
        if (gv->kind == QD_RW_REL && pv->kind == QD_RW_REL)
            return rel_eq(c, gv, pv);
        if (gv->kind == QD_RW_REL || pv->kind == QD_RW_REL)
            return false;
        return eq(c, gv, pv);
    }
    if (g->kind == QD_RW_TEXT || p->kind == QD_RW_TEXT)
        return text_eq(g, p);
    if (g->kind == QD_RW_MATRIX && p->kind == QD_RW_MATRIX)
        return matrix_eq(c, g, p);
    if (has_matrix(g) || has_matrix(p))
        return mat_expr_eq(g, p);
    if (is_collection(g) || is_collection(p))
        return coll_eq(c, g, p);
    return scalar_eq(g, p);
}

/* Whitespace- and $-insensitive string equality: the cheap first test. */
static bool same_text(const char *a, const char *b)
{
    for (;;) {
        while (*a && (isspace((unsigned char)*a) || *a == '$'))
            a++;
        while (*b && (isspace((unsigned char)*b) || *b == '$'))
            b++;
        if (*a != *b)
            return false;
        if (!*a)
            return true;
        a++;
        b++;
    }
}

bool qd_rewards_equiv(const char *gold, const char *pred)
{
    if (!gold || !pred)
        return false;
    unsigned long failures = qd_rw_alloc_failures();
    if (same_text(gold, pred)) {
        qd_rw_arena arena = {0};
        qd_rw_node *g = qd_rw_parse(&arena, gold, false);
        bool undef = g && undefined(g);
        qd_rw_arena_free(&arena);
        return !undef && qd_rw_alloc_failures() == failures;
    }
    /* "1,22" is a list or a decimal: either reading may match */
    bool res = false;
    for (int dc = 0; dc < 2 && !res; dc++) {
        qd_rw_arena arena = {0};
        ctx c = {&arena};
        qd_rw_node *g = qd_rw_parse(&arena, gold, dc), *p = qd_rw_parse(&arena, pred, dc);
        res = (g && p) ? eq(&c, g, p) : qd_rewards_equiv_hendrycks(gold, pred);
        qd_rw_arena_free(&arena);
    }
    return res && qd_rw_alloc_failures() == failures; /* a fallback taken for lack of memory decides nothing */
}
