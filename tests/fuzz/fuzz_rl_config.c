/* libFuzzer: `quads rl`'s config: the input as a --config JSON file, or (when
 * it is not JSON) as --set KEY=VALUE lines; an accepted config is validated,
 * derived, summarized and written back to JSON. */
#include <jansson.h>
#include "orchestrator/rl_config.h"
#include "tests/fuzz/fuzz.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    qd_config *cfg = qd_config_new();
    if (!cfg)
        abort();
    json_t *root = json_loadb((const char *)data, size, JSON_REJECT_DUPLICATES, NULL);
    int ok = 1;
    if (root) {
        ok = qd_config_load_json(cfg, root, "config.json") == QD_OK;
        json_decref(root);
    } else {
        char *s = qd_fuzz_cstr(data, size);
        for (char *save = NULL, *line = strtok_r(s, "\n", &save); ok && line; line = strtok_r(NULL, "\n", &save))
            ok = qd_config_set(cfg, line) == QD_OK;
        free(s);
    }
    if (ok && qd_config_validate(cfg) == QD_OK) {
        qd_config_batch b;
        char buf[4096];
        qd_config_derive(cfg, &b);
        qd_config_summary(cfg, buf, sizeof buf);
        json_decref(qd_config_to_json(cfg));
    }
    qd_config_free(cfg);
    return 0;
}
