/* quads tokenize: text on stdin -> JSON array of token ids on stdout, or with
 * --decode a JSON array of ids on stdin -> text on stdout. */
#include <getopt.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "models/tokenizer.h"
#include "orchestrator/commands.h"

typedef struct {
    const char *tokenizer;
    int decode, skip_special, chat;
    const char *system;
    char *message, *generation; /* template overrides, escapes resolved (owned) */
} tokenize_opts;

static void usage(FILE *f)
{
    fprintf(f,
            "usage: quads tokenize --tokenizer FILE.json [--decode [--skip-special]] [--chat ...]\n\n"
            "Encodes UTF-8 text read from stdin and prints its ids as a JSON array; with --decode,\n"
            "reads a JSON array of ids and prints the text.\n\n"
            "  --tokenizer FILE      a Hugging Face tokenizer.json (byte-level BPE)\n"
            "  --decode              ids -> text\n"
            "  --skip-special        with --decode, leave special tokens out\n"
            "  --chat                stdin is one user message: encode the chat-formatted\n"
            "                        conversation with the generation prompt (ChatML by default)\n"
            "  --system TEXT         with --chat, a system message first\n"
            "  --template STR        with --chat, the message template ({role}, {content};\n"
            "                        \\n, \\t and \\\\ are unescaped)\n"
            "  --generation STR      with --chat, the generation prompt (same escapes)\n");
}

/* A copy of s with \n, \t and \\ replaced by the characters they name. */
static char *unescape(const char *s)
{
    char *out = malloc(strlen(s) + 1), *o = out;
    if (!out)
        return NULL;
    for (; *s; s++) {
        if (s[0] == '\\' && (s[1] == 'n' || s[1] == 't' || s[1] == '\\')) {
            *o++ = s[1] == 'n' ? '\n' : s[1] == 't' ? '\t' : '\\';
            s++;
        } else
            *o++ = *s;
    }
    *o = 0;
    return out;
}

static int parse_args(int argc, char **argv, tokenize_opts *o)
{
    static const struct option longs[] = {
        {"tokenizer", required_argument, 0, 'k'}, {"decode", no_argument, 0, 'd'},
        {"skip-special", no_argument, 0, 's'},     {"chat", no_argument, 0, 'c'},
        {"system", required_argument, 0, 'y'},     {"template", required_argument, 0, 'm'},
        {"generation", required_argument, 0, 'g'}, {"help", no_argument, 0, 'h'},
        {0, 0, 0, 0},
    };
    int c;
    optind = 1;
    while ((c = getopt_long(argc, argv, "h", longs, NULL)) != -1) {
        switch (c) {
        case 'k': o->tokenizer = optarg; break;
        case 'd': o->decode = 1; break;
        case 's': o->skip_special = 1; break;
        case 'c': o->chat = 1; break;
        case 'y': o->system = optarg; break;
        case 'm': free(o->message); o->message = unescape(optarg); break;
        case 'g': free(o->generation); o->generation = unescape(optarg); break;
        case 'h': usage(stdout); return 0;
        default: usage(stderr); return 2;
        }
    }
    if (!o->tokenizer || optind != argc || (o->decode && o->chat)) {
        usage(stderr);
        return 2;
    }
    return -1;
}

/* All of stdin; *n bytes (NUL bytes kept), NUL-terminated. */
static char *read_stdin(size_t *n)
{
    size_t cap = 1 << 16;
    char *buf = malloc(cap);
    *n = 0;
    while (buf) {
        *n += fread(buf + *n, 1, cap - *n - 1, stdin);
        if (*n < cap - 1)
            break;
        char *b = realloc(buf, cap *= 2);
        if (!b)
            free(buf);
        buf = b;
    }
    if (buf)
        buf[*n] = 0;
    return buf;
}

static int fail(const char *what)
{
    fprintf(stderr, "quads tokenize: %s\n", what);
    return 1;
}

