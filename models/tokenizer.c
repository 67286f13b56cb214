/* Byte-level BPE tokenizer read from a Hugging Face tokenizer.json (see tokenizer.h).
 *
 * Encoding follows HF `tokenizers`: split the raw text on unnormalized added
 * tokens, normalize each remaining piece, split it on normalized added tokens,
 * run the pre-tokenizer's Split regexes ("Isolated" keeps matches and gaps as
 * pieces, "Removed" keeps the gaps), map each piece's bytes to GPT-2's
 * byte-level characters and apply BPE merges lowest rank first (leftmost on ties). */
#define _GNU_SOURCE /* qsort_r */
#define PCRE2_CODE_UNIT_WIDTH 8
#include <jansson.h>
#include <pcre2.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <utf8proc.h>
#include "models/tokenizer.h"
#include "quant/fileio.h"

enum { NORM_MAX = 8, SPLIT_MAX = 8 };

/* The pre-tokenizer regex of GPT-2, used by ByteLevel when use_regex is true. */
static const char gpt2_pattern[] =
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";

typedef struct {
    char *content;      /* the token as written in the file (what decode gives back) */
    size_t len;
    char *match;        /* what is searched for: content, normalized when `normalized` */
    size_t match_len;
    int32_t id;
    int special, normalized;
} added_token;

/* The added tokens of one matching pass, sorted by first byte then longest first,
 * so the first hit at a position is the longest one. */
typedef struct {
    int32_t *order;     /* indices into qd_tokenizer.added */
    size_t start[257];  /* tokens whose match starts with byte b: order[start[b] .. start[b+1]) */
} added_set;

typedef struct {
    pcre2_code *re;
    int remove;         /* behavior "Removed": the matches are dropped, the gaps kept */
} split_step;

typedef struct {
    uint64_t key;       /* (left id << 32) | right id; EMPTY_KEY when free */
    int32_t rank, id;   /* the merge's rank (priority) and the id it produces */
} merge_slot;

#define EMPTY_KEY UINT64_MAX

struct qd_tokenizer {
    int32_t n_ids;          /* one more than the largest id */
    char **str;             /* (n_ids) token strings (vocabulary in byte-level form), NULL for holes */
    size_t *len;            /* (n_ids) */
    uint8_t *special;       /* (n_ids) 1 for added tokens marked special */
    int32_t *vocab;         /* (vocab_cap) open addressing, model vocabulary string -> id, -1 free */
    size_t vocab_cap;
    merge_slot *merges;     /* (merge_cap) open addressing, pair -> rank and merged id */
    size_t merge_cap;
    added_token *added;     /* (n_added) */
    size_t n_added;
    added_set raw_set, norm_set;
    int norm_opts[NORM_MAX];/* utf8proc options of each normalizer, applied in order */
    int n_norm;
    split_step split[SPLIT_MAX];
    int n_split;
    pcre2_code *byte_level_re;  /* ByteLevel's own regex (use_regex), or NULL */
    int prefix_space;           /* ByteLevel add_prefix_space */
    uint32_t byte_cp[256];      /* GPT-2 bytes_to_unicode */
    int16_t cp_byte[0x144];     /* its inverse, -1 where no byte maps */
    int32_t byte_id[256];       /* vocabulary id of each byte's character, -1 if absent */
    int32_t unk_id;
    int fuse_unk, ignore_merges;
};

const qd_chat_template qd_chat_chatml = {QD_CHATML_MESSAGE, QD_CHATML_GENERATION};

/* ---- small helpers */

static uint64_t hash_bytes(const char *s, size_t n)
{
    uint64_t h = 1469598103934665603ull; /* FNV-1a */
    for (size_t i = 0; i < n; i++)
        h = (h ^ (uint8_t)s[i]) * 1099511628211ull;
    return h;
}

static uint64_t hash_pair(uint64_t key)
{
    key ^= key >> 33; /* the murmur3 finalizer */
    key *= 0xff51afd7ed558ccdull;
    key ^= key >> 33;
    key *= 0xc4ceb9fe1a85ec53ull;
    return key ^ (key >> 33);
}

static size_t table_cap(size_t n)
{
    size_t cap = 16;
    while (cap < 2 * n)
        cap <<= 1;
    return cap;
}

static char *dup_bytes(const char *s, size_t n)
{
    char *d = malloc(n + 1);
    if (d) {
        memcpy(d, s, n);
        d[n] = 0;
    }
    return d;
}

/* Length of the valid UTF-8 sequence at s (1..4), or minus the length of its
 * maximal invalid subpart (Unicode 3.9, Table 3-7), as Rust's lossy decoding uses. */
static int utf8_seq(const uint8_t *s, size_t n)
{
    uint8_t b = s[0], lo = 0x80, hi = 0xbf;
    int need;
    if (b < 0x80)
        return 1;
    if (b >= 0xc2 && b <= 0xdf)
        need = 1;
    else if (b >= 0xe0 && b <= 0xef) {
        need = 2;
        lo = b == 0xe0 ? 0xa0 : 0x80;
        hi = b == 0xed ? 0x9f : 0xbf;
    } else if (b >= 0xf0 && b <= 0xf4) {
        need = 3;
        lo = b == 0xf0 ? 0x90 : 0x80;
        hi = b == 0xf4 ? 0x8f : 0xbf;
    } else
        return -1;
    for (int k = 1; k <= need; k++) {
        if ((size_t)k >= n || s[k] < lo || s[k] > hi)
            return -k;
        lo = 0x80;
        hi = 0xbf;
    }
    return need + 1;
}

/* The offset of the first byte that is not valid UTF-8, or n. */
static size_t utf8_valid_prefix(const char *s, size_t n)
{
    size_t i = 0;
    for (int k; i < n && (k = utf8_seq((const uint8_t *)s + i, n - i)) > 0;)
        i += (size_t)k;
    return i;
}

static size_t put_utf8(char *out, uint32_t cp)
{
    if (cp < 0x80) {
        out[0] = (char)cp;
        return 1;
    }
    out[0] = (char)(0xc0 | (cp >> 6)); /* byte-level characters are all below U+0800 */
    out[1] = (char)(0x80 | (cp & 0x3f));
    return 2;
}

/* GPT-2's bytes_to_unicode: printable Latin-1 bytes stand for themselves, the
 * other 68 bytes take U+0100.. in byte order. */
static void byte_level_tables(qd_tokenizer *t)
{
    uint32_t next = 0x100;
    memset(t->cp_byte, -1, sizeof t->cp_byte);
    for (int b = 0; b < 256; b++) {
        int printable = (b >= 0x21 && b <= 0x7e) || (b >= 0xa1 && b <= 0xac) || b >= 0xae;
        t->byte_cp[b] = printable ? (uint32_t)b : next++;
        t->cp_byte[t->byte_cp[b]] = (int16_t)b;
    }
}

