/* SHA-256 (FIPS 180-4), used to verify downloaded benchmark files. */
#ifndef QD_SHA256_H
#define QD_SHA256_H
#include <stddef.h>
#include <stdint.h>
#include "quant/status.h"

typedef struct {
    uint32_t h[8];
    uint8_t block[64];
    size_t fill;    /* bytes waiting in block */
    uint64_t total; /* message length in bytes */
} qd_sha256_ctx;

void qd_sha256_init(qd_sha256_ctx *c);
void qd_sha256_update(qd_sha256_ctx *c, const void *data, size_t n);
/* Writes the 32-byte digest. */
void qd_sha256_final(qd_sha256_ctx *c, uint8_t out[32]);
/* A digest as 64 lowercase hex digits plus NUL. */
void qd_sha256_to_hex(const uint8_t d[32], char hex[65]);
/* Digest of a buffer as 64 lowercase hex digits plus NUL. */
void qd_sha256_hex(const void *data, size_t n, char hex[65]);
/* Digest of a whole file as hex; QD_ERR_IO if it cannot be read. */
qd_status qd_sha256_file(const char *path, char hex[65]);

#endif
