/* The tokenizer of a Hugging Face `tokenizer.json` for a byte-level BPE
 * (Qwen2/Qwen3 style): added/special tokens matched first (longest at the
 * leftmost position), a Unicode normalizer (NFC, NFD, NFKC, NFKD via
 * utf8proc), the pre-tokenizer's Split regexes (PCRE2, UTF + UCP) followed by
 * ByteLevel, BPE merges by rank, and the ByteLevel decoder. Also the chat
 * formatting of a conversation through a template string (ChatML for Qwen).
 *
 * Anything in the file that would change the ids and is not implemented here
 * (another model type, byte_fallback, dropout, truncation, a template
 * post-processor, lstrip/rstrip/single_word added tokens, ...) is refused at
 * load with a message naming the file and the field. */
#ifndef QD_TOKENIZER_H
#define QD_TOKENIZER_H

#include <stddef.h>
#include <stdint.h>
#include "quant/status.h"

/* Ids are below this bound (2^24); a larger one in the file is refused. */
#define QD_TOKENIZER_MAX_ID (1 << 24)

typedef struct qd_tokenizer qd_tokenizer;

/* Loads a tokenizer.json. On success *out owns the tokenizer (free with
 * qd_tokenizer_free); on failure *out is NULL and the message names path and field. */
qd_status qd_tokenizer_load(const char *path, qd_tokenizer **out);
/* The same from len bytes of JSON text; name stands for the file in messages. */
qd_status qd_tokenizer_load_string(const char *json, size_t len, const char *name,
                                   qd_tokenizer **out);
void qd_tokenizer_free(qd_tokenizer *tok);

/* Encodes len bytes of UTF-8 text (NUL bytes allowed) into *ids (malloc'd,
 * owned by the caller, NULL when *n_ids is 0). Invalid UTF-8 is refused. */
qd_status qd_tokenizer_encode(const qd_tokenizer *tok, const char *text, size_t len,
                              int32_t **ids, size_t *n_ids);
/* Decodes ids to UTF-8 in *text (malloc'd, NUL-terminated, owned by the
 * caller; *len excludes the NUL). Byte sequences that are not valid UTF-8
 * (e.g. half of a character) become U+FFFD, as HF does. With skip_special,
 * added tokens marked special are left out. An id that names no token is refused. */
qd_status qd_tokenizer_decode(const qd_tokenizer *tok, const int32_t *ids, size_t n_ids,
                              int skip_special, char **text, size_t *len);

/* One more than the largest id (model vocabulary and added tokens). */
int32_t qd_tokenizer_n_ids(const qd_tokenizer *tok);
/* The id of a token's exact string (an added token or a vocabulary entry in
 * its byte-level form), or -1. */
int32_t qd_tokenizer_token_id(const qd_tokenizer *tok, const char *token);
/* Whether id is an added token marked special (e.g. <|im_end|>). */
int qd_tokenizer_is_special(const qd_tokenizer *tok, int32_t id);

/* ---- chat formatting */

typedef struct {
    const char *role;    /* "system", "user", "assistant", ... */
    const char *content;
} qd_chat_message;

/* message: the text of one message, "{role}" and "{content}" replaced;
 * generation: appended to prompt the model's reply. */
typedef struct {
    const char *message;
    const char *generation;
} qd_chat_template;

#define QD_CHATML_MESSAGE "<|im_start|>{role}\n{content}<|im_end|>\n"
#define QD_CHATML_GENERATION "<|im_start|>assistant\n"
/* Qwen's ChatML: QD_CHATML_MESSAGE and QD_CHATML_GENERATION. */
extern const qd_chat_template qd_chat_chatml;

/* Formats n messages (and the generation prompt when add_generation) into
 * *out (malloc'd, NUL-terminated, owned by the caller). Special tokens in the
 * result are matched as such by qd_tokenizer_encode. A template without
 * "{content}" is refused, and so is a message that is not valid UTF-8 (the
 * message's role and the byte offset in its content named). */
qd_status qd_tokenizer_chat_format(const qd_chat_template *tmpl, const qd_chat_message *msgs,
                                   size_t n, int add_generation, char **out);

#endif