static int grow(void **p, size_t *cap, size_t need, size_t elem)
{
    if (need <= *cap)
        return 1;
    size_t c = *cap ? *cap : 64;
    while (c < need)
        c *= 2;
    void *q = realloc(*p, c * elem);
    if (!q)
        return 0;
    *p = q;
    *cap = c;
    return 1;
}

/* ---- the vocabulary and merge tables */

static int32_t vocab_find(const qd_tokenizer *t, const char *s, size_t n)
{
    size_t mask = t->vocab_cap - 1;
    for (size_t i = hash_bytes(s, n) & mask;; i = (i + 1) & mask) {
        int32_t id = t->vocab[i];
        if (id < 0)
            return -1;
        if (t->len[id] == n && !memcmp(t->str[id], s, n))
            return id;
    }
}

static void vocab_insert(qd_tokenizer *t, int32_t id)
{
    size_t mask = t->vocab_cap - 1;
    size_t i = hash_bytes(t->str[id], t->len[id]) & mask;
    while (t->vocab[i] >= 0)
        i = (i + 1) & mask;
    t->vocab[i] = id;
}

static uint64_t pair_key(int32_t a, int32_t b) { return ((uint64_t)(uint32_t)a << 32) | (uint32_t)b; }

static const merge_slot *merge_find(const qd_tokenizer *t, int32_t a, int32_t b)
{
    uint64_t key = pair_key(a, b);
    size_t mask = t->merge_cap - 1;
    for (size_t i = hash_pair(key) & mask;; i = (i + 1) & mask) {
        if (t->merges[i].key == key)
            return &t->merges[i];
        if (t->merges[i].key == EMPTY_KEY)
            return NULL;
    }
}

/* Inserts a merge unless the pair is already there (the first, lowest rank, wins). */
static void merge_insert(qd_tokenizer *t, int32_t a, int32_t b, int32_t rank, int32_t id)
{
    uint64_t key = pair_key(a, b);
    size_t mask = t->merge_cap - 1;
    size_t i = hash_pair(key) & mask;
    while (t->merges[i].key != EMPTY_KEY && t->merges[i].key != key)
        i = (i + 1) & mask;
    if (t->merges[i].key == key)
        return;
    t->merges[i] = (merge_slot){key, rank, id};
}

/* ---- loading */

static qd_status fmt_err(const char *name, const char *field, const char *what)
{
    return qd_error(QD_ERR_FORMAT, "%s: %s: %s", name, field, what);
}

static qd_status unsupported(const char *name, const char *field, const char *what)
{
    return qd_error(QD_ERR_UNSUPPORTED, "%s: %s: %s is not supported", name, field, what);
}

/* A boolean member, dflt when absent or null. */
static qd_status get_bool(const json_t *obj, const char *key, int dflt, int *out,
                          const char *name, const char *where)
{
    const json_t *v = json_object_get(obj, key);
    *out = dflt;
    if (!v || json_is_null(v))
        return QD_OK;
    if (!json_is_boolean(v))
        return qd_error(QD_ERR_FORMAT, "%s: %s.%s: expected true or false", name, where, key);
    *out = json_is_true(v);
    return QD_OK;
}

/* The string member "type", or NULL. */
static const char *type_of(const json_t *obj)
{
    return json_string_value(json_object_get(obj, "type"));
}

static qd_status check_id(const json_t *v, const char *name, const char *field, int32_t *id)
{
    if (!json_is_integer(v))
        return fmt_err(name, field, "id is not an integer");
    json_int_t x = json_integer_value(v);
    if (x < 0 || x >= QD_TOKENIZER_MAX_ID)
        return qd_error(QD_ERR_FORMAT, "%s: %s: id %lld out of range [0, %d)", name, field,
                        (long long)x, QD_TOKENIZER_MAX_ID);
    *id = (int32_t)x;
    return QD_OK;
}

/* Sizes the id tables from the largest id of the vocabulary and the added tokens. */
static qd_status alloc_ids(qd_tokenizer *t, const json_t *vocab, const json_t *added, const char *name)
{
    int32_t max_id = -1, id;
    const char *key;
    const json_t *v;
    char field[96];
    json_object_foreach((json_t *)vocab, key, v) {
        snprintf(field, sizeof field, "model.vocab[\"%.40s\"]", key);
        qd_status st = check_id(v, name, field, &id);
        if (st)
            return st;
        max_id = id > max_id ? id : max_id;
    }
    for (size_t i = 0; i < json_array_size(added); i++) {
        snprintf(field, sizeof field, "added_tokens[%zu].id", i);
        qd_status st = check_id(json_object_get(json_array_get(added, i), "id"), name, field, &id);
        if (st)
            return st;
        max_id = id > max_id ? id : max_id;
    }
    t->n_ids = max_id + 1;
    t->str = calloc((size_t)t->n_ids + 1, sizeof *t->str);
    t->len = calloc((size_t)t->n_ids + 1, sizeof *t->len);
    t->special = calloc((size_t)t->n_ids + 1, 1);
    return t->str && t->len && t->special ? QD_OK : qd_error(QD_ERR_NOMEM, "%s: out of memory", name);
}

static qd_status load_vocab(qd_tokenizer *t, const json_t *vocab, const char *name)
{
    size_t n = json_object_size(vocab);
    t->vocab_cap = table_cap(n);
    t->vocab = malloc(t->vocab_cap * sizeof *t->vocab);
    if (!t->vocab)
        return qd_error(QD_ERR_NOMEM, "%s: out of memory", name);
    memset(t->vocab, -1, t->vocab_cap * sizeof *t->vocab);
    const char *key;
    const json_t *v;
    json_object_foreach((json_t *)vocab, key, v) {
        int32_t id = (int32_t)json_integer_value(v);
        if (t->str[id])
            return qd_error(QD_ERR_FORMAT, "%s: model.vocab: id %d given to both \"%.40s\" and \"%.40s\"",
                            name, id, t->str[id], key);
        if (!(t->str[id] = strdup(key)))
            return qd_error(QD_ERR_NOMEM, "%s: out of memory", name);
        t->len[id] = strlen(key);
        vocab_insert(t, id);
    }
    return QD_OK;
}

/* One merges entry as its two tokens: "a b" (the legacy form) or ["a", "b"]. */
static qd_status merge_parts(const json_t *e, const char *name, const char *field,
                             const char **a, size_t *na, const char **b, size_t *nb)
{
    if (json_is_string(e)) {
        const char *s = json_string_value(e), *sp = strchr(s, ' ');
        if (!sp || sp == s || !sp[1] || strchr(sp + 1, ' '))
            return fmt_err(name, field, "expected \"left right\" (two tokens separated by one space)");
        *a = s;
        *na = (size_t)(sp - s);
        *b = sp + 1;
        *nb = strlen(sp + 1);
        return QD_OK;
    }
    if (json_is_array(e) && json_array_size(e) == 2 && json_is_string(json_array_get(e, 0)) &&
        json_is_string(json_array_get(e, 1))) {
        *a = json_string_value(json_array_get(e, 0));
        *na = json_string_length(json_array_get(e, 0));
        *b = json_string_value(json_array_get(e, 1));
        *nb = json_string_length(json_array_get(e, 1));
        return QD_OK;
    }
    return fmt_err(name, field, "expected a string \"left right\" or an array [left, right]");
}

