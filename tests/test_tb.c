/* Check suite of orchestrator/tb.c, the TensorBoard event writer: CRC-32C
 * against RFC 3720's vectors, the TFRecord framing and the protobuf bytes of
 * a scalar event, and the tags of a metrics line. (tests/test_rl.c reads whole
 * runs back with the tensorboard package.) */
#define _GNU_SOURCE
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "tests/suites.h"
#include "orchestrator/tb.h"

/* RFC 3720 appendix B.4 (iSCSI CRC32C examples), and the usual check value
 * of "123456789"; the masked CRC is tensorboard's masked_crc32c of the same
 * bytes (its pure-Python crc32c). */
START_TEST(test_tb_crc32c_vectors)
{
    uint8_t b[32];
    memset(b, 0, 32);
    ck_assert_uint_eq(qd_tb_crc32c(b, 32), 0x8A9136AAu);
    memset(b, 0xFF, 32);
    ck_assert_uint_eq(qd_tb_crc32c(b, 32), 0x62A8AB43u);
    for (int i = 0; i < 32; i++)
        b[i] = (uint8_t)i;
    ck_assert_uint_eq(qd_tb_crc32c(b, 32), 0x46DD794Eu);
    for (int i = 0; i < 32; i++)
        b[i] = (uint8_t)(31 - i);
    ck_assert_uint_eq(qd_tb_crc32c(b, 32), 0x113FDB5Cu);
    ck_assert_uint_eq(qd_tb_crc32c("123456789", 9), 0xE3069283u);
    ck_assert_uint_eq(qd_tb_mask_crc(qd_tb_crc32c("123456789", 9)), 0xC78AB0E5u);
    ck_assert_uint_eq(qd_tb_crc32c("", 0), 0);
}
END_TEST

static uint64_t le(const uint8_t *p, int n)
{
    uint64_t v = 0;
    for (int i = n - 1; i >= 0; i--)
        v = v << 8 | p[i];
    return v;
}

/* The records of an event file: checks each one's framing and CRCs and
 * returns the data of record k (its length in *len). */
static const uint8_t *record(const uint8_t *f, size_t n, int k, size_t *len)
{
    size_t pos = 0;
    for (int i = 0; pos < n; i++) {
        ck_assert_uint_ge(n - pos, 16);
        uint64_t l = le(f + pos, 8);
        ck_assert_uint_eq(le(f + pos + 8, 4), qd_tb_mask_crc(qd_tb_crc32c(f + pos, 8)));
        ck_assert_uint_le(l, n - pos - 16);
        ck_assert_uint_eq(le(f + pos + 12 + l, 4), qd_tb_mask_crc(qd_tb_crc32c(f + pos + 12, l)));
        if (i == k) {
            *len = l;
            return f + pos + 12;
        }
        pos += 16 + l;
    }
    return NULL;
}

static uint8_t *read_all(const char *path, size_t *n)
{
    FILE *f = fopen(path, "rb");
    ck_assert_ptr_nonnull(f);
    uint8_t *buf = malloc(1 << 16);
    *n = fread(buf, 1, 1 << 16, f);
    fclose(f);
    return buf;
}

/* An event file: file_version first, then SessionLog START, then the scalar
 * with exactly the protobuf bytes of event.proto/summary.proto. */
START_TEST(test_tb_scalar_event_bytes)
{
    char dir[256];
    qd_test_mkdtemp(dir, sizeof dir, "tb");
    char sub[300];
    snprintf(sub, sizeof sub, "%s/tb", dir);
    qd_tb *tb;
    ck_assert_int_eq(qd_tb_open(&tb, sub, 7), QD_OK);
    ck_assert_int_eq(qd_tb_scalar(tb, "a/b", 300, 1.5f), QD_OK);
    ck_assert_int_eq(qd_tb_flush(tb), QD_OK);
    ck_assert_ptr_nonnull(strstr(qd_tb_path(tb), "/tb/events.out.tfevents."));
    size_t n, len;
    uint8_t *f = read_all(qd_tb_path(tb), &n);
    /* Event{wall_time (1, fixed64), step 7 (2, varint), file_version (3)} */
    const uint8_t *r = record(f, n, 0, &len);
    ck_assert_ptr_nonnull(r);
    static const uint8_t version[] = {0x10, 7, 0x1a, 13, 'b', 'r', 'a', 'i', 'n', '.', 'E', 'v', 'e', 'n', 't', ':', '2'};
    ck_assert_uint_eq(len, 9 + sizeof version);
    ck_assert_int_eq(r[0], 0x09);
    ck_assert_int_eq(memcmp(r + 9, version, sizeof version), 0);
    /* Event{..., session_log (7) SessionLog{status START = 1}} */
    r = record(f, n, 1, &len);
    static const uint8_t start[] = {0x10, 7, 0x3a, 2, 0x08, 1};
    ck_assert_uint_eq(len, 9 + sizeof start);
    ck_assert_int_eq(memcmp(r + 9, start, sizeof start), 0);
    /* Event{..., step 300, summary (5) Summary{value (1) Value{tag (1) "a/b",
     * simple_value (2, fixed32) 1.5f = 0x3fc00000}}} */
    r = record(f, n, 2, &len);
    static const uint8_t scalar[] = {0x10, 0xac, 0x02, 0x2a, 12, 0x0a, 10, 0x0a, 3, 'a', '/', 'b', 0x15, 0, 0, 0xc0, 0x3f};
    ck_assert_uint_eq(len, 9 + sizeof scalar);
    ck_assert_int_eq(memcmp(r + 9, scalar, sizeof scalar), 0);
    ck_assert_ptr_null(record(f, n, 3, &len));
    free(f);
    qd_tb_close(tb);
    qd_test_rm_tree(dir);
}
END_TEST

