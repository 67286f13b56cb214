/* Helpers shared by the files of rewards/ (not part of the public API). */
#ifndef QD_REWARDS_INTERNAL_H
#define QD_REWARDS_INTERNAL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <gmp.h>

/* Every allocation of the math graders goes through these: NULL on failure,
 * and each failure is counted for the calling thread, so that a public entry
 * point (qd_rewards_grade) can tell "out of memory" from "no answer". Model
 * output is hostile input: running out of memory fails one answer, never the
 * process. */
void *qd_rw_malloc(size_t size);
void *qd_rw_calloc(size_t n, size_t size);
void *qd_rw_realloc(void *p, size_t size);
/* Allocation failures of the calling thread so far (compare two readings). */
unsigned long qd_rw_alloc_failures(void);
/* Tests only: the n-th allocation of the calling thread from now on fails
 * (0 = the next one); n < 0 disarms. Returns how many allocations were made
 * since the previous call. */
long qd_rw_test_fail_after(long n);

/* A growable NUL-terminated string. After a failed allocation it is `oom`:
 * later puts are ignored and steal returns NULL. */
typedef struct {
    char *s;
    size_t len, cap;
    bool oom;
} qd_rw_buf;

void qd_rw_buf_putn(qd_rw_buf *b, const char *s, size_t n);
/* A NULL s (a helper that ran out of memory) makes the buffer oom. */
void qd_rw_buf_puts(qd_rw_buf *b, const char *s);
void qd_rw_buf_putc(qd_rw_buf *b, char c);
/* Hands the string over to the caller ("" when nothing was written; NULL,
 * with the buffer freed, when it is oom). */
char *qd_rw_buf_steal(qd_rw_buf *b);

/* The string helpers return NULL when out of memory, and pass a NULL input
 * through as NULL, so that a chain of them needs one check at its end. */
char *qd_rw_strndup(const char *s, size_t n);
/* New string: every occurrence of `from` in s replaced by `to`. */
char *qd_rw_replace(const char *s, const char *from, const char *to);
/* In place: replace_all, freeing the old string. */
void qd_rw_replace_inplace(char **s, const char *from, const char *to);
/* New string without leading/trailing whitespace. */
char *qd_rw_trim(const char *s);
/* Index just past the '}' matching the '{' at s[open], or 0 if unbalanced. */
size_t qd_rw_match_brace(const char *s, size_t open);
bool qd_rw_starts(const char *s, const char *prefix);

/* ---- the answer AST of mathparse.c, compared by equiv.c */
typedef enum {
    QD_RW_NUM,    /* literal number: exact num/den when it fits, else val */
    QD_RW_VAR,    /* a symbol: x, x_1, \alpha, S_{MBCN} */
    QD_RW_INF,    /* \infty */
    QD_RW_TEXT,   /* a word answer: "Evelyn", "odd", "204_5" */
    QD_RW_ADD, QD_RW_SUB, QD_RW_MUL, QD_RW_DIV, QD_RW_POW,
    QD_RW_NEG,
    QD_RW_PM,     /* kids[0] ± kids[1]; kids[0] NULL for a unary ± */
    QD_RW_FUNC,   /* name(kids[0]); sqrt, sin, ..., root (kids[1] = index) */
    QD_RW_FACT,   /* kids[0]! */
    QD_RW_LIST,   /* bare comma list: a, b, c */
    QD_RW_TUPLE,  /* (a, b], [a, b], (a, b, c): open/close kept */
    QD_RW_SET,    /* \{a, b\} or several boxed answers */
    QD_RW_MATRIX, /* rows x cols, row-major kids */
    QD_RW_UNION,  /* A \cup B \cup ... */
    QD_RW_REL,    /* kids[0] ops[0] kids[1] ops[1] ... */
} qd_rw_kind;

/* Relation operators, one character each in qd_rw_node.ops. */
#define QD_RW_EQ '='
#define QD_RW_LT '<'
#define QD_RW_GT '>'
#define QD_RW_LE 'l'
#define QD_RW_GE 'g'
#define QD_RW_NE 'n'
#define QD_RW_APPROX '~'
#define QD_RW_IN 'i'

typedef struct qd_rw_node qd_rw_node;
typedef struct qd_rw_arena qd_rw_arena;
struct qd_rw_node {
    qd_rw_kind kind;
    int64_t num, den;  /* NUM: exact value num/den when it fits in 64 bits */
    bool exact;
    double val;        /* NUM: value */
    int decimals;      /* NUM: digits after the point as written (0 for integers) */
    char name[64];     /* VAR/TEXT/FUNC name; NUM: the literal as written */
    char open, close;  /* TUPLE brackets */
    int rows, cols;    /* MATRIX */
    int nkids;
    qd_rw_node **kids;
    char *ops;         /* REL: nkids-1 operators */
    qd_rw_node *next_alloc; /* arena chain */
    qd_rw_arena *arena;     /* the arena that owns the node */
    int qstate;             /* exact value (equiv.c memo): 0 not computed, 1 in q, -1 none */
    mpq_t q;                /* initialized once qstate != 0 */
};

struct qd_rw_arena {
    qd_rw_node *nodes; /* every node allocated for one parse */
    long exact_work;   /* bits of exact arithmetic spent on these nodes (equiv.c bounds it) */
};

/* Parses one extracted answer into an AST; NULL if it is not understood.
 * With decimal_comma, a whole answer like "2,74" or "0,111" is a decimal
 * number (European notation) rather than a list. */
qd_rw_node *qd_rw_parse(qd_rw_arena *a, const char *answer, bool decimal_comma);
/* NULL when out of memory. */
qd_rw_node *qd_rw_new(qd_rw_arena *a, qd_rw_kind kind);
/* false (n unchanged) when out of memory. */
bool qd_rw_add_kid(qd_rw_node *n, qd_rw_node *kid);
void qd_rw_arena_free(qd_rw_arena *a);
/* Does the answer parse at all (used by extraction to accept bare answers)? */
bool qd_rw_parses(const char *answer);

#endif
