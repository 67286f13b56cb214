/* TensorBoard event files: TFRecord framing with CRC-32C and the few protobuf
 * fields of Event, Summary and TensorProto that scalars and text need (tb.h). */
#define _GNU_SOURCE
#include <dirent.h>
#include <pthread.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/time.h>
#include <unistd.h>
#include "orchestrator/tb.h"
#include "quant/fileio.h"

struct qd_tb {
    FILE *f;
    char *path;
};

/* ---- CRC-32C */

static uint32_t crc_table[256];

static void crc_init(void)
{
    for (uint32_t i = 0; i < 256; i++) {
        uint32_t c = i;
        for (int k = 0; k < 8; k++)
            c = c & 1 ? (c >> 1) ^ 0x82F63B78u : c >> 1;
        crc_table[i] = c;
    }
}

uint32_t qd_tb_crc32c(const void *data, size_t n)
{
    static pthread_once_t once = PTHREAD_ONCE_INIT;
    pthread_once(&once, crc_init);
    const uint8_t *p = data;
    uint32_t c = 0xFFFFFFFFu;
    for (size_t i = 0; i < n; i++)
        c = crc_table[(c ^ p[i]) & 0xFF] ^ (c >> 8);
    return c ^ 0xFFFFFFFFu;
}

uint32_t qd_tb_mask_crc(uint32_t crc) { return ((crc >> 15) | (crc << 17)) + 0xa282ead8u; }

/* ---- protobuf encoding (a growable byte buffer; oom sticks and is checked once) */

typedef struct {
    uint8_t *p;
    size_t n, cap;
    int oom;
} pb;

static void pb_bytes(pb *b, const void *src, size_t n)
{
    if (b->oom)
        return;
    if (b->n + n > b->cap) {
        size_t cap = (b->n + n) * 2 + 64;
        uint8_t *p = realloc(b->p, cap);
        if (!p) {
            b->oom = 1;
            return;
        }
        b->p = p, b->cap = cap;
    }
    memcpy(b->p + b->n, src, n);
    b->n += n;
}

static void pb_varint(pb *b, uint64_t v)
{
    uint8_t t[10];
    int n = 0;
    do {
        t[n++] = (uint8_t)((v & 0x7F) | (v > 0x7F ? 0x80 : 0));
        v >>= 7;
    } while (v);
    pb_bytes(b, t, (size_t)n);
}

/* wire types: 0 varint, 1 64-bit, 2 length-delimited, 5 32-bit */
static void pb_key(pb *b, int field, int wire) { pb_varint(b, (uint64_t)field << 3 | (uint64_t)wire); }

static void pb_len(pb *b, int field, const void *data, size_t n)
{
    pb_key(b, field, 2);
    pb_varint(b, n);
    pb_bytes(b, data, n);
}

static void pb_str(pb *b, int field, const char *s) { pb_len(b, field, s, strlen(s)); }

/* a nested message (its bytes are freed) */
static void pb_msg(pb *b, int field, pb *m)
{
    if (m->oom)
        b->oom = 1;
    pb_len(b, field, m->p, m->n);
    free(m->p);
    *m = (pb){0};
}

static void pb_le(pb *b, uint64_t v, int bytes)
{
    uint8_t t[8];
    for (int i = 0; i < bytes; i++)
        t[i] = (uint8_t)(v >> (8 * i));
    pb_bytes(b, t, (size_t)bytes);
}

/* Summary.Value{tag 1, simple_value 2} appended to a Summary as its field 1 */
static void summary_scalar(pb *summary, const char *tag, float value)
{
    pb v = {0};
    uint32_t bits;
    memcpy(&bits, &value, 4);
    pb_str(&v, 1, tag);
    pb_key(&v, 2, 5);
    pb_le(&v, bits, 4);
    pb_msg(summary, 1, &v);
}

/* ---- records and events */

static double wall_time(void)
{
    struct timeval tv;
    gettimeofday(&tv, NULL);
    return (double)tv.tv_sec + tv.tv_usec * 1e-6;
}

static qd_status write_record(qd_tb *tb, const pb *data)
{
    if (data->oom)
        return qd_error(QD_ERR_NOMEM, "%s: encoding an event", tb->path);
    uint8_t len[8];
    for (int i = 0; i < 8; i++)
        len[i] = (uint8_t)((uint64_t)data->n >> (8 * i));
    uint32_t c[2] = {qd_tb_mask_crc(qd_tb_crc32c(len, 8)), qd_tb_mask_crc(qd_tb_crc32c(data->p, data->n))};
    uint8_t cb[2][4];
    for (int k = 0; k < 2; k++)
        for (int i = 0; i < 4; i++)
            cb[k][i] = (uint8_t)(c[k] >> (8 * i));
    if (fwrite(len, 1, 8, tb->f) != 8 || fwrite(cb[0], 1, 4, tb->f) != 4 ||
        fwrite(data->p, 1, data->n, tb->f) != data->n || fwrite(cb[1], 1, 4, tb->f) != 4)
        return qd_error(QD_ERR_IO, "%s: write: %s", tb->path, strerror(errno));
    return QD_OK;
}

/* Event{wall_time 1, step 2} + the given field (a message or a string) */
static qd_status write_event(qd_tb *tb, int64_t step, int field, pb *body, const char *str)
{
    pb e = {0};
    double t = wall_time();
    uint64_t bits;
    memcpy(&bits, &t, 8);
    pb_key(&e, 1, 1);
    pb_le(&e, bits, 8);
    pb_key(&e, 2, 0);
    pb_varint(&e, (uint64_t)step);
    if (body)
        pb_msg(&e, field, body);
    else
        pb_str(&e, field, str);
    qd_status st = write_record(tb, &e);
    free(e.p);
    return st;
}