/* Merge number i; *joined is a scratch buffer for the merged string (grown here). */
static qd_status load_merge(qd_tokenizer *t, const json_t *e, size_t i, const char *name, char **joined,
                            size_t *cap)
{
    char field[48];
    const char *a = NULL, *b = NULL;
    size_t na = 0, nb = 0;
    snprintf(field, sizeof field, "model.merges[%zu]", i);
    qd_status st = merge_parts(e, name, field, &a, &na, &b, &nb);
    if (st)
        return st;
    int32_t ia = vocab_find(t, a, na), ib = vocab_find(t, b, nb);
    if (ia < 0 || ib < 0)
        return qd_error(QD_ERR_FORMAT, "%s: %s: token \"%.*s\" is not in model.vocab", name, field,
                        (int)(ia < 0 ? na : nb), ia < 0 ? a : b);
    if (!grow((void **)joined, cap, na + nb, 1))
        return qd_error(QD_ERR_NOMEM, "%s: out of memory", name);
    memcpy(*joined, a, na);
    memcpy(*joined + na, b, nb);
    int32_t id = vocab_find(t, *joined, na + nb);
    if (id < 0)
        return qd_error(QD_ERR_FORMAT, "%s: %s: merged token \"%.*s%.*s\" is not in model.vocab", name,
                        field, (int)na, a, (int)nb, b);
    merge_insert(t, ia, ib, (int32_t)i, id);
    return QD_OK;
}

static qd_status load_merges(qd_tokenizer *t, const json_t *merges, const char *name)
{
    if (!json_is_array(merges))
        return fmt_err(name, "model.merges", "missing or not an array");
    size_t n = json_array_size(merges), cap = 0;
    char *joined = NULL;
    t->merge_cap = table_cap(n);
    t->merges = malloc(t->merge_cap * sizeof *t->merges);
    if (!t->merges)
        return qd_error(QD_ERR_NOMEM, "%s: out of memory", name);
    for (size_t i = 0; i < t->merge_cap; i++)
        t->merges[i].key = EMPTY_KEY;
    qd_status st = QD_OK;
    for (size_t i = 0; !st && i < n; i++)
        st = load_merge(t, json_array_get(merges, i), i, name, &joined, &cap);
    free(joined);
    return st;
}

static qd_status load_model(qd_tokenizer *t, const json_t *model, const char *name)
{
    const char *type = type_of(model);
    if (type && strcmp(type, "BPE"))
        return qd_error(QD_ERR_UNSUPPORTED, "%s: model.type: \"%s\" is not supported (only BPE)", name, type);
    const json_t *dropout = json_object_get(model, "dropout");
    if (dropout && !json_is_null(dropout) && json_number_value(dropout) != 0.0)
        return unsupported(name, "model.dropout", "BPE dropout");
    const char *affix[] = {"continuing_subword_prefix", "end_of_word_suffix"};
    for (int i = 0; i < 2; i++) {
        const json_t *v = json_object_get(model, affix[i]);
        if (v && !json_is_null(v) && !(json_is_string(v) && !json_string_length(v))) {
            char field[64];
            snprintf(field, sizeof field, "model.%s", affix[i]);
            return unsupported(name, field, "a non-empty affix");
        }
    }
    int byte_fallback;
    qd_status st = get_bool(model, "byte_fallback", 0, &byte_fallback, name, "model");
    if (!st && byte_fallback)
        return unsupported(name, "model.byte_fallback", "byte fallback");
    if (!st)
        st = get_bool(model, "fuse_unk", 0, &t->fuse_unk, name, "model");
    if (!st)
        st = get_bool(model, "ignore_merges", 0, &t->ignore_merges, name, "model");
    if (!st)
        st = load_vocab(t, json_object_get(model, "vocab"), name);
    if (!st)
        st = load_merges(t, json_object_get(model, "merges"), name);
    if (st)
        return st;
    const json_t *unk = json_object_get(model, "unk_token");
    t->unk_id = -1;
    if (unk && !json_is_null(unk)) {
        if (!json_is_string(unk))
            return fmt_err(name, "model.unk_token", "expected a string or null");
        t->unk_id = vocab_find(t, json_string_value(unk), json_string_length(unk));
        if (t->unk_id < 0)
            return fmt_err(name, "model.unk_token", "not in model.vocab");
    }
    return QD_OK;
}

static qd_status normalize(const qd_tokenizer *t, const char *s, size_t n, char **out, size_t *out_len);

static qd_status load_added_one(qd_tokenizer *t, const json_t *e, size_t i, const char *name)
{
    char field[64];
    snprintf(field, sizeof field, "added_tokens[%zu]", i);
    const json_t *c = json_object_get(e, "content");
    if (!json_is_string(c) || !json_string_length(c))
        return fmt_err(name, field, "content missing or empty");
    added_token *a = &t->added[i];
    a->id = (int32_t)json_integer_value(json_object_get(e, "id"));
    a->len = json_string_length(c);
    if (!(a->content = dup_bytes(json_string_value(c), a->len)))
        return qd_error(QD_ERR_NOMEM, "%s: out of memory", name);
    int single_word, lstrip, rstrip;
    qd_status st = get_bool(e, "special", 0, &a->special, name, field);
    if (!st)
        st = get_bool(e, "normalized", !a->special, &a->normalized, name, field);
    if (!st)
        st = get_bool(e, "single_word", 0, &single_word, name, field);
    if (!st)
        st = get_bool(e, "lstrip", 0, &lstrip, name, field);
    if (!st)
        st = get_bool(e, "rstrip", 0, &rstrip, name, field);
    if (!st && (single_word || lstrip || rstrip))
        return unsupported(name, field, single_word ? "single_word" : lstrip ? "lstrip" : "rstrip");
    return st;
}

/* Gives each added token its id slot; a vocabulary entry under the same id must be the same string. */
static qd_status place_added(qd_tokenizer *t, added_token *a, size_t i, const char *name)
{
    if (t->str[a->id] && (t->len[a->id] != a->len || memcmp(t->str[a->id], a->content, a->len)))
        return qd_error(QD_ERR_FORMAT, "%s: added_tokens[%zu].id: %d already names \"%.40s\"", name, i,
                        a->id, t->str[a->id]);
    if (!t->str[a->id] && !(t->str[a->id] = dup_bytes(a->content, a->len)))
        return qd_error(QD_ERR_NOMEM, "%s: out of memory", name);
    t->len[a->id] = a->len;
    t->special[a->id] = (uint8_t)a->special;
    if (!a->normalized) {
        a->match = dup_bytes(a->content, a->len);
        a->match_len = a->len;
        return a->match ? QD_OK : qd_error(QD_ERR_NOMEM, "%s: out of memory", name);
    }
    return normalize(t, a->content, a->len, &a->match, &a->match_len);
}

