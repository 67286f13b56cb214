/* models/checkpoint: a Hugging Face model folder (config.json +
 * model.safetensors or a sharded model.safetensors.index.json) to and from the
 * flat float32 parameter buffer of a backend (backends/backend.h: one buffer,
 * tensors in qd_param_info order, HF names, per-expert tensors separate).
 *
 * Loading is strict: every expected tensor must exist with exactly the
 * expected shape (norm weights 1-D [cols], every other tensor 2-D [rows,
 * cols]) and dtype F32, BF16 or F16, every value finite, and no other tensor
 * may be present except the rotary "inv_freq" buffers some old checkpoints
 * carry (derived from config.json, so harmless). With tied embeddings the
 * backend lists no lm_head.weight, so a checkpoint holding one is refused.
 * Messages name the file, the tensor and the field.
 *
 * Saving writes what transformers' save_pretrained writes for
 * Qwen3MoeForCausalLM / Qwen3ForCausalLM: config.json in the spelling of the
 * published Qwen3 checkpoints (num_experts, top-level rope_theta, torch_dtype)
 * and one model.safetensors with the per-expert names and metadata
 * {"format": "pt"}; both files are replaced atomically (quant/fileio.h).
 * Tokenizer files are the caller's business. */
#ifndef QD_CHECKPOINT_H
#define QD_CHECKPOINT_H

#include "backends/backend.h"
#include "models/model_config.h"
#include "models/safetensors.h"
#include "quant/status.h"

/* dir/config.json into *cfg (QD_ERR_IO naming the file when it is missing). */
qd_status qd_checkpoint_read_config(const char *dir, qd_model_config *cfg);

/* Reads the n tensors of params from dir (a folder with
 * model.safetensors.index.json or model.safetensors, or one .safetensors
 * file) into out (the flat buffer, offsets of params), converted to float32
 * exactly. On error out is partly written. */
qd_status qd_checkpoint_load(const char *dir, const qd_param_info *params, int n, float *out);

/* Writes dir/config.json (from cfg, torch_dtype of dtype) and
 * dir/model.safetensors (the n tensors of data in dtype: QD_ST_F32 exactly,
 * QD_ST_BF16 rounded to nearest even). Makes dir if missing. Non-finite
 * values are refused before anything is written. */
qd_status qd_checkpoint_save(const char *dir, const qd_model_config *cfg, const qd_param_info *params,
                             int n, const float *data, qd_st_dtype dtype);

/* Writes dir/config.json alone (from cfg, torch_dtype of dtype; dir must
 * exist), as qd_checkpoint_save does: for weights written some other way. */
qd_status qd_checkpoint_write_config(const char *dir, const qd_model_config *cfg, qd_st_dtype dtype);

/* Reads dir's config, makes a backend by name ("auto", "cpu", "cuda";
 * opt NULL = fp32 recipe, rollout role, defaults) and loads and syncs the
 * weights. NULL on failure, with the message in qd_last_error(). */
qd_backend *qd_checkpoint_open_backend(const char *dir, const char *backend_name,
                                       const qd_backend_options *opt);

#endif
