/* libFuzzer: a safetensors file (header and data) through the reader and the
 * float32 conversion of every tensor. */
#include <stdio.h>
#include <unistd.h>
#include "models/safetensors.h"
#include "tests/fuzz/fuzz.h"

/* the reader maps a file: one per process, rewritten for each input */
static char path[64];

static void remove_file(void) { unlink(path); }

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (!path[0]) {
        snprintf(path, sizeof path, "/tmp/qd_fuzz_st_%ld.safetensors", (long)getpid());
        atexit(remove_file);
    }
    FILE *f = fopen(path, "wb");
    if (!f || fwrite(data, 1, size, f) != size || fclose(f))
        abort();
    qd_safetensors *st = NULL;
    if (qd_safetensors_open(&st, path) == QD_OK) {
        for (size_t i = 0; i < qd_safetensors_count(st); i++) {
            const qd_st_tensor *t = qd_safetensors_at(st, i);
            if (t->numel > (1 << 20))
                continue;
            float *v = malloc(sizeof(float) * (size_t)(t->numel + 1));
            if (v && qd_safetensors_to_f32(v, t) == QD_OK && qd_safetensors_find(st, t->name) != t)
                abort(); /* find must return the tensor by its name */
            free(v);
        }
        for (size_t i = 0; i < qd_safetensors_metadata_count(st); i++)
            if (!qd_safetensors_metadata_get(st, qd_safetensors_metadata_key(st, i)))
                abort();
        qd_safetensors_close(st);
    }
    return 0;
}