static int by_first_byte_longest(const void *x, const void *y, void *tokens)
{
    const added_token *all = tokens;
    const added_token *a = &all[*(const int32_t *)x], *b = &all[*(const int32_t *)y];
    int fa = (uint8_t)a->match[0], fb = (uint8_t)b->match[0];
    if (fa != fb)
        return fa - fb;
    return (a->match_len < b->match_len) - (a->match_len > b->match_len);
}

/* The tokens with normalized == which, ordered for leftmost-longest search. */
static qd_status build_set(qd_tokenizer *t, added_set *set, int which)
{
    size_t n = 0;
    if (!(set->order = malloc((t->n_added + 1) * sizeof *set->order)))
        return qd_error(QD_ERR_NOMEM, "tokenizer: out of memory");
    for (size_t i = 0; i < t->n_added; i++)
        if (t->added[i].normalized == which && t->added[i].match_len)
            set->order[n++] = (int32_t)i;
    qsort_r(set->order, n, sizeof *set->order, by_first_byte_longest, t->added);
    size_t k = 0;
    for (int b = 0; b <= 256; b++) {
        while (b < 256 && k < n && (uint8_t)t->added[set->order[k]].match[0] < b)
            k++;
        set->start[b] = b < 256 ? k : n;
    }
    return QD_OK;
}

static qd_status load_added(qd_tokenizer *t, const json_t *added, const char *name)
{
    if (added && !json_is_null(added) && !json_is_array(added))
        return fmt_err(name, "added_tokens", "expected an array");
    t->n_added = json_array_size(added);
    t->added = calloc(t->n_added + 1, sizeof *t->added);
    if (!t->added)
        return qd_error(QD_ERR_NOMEM, "%s: out of memory", name);
    for (size_t i = 0; i < t->n_added; i++) {
        qd_status st = load_added_one(t, json_array_get(added, i), i, name);
        if (!st)
            st = place_added(t, &t->added[i], i, name);
        if (st)
            return st;
    }
    qd_status st = build_set(t, &t->raw_set, 0);
    return st ? st : build_set(t, &t->norm_set, 1);
}

static qd_status load_one_normalizer(qd_tokenizer *t, const json_t *n, const char *name, const char *field)
{
    static const struct { const char *type; int opts; } forms[] = {
        {"NFC", UTF8PROC_STABLE | UTF8PROC_COMPOSE},
        {"NFD", UTF8PROC_STABLE | UTF8PROC_DECOMPOSE},
        {"NFKC", UTF8PROC_STABLE | UTF8PROC_COMPOSE | UTF8PROC_COMPAT},
        {"NFKD", UTF8PROC_STABLE | UTF8PROC_DECOMPOSE | UTF8PROC_COMPAT},
    };
    const char *type = type_of(n);
    if (!type)
        return fmt_err(name, field, "missing \"type\"");
    if (!strcmp(type, "Sequence")) {
        const json_t *list = json_object_get(n, "normalizers");
        if (!json_is_array(list))
            return fmt_err(name, field, "Sequence without a \"normalizers\" array");
        for (size_t i = 0; i < json_array_size(list); i++) {
            char sub[64];
            snprintf(sub, sizeof sub, "%s.normalizers[%zu]", field, i);
            qd_status st = load_one_normalizer(t, json_array_get(list, i), name, sub);
            if (st)
                return st;
        }
        return QD_OK;
    }
    for (size_t i = 0; i < sizeof forms / sizeof forms[0]; i++)
        if (!strcmp(type, forms[i].type)) {
            if (t->n_norm == NORM_MAX)
                return unsupported(name, field, "more than 8 normalizers");
            t->norm_opts[t->n_norm++] = forms[i].opts;
            return QD_OK;
        }
    return qd_error(QD_ERR_UNSUPPORTED, "%s: %s.type: \"%s\" is not supported", name, field, type);
}

/* Oniguruma's \s (HF compiles its regexes with Oniguruma) is Unicode White_Space;
 * PCRE2's \s with UCP also matches U+180E. Spelling \s and \S out as this class
 * makes the two agree (checked on every code point, see tests/ref/). \S inside a
 * class cannot be spelled out and keeps PCRE2's meaning. */
#define WHITE_SPACE "\\t-\\r\\x{20}\\x{85}\\x{a0}\\x{1680}\\x{2000}-\\x{200a}\\x{2028}\\x{2029}\\x{202f}\\x{205f}\\x{3000}"

/* Copies pat[i..] through the next `end` (or to the end): a quoted \Q...\E or a
 * POSIX class [:alpha:], where nothing is rewritten. Returns the index after it. */
static size_t copy_through(const char *pat, size_t n, size_t i, const char *end, char *out, size_t *k)
{
    const char *stop = NULL;
    for (size_t j = i + 2; j + strlen(end) <= n && !stop; j++)
        if (!memcmp(pat + j, end, strlen(end)))
            stop = pat + j + strlen(end);
    size_t m = stop ? (size_t)(stop - (pat + i)) : n - i;
    memcpy(out + *k, pat + i, m);
    *k += m;
    return i + m;
}

/* pat with \s and \S spelled out as WHITE_SPACE; *out is malloc'd and NUL-terminated. */
static char *spell_out_space(const char *pat, size_t n, size_t *out_len)
{
    const size_t ws = sizeof WHITE_SPACE - 1;
    char *out = malloc(n * (ws + 4) / 2 + 8);
    size_t k = 0, i = 0;
    int in_class = 0;
    while (out && i < n) {
        char c = pat[i], d = i + 1 < n ? pat[i + 1] : 0;
        if (c == '\\' && d == 'Q')
            i = copy_through(pat, n, i, "\\E", out, &k);
        else if (in_class && c == '[' && d == ':')
            i = copy_through(pat, n, i, ":]", out, &k);
        else if (c == '\\' && (d == 's' || (d == 'S' && !in_class))) {
            const char *open = in_class ? "" : d == 's' ? "[" : "[^";
            k += (size_t)sprintf(out + k, "%s%s%s", open, WHITE_SPACE, in_class ? "" : "]");
            i += 2;
        } else if (c == '\\') {
            memcpy(out + k, pat + i, d ? 2 : 1);
            k += d ? 2 : 1;
            i += d ? 2 : 1;
        } else if (!in_class && c == '[') {
            in_class = 1; /* a ']' right after '[' or '[^' is a literal */
            out[k++] = pat[i++];
            if (i < n && pat[i] == '^')
                out[k++] = pat[i++];
            if (i < n && pat[i] == ']')
                out[k++] = pat[i++];
        } else {
            in_class &= c != ']';
            out[k++] = pat[i++];
        }
    }
    if (out)
        out[k] = 0;
    *out_len = k;
    return out;
}

