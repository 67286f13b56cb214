/* The last-error message of each thread. */
#include <stdarg.h>
#include <stdio.h>
#include "quant/status.h"

static _Thread_local char last_error[1024];

qd_status qd_error(qd_status st, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(last_error, sizeof last_error, fmt, ap);
    va_end(ap);
    return st;
}

const char *qd_last_error(void) { return last_error; }

const char *qd_status_str(qd_status st)
{
    static const char *const names[] = {
        "ok", "non-finite value", "bad shape", "out of memory", "I/O error",
        "malformed input", "bad argument", "network error", "unsupported", "device error",
    };
    if ((unsigned)st < sizeof names / sizeof names[0])
        return names[st];
    return "unknown error";
}
