/* Check suite of the tokenizer and model-config modules.
 *
 * The tokenizer is compared with Hugging Face `tokenizers` on fixtures that
 * tests/ref/make_tokenizer_fixture.py made with it (a Qwen2-style byte-level
 * BPE and a GPT-2-style one): ids of hard texts, decodes, ChatML. Malformed
 * tokenizer.json and config.json files must be refused with messages naming
 * the file and the field. */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>
#include "models/model_config.h"
#include "models/tokenizer.h"
#include "tests/suites.h"

#define QWEN2 "tests/fixtures/tokenizer/qwen2_bpe.json"

static json_t *load_fixture(const char *rel)
{
    json_error_t err;
    json_t *j = json_load_file(qd_test_path(rel), JSON_ALLOW_NUL, &err);
    ck_assert_msg(j != NULL, "%s: %s", rel, err.text);
    return j;
}

static qd_tokenizer *load_tokenizer(const char *rel)
{
    qd_tokenizer *tok = NULL;
    qd_status st = qd_tokenizer_load(qd_test_path(rel), &tok);
    ck_assert_msg(st == QD_OK, "%s", qd_last_error());
    return tok;
}

/* Encodes a JSON string (NULs kept) and compares with the JSON array of HF ids. */
static void check_encode(const qd_tokenizer *tok, const json_t *text, const json_t *want, size_t case_no)
{
    int32_t *ids;
    size_t n;
    qd_status st = qd_tokenizer_encode(tok, json_string_value(text), json_string_length(text), &ids, &n);
    ck_assert_msg(st == QD_OK, "case %zu: %s", case_no, qd_last_error());
    ck_assert_msg(n == json_array_size(want), "case %zu: %zu ids, HF gives %zu", case_no, n,
                  json_array_size(want));
    for (size_t i = 0; i < n; i++)
        ck_assert_msg(ids[i] == json_integer_value(json_array_get(want, i)),
                      "case %zu: id %zu is %d, HF gives %lld", case_no, i, ids[i],
                      (long long)json_integer_value(json_array_get(want, i)));
    free(ids);
}

static int32_t *ids_of(const json_t *arr)
{
    int32_t *ids = malloc((json_array_size(arr) + 1) * sizeof *ids);
    for (size_t i = 0; i < json_array_size(arr); i++)
        ids[i] = (int32_t)json_integer_value(json_array_get(arr, i));
    return ids;
}

static void check_decode(const qd_tokenizer *tok, const json_t *ids_json, int skip, const json_t *want,
                         size_t case_no)
{
    int32_t *ids = ids_of(ids_json);
    char *text;
    size_t len;
    qd_status st = qd_tokenizer_decode(tok, ids, json_array_size(ids_json), skip, &text, &len);
    ck_assert_msg(st == QD_OK, "case %zu: %s", case_no, qd_last_error());
    ck_assert_msg(len == json_string_length(want) && !memcmp(text, json_string_value(want), len),
                  "case %zu (skip=%d): decoded \"%s\", HF gives \"%s\"", case_no, skip, text,
                  json_string_value(want));
    free(text);
    free(ids);
}

static void check_cases(const qd_tokenizer *tok, const char *cases_rel, int with_decode)
{
    json_t *cases = load_fixture(cases_rel);
    ck_assert_uint_ge(json_array_size(cases), 35);
    for (size_t i = 0; i < json_array_size(cases); i++) {
        const json_t *c = json_array_get(cases, i);
        check_encode(tok, json_object_get(c, "text"), json_object_get(c, "ids"), i);
        if (with_decode) {
            check_decode(tok, json_object_get(c, "ids"), 0, json_object_get(c, "decoded"), i);
            check_decode(tok, json_object_get(c, "ids"), 1, json_object_get(c, "decoded_skip"), i);
        }
    }
    json_decref(cases);
}

START_TEST(test_ids_equal_hf)
{
    qd_tokenizer *tok = load_tokenizer(QWEN2);
    check_cases(tok, "tests/fixtures/tokenizer/cases.json", 1);
    qd_tokenizer_free(tok);
}
END_TEST

START_TEST(test_gpt2_layout_equal_hf)
{
    qd_tokenizer *tok = load_tokenizer("tests/fixtures/tokenizer/gpt2_bpe.json");
    check_cases(tok, "tests/fixtures/tokenizer/gpt2_cases.json", 0);
    qd_tokenizer_free(tok);
}
END_TEST

/* Every single id and the prefixes of multi-byte texts: HF's lossy UTF-8 included. */
START_TEST(test_decodes_equal_hf)
{
    qd_tokenizer *tok = load_tokenizer(QWEN2);
    json_t *cases = load_fixture("tests/fixtures/tokenizer/decodes.json");
    ck_assert_uint_ge(json_array_size(cases), (size_t)qd_tokenizer_n_ids(tok));
    for (size_t i = 0; i < json_array_size(cases); i++) {
        const json_t *c = json_array_get(cases, i);
        check_decode(tok, json_object_get(c, "ids"), 0, json_object_get(c, "decoded"), i);
    }
    json_decref(cases);
    qd_tokenizer_free(tok);
}
END_TEST

/* The fixture tokenizer with its Split regex replaced by pattern (behavior
 * Removed) and no normalizer or added tokens: a code point is in the
 * pattern's class when encoding it alone gives no ids. */
