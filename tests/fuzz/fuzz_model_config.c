/* libFuzzer: a config.json through the parser; an accepted config must pass
 * qd_model_config_check and give a parameter table. */
#include "backends/layout.h"
#include "models/model_config.h"
#include "tests/fuzz/fuzz.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    qd_model_config cfg;
    if (qd_model_config_load_string((const char *)data, size, "config.json", &cfg) != QD_OK)
        return 0;
    if (qd_model_config_check(&cfg) != QD_OK)
        abort(); /* the loader accepted what the check refuses */
    /* the table costs ~100 bytes a tensor: build it for small tensor counts only */
    if ((int64_t)cfg.num_hidden_layers * (cfg.num_experts + 1) <= 4096) {
        qd_model_layout m;
        if (qd_model_layout_init(&m, &cfg) == QD_OK)
            qd_model_layout_free(&m);
    }
    return 0;
}