static bool has(const uint8_t *f, size_t n, const char *s) { return memmem(f, n, s, strlen(s)) != NULL; }

/* A metrics line: nested members as a/b, arrays named by layers.json (or by
 * index without it), "step", strings and nulls left out. */
START_TEST(test_tb_json_tags)
{
    char dir[256];
    qd_test_mkdtemp(dir, sizeof dir, "tb");
    qd_tb *tb;
    ck_assert_int_eq(qd_tb_open(&tb, dir, 1), QD_OK);
    json_t *o = json_loads("{\"step\": 4, \"reward_mean\": 0.25, \"gap\": {\"k3_kl\": 1e-5, \"pearson\": null},"
                           " \"quant\": {\"act_err\": [0.5, 0.125]}, \"router\": {\"agree\": [1, 0.75]},"
                           " \"extra\": [3], \"weights_checksum\": \"00ff\"}", 0, NULL);
    json_t *names = json_loads("{\"quant\": [\"model.layers.0.self_attn.q_proj.weight\", \"lm.up\"],"
                               " \"router\": [0, 1], \"extra\": [1, 2]}", 0, NULL);
    ck_assert_ptr_nonnull(o);
    ck_assert_ptr_nonnull(names);
    ck_assert_int_eq(qd_tb_json(tb, 4, o, names), QD_OK);
    ck_assert_int_eq(qd_tb_flush(tb), QD_OK);
    size_t n;
    uint8_t *f = read_all(qd_tb_path(tb), &n);
    ck_assert(has(f, n, "reward_mean") && has(f, n, "gap/k3_kl") && has(f, n, "quant/act_err/layers.0.self_attn.q_proj"));
    ck_assert(has(f, n, "quant/act_err/lm.up") && has(f, n, "router/agree/layer0") && has(f, n, "router/agree/layer1"));
    ck_assert(has(f, n, "extra/0")); /* names of another length: the index */
    ck_assert(!has(f, n, "pearson") && !has(f, n, "step") && !has(f, n, "checksum") && !has(f, n, ".weight"));
    free(f);
    json_decref(o);
    json_decref(names);
    qd_tb_close(tb);
    qd_test_rm_tree(dir);
}
END_TEST

/* A second writer in the same folder names its file after the first one's
 * (TensorBoard reads them in name order), even within the same second. */
START_TEST(test_tb_file_order)
{
    char dir[256], a[4096];
    qd_test_mkdtemp(dir, sizeof dir, "tb");
    qd_tb *tb;
    ck_assert_int_eq(qd_tb_open(&tb, dir, 1), QD_OK);
    snprintf(a, sizeof a, "%s", qd_tb_path(tb));
    qd_tb_close(tb);
    ck_assert_int_eq(qd_tb_open(&tb, dir, 5), QD_OK);
    ck_assert_int_lt(strcmp(a, qd_tb_path(tb)), 0);
    qd_tb_close(tb);
    ck_assert_int_eq(qd_test_dir_entries(dir), 2);
    qd_test_rm_tree(dir);
}
END_TEST

Suite *suite_tb(void)
{
    Suite *s = suite_create("tb");
    TCase *tc = tcase_create("events");
    tcase_add_test(tc, test_tb_crc32c_vectors);
    tcase_add_test(tc, test_tb_scalar_event_bytes);
    tcase_add_test(tc, test_tb_json_tags);
    tcase_add_test(tc, test_tb_file_order);
    suite_add_tcase(s, tc);
    return s;
}