/* ---- opening */

/* The largest <seconds> among dir's events.out.tfevents.<seconds>.* files. */
static long long latest_stamp(const char *dir)
{
    long long best = 0;
    DIR *d = opendir(dir);
    for (struct dirent *e; d && (e = readdir(d));) {
        long long s;
        if (sscanf(e->d_name, "events.out.tfevents.%lld.", &s) == 1 && s > best)
            best = s;
    }
    if (d)
        closedir(d);
    return best;
}

qd_status qd_tb_open(qd_tb **tb, const char *dir, int64_t start_step)
{
    *tb = NULL;
    qd_status st = qd_mkdirs(dir);
    if (st)
        return st;
    long long stamp = (long long)wall_time(), last = latest_stamp(dir);
    if (stamp <= last)
        stamp = last + 1;
    qd_tb *w = calloc(1, sizeof *w);
    if (!w || asprintf(&w->path, "%s/events.out.tfevents.%010lld.quads.%d", dir, stamp, (int)getpid()) < 0) {
        free(w);
        return qd_error(QD_ERR_NOMEM, "%s: opening an event file", dir);
    }
    w->f = fopen(w->path, "wb");
    if (!w->f) {
        st = qd_error(QD_ERR_IO, "%s: create: %s", w->path, strerror(errno));
        qd_tb_close(w);
        return st;
    }
    st = write_event(w, start_step, 3, NULL, "brain.Event:2");
    pb log = {0};
    pb_key(&log, 1, 0);
    pb_varint(&log, 1); /* SessionLog.status = START */
    st = st ? st : write_event(w, start_step, 7, &log, NULL);
    free(log.p);
    st = st ? st : qd_tb_flush(w);
    if (st) {
        qd_tb_close(w);
        return st;
    }
    *tb = w;
    return QD_OK;
}

void qd_tb_close(qd_tb *tb)
{
    if (!tb)
        return;
    if (tb->f)
        fclose(tb->f);
    free(tb->path);
    free(tb);
}

const char *qd_tb_path(const qd_tb *tb) { return tb->path; }

qd_status qd_tb_flush(qd_tb *tb)
{
    if (fflush(tb->f) != 0)
        return qd_error(QD_ERR_IO, "%s: write: %s", tb->path, strerror(errno));
    return QD_OK;
}

/* ---- summaries */

qd_status qd_tb_scalar(qd_tb *tb, const char *tag, int64_t step, float value)
{
    pb s = {0};
    summary_scalar(&s, tag, value);
    return write_event(tb, step, 5, &s, NULL);
}

qd_status qd_tb_text(qd_tb *tb, const char *tag, int64_t step, const char *text)
{
    pb plugin = {0}, meta = {0}, tensor = {0}, v = {0}, s = {0};
    pb_str(&plugin, 1, "text"); /* PluginData.plugin_name */
    pb_msg(&meta, 1, &plugin);  /* SummaryMetadata.plugin_data */
    pb_key(&tensor, 1, 0);
    pb_varint(&tensor, 7);        /* TensorProto.dtype = DT_STRING; no shape: a scalar */
    pb_str(&tensor, 8, text);     /* TensorProto.string_val */
    pb_str(&v, 1, tag);
    pb_msg(&v, 9, &meta);
    pb_msg(&v, 8, &tensor);
    pb_msg(&s, 1, &v);
    return write_event(tb, step, 5, &s, NULL);
}

/* The tag of element i of an array: names' entry, shortened, or the index. */
static void element_tag(char *buf, size_t n, const char *path, const json_t *list, size_t i)
{
    const json_t *e = json_array_get(list, i);
    if (json_is_string(e)) {
        const char *s = json_string_value(e);
        size_t len = strlen(s);
        if (!strncmp(s, "model.", 6))
            s += 6, len -= 6;
        if (len > 7 && !strcmp(s + len - 7, ".weight"))
            len -= 7;
        snprintf(buf, n, "%s/%.*s", path, (int)len, s);
    } else if (json_is_integer(e))
        snprintf(buf, n, "%s/layer%lld", path, (long long)json_integer_value(e));
    else
        snprintf(buf, n, "%s/%zu", path, i);
}

static void add_value(pb *s, const char *tag, const json_t *v)
{
    if (json_is_number(v))
        summary_scalar(s, tag, (float)json_number_value(v));
}

static void add_object(pb *s, const char *prefix, const json_t *obj, const json_t *names, const json_t *section)
{
    const char *key;
    const json_t *v;
    json_object_foreach((json_t *)obj, key, v) {
        if (!*prefix && !strcmp(key, "step"))
            continue;
        char tag[512];
        snprintf(tag, sizeof tag, "%s%s%s", prefix, *prefix ? "/" : "", key);
        const json_t *sec = *prefix ? section : json_object_get(names, key);
        if (json_is_object(v))
            add_object(s, tag, v, names, sec);
        else if (json_is_array(v)) {
            const json_t *list = json_array_size(sec) == json_array_size(v) ? sec : NULL;
            for (size_t i = 0; i < json_array_size(v); i++) {
                char et[1024];
                element_tag(et, sizeof et, tag, list, i);
                add_value(s, et, json_array_get(v, i));
            }
        } else
            add_value(s, tag, v);
    }
}

qd_status qd_tb_json(qd_tb *tb, int64_t step, const json_t *obj, const json_t *names)
{
    pb s = {0};
    add_object(&s, "", obj, names, NULL);
    if (!s.n && !s.oom)
        return QD_OK;
    return write_event(tb, step, 5, &s, NULL);
}
