/* models/safetensors: reading and writing Hugging Face safetensors files.
 *
 * Format (https://github.com/huggingface/safetensors): an 8-byte little-endian
 * header length n, n bytes of JSON {name: {"dtype", "shape", "data_offsets"},
 * "__metadata__": {str: str}}, then the data; offsets are relative to the end
 * of the header. The reader maps files with mmap and validates every field as
 * the reference implementation does (tensors tile the data exactly: no
 * overlap, no gap, no trailing bytes). A sharded checkpoint
 * (model.safetensors.index.json with its "weight_map") opens as one tensor set.
 * The writer orders the data as the reference does (larger dtypes first, then
 * by name), pads the header with spaces to a multiple of 8, and replaces the
 * target file atomically. */
#ifndef QD_SAFETENSORS_H
#define QD_SAFETENSORS_H

#include <stddef.h>
#include <stdint.h>
#include "quant/status.h"

#define QD_ST_MAX_DIMS 8

typedef enum {
    QD_ST_BOOL, QD_ST_U8, QD_ST_I8, QD_ST_F8_E4M3, QD_ST_F8_E5M2,
    QD_ST_U16, QD_ST_I16, QD_ST_F16, QD_ST_BF16,
    QD_ST_U32, QD_ST_I32, QD_ST_F32,
    QD_ST_U64, QD_ST_I64, QD_ST_F64,
    QD_ST_NDTYPES
} qd_st_dtype;

/* One tensor of an open file; everything points into the reader and stays
 * valid until qd_safetensors_close. */
typedef struct {
    const char *name;
    const char *file;               /* path of the file (shard) holding it */
    qd_st_dtype dtype;
    int ndim;                       /* 0 for a scalar */
    int64_t shape[QD_ST_MAX_DIMS];
    int64_t numel;                  /* product of shape (1 for a scalar) */
    size_t nbytes;                  /* numel * dtype size */
    const void *data;               /* little-endian, not necessarily aligned */
} qd_st_tensor;

typedef struct qd_safetensors qd_safetensors;

/* "F32", "BF16", ... and back; qd_st_dtype_parse returns -1 for an unknown name. */
const char *qd_st_dtype_name(qd_st_dtype dt);
int qd_st_dtype_parse(const char *name);
size_t qd_st_dtype_size(qd_st_dtype dt);

/* Opens a .safetensors file, a sharded checkpoint's *.index.json, or a
 * directory holding model.safetensors.index.json or model.safetensors.
 * On success *out is owned by the caller (qd_safetensors_close). */
qd_status qd_safetensors_open(qd_safetensors **out, const char *path);
void qd_safetensors_close(qd_safetensors *f);

/* Tensors in name order: index 0 .. count-1. */
size_t qd_safetensors_count(const qd_safetensors *f);
const qd_st_tensor *qd_safetensors_at(const qd_safetensors *f, size_t i);
/* NULL if no tensor has that name. */
const qd_st_tensor *qd_safetensors_find(const qd_safetensors *f, const char *name);

/* "__metadata__" (of the first shard when sharded), in key order. */
size_t qd_safetensors_metadata_count(const qd_safetensors *f);
const char *qd_safetensors_metadata_key(const qd_safetensors *f, size_t i);
const char *qd_safetensors_metadata_value(const qd_safetensors *f, size_t i);
/* NULL if absent. */
const char *qd_safetensors_metadata_get(const qd_safetensors *f, const char *key);

/* out (t->numel) = t's values as float32, exactly, for F32, F16, BF16 and
 * F8_E4M3; QD_ERR_UNSUPPORTED for other dtypes. */
qd_status qd_safetensors_to_f32(float *out, const qd_st_tensor *t);
/* The same for elements [begin, begin + n) of t into out (n floats): the
 * piece of a tensor one thread converts. */
qd_status qd_safetensors_to_f32_range(float *out, const qd_st_tensor *t, int64_t begin, int64_t n);

/* ---- writing */
typedef struct qd_safetensors_writer qd_safetensors_writer;

qd_status qd_safetensors_writer_new(qd_safetensors_writer **out);
void qd_safetensors_writer_free(qd_safetensors_writer *w);
/* Adds a tensor; the name and shape are copied, data (nbytes of shape and
 * dtype) is borrowed and must stay valid until the writer is freed. */
qd_status qd_safetensors_writer_add(qd_safetensors_writer *w, const char *name, qd_st_dtype dt,
                                    int ndim, const int64_t *shape, const void *data);
/* Same, but the writer takes ownership of data (a malloc'd block), also on error. */
qd_status qd_safetensors_writer_add_steal(qd_safetensors_writer *w, const char *name,
                                          qd_st_dtype dt, int ndim, const int64_t *shape,
                                          void *data);
qd_status qd_safetensors_writer_set_metadata(qd_safetensors_writer *w, const char *key,
                                             const char *value);
/* Writes the file atomically (qd_atomic_write_with of quant/fileio.h); on
 * failure the target is untouched and no temp file remains. */
qd_status qd_safetensors_writer_write(const qd_safetensors_writer *w, const char *path);

#endif
