/* Shared by the libFuzzer targets of tests/fuzz/ (tests/fuzz/README.md): the
 * entry point each defines, and the input as a NUL-terminated copy. */
#ifndef QD_FUZZ_H
#define QD_FUZZ_H
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* data as a malloc'd string (NUL appended; inner NULs kept); aborts when out of
 * memory, which libFuzzer then reports. */
static inline char *qd_fuzz_cstr(const uint8_t *data, size_t size)
{
    char *s = malloc(size + 1);
    if (!s)
        abort();
    if (size)
        memcpy(s, data, size);
    s[size] = '\0';
    return s;
}

#endif