static qd_tokenizer *class_tokenizer(const char *pattern)
{
    json_t *root = load_fixture(QWEN2);
    json_t *split = json_pack("{s:s, s:{s:s}, s:s, s:b}", "type", "Split", "pattern", "Regex", pattern,
                              "behavior", "Removed", "invert", 0);
    json_array_set_new(json_object_get(json_object_get(root, "pre_tokenizer"), "pretokenizers"), 0, split);
    json_object_set_new(root, "normalizer", json_null());
    json_object_set_new(root, "added_tokens", json_array());
    char *text = json_dumps(root, 0);
    qd_tokenizer *tok = NULL;
    ck_assert_msg(qd_tokenizer_load_string(text, strlen(text), pattern, &tok) == QD_OK, "%s", qd_last_error());
    free(text);
    json_decref(root);
    return tok;
}

static int in_class(const qd_tokenizer *tok, uint32_t cp)
{
    char s[4];
    int32_t *ids;
    uint32_t v = cp;
    size_t n, len = cp < 0x80 ? 1 : cp < 0x800 ? 2 : cp < 0x10000 ? 3 : 4;
    for (size_t i = len - 1; i > 0; i--, v >>= 6)
        s[i] = (char)(0x80 | (v & 0x3f));
    s[0] = (char)(len == 1 ? v : (0xf00u >> len) | v);
    if (qd_tokenizer_encode(tok, s, len, &ids, &n)) /* no ck_assert here: each one writes to a pipe */
        ck_abort_msg("U+%04X: %s", cp, qd_last_error());
    free(ids);
    return n == 0;
}

/* Every code point against HF's classes (regex_classes.json). PCRE2 10.42 has
 * Unicode 14 tables: letters and digits added since (unassigned, \p{Cn}, to
 * PCRE2) may differ; nothing else may, and \s, \S must agree everywhere. */
START_TEST(test_regex_classes_equal_hf)
{
    json_t *fx = load_fixture("tests/fixtures/tokenizer/regex_classes.json");
    const json_t *cls = json_array_get(json_object_get(fx, "classes"), (size_t)_i);
    const char *pattern = json_string_value(json_object_get(cls, "pattern"));
    const json_t *ranges = json_object_get(cls, "ranges");
    qd_tokenizer *tok = class_tokenizer(pattern), *unassigned = class_tokenizer("\\p{Cn}");
    size_t r = 0, newer = 0;
    for (uint32_t cp = 1; cp < 0x110000; cp++) {
        if (cp >= 0xd800 && cp <= 0xdfff)
            continue;
        while (r < json_array_size(ranges) &&
               json_integer_value(json_array_get(json_array_get(ranges, r), 1)) < cp)
            r++;
        const json_t *rg = json_array_get(ranges, r);
        int hf = rg && json_integer_value(json_array_get(rg, 0)) <= cp;
        if (in_class(tok, cp) == hf)
            continue;
        if (!in_class(unassigned, cp))
            ck_abort_msg("%s: U+%04X: HF %d, ours %d", pattern, cp, hf, !hf);
        newer++;
    }
    if (pattern[1] == 's' || pattern[1] == 'S')
        ck_assert_uint_eq(newer, 0);
    ck_assert_uint_lt(newer, 12000);
    qd_tokenizer_free(tok);
    qd_tokenizer_free(unassigned);
    json_decref(fx);
}
END_TEST

/* The tokenizer.json with merges rewritten in the legacy "a b" string form gives the same ids. */
START_TEST(test_legacy_merges)
{
    json_t *root = load_fixture(QWEN2);
    json_t *merges = json_object_get(json_object_get(root, "model"), "merges");
    ck_assert(json_is_array(json_array_get(merges, 0)));
    for (size_t i = 0; i < json_array_size(merges); i++) {
        json_t *m = json_array_get(merges, i);
        char buf[256];
        snprintf(buf, sizeof buf, "%s %s", json_string_value(json_array_get(m, 0)),
                 json_string_value(json_array_get(m, 1)));
        json_array_set_new(merges, i, json_string(buf));
    }
    char *text = json_dumps(root, 0);
    qd_tokenizer *tok = NULL;
    ck_assert_msg(qd_tokenizer_load_string(text, strlen(text), "legacy.json", &tok) == QD_OK, "%s",
                  qd_last_error());
    check_cases(tok, "tests/fixtures/tokenizer/cases.json", 0);
    qd_tokenizer_free(tok);
    free(text);
    json_decref(root);
}
END_TEST

START_TEST(test_chatml_equal_hf)
{
    json_t *chat = load_fixture("tests/fixtures/tokenizer/chat.json");
    const json_t *msgs = json_object_get(chat, "messages");
    qd_chat_message m[8];
    ck_assert_uint_le(json_array_size(msgs), 8);
    for (size_t i = 0; i < json_array_size(msgs); i++) {
        m[i].role = json_string_value(json_object_get(json_array_get(msgs, i), "role"));
        m[i].content = json_string_value(json_object_get(json_array_get(msgs, i), "content"));
    }
    ck_assert_str_eq(qd_chat_chatml.message, json_string_value(json_object_get(chat, "template")));
    ck_assert_str_eq(qd_chat_chatml.generation, json_string_value(json_object_get(chat, "generation")));
    char *text;
    ck_assert_int_eq(qd_tokenizer_chat_format(&qd_chat_chatml, m, json_array_size(msgs), 1, &text), QD_OK);
    ck_assert_str_eq(text, json_string_value(json_object_get(chat, "text")));
    qd_tokenizer *tok = load_tokenizer(QWEN2);
    json_t *as_json = json_string(text);
    check_encode(tok, as_json, json_object_get(chat, "ids"), 0);
    json_decref(as_json);
    free(text);
    /* Without the generation prompt, and a template without {content}. */
    ck_assert_int_eq(qd_tokenizer_chat_format(&qd_chat_chatml, m, 1, 0, &text), QD_OK);
    ck_assert_str_eq(text, "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n");
    free(text);
    qd_chat_template bad = {"<|im_start|>{role}\n", ""};
    ck_assert_int_eq(qd_tokenizer_chat_format(&bad, m, 1, 1, &text), QD_ERR_ARG);
    qd_tokenizer_free(tok);
    json_decref(chat);
}
END_TEST

