/* libFuzzer: the model checkpoint loader (models/checkpoint.c). The input is
 * config.json, a NUL byte, then model.safetensors; both are written to a
 * folder that qd_checkpoint_open_backend loads into a CPU backend. */
#include <stdio.h>
#include <unistd.h>
#include "backends/layout.h"
#include "models/checkpoint.h"
#include "tests/fuzz/fuzz.h"

static void write_file(const char *dir, const char *name, const uint8_t *data, size_t n)
{
    char path[256];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(path, "wb");
    if (!f || fwrite(data, 1, n, f) != n || fclose(f))
        abort();
}

static char dir[64];

static void remove_dir(void)
{
    char path[256];
    snprintf(path, sizeof path, "%s/config.json", dir);
    unlink(path);
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    unlink(path);
    rmdir(dir);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (!dir[0]) {
        snprintf(dir, sizeof dir, "/tmp/qd_fuzz_ckpt_XXXXXX");
        if (!mkdtemp(dir))
            abort();
        atexit(remove_dir);
    }
    const uint8_t *nul = memchr(data, 0, size);
    size_t clen = nul ? (size_t)(nul - data) : size;
    qd_model_config cfg;
    /* the loader's job is the files: only models small enough to allocate at once */
    if (qd_model_config_load_string((const char *)data, clen, "config.json", &cfg) != QD_OK ||
        (int64_t)cfg.num_hidden_layers * (cfg.num_experts + 1) > 4096)
        return 0;
    qd_model_layout m;
    if (qd_model_layout_init(&m, &cfg) != QD_OK)
        return 0;
    size_t nfloats = m.nfloats;
    qd_model_layout_free(&m);
    if (nfloats > (1u << 22))
        return 0;
    write_file(dir, "config.json", data, clen);
    write_file(dir, "model.safetensors", nul ? nul + 1 : data, nul ? size - clen - 1 : 0);
    qd_backend_free(qd_checkpoint_open_backend(dir, "cpu", NULL));
    return 0;
}
