/* TensorBoard event files: the writer of RUN/tb/ (quads rl, log.tensorboard).
 *
 * An event file is a sequence of TFRecord records (uint64 length, masked
 * CRC-32C of the length, the data, masked CRC-32C of the data), each holding
 * one tensorboard.Event protobuf (tensorboard/compat/proto/event.proto):
 * wall_time (1, double), step (2, int64), file_version (3, "brain.Event:2",
 * first record), summary (5) and session_log (7). A Summary (summary.proto)
 * holds Values: tag (1), simple_value (2, float) for scalars; text goes as a
 * TensorProto (tensor.proto: dtype 1 = DT_STRING 7, string_val 8) in tensor
 * (8) with metadata (9) naming the plugin "text". Only the fields written
 * here are encoded; no protobuf library is needed. */
#ifndef QD_TB_H
#define QD_TB_H
#include <stddef.h>
#include <stdint.h>
#include <jansson.h>
#include "quant/status.h"

typedef struct qd_tb qd_tb;

/* CRC-32C (Castagnoli, reflected polynomial 0x82F63B78; RFC 3720 B.4) of n
 * bytes, and the TFRecord mask of a CRC: rotate right by 15, add 0xa282ead8. */
uint32_t qd_tb_crc32c(const void *data, size_t n);
uint32_t qd_tb_mask_crc(uint32_t crc);

/* Creates dir (and its parents) and a new event file in it, named
 * events.out.tfevents.<seconds>.quads.<pid> so that it sorts after every event
 * file already there (TensorBoard reads a folder's files in name order). Writes
 * the file_version event and a SessionLog START at start_step: TensorBoard then
 * drops the events of earlier files at steps >= start_step (those a resumed run
 * writes again). Close with qd_tb_close. */
qd_status qd_tb_open(qd_tb **tb, const char *dir, int64_t start_step);
void qd_tb_close(qd_tb *tb);
/* The event file's path (owned by tb). */
const char *qd_tb_path(const qd_tb *tb);

/* One scalar (a float, as TensorBoard stores them). */
qd_status qd_tb_scalar(qd_tb *tb, const char *tag, int64_t step, float value);
/* One text summary (the "text" plugin; TensorBoard renders it as Markdown). */
qd_status qd_tb_text(qd_tb *tb, const char *tag, int64_t step, const char *text);
/* Every number of obj at step as a scalar, in one event: the tag is the path
 * of member names joined by '/' ("gap/mean_abs"); member "step", strings,
 * booleans and nulls are skipped. An array's elements are tagged by
 * names[section], section being the first name of the path (RUN/layers.json:
 * a string "model.layers.3.self_attn.q_proj.weight" gives
 * "quant/act_err/layers.3.self_attn.q_proj", an integer 3 gives
 * "router/agree/layer3"), or by their index when names has no such list of
 * the array's length. names may be NULL. */
qd_status qd_tb_json(qd_tb *tb, int64_t step, const json_t *obj, const json_t *names);
/* Writes buffered events to the file (not fsync'ed: the event files are for
 * watching; metrics.jsonl is the record). */
qd_status qd_tb_flush(qd_tb *tb);

#endif