START_TEST(test_special_lookup)
{
    qd_tokenizer *tok = load_tokenizer(QWEN2);
    int32_t end = qd_tokenizer_token_id(tok, "<|im_end|>");
    ck_assert_int_eq(qd_tokenizer_n_ids(tok), 1507);
    ck_assert_int_eq(end, 1502);
    ck_assert(qd_tokenizer_is_special(tok, end));
    ck_assert(!qd_tokenizer_is_special(tok, qd_tokenizer_token_id(tok, "<think>")));
    ck_assert_int_eq(qd_tokenizer_token_id(tok, "\xc4\xa0"), 220); /* "Ġ", the byte-level space */
    ck_assert_int_eq(qd_tokenizer_token_id(tok, "no such token"), -1);
    qd_tokenizer_free(tok);
}
END_TEST

START_TEST(test_bad_input_refused)
{
    qd_tokenizer *tok = load_tokenizer(QWEN2);
    int32_t *ids;
    size_t n;
    char *text;
    ck_assert_int_eq(qd_tokenizer_encode(tok, "ok \xff", 4, &ids, &n), QD_ERR_ARG);
    ck_assert_int_eq(qd_tokenizer_encode(tok, "\xed\xa0\x80", 3, &ids, &n), QD_ERR_ARG); /* a surrogate */
    int32_t bad[] = {5, 1507};
    ck_assert_int_eq(qd_tokenizer_decode(tok, bad, 2, 0, &text, &n), QD_ERR_ARG);
    ck_assert_ptr_nonnull(strstr(qd_last_error(), "1507"));
    bad[1] = -1;
    ck_assert_int_eq(qd_tokenizer_decode(tok, bad, 2, 0, &text, &n), QD_ERR_ARG);
    qd_tokenizer_free(tok);
}
END_TEST

/* One malformed tokenizer.json: a change applied to the good file. */
typedef struct {
    const char *pointer; /* "model", "model.merges[5]", ... as a path of keys and indices */
    const char *value;   /* JSON to put there, NULL to delete it */
    qd_status want;
    const char *field;   /* what the message must name */
} tok_mutation;

static const tok_mutation tok_bad[] = {
    {"model", NULL, QD_ERR_FORMAT, "model"},
    {"model/type", "\"WordPiece\"", QD_ERR_UNSUPPORTED, "model.type"},
    {"model/vocab", NULL, QD_ERR_FORMAT, "model.vocab"},
    {"model/merges", NULL, QD_ERR_FORMAT, "model.merges"},
    {"model/merges/5", "\"abc\"", QD_ERR_FORMAT, "model.merges[5]"},
    {"model/merges/5", "[\"h\"]", QD_ERR_FORMAT, "model.merges[5]"},
    {"model/merges/5", "7", QD_ERR_FORMAT, "model.merges[5]"},
    {"model/merges/5", "[\"h\", \"not-a-token\"]", QD_ERR_FORMAT, "model.merges[5]"},
    {"model/vocab/h", "-3", QD_ERR_FORMAT, "model.vocab[\"h\"]"},
    {"model/vocab/h", "16777216", QD_ERR_FORMAT, "model.vocab[\"h\"]"},
    {"model/vocab/h", "\"12\"", QD_ERR_FORMAT, "model.vocab[\"h\"]"},
    {"model/vocab/h", "0", QD_ERR_FORMAT, "model.vocab"},
    {"model/byte_fallback", "true", QD_ERR_UNSUPPORTED, "model.byte_fallback"},
    {"model/dropout", "0.1", QD_ERR_UNSUPPORTED, "model.dropout"},
    {"model/unk_token", "\"<unk>\"", QD_ERR_FORMAT, "model.unk_token"},
    {"pre_tokenizer/pretokenizers/0/pattern/Regex", "\"(?i:'s|'t\"", QD_ERR_FORMAT,
     "pre_tokenizer.pretokenizers[0].pattern.Regex"},
    {"pre_tokenizer/pretokenizers/0/behavior", "\"MergedWithNext\"", QD_ERR_UNSUPPORTED,
     "pre_tokenizer.pretokenizers[0].behavior"},
    {"pre_tokenizer/pretokenizers/1/type", "\"Whitespace\"", QD_ERR_UNSUPPORTED,
     "pre_tokenizer.pretokenizers[1].type"},
    {"pre_tokenizer", NULL, QD_ERR_FORMAT, "pre_tokenizer"},
    {"normalizer", "{\"type\": \"Lowercase\"}", QD_ERR_UNSUPPORTED, "normalizer.type"},
    {"added_tokens/0/id", "-1", QD_ERR_FORMAT, "added_tokens[0].id"},
    {"added_tokens/0/id", "5", QD_ERR_FORMAT, "added_tokens[0].id"},
    {"added_tokens/1/content", "\"\"", QD_ERR_FORMAT, "added_tokens[1]"},
    {"added_tokens/2/lstrip", "true", QD_ERR_UNSUPPORTED, "added_tokens[2]"},
    {"decoder", "{\"type\": \"WordPiece\"}", QD_ERR_UNSUPPORTED, "decoder.type"},
    {"post_processor", "{\"type\": \"TemplateProcessing\"}", QD_ERR_UNSUPPORTED, "post_processor.type"},
    {"truncation", "{\"max_length\": 8}", QD_ERR_UNSUPPORTED, "truncation"},
};