static int print_ids(const int32_t *ids, size_t n)
{
    putchar('[');
    for (size_t i = 0; i < n; i++)
        printf(i ? ",%d" : "%d", ids[i]);
    printf("]\n");
    return fflush(stdout) ? fail("cannot write stdout") : 0;
}

/* The text to encode: stdin as is, or as the user message of a chat. */
static qd_status input_text(const tokenize_opts *o, char *in, size_t n, char **text, size_t *len)
{
    if (!o->chat) {
        *text = in;
        *len = n;
        return QD_OK;
    }
    if (strlen(in) != n)
        return qd_error(QD_ERR_ARG, "stdin: a NUL byte in a chat message");
    qd_chat_template t = qd_chat_chatml;
    qd_chat_message msgs[2] = {{"system", o->system}, {"user", in}};
    if (o->message)
        t.message = o->message;
    if (o->generation)
        t.generation = o->generation;
    qd_status st = qd_tokenizer_chat_format(&t, o->system ? msgs : msgs + 1, o->system ? 2 : 1, 1, text);
    *len = st ? 0 : strlen(*text);
    return st;
}

static int encode(const qd_tokenizer *tok, const tokenize_opts *o)
{
    size_t n, len = 0, n_ids = 0;
    char *in = read_stdin(&n), *text = NULL;
    int32_t *ids = NULL;
    if (!in)
        return fail("out of memory reading stdin");
    qd_status st = input_text(o, in, n, &text, &len);
    if (!st)
        st = qd_tokenizer_encode(tok, text, len, &ids, &n_ids);
    int rc = st ? fail(qd_last_error()) : print_ids(ids, n_ids);
    if (text != in)
        free(text);
    free(in);
    free(ids);
    return rc;
}

/* stdin as a JSON array of integer ids. */
static qd_status read_ids(int32_t **ids, size_t *n)
{
    json_error_t err;
    json_t *arr = json_loadf(stdin, JSON_DECODE_ANY, &err);
    *ids = NULL;
    if (!arr || !json_is_array(arr)) {
        json_decref(arr);
        return qd_error(QD_ERR_FORMAT, "stdin: expected a JSON array of ids (%s)", arr ? "not an array" : err.text);
    }
    *n = json_array_size(arr);
    *ids = malloc((*n + 1) * sizeof **ids);
    for (size_t i = 0; *ids && i < *n; i++) {
        const json_t *v = json_array_get(arr, i);
        if (!json_is_integer(v) || json_integer_value(v) < INT32_MIN || json_integer_value(v) > INT32_MAX) {
            json_decref(arr);
            free(*ids);
            *ids = NULL;
            return qd_error(QD_ERR_FORMAT, "stdin: element %zu is not an integer id", i);
        }
        (*ids)[i] = (int32_t)json_integer_value(v);
    }
    json_decref(arr);
    return *ids ? QD_OK : qd_error(QD_ERR_NOMEM, "out of memory");
}

static int decode(const qd_tokenizer *tok, const tokenize_opts *o)
{
    int32_t *ids;
    size_t n = 0, len = 0;
    char *text = NULL;
    qd_status st = read_ids(&ids, &n);
    if (!st)
        st = qd_tokenizer_decode(tok, ids, n, o->skip_special, &text, &len);
    free(ids);
    if (st)
        return fail(qd_last_error());
    int bad = fwrite(text, 1, len, stdout) != len || fflush(stdout);
    free(text);
    return bad ? fail("cannot write stdout") : 0;
}

int qd_cmd_tokenize(int argc, char **argv)
{
    tokenize_opts o = {0};
    qd_tokenizer *tok = NULL;
    int rc = parse_args(argc, argv, &o);
    if (rc < 0) {
        qd_status st = qd_tokenizer_load(o.tokenizer, &tok);
        rc = st ? fail(qd_last_error()) : o.decode ? decode(tok, &o) : encode(tok, &o);
    }
    qd_tokenizer_free(tok);
    free(o.message);
    free(o.generation);
    return rc;
}