/* Compiles a regex (or, when literal, a plain string) for the pre-tokenizer. */
static qd_status compile(pcre2_code **re, const char *pat, size_t len, int literal,
                         const char *name, const char *field)
{
    int code;
    PCRE2_SIZE at;
    size_t n = len;
    uint32_t opts = PCRE2_UTF | (literal ? PCRE2_LITERAL : PCRE2_UCP); /* LITERAL refuses UCP */
    char *spelled = literal ? dup_bytes(pat, len) : spell_out_space(pat, len, &n);
    if (!spelled)
        return qd_error(QD_ERR_NOMEM, "%s: out of memory", name);
    *re = pcre2_compile((PCRE2_SPTR)spelled, n, opts, &code, &at, NULL);
    free(spelled);
    if (!*re) {
        PCRE2_UCHAR msg[160];
        int code_pat;
        pcre2_code *as_written = pcre2_compile((PCRE2_SPTR)pat, len, opts, &code_pat, &at, NULL);
        pcre2_code_free(as_written);
        if (as_written) { /* only the spelled-out form fails: a limit, with no offset in the file's pattern */
            pcre2_get_error_message(code, msg, sizeof msg);
            return qd_error(QD_ERR_FORMAT, "%s: %s: regex refused once \\s and \\S are spelled out as White_Space "
                            "classes (%zu bytes): %s", name, field, n, (const char *)msg);
        }
        pcre2_get_error_message(code_pat, msg, sizeof msg); /* the error and its offset as in the file's pattern */
        return qd_error(QD_ERR_FORMAT, "%s: %s: bad regex at offset %zu: %s", name, field, (size_t)at,
                        (const char *)msg);
    }
    pcre2_jit_compile(*re, PCRE2_JIT_COMPLETE); /* optional: the interpreter runs when JIT is absent */
    return QD_OK;
}

static qd_status load_split(qd_tokenizer *t, const json_t *p, const char *name, const char *field)
{
    char sub[80];
    int invert;
    const char *behavior = json_string_value(json_object_get(p, "behavior"));
    const json_t *pat = json_object_get(p, "pattern");
    const json_t *regex = json_object_get(pat, "Regex"), *literal = json_object_get(pat, "String");
    snprintf(sub, sizeof sub, "%s.pattern", field);
    if (!json_is_string(regex) && !json_is_string(literal))
        return fmt_err(name, sub, "expected {\"Regex\": ...} or {\"String\": ...}");
    qd_status st = get_bool(p, "invert", 0, &invert, name, field);
    if (st)
        return st;
    snprintf(sub, sizeof sub, "%s.invert", field);
    if (invert)
        return unsupported(name, sub, "invert = true");
    snprintf(sub, sizeof sub, "%s.behavior", field);
    if (!behavior || (strcmp(behavior, "Isolated") && strcmp(behavior, "Removed")))
        return unsupported(name, sub, behavior ? behavior : "a missing behavior");
    if (t->n_split == SPLIT_MAX)
        return unsupported(name, field, "more than 8 Split steps");
    split_step *s = &t->split[t->n_split++];
    s->remove = !strcmp(behavior, "Removed");
    snprintf(sub, sizeof sub, "%s.pattern.%s", field, regex ? "Regex" : "String");
    const json_t *src = regex ? regex : literal;
    return compile(&s->re, json_string_value(src), json_string_length(src), !regex, name, sub);
}

static qd_status load_byte_level(qd_tokenizer *t, const json_t *p, const char *name, const char *field)
{
    int use_regex;
    qd_status st = get_bool(p, "add_prefix_space", 1, &t->prefix_space, name, field);
    if (!st)
        st = get_bool(p, "use_regex", 1, &use_regex, name, field);
    if (!st && use_regex)
        st = compile(&t->byte_level_re, gpt2_pattern, sizeof gpt2_pattern - 1, 0, name, field);
    return st;
}

/* Split steps then one ByteLevel, last: the byte-level mapping must see the final pieces. */
static qd_status load_pre_tokenizer(qd_tokenizer *t, const json_t *p, const char *name)
{
    const char *type = type_of(p);
    if (!type)
        return fmt_err(name, "pre_tokenizer", "missing (a byte-level BPE needs ByteLevel)");
    if (!strcmp(type, "ByteLevel"))
        return load_byte_level(t, p, name, "pre_tokenizer");
    const json_t *list = json_object_get(p, "pretokenizers");
    if (strcmp(type, "Sequence"))
        return qd_error(QD_ERR_UNSUPPORTED, "%s: pre_tokenizer.type: \"%s\" is not supported", name, type);
    size_t n = json_array_size(list);
    for (size_t i = 0; i < n; i++) {
        char field[64];
        const json_t *e = json_array_get(list, i);
        const char *et = type_of(e);
        snprintf(field, sizeof field, "pre_tokenizer.pretokenizers[%zu]", i);
        qd_status st;
        if (et && !strcmp(et, "Split") && i + 1 < n)
            st = load_split(t, e, name, field);
        else if (et && !strcmp(et, "ByteLevel") && i + 1 == n)
            st = load_byte_level(t, e, name, field);
        else
            st = qd_error(QD_ERR_UNSUPPORTED, "%s: %s.type: \"%s\" is not supported here "
                          "(Split steps then ByteLevel last)", name, field, et ? et : "(missing)");
        if (st)
            return st;
    }
    return n ? QD_OK : fmt_err(name, "pre_tokenizer.pretokenizers", "empty (a byte-level BPE needs ByteLevel)");
}

/* Parts that change nothing we implement must be absent or harmless. */
static qd_status check_rest(const json_t *root, const char *name)
{
    const char *dec = type_of(json_object_get(root, "decoder"));
    const json_t *post = json_object_get(root, "post_processor");
    const json_t *trunc = json_object_get(root, "truncation");
    if (!dec || strcmp(dec, "ByteLevel"))
        return unsupported(name, "decoder.type", dec ? dec : "a missing decoder");
    if (post && !json_is_null(post) && (!type_of(post) || strcmp(type_of(post), "ByteLevel")))
        return unsupported(name, "post_processor.type", type_of(post) ? type_of(post) : "(missing)");
    if (trunc && !json_is_null(trunc))
        return unsupported(name, "truncation", "truncation");
    return QD_OK;
}

static void set_byte_ids(qd_tokenizer *t)
{
    for (int b = 0; b < 256; b++) {
        char s[2];
        t->byte_id[b] = vocab_find(t, s, put_utf8(s, t->byte_cp[b]));
    }
}