/* Sets (or with value NULL deletes) the member at a '/'-separated path. */
static void mutate(json_t *root, const char *pointer, const char *value)
{
    char path[128];
    snprintf(path, sizeof path, "%s", pointer);
    json_t *parent = root;
    char *key = path, *slash;
    while ((slash = strchr(key, '/'))) {
        *slash = 0;
        parent = json_is_array(parent) ? json_array_get(parent, (size_t)atoi(key)) : json_object_get(parent, key);
        ck_assert_msg(parent != NULL, "%s: no %s", pointer, key);
        key = slash + 1;
    }
    json_t *v = value ? json_loads(value, JSON_DECODE_ANY, NULL) : NULL;
    ck_assert(!value || v);
    if (json_is_array(parent))
        ck_assert_int_eq(v ? json_array_set_new(parent, (size_t)atoi(key), v)
                           : json_array_remove(parent, (size_t)atoi(key)), 0);
    else
        ck_assert_int_eq(v ? json_object_set_new(parent, key, v) : json_object_del(parent, key), 0);
}

START_TEST(test_malformed_tokenizer_refused)
{
    const tok_mutation *m = &tok_bad[_i];
    json_t *root = load_fixture(QWEN2);
    mutate(root, m->pointer, m->value);
    char *text = json_dumps(root, 0);
    qd_tokenizer *tok = (qd_tokenizer *)1;
    qd_status st = qd_tokenizer_load_string(text, strlen(text), "bad.json", &tok);
    ck_assert_msg(st == m->want, "%s: status %s (%s)", m->pointer, qd_status_str(st), qd_last_error());
    ck_assert_ptr_null(tok);
    ck_assert_msg(strstr(qd_last_error(), "bad.json: ") == qd_last_error(), "%s", qd_last_error());
    ck_assert_msg(strstr(qd_last_error(), m->field), "%s: message '%s' does not name %s", m->pointer,
                  qd_last_error(), m->field);
    free(text);
    json_decref(root);
}
END_TEST

/* A Split regex that PCRE2 refuses only once \\S is spelled out (5000 of
 * them pass the length limit) reports PCRE2's error, not "no error". */
START_TEST(test_regex_limit_reported)
{
    enum { N = 5000 };
    char *pat = malloc(2 * N + 1);
    for (int i = 0; i < N; i++)
        memcpy(pat + 2 * i, "\\S", 2);
    pat[2 * N] = 0;
    json_t *root = load_fixture(QWEN2);
    json_t *split = json_object_get(json_array_get(json_object_get(json_object_get(root, "pre_tokenizer"),
                                                                   "pretokenizers"), 0), "pattern");
    ck_assert_int_eq(json_object_set_new(split, "Regex", json_string(pat)), 0);
    char *text = json_dumps(root, 0);
    qd_tokenizer *tok = (qd_tokenizer *)1;
    ck_assert_int_eq(qd_tokenizer_load_string(text, strlen(text), "bad.json", &tok), QD_ERR_FORMAT);
    ck_assert_ptr_null(tok);
    const char *msg = qd_last_error();
    ck_assert_msg(strstr(msg, "pre_tokenizer.pretokenizers[0].pattern.Regex") && !strstr(msg, "no error") &&
                  strstr(msg, "too large"), "%s", msg);
    free(text);
    free(pat);
    json_decref(root);
}
END_TEST

START_TEST(test_unreadable_tokenizer_refused)
{
    qd_tokenizer *tok;
    ck_assert_int_eq(qd_tokenizer_load("/nonexistent/tokenizer.json", &tok), QD_ERR_IO);
    ck_assert_ptr_nonnull(strstr(qd_last_error(), "/nonexistent/tokenizer.json"));
    ck_assert_int_eq(qd_tokenizer_load_string("{\"model\": ", 10, "trunc.json", &tok), QD_ERR_FORMAT);
    ck_assert_ptr_nonnull(strstr(qd_last_error(), "trunc.json"));
    ck_assert_int_eq(qd_tokenizer_load_string("[1, 2]", 6, "arr.json", &tok), QD_ERR_FORMAT);
}
END_TEST

/* Runs `quads tokenize ARGS` on input; its stdout in *out (malloc'd), the exit status returned. */
static int run_cli(const char *args, const char *input, size_t n, char **out)
{
    char in_path[] = "/tmp/qd_tok_inXXXXXX", out_path[] = "/tmp/qd_tok_outXXXXXX", cmd[2048];
    int fi = mkstemp(in_path), fo = mkstemp(out_path);
    ck_assert(fi >= 0 && fo >= 0);
    ck_assert_int_eq(write(fi, input, n), (ssize_t)n);
    close(fi);
    close(fo);
    snprintf(cmd, sizeof cmd, "'%s/quads' tokenize --tokenizer '%s' %s < %s > %s 2>/dev/null",
             getenv("QD_BUILDDIR"), qd_test_path(QWEN2), args, in_path, out_path);
    int rc = system(cmd);
    FILE *f = fopen(out_path, "rb");
    *out = calloc(1, 1 << 16);
    ck_assert(f && *out);
    size_t got = fread(*out, 1, (1 << 16) - 1, f);
    (*out)[got] = 0;
    fclose(f);
    unlink(in_path);
    unlink(out_path);
    return WIFEXITED(rc) ? WEXITSTATUS(rc) : -1;
}

