/* The option-value parsers every subcommand shares (orchestrator/commands.h). */
#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include "orchestrator/commands.h"

int qd_cli_real(const char *s, double lo, double hi, double *out)
{
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (!*s || *end || errno || !(v >= lo && v <= hi)) /* NaN fails the bounds */
        return 0;
    *out = v;
    return 1;
}

int qd_cli_uint(const char *s, uint64_t max, uint64_t *out)
{
    char *end;
    if (*s < '0' || *s > '9') /* strtoull would take a sign or spaces */
        return 0;
    errno = 0;
    unsigned long long v = strtoull(s, &end, 10);
    if (*end || errno || v > max)
        return 0;
    *out = v;
    return 1;
}

qd_status qd_cli_backend_mode(const char *backend, const char *mode, qd_exec_mode *out)
{
    *out = QD_MODE_EXACT;
    if (backend && strcmp(backend, "auto") && strcmp(backend, "cpu") && strcmp(backend, "cuda"))
        return qd_error(QD_ERR_ARG, "--backend: unknown value '%s' (auto, cpu, cuda)", backend);
    if (mode && qd_mode_parse(out, mode))
        return qd_error(QD_ERR_ARG, "--mode: unknown value '%s' (exact, fast)", mode);
    if (*out == QD_MODE_FAST && backend && !strcmp(backend, "cpu"))
        return qd_error(QD_ERR_ARG, "--mode fast: the cpu backend runs exact mode only (use --backend cuda "
                                    "or auto, or --mode exact)");
    return QD_OK;
}