static qd_status load_root(qd_tokenizer *t, const json_t *root, const char *name)
{
    const json_t *model = json_object_get(root, "model"), *added = json_object_get(root, "added_tokens");
    const json_t *norm = json_object_get(root, "normalizer");
    if (!json_is_object(root))
        return fmt_err(name, "(top level)", "expected a JSON object");
    if (!json_is_object(model))
        return fmt_err(name, "model", "missing or not an object");
    if (!json_is_object(json_object_get(model, "vocab")))
        return fmt_err(name, "model.vocab", "missing or not an object");
    byte_level_tables(t);
    qd_status st = alloc_ids(t, json_object_get(model, "vocab"), json_is_array(added) ? added : NULL, name);
    if (!st)
        st = load_model(t, model, name);
    if (!st && norm && !json_is_null(norm))
        st = load_one_normalizer(t, norm, name, "normalizer");
    if (!st)
        st = load_added(t, added, name);
    if (!st)
        st = load_pre_tokenizer(t, json_object_get(root, "pre_tokenizer"), name);
    if (!st)
        st = check_rest(root, name);
    if (!st)
        set_byte_ids(t);
    return st;
}

static qd_status load_json(json_t *root, const char *name, qd_tokenizer **out)
{
    qd_tokenizer *t = calloc(1, sizeof *t);
    if (!t) {
        json_decref(root);
        return qd_error(QD_ERR_NOMEM, "%s: out of memory", name);
    }
    qd_status st = load_root(t, root, name);
    json_decref(root);
    if (st) {
        qd_tokenizer_free(t);
        return st;
    }
    *out = t;
    return QD_OK;
}

qd_status qd_tokenizer_load_string(const char *json, size_t len, const char *name, qd_tokenizer **out)
{
    json_error_t err;
    *out = NULL;
    json_t *root = json_loadb(json, len, JSON_ALLOW_NUL, &err);
    if (!root)
        return qd_error(QD_ERR_FORMAT, "%s: line %d: %s", name, err.line, err.text);
    return load_json(root, name, out);
}

qd_status qd_tokenizer_load(const char *path, qd_tokenizer **out)
{
    json_error_t err;
    FILE *f;
    *out = NULL;
    qd_status st = qd_fopen_regular(path, &f);
    if (st)
        return st;
    json_t *root = json_loadf(f, JSON_ALLOW_NUL, &err);
    fclose(f);
    if (!root)
        return qd_error(QD_ERR_FORMAT, "%s: line %d: %s", path, err.line, err.text);
    return load_json(root, path, out);
}

void qd_tokenizer_free(qd_tokenizer *t)
{
    if (!t)
        return;
    for (int32_t i = 0; t->str && i < t->n_ids; i++)
        free(t->str[i]);
    for (size_t i = 0; t->added && i < t->n_added; i++) {
        free(t->added[i].content);
        free(t->added[i].match);
    }
    for (int i = 0; i < t->n_split; i++)
        pcre2_code_free(t->split[i].re);
    pcre2_code_free(t->byte_level_re);
    free(t->raw_set.order);
    free(t->norm_set.order);
    free(t->added);
    free(t->str);
    free(t->len);
    free(t->special);
    free(t->vocab);
    free(t->merges);
    free(t);
}

/* ---- encoding */

typedef struct {
    int32_t id;
    int prev, next;     /* neighbours in the word, -1 at the ends */
} symbol;

typedef struct {
    int32_t rank;
    int pos;            /* index of the left symbol: ties go to the leftmost */
    int32_t left, right, id;
} candidate;

/* Per-call state: the output and scratch buffers (encode is reentrant). */
typedef struct {
    const qd_tokenizer *t;
    int32_t *ids;
    size_t n, cap;
    pcre2_match_data *md;
    symbol *sym;
    candidate *heap;
    size_t sym_cap, heap_n, heap_cap;
    char *buf;          /* a prefix-spaced piece or a byte-level word */
    size_t buf_cap;
} encoder;

static qd_status emit(encoder *e, int32_t id)
{
    if (!grow((void **)&e->ids, &e->cap, e->n + 1, sizeof *e->ids))
        return qd_error(QD_ERR_NOMEM, "tokenizer: out of memory");
    e->ids[e->n++] = id;
    return QD_OK;
}

static int cand_less(const candidate *a, const candidate *b)
{
    return a->rank < b->rank || (a->rank == b->rank && a->pos < b->pos);
}

static qd_status heap_push(encoder *e, int pos, int right)
{
    const merge_slot *m = merge_find(e->t, e->sym[pos].id, e->sym[right].id);
    if (!m)
        return QD_OK;
    if (!grow((void **)&e->heap, &e->heap_cap, e->heap_n + 1, sizeof *e->heap))
        return qd_error(QD_ERR_NOMEM, "tokenizer: out of memory");
    candidate c = {m->rank, pos, e->sym[pos].id, e->sym[right].id, m->id};
    size_t i = e->heap_n++;
    for (; i > 0 && cand_less(&c, &e->heap[(i - 1) / 2]); i = (i - 1) / 2)
        e->heap[i] = e->heap[(i - 1) / 2];
    e->heap[i] = c;
    return QD_OK;
}

static candidate heap_pop(encoder *e)
{
    candidate top = e->heap[0], last = e->heap[--e->heap_n];
    size_t i = 0;
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= e->heap_n)
            break;
        if (c + 1 < e->heap_n && cand_less(&e->heap[c + 1], &e->heap[c]))
            c++;
        if (!cand_less(&e->heap[c], &last))
            break;
        e->heap[i] = e->heap[c];
        i = c;
    }
    if (e->heap_n)
        e->heap[i] = last;
    return top;
}

/* The word's initial symbols: one per byte; a byte missing from the vocabulary
 * becomes unk (consecutive ones fused with fuse_unk) or, without unk, is dropped as HF does. */
static qd_status initial_symbols(encoder *e, const char *w, size_t n, int *n_sym)
{
    const qd_tokenizer *t = e->t;
    int k = 0, prev_unk = 0;
    if (!grow((void **)&e->sym, &e->sym_cap, n, sizeof *e->sym))
        return qd_error(QD_ERR_NOMEM, "tokenizer: out of memory");
    for (size_t i = 0; i < n; i++) {
        int32_t id = t->byte_id[(uint8_t)w[i]];
        int unk = id < 0;
        if (unk && (t->unk_id < 0 || (t->fuse_unk && prev_unk)))
            continue;
        e->sym[k] = (symbol){unk ? t->unk_id : id, k - 1, k + 1};
        k++;
        prev_unk = unk;
    }
    if (k)
        e->sym[k - 1].next = -1;
    *n_sym = k;
    return QD_OK;
}

/* The byte-level spelling of a word, for ignore_merges' whole-word lookup. */
static int32_t whole_word_id(encoder *e, const char *w, size_t n)
{
    if (!grow((void **)&e->buf, &e->buf_cap, 2 * n, 1))
        return -1;
    size_t k = 0;
    for (size_t i = 0; i < n; i++)
        k += put_utf8(e->buf + k, e->t->byte_cp[(uint8_t)w[i]]);
    return vocab_find(e->t, e->buf, k);
}