/* The CLI end to end: HF's ids for a case, its decode, --chat, and refusals. */
START_TEST(test_cli)
{
    if (!getenv("QD_BUILDDIR"))
        return; /* only under make check, which builds quads */
    json_t *cases = load_fixture("tests/fixtures/tokenizer/cases.json");
    const json_t *c = json_array_get(cases, 16); /* ChatML text with special tokens */
    const char *text = json_string_value(json_object_get(c, "text"));
    char *want = json_dumps(json_object_get(c, "ids"), JSON_COMPACT), *out;
    ck_assert_int_eq(run_cli("", text, strlen(text), &out), 0);
    ck_assert_msg(strncmp(out, want, strlen(want)) == 0 && out[strlen(want)] == '\n', "%s vs %s", out, want);
    free(out);
    ck_assert_int_eq(run_cli("--decode", want, strlen(want), &out), 0);
    ck_assert_str_eq(out, text);
    free(out);
    ck_assert_int_eq(run_cli("--decode --skip-special", want, strlen(want), &out), 0);
    ck_assert_str_eq(out, "user\nhi there\nassistant\n");
    free(out);
    /* HF tokenizers' ids of the ChatML text of (system "Be brief.", user "hi there") + generation prompt. */
    ck_assert_int_eq(run_cli("--chat --system 'Be brief.'", "hi there", 8, &out), 0);
    ck_assert_str_eq(out, "[1501,82,88,261,68,76,198,33,68,431,285,68,69,13,1502,198,1501,409,198,71,72,"
                          "294,256,68,1502,198,1501,1118,198]\n");
    free(out);
    ck_assert_int_eq(run_cli("", "bad \xff", 5, &out), 1);
    free(out);
    /* with --chat the offset is the input's, not the formatted conversation's */
    char dir[256], cmd[1024], msg[4096];
    qd_test_mkdtemp(dir, sizeof dir, "tok_chat");
    qd_test_write_file(qd_test_join(dir, "in.txt"), "bad \xff");
    snprintf(cmd, sizeof cmd, "tokenize --tokenizer '%s' --chat --system 'Be brief.' < '%s'", qd_test_path(QWEN2),
             qd_test_join(dir, "in.txt"));
    ck_assert_int_eq(qd_test_run_quads(cmd, msg, sizeof msg), 1);
    ck_assert_msg(strstr(msg, "user message is not valid UTF-8 at byte 4"), "%s", msg);
    qd_test_rm_tree(dir);
    ck_assert_int_eq(run_cli("--decode", "[1, \"x\"]", 8, &out), 1);
    free(out);
    ck_assert_int_eq(run_cli("--bogus", "", 0, &out), 2);
    free(out);
    free(want);
    json_decref(cases);
}
END_TEST

/* ---- config.json */

static qd_model_config cfg; /* large (mlp_only_layers): not on the test's stack */

START_TEST(test_config_qwen3_30b_a3b)
{
    ck_assert_msg(qd_model_config_load(qd_test_path("tests/fixtures/config/qwen3_30b_a3b.json"), &cfg) == QD_OK,
                  "%s", qd_last_error());
    ck_assert_int_eq(cfg.arch, QD_ARCH_QWEN3_MOE);
    ck_assert_int_eq(cfg.vocab_size, 151936);
    ck_assert_int_eq(cfg.hidden_size, 2048);
    ck_assert_int_eq(cfg.intermediate_size, 6144);
    ck_assert_int_eq(cfg.moe_intermediate_size, 768);
    ck_assert_int_eq(cfg.num_hidden_layers, 48);
    ck_assert_int_eq(cfg.num_attention_heads, 32);
    ck_assert_int_eq(cfg.num_key_value_heads, 4);
    ck_assert_int_eq(cfg.head_dim, 128);
    ck_assert(cfg.rope_theta == 1e6);
    ck_assert(cfg.rms_norm_eps == 1e-6);
    ck_assert_int_eq(cfg.num_experts, 128);
    ck_assert_int_eq(cfg.num_experts_per_tok, 8);
    ck_assert_int_eq(cfg.norm_topk_prob, 1);
    ck_assert_int_eq(cfg.decoder_sparse_step, 1);
    ck_assert_int_eq(cfg.n_mlp_only_layers, 0);
    ck_assert_int_eq(cfg.tie_word_embeddings, 0);
    ck_assert_int_eq(cfg.max_position_embeddings, 40960);
    ck_assert_str_eq(cfg.torch_dtype, "bfloat16");
    for (int i = 0; i < 48; i++)
        ck_assert(qd_model_config_is_moe_layer(&cfg, i));
}
END_TEST

START_TEST(test_config_dense_qwen3)
{
    ck_assert_msg(qd_model_config_load(qd_test_path("tests/fixtures/config/qwen3_8b.json"), &cfg) == QD_OK, "%s",
                  qd_last_error());
    ck_assert_int_eq(cfg.arch, QD_ARCH_QWEN3);
    ck_assert_int_eq(cfg.hidden_size, 4096);
    ck_assert_int_eq(cfg.intermediate_size, 12288);
    ck_assert_int_eq(cfg.num_hidden_layers, 36);
    ck_assert_int_eq(cfg.num_key_value_heads, 8);
    ck_assert_int_eq(cfg.head_dim, 128);
    ck_assert(cfg.rope_theta == 1e6);
    ck_assert_int_eq(cfg.num_experts, 0);
    for (int i = 0; i < 36; i++)
        ck_assert(!qd_model_config_is_moe_layer(&cfg, i));
}
END_TEST

/* decoder_sparse_step 2 and mlp_only_layers [0, 5]: MoE at 1, 3, 7 (5 forced dense);
 * transformers 5's "dtype" and "rope_parameters"; an unknown field ignored. */
