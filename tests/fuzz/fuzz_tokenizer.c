/* libFuzzer: a tokenizer.json through the loader; an accepted tokenizer
 * encodes and decodes a few fixed texts (special tokens, bytes, spaces). */
#include "models/tokenizer.h"
#include "tests/fuzz/fuzz.h"

static const char *const texts[] = {
    "Hello world! 123 + 456 = 579", "  \n\t x", "<|im_start|>user\nhi<|im_end|>\n", "caf\xc3\xa9 \xe4\xb8\xad",
};

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    qd_tokenizer *tok = NULL;
    if (qd_tokenizer_load_string((const char *)data, size, "tokenizer.json", &tok) != QD_OK)
        return 0;
    for (size_t i = 0; i < sizeof texts / sizeof texts[0]; i++) {
        int32_t *ids = NULL;
        size_t n = 0, len = 0;
        char *back = NULL;
        if (qd_tokenizer_encode(tok, texts[i], strlen(texts[i]), &ids, &n) == QD_OK &&
            qd_tokenizer_decode(tok, ids, n, i & 1, &back, &len) == QD_OK)
            free(back);
        free(ids);
    }
    qd_tokenizer_free(tok);
    return 0;
}