/* BPE of one pre-tokenized piece: repeatedly merge the adjacent pair of
 * lowest rank, leftmost first; stale heap entries are skipped when popped. */
static qd_status bpe_word(encoder *e, const char *w, size_t n)
{
    int n_sym;
    if (e->t->ignore_merges) {
        int32_t id = whole_word_id(e, w, n);
        if (id >= 0)
            return emit(e, id);
    }
    qd_status st = initial_symbols(e, w, n, &n_sym);
    e->heap_n = 0;
    for (int i = 0; !st && i + 1 < n_sym; i++)
        st = heap_push(e, i, i + 1);
    while (!st && e->heap_n) {
        candidate c = heap_pop(e);
        symbol *s = &e->sym[c.pos];
        if (s->id != c.left || s->next < 0 || e->sym[s->next].id != c.right)
            continue;
        int gone = s->next;
        s->id = c.id;
        s->next = e->sym[gone].next;
        e->sym[gone].id = -1;
        if (s->next >= 0)
            e->sym[s->next].prev = c.pos;
        if (s->prev >= 0)
            st = heap_push(e, s->prev, c.pos);
        if (!st && s->next >= 0)
            st = heap_push(e, c.pos, s->next);
    }
    for (int i = n_sym ? 0 : -1; !st && i >= 0; i = e->sym[i].next)
        st = emit(e, e->sym[i].id);
    return st;
}

/* The next non-empty match of re in s[0, n) at or after from: 1 found, 0 none. */
static qd_status next_match(encoder *e, const pcre2_code *re, const char *s, size_t n, size_t from,
                            size_t *ms, size_t *me, int *found)
{
    *found = 0;
    while (from < n) {
        int rc = pcre2_match(re, (PCRE2_SPTR)s, n, from, PCRE2_NO_UTF_CHECK, e->md, NULL);
        if (rc == PCRE2_ERROR_JIT_STACKLIMIT) /* long runs: the interpreter's heap has more room */
            rc = pcre2_match(re, (PCRE2_SPTR)s, n, from, PCRE2_NO_UTF_CHECK | PCRE2_NO_JIT, e->md, NULL);
        if (rc == PCRE2_ERROR_NOMATCH)
            return QD_OK;
        if (rc < 0) {
            PCRE2_UCHAR msg[160];
            pcre2_get_error_message(rc, msg, sizeof msg);
            return qd_error(QD_ERR_ARG, "tokenizer: pre_tokenizer regex failed: %s", (const char *)msg);
        }
        const PCRE2_SIZE *ov = pcre2_get_ovector_pointer(e->md);
        if (ov[1] > ov[0]) {
            *ms = ov[0];
            *me = ov[1];
            *found = 1;
            return QD_OK;
        }
        from = ov[0] + (size_t)utf8_seq((const uint8_t *)s + ov[0], n - ov[0]); /* skip an empty match */
    }
    return QD_OK;
}

/* ByteLevel: an optional leading space, GPT-2's regex when use_regex, then BPE. */
static qd_status byte_level(encoder *e, const char *s, size_t n)
{
    char *spaced = NULL;
    if (e->t->prefix_space && s[0] != ' ') {
        if (!(spaced = malloc(n + 1)))
            return qd_error(QD_ERR_NOMEM, "tokenizer: out of memory");
        spaced[0] = ' ';
        memcpy(spaced + 1, s, n++);
        s = spaced;
    }
    qd_status st = QD_OK;
    if (!e->t->byte_level_re)
        st = bpe_word(e, s, n);
    for (size_t at = 0, ms = 0, me = 0; e->t->byte_level_re && !st && at < n; at = me) {
        int found;
        st = next_match(e, e->t->byte_level_re, s, n, at, &ms, &me, &found);
        if (!st && !found)
            ms = me = n;
        if (!st && ms > at)
            st = bpe_word(e, s + at, ms - at);
        if (!st && me > ms)
            st = bpe_word(e, s + ms, me - ms);
    }
    free(spaced);
    return st;
}

/* Split step `step` (Isolated: gaps and matches in order; Removed: gaps only), then the rest. */
static qd_status pre_tokenize(encoder *e, int step, const char *s, size_t n)
{
    if (!n)
        return QD_OK;
    if (step == e->t->n_split)
        return byte_level(e, s, n);
    const split_step *sp = &e->t->split[step];
    qd_status st = QD_OK;
    for (size_t at = 0, ms = 0, me = 0; !st && at < n; at = me) {
        int found;
        st = next_match(e, sp->re, s, n, at, &ms, &me, &found);
        if (!st && !found)
            ms = me = n;
        if (!st)
            st = pre_tokenize(e, step + 1, s + at, ms - at);
        if (!st && !sp->remove)
            st = pre_tokenize(e, step + 1, s + ms, me - ms);
    }
    return st;
}

/* The leftmost occurrence at or after from of a token of set, the longest there. */
static const added_token *find_added(const qd_tokenizer *t, const added_set *set, const char *s,
                                     size_t n, size_t from, size_t *at)
{
    for (size_t p = from; p < n; p++) {
        uint8_t b = (uint8_t)s[p];
        for (size_t k = set->start[b]; k < set->start[b + 1]; k++) {
            const added_token *a = &t->added[set->order[k]];
            if (a->match_len <= n - p && !memcmp(s + p, a->match, a->match_len)) {
                *at = p;
                return a;
            }
        }
    }
    return NULL;
}

/* Splits s on the added tokens of set: tokens become their ids, gaps go to next. */
static qd_status split_added(encoder *e, const added_set *set, const char *s, size_t n,
                             qd_status (*next)(encoder *, const char *, size_t))
{
    size_t from = 0, at;
    const added_token *a;
    while ((a = find_added(e->t, set, s, n, from, &at))) {
        qd_status st = next(e, s + from, at - from);
        if (!st)
            st = emit(e, a->id);
        if (st)
            return st;
        from = at + a->match_len;
    }
    return next(e, s + from, n - from);
}

static qd_status after_norm_added(encoder *e, const char *s, size_t n) { return pre_tokenize(e, 0, s, n); }

static qd_status normalize(const qd_tokenizer *t, const char *s, size_t n, char **out, size_t *out_len)
{
    char *cur = dup_bytes(s, n);
    size_t len = n;
    for (int i = 0; cur && i < t->n_norm && len; i++) {
        utf8proc_uint8_t *dst = NULL;
        utf8proc_ssize_t r = utf8proc_map((const utf8proc_uint8_t *)cur, (utf8proc_ssize_t)len, &dst,
                                          (utf8proc_option_t)t->norm_opts[i]);
        free(cur);
        if (r < 0) {
            *out = NULL;
            return qd_error(QD_ERR_ARG, "tokenizer: normalizer: %s", utf8proc_errmsg(r));
        }
        cur = (char *)dst;
        len = (size_t)r;
    }
    *out = cur;
    *out_len = len;
    return cur ? QD_OK : qd_error(QD_ERR_NOMEM, "tokenizer: out of memory");
}