START_TEST(test_config_sparse_layers)
{
    ck_assert_msg(qd_model_config_load(qd_test_path("tests/fixtures/config/tiny_sparse_moe.json"), &cfg) == QD_OK,
                  "%s", qd_last_error());
    int moe = 0;
    for (int i = 0; i < 8; i++)
        moe |= qd_model_config_is_moe_layer(&cfg, i) << i;
    ck_assert_int_eq(moe, (1 << 1) | (1 << 3) | (1 << 7));
    ck_assert(cfg.rope_theta == 10000.0);
    ck_assert_str_eq(cfg.torch_dtype, "float32");
    ck_assert_int_eq(cfg.tie_word_embeddings, 1);
    ck_assert_int_eq(cfg.norm_topk_prob, 0);
    ck_assert_int_eq(cfg.head_dim, 16);
}
END_TEST

/* Absent optional fields take transformers' Qwen3MoeConfig defaults. */
START_TEST(test_config_defaults)
{
    static const char json[] =
        "{\"architectures\": [\"Qwen3MoeForCausalLM\"], \"vocab_size\": 100, \"hidden_size\": 64,"
        " \"intermediate_size\": 96, \"num_hidden_layers\": 2, \"num_attention_heads\": 8,"
        " \"rms_norm_eps\": 1e-6, \"rope_theta\": 10000, \"num_experts\": 4, \"num_experts_per_tok\": 2,"
        " \"moe_intermediate_size\": 16}";
    ck_assert_msg(qd_model_config_load_string(json, sizeof json - 1, "min.json", &cfg) == QD_OK, "%s",
                  qd_last_error());
    ck_assert_int_eq(cfg.num_key_value_heads, 8);
    ck_assert_int_eq(cfg.head_dim, 8);
    ck_assert_int_eq(cfg.decoder_sparse_step, 1);
    ck_assert_int_eq(cfg.norm_topk_prob, 0);
    ck_assert_int_eq(cfg.tie_word_embeddings, 0);
    ck_assert_int_eq(cfg.max_position_embeddings, 32768);
    ck_assert_str_eq(cfg.torch_dtype, "");
}
END_TEST

typedef struct {
    const char *file;    /* a fixture under tests/fixtures/config/, or NULL: change the 30B-A3B one */
    const char *key;
    const char *value;   /* JSON, NULL to delete */
    qd_status want;
    const char *field;
} cfg_case;

static const cfg_case cfg_bad[] = {
    {"bad_wrong_type.json", NULL, NULL, QD_ERR_FORMAT, "hidden_size"},
    {"bad_missing_field.json", NULL, NULL, QD_ERR_FORMAT, "num_attention_heads"},
    {"bad_unknown_arch.json", NULL, NULL, QD_ERR_UNSUPPORTED, "LlamaForCausalLM"},
    {"bad_rope_scaling.json", NULL, NULL, QD_ERR_UNSUPPORTED, "rope_scaling"},
    {NULL, "attention_bias", "true", QD_ERR_UNSUPPORTED, "attention_bias"},
    {NULL, "use_sliding_window", "true", QD_ERR_UNSUPPORTED, "use_sliding_window"},
    {NULL, "hidden_act", "\"gelu\"", QD_ERR_UNSUPPORTED, "hidden_act"},
    {NULL, "attention_dropout", "0.1", QD_ERR_UNSUPPORTED, "attention_dropout"},
    {NULL, "quantization_config", "{\"quant_method\": \"fp8\"}", QD_ERR_UNSUPPORTED, "quantization_config"},
    {NULL, "torch_dtype", "\"float8_e4m3fn\"", QD_ERR_UNSUPPORTED, "torch_dtype"},
    {NULL, "layer_types", "[\"sliding_attention\"]", QD_ERR_UNSUPPORTED, "layer_types"},
    {NULL, "model_type", "\"qwen2_moe\"", QD_ERR_FORMAT, "model_type"},
    {NULL, "num_key_value_heads", "5", QD_ERR_FORMAT, "num_key_value_heads"},
    {NULL, "num_experts_per_tok", "129", QD_ERR_FORMAT, "num_experts_per_tok"},
    {NULL, "num_experts", NULL, QD_ERR_FORMAT, "num_experts"},
    {NULL, "mlp_only_layers", "[3, 48]", QD_ERR_FORMAT, "mlp_only_layers[1]"},
    {NULL, "decoder_sparse_step", "0", QD_ERR_FORMAT, "decoder_sparse_step"},
    {NULL, "rms_norm_eps", "-1e-6", QD_ERR_FORMAT, "rms_norm_eps"},
    {NULL, "rope_theta", "\"1e6\"", QD_ERR_FORMAT, "rope_theta"},
    {NULL, "head_dim", "127", QD_ERR_FORMAT, "head_dim"},
    {NULL, "norm_topk_prob", "1", QD_ERR_FORMAT, "norm_topk_prob"},
    {NULL, "architectures", "\"Qwen3MoeForCausalLM\"", QD_ERR_FORMAT, "architectures"},
    /* hidden_size / num_attention_heads (the MoE head_dim default) was computed
     * after a size had failed: SIGFPE at -O0 and under UBSan */
    {NULL, "num_attention_heads", NULL, QD_ERR_FORMAT, "num_attention_heads"},
    {NULL, "num_attention_heads", "null", QD_ERR_FORMAT, "num_attention_heads"},
    {NULL, "num_attention_heads", "0", QD_ERR_FORMAT, "num_attention_heads"},
    {NULL, "num_attention_heads", "32.0", QD_ERR_FORMAT, "num_attention_heads"},
    {NULL, "num_attention_heads", "\"32\"", QD_ERR_FORMAT, "num_attention_heads"},
    {NULL, "num_attention_heads", "1099511627776", QD_ERR_FORMAT, "num_attention_heads"},
    {NULL, "vocab_size", NULL, QD_ERR_FORMAT, "vocab_size"},
    {NULL, "hidden_size", "0", QD_ERR_FORMAT, "hidden_size"},
    {NULL, "intermediate_size", "null", QD_ERR_FORMAT, "intermediate_size"},
    {NULL, "num_hidden_layers", "\"48\"", QD_ERR_FORMAT, "num_hidden_layers"},
    /* sizes in range one by one whose products overflowed the parameter table
     * (backends/layout.c wrote past it, or announced 1.8e19 parameters) */
    {NULL, "num_experts", "715827883", QD_ERR_UNSUPPORTED, "num_experts"},
    {NULL, "head_dim", "1073741824", QD_ERR_UNSUPPORTED, "head_dim"},
    {NULL, "moe_intermediate_size", "1073741824", QD_ERR_UNSUPPORTED, "moe_intermediate_size"},
    {NULL, "vocab_size", "1073741824", QD_ERR_UNSUPPORTED, "vocab_size"},
};

START_TEST(test_malformed_config_refused)
{
    const cfg_case *c = &cfg_bad[_i];
    char rel[128];
    qd_status st;
    if (c->file) {
        snprintf(rel, sizeof rel, "tests/fixtures/config/%s", c->file);
        st = qd_model_config_load(qd_test_path(rel), &cfg);
        ck_assert_ptr_nonnull(strstr(qd_last_error(), c->file));
    } else {
        json_t *root = load_fixture("tests/fixtures/config/qwen3_30b_a3b.json");
        mutate(root, c->key, c->value);
        char *text = json_dumps(root, 0);
        st = qd_model_config_load_string(text, strlen(text), "config.json", &cfg);
        ck_assert_msg(strstr(qd_last_error(), "config.json: ") == qd_last_error(), "%s", qd_last_error());
        free(text);
        json_decref(root);
    }
    ck_assert_msg(st == c->want, "%s: status %s (%s)", c->file ? c->file : c->key, qd_status_str(st),
                  qd_last_error());
    ck_assert_msg(strstr(qd_last_error(), c->field), "message '%s' does not name %s", qd_last_error(), c->field);
}
END_TEST

/* 2^29 experts x 1024 layers and 65536 heads x 32768 wrap int counts of the
 * parameter table; refused naming the field, before any allocation. */