static qd_status after_raw_added(encoder *e, const char *s, size_t n)
{
    char *norm;
    size_t len;
    if (!n)
        return QD_OK;
    qd_status st = normalize(e->t, s, n, &norm, &len);
    if (!st)
        st = split_added(e, &e->t->norm_set, norm, len, after_norm_added);
    free(norm);
    return st;
}

static void encoder_free(encoder *e)
{
    pcre2_match_data_free(e->md);
    free(e->sym);
    free(e->heap);
    free(e->buf);
}

qd_status qd_tokenizer_encode(const qd_tokenizer *t, const char *text, size_t len, int32_t **ids,
                              size_t *n_ids)
{
    encoder e = {.t = t};
    *ids = NULL;
    *n_ids = 0;
    size_t valid = utf8_valid_prefix(text, len);
    if (valid < len)
        return qd_error(QD_ERR_ARG, "tokenizer: input is not valid UTF-8 at byte %zu", valid);
    if (!(e.md = pcre2_match_data_create(16, NULL)))
        return qd_error(QD_ERR_NOMEM, "tokenizer: out of memory");
    qd_status st = split_added(&e, &t->raw_set, text, len, after_raw_added);
    encoder_free(&e);
    if (st) {
        free(e.ids);
        return st;
    }
    *ids = e.ids;
    *n_ids = e.n;
    return QD_OK;
}

/* ---- decoding */

/* A token's bytes: its characters mapped back through the byte-level table,
 * or (HF's ByteLevel decoder) its raw UTF-8 when some character is not a byte-level one. */
static size_t token_bytes(const qd_tokenizer *t, const char *s, size_t n, char *out)
{
    size_t k = 0;
    for (size_t i = 0; i < n;) {
        utf8proc_int32_t cp;
        utf8proc_ssize_t r = utf8proc_iterate((const utf8proc_uint8_t *)s + i, (utf8proc_ssize_t)(n - i), &cp);
        if (r <= 0 || cp >= 0x144 || t->cp_byte[cp] < 0) {
            memcpy(out, s, n);
            return n;
        }
        out[k++] = (char)t->cp_byte[cp];
        i += (size_t)r;
    }
    return k;
}

/* Copies bytes as UTF-8, each maximal invalid subpart replaced by U+FFFD. */
static size_t lossy_utf8(const char *in, size_t n, char *out)
{
    size_t k = 0;
    for (size_t i = 0; i < n;) {
        int r = utf8_seq((const uint8_t *)in + i, n - i);
        if (r > 0) {
            memcpy(out + k, in + i, (size_t)r);
            k += (size_t)r;
            i += (size_t)r;
        } else {
            memcpy(out + k, "\xef\xbf\xbd", 3);
            k += 3;
            i += (size_t)-r;
        }
    }
    return k;
}

qd_status qd_tokenizer_decode(const qd_tokenizer *t, const int32_t *ids, size_t n_ids, int skip_special,
                              char **text, size_t *len)
{
    size_t total = 0;
    *text = NULL;
    *len = 0;
    for (size_t i = 0; i < n_ids; i++) {
        if (ids[i] < 0 || ids[i] >= t->n_ids || !t->str[ids[i]])
            return qd_error(QD_ERR_ARG, "tokenizer: decode: id %d (position %zu) names no token", ids[i], i);
        total += t->len[ids[i]];
    }
    char *bytes = malloc(total + 1), *out = malloc(3 * total + 1); /* U+FFFD is 3 bytes per bad byte */
    if (!bytes || !out) {
        free(bytes);
        free(out);
        return qd_error(QD_ERR_NOMEM, "tokenizer: out of memory");
    }
    size_t k = 0;
    for (size_t i = 0; i < n_ids; i++)
        if (!(skip_special && t->special[ids[i]]))
            k += token_bytes(t, t->str[ids[i]], t->len[ids[i]], bytes + k);
    *len = lossy_utf8(bytes, k, out);
    out[*len] = 0;
    free(bytes);
    *text = out;
    return QD_OK;
}

int32_t qd_tokenizer_n_ids(const qd_tokenizer *t) { return t->n_ids; }

int32_t qd_tokenizer_token_id(const qd_tokenizer *t, const char *token)
{
    size_t n = strlen(token);
    for (size_t i = 0; i < t->n_added; i++)
        if (t->added[i].len == n && !memcmp(t->added[i].content, token, n))
            return t->added[i].id;
    return vocab_find(t, token, n);
}

int qd_tokenizer_is_special(const qd_tokenizer *t, int32_t id)
{
    return id >= 0 && id < t->n_ids && t->special[id];
}

/* ---- chat formatting */

/* Appends tmpl with {role} and {content} replaced to *buf (NULL: only counts). */
static size_t fill_template(const char *tmpl, const char *role, const char *content, char *buf)
{
    size_t k = 0;
    for (const char *p = tmpl; *p;) {
        const char *sub = NULL;
        size_t skip = 1;
        if (!strncmp(p, "{role}", 6))
            sub = role, skip = 6;
        else if (!strncmp(p, "{content}", 9))
            sub = content, skip = 9;
        size_t n = sub ? strlen(sub) : 1;
        if (buf)
            memcpy(buf + k, sub ? sub : p, n);
        k += n;
        p += skip;
    }
    return k;
}

qd_status qd_tokenizer_chat_format(const qd_chat_template *tmpl, const qd_chat_message *msgs, size_t n,
                                   int add_generation, char **out)
{
    *out = NULL;
    if (!tmpl->message || !strstr(tmpl->message, "{content}"))
        return qd_error(QD_ERR_ARG, "chat template: the message template has no {content}");
    size_t total = add_generation && tmpl->generation ? strlen(tmpl->generation) : 0;
    for (size_t i = 0; i < n; i++) {
        if (!msgs[i].role || !msgs[i].content)
            return qd_error(QD_ERR_ARG, "chat template: message %zu has no role or content", i);
        /* checked here, where an offset still refers to the caller's text, not the formatted one */
        size_t len = strlen(msgs[i].content), valid = utf8_valid_prefix(msgs[i].content, len);
        if (valid < len)
            return qd_error(QD_ERR_ARG, "chat template: the %s message is not valid UTF-8 at byte %zu",
                            msgs[i].role, valid);
        total += fill_template(tmpl->message, msgs[i].role, msgs[i].content, NULL);
    }
    char *buf = malloc(total + 1);
    if (!buf)
        return qd_error(QD_ERR_NOMEM, "chat template: out of memory");
    size_t k = 0;
    for (size_t i = 0; i < n; i++)
        k += fill_template(tmpl->message, msgs[i].role, msgs[i].content, buf + k);
    if (add_generation && tmpl->generation)
        k += fill_template(tmpl->generation, "", "", buf + k);
    buf[k] = 0;
    *out = buf;
    return QD_OK;
}