START_TEST(test_config_too_large_refused)
{
    static const struct { const char *json, *field; } cases[] = {
        {"\"num_local_experts\": 536870912, \"num_hidden_layers\": 1024, \"num_attention_heads\": 4",
         "num_local_experts"},
        {"\"num_local_experts\": 8, \"num_hidden_layers\": 2, \"num_attention_heads\": 65536, \"head_dim\": 32768",
         "head_dim"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char json[1024];
        snprintf(json, sizeof json, "{\"architectures\": [\"Qwen3MoeForCausalLM\"], \"vocab_size\": 100, "
                 "\"hidden_size\": 64, \"intermediate_size\": 96, \"rms_norm_eps\": 1e-6, \"rope_theta\": 1e4, "
                 "\"num_experts_per_tok\": 2, \"moe_intermediate_size\": 16, %s}", cases[i].json);
        ck_assert_int_eq(qd_model_config_load_string(json, strlen(json), "config.json", &cfg), QD_ERR_UNSUPPORTED);
        ck_assert_msg(strstr(qd_last_error(), "config.json: ") == qd_last_error() &&
                      strstr(qd_last_error(), cases[i].field), "case %zu: %s", i, qd_last_error());
    }
    /* the same sizes built by hand: qd_model_config_check and the layout refuse them */
    qd_model_config c = qd_test_moe_config(100, 8, 64);
    c.num_experts = 536870912;
    c.num_hidden_layers = 1024;
    ck_assert_int_eq(qd_model_config_check(&c), QD_ERR_ARG);
    ck_assert_msg(strstr(qd_last_error(), "num_experts"), "%s", qd_last_error());
    c = qd_test_moe_config(100, 8, 64);
    c.num_attention_heads = 65536;
    c.num_key_value_heads = 65536;
    c.head_dim = 32768;
    ck_assert_int_eq(qd_model_config_check(&c), QD_ERR_ARG);
    ck_assert_msg(strstr(qd_last_error(), "head_dim"), "%s", qd_last_error());
}
END_TEST

/* A MoE without head_dim takes hidden_size / num_attention_heads, which can
 * be 0: refused naming head_dim (it gave zero-width attention). */
START_TEST(test_config_head_dim_default_refused)
{
    static const char json[] =
        "{\"architectures\": [\"Qwen3MoeForCausalLM\"], \"vocab_size\": 100, \"hidden_size\": 4,"
        " \"intermediate_size\": 96, \"num_hidden_layers\": 2, \"num_attention_heads\": 8,"
        " \"rms_norm_eps\": 1e-6, \"rope_theta\": 10000, \"num_experts\": 4, \"num_experts_per_tok\": 2,"
        " \"moe_intermediate_size\": 16}";
    ck_assert_int_eq(qd_model_config_load_string(json, sizeof json - 1, "config.json", &cfg), QD_ERR_FORMAT);
    ck_assert_msg(strstr(qd_last_error(), "config.json: head_dim"), "%s", qd_last_error());
}
END_TEST

/* Duplicate keys are refused (as every other JSON input): which one wins
 * would be a guess. */
START_TEST(test_config_duplicate_keys_refused)
{
    static const char json[] =
        "{\"architectures\": [\"Qwen3ForCausalLM\"], \"vocab_size\": 100, \"hidden_size\": 64,"
        " \"intermediate_size\": 96, \"num_hidden_layers\": 2, \"num_attention_heads\": 8,"
        " \"rms_norm_eps\": 1e-6, \"rope_theta\": 10000, \"hidden_size\": 128}";
    ck_assert_int_eq(qd_model_config_load_string(json, sizeof json - 1, "config.json", &cfg), QD_ERR_FORMAT);
    ck_assert_msg(strstr(qd_last_error(), "config.json") && strstr(qd_last_error(), "duplicate") &&
                  strstr(qd_last_error(), "hidden_size"), "%s", qd_last_error());
    char dir[256], path[300];
    qd_test_mkdtemp(dir, sizeof dir, "cfg_dup");
    snprintf(path, sizeof path, "%s/config.json", dir);
    qd_test_write_file(path, json);
    ck_assert_int_eq(qd_model_config_load(path, &cfg), QD_ERR_FORMAT);
    ck_assert_msg(strstr(qd_last_error(), path) && strstr(qd_last_error(), "duplicate"), "%s", qd_last_error());
    qd_test_rm_tree(dir);
}
END_TEST

/* A FIFO as config.json or tokenizer.json is refused at once (open(2) of a
 * FIFO without a writer used to block forever). */
START_TEST(test_fifo_refused)
{
    char dir[256], path[300];
    qd_test_mkdtemp(dir, sizeof dir, "fifo");
    snprintf(path, sizeof path, "%s/config.json", dir);
    ck_assert_int_eq(mkfifo(path, 0600), 0);
    ck_assert_int_eq(qd_model_config_load(path, &cfg), QD_ERR_IO);
    ck_assert_msg(strstr(qd_last_error(), path) && strstr(qd_last_error(), "not a regular file"), "%s",
                  qd_last_error());
    qd_tokenizer *tok = (qd_tokenizer *)1;
    ck_assert_int_eq(qd_tokenizer_load(path, &tok), QD_ERR_IO);
    ck_assert_ptr_null(tok);
    ck_assert_msg(strstr(qd_last_error(), "not a regular file"), "%s", qd_last_error());
    ck_assert_int_eq(qd_model_config_load(dir, &cfg), QD_ERR_IO); /* a directory neither */
    qd_test_rm_tree(dir);
}
END_TEST

/* The transformers-made fixtures use both spellings: transformers 5's
 * num_local_experts/rope_parameters/dtype and the hub's num_experts/rope_theta. */
START_TEST(test_config_hf_fixtures)
{
    static const struct { const char *dir; int experts, layers, tied, norm_topk; } want[] = {
        {"qwen3moe_gqa_untied", 8, 2, 0, 1},     {"qwen3moe_mha_tied_nonorm", 8, 2, 1, 0},
        {"qwen3moe_mqa_sparse2", 8, 3, 0, 1},    {"qwen3moe_mlponly0", 8, 3, 0, 1},
        {"qwen3_dense", 0, 2, 0, 0},
    };
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++) {
        char rel[256];
        snprintf(rel, sizeof rel, "tests/fixtures/hf_models/%s/config.json", want[i].dir);
        qd_model_config cfg;
        ck_assert_msg(qd_model_config_load(qd_test_path(rel), &cfg) == QD_OK, "%s", qd_last_error());
        ck_assert_int_eq(cfg.num_experts, want[i].experts);
        ck_assert_int_eq(cfg.num_hidden_layers, want[i].layers);
        ck_assert_int_eq(cfg.tie_word_embeddings, want[i].tied);
        ck_assert_int_eq(cfg.norm_topk_prob, want[i].norm_topk);
        ck_assert_int_eq(cfg.head_dim, 16);
        ck_assert(cfg.rope_theta == 10000.0);
        ck_assert(cfg.rms_norm_eps == 1e-6);
    }
}
END_TEST

Suite *suite_tokenizer(void)
{
    Suite *s = suite_create("tokenizer");
    TCase *hf = tcase_create("hf_reference");
    tcase_add_test(hf, test_ids_equal_hf);
    tcase_add_test(hf, test_gpt2_layout_equal_hf);
    tcase_add_test(hf, test_decodes_equal_hf);
    tcase_add_test(hf, test_legacy_merges);
    tcase_add_test(hf, test_chatml_equal_hf);
    tcase_add_test(hf, test_special_lookup);
    tcase_add_loop_test(hf, test_regex_classes_equal_hf, 0, 5);
    tcase_set_timeout(hf, 60);
    suite_add_tcase(s, hf);
    TCase *bad = tcase_create("malformed");
    tcase_add_test(bad, test_bad_input_refused);
    tcase_add_loop_test(bad, test_malformed_tokenizer_refused, 0, (int)(sizeof tok_bad / sizeof tok_bad[0]));
    tcase_add_test(bad, test_regex_limit_reported);
    tcase_add_test(bad, test_unreadable_tokenizer_refused);
    tcase_add_test(bad, test_cli);
    suite_add_tcase(s, bad);
    TCase *config = tcase_create("config");
    tcase_add_test(config, test_config_qwen3_30b_a3b);
    tcase_add_test(config, test_config_dense_qwen3);
    tcase_add_test(config, test_config_sparse_layers);
    tcase_add_test(config, test_config_defaults);
    tcase_add_test(config, test_config_hf_fixtures);
    tcase_add_loop_test(config, test_malformed_config_refused, 0, (int)(sizeof cfg_bad / sizeof cfg_bad[0]));
    tcase_add_test(config, test_config_too_large_refused);
    tcase_add_test(config, test_config_head_dim_default_refused);
    tcase_add_test(config, test_config_duplicate_keys_refused);
    tcase_add_test(config, test_fifo_refused);
    suite_add_tcase(s, config);
    return s;
}
