/* The quads subcommands: each takes the arguments after its name and returns
 * the process exit status. */
#ifndef QD_COMMANDS_H
#define QD_COMMANDS_H

#include <stdint.h>
#include "backends/backend.h"
#include "orchestrator/rl.h"

typedef int (*qd_command_fn)(int argc, char **argv);

typedef struct {
    const char *name;
    qd_command_fn run;
    const char *summary;
} qd_command;

int qd_cmd_quantize(int argc, char **argv);
int qd_cmd_grade(int argc, char **argv);
int qd_cmd_bench(int argc, char **argv);
int qd_cmd_eval(int argc, char **argv);
int qd_cmd_tokenize(int argc, char **argv);
int qd_cmd_rl(int argc, char **argv);
/* quads rl with the loop's test hooks (NULL: none; tests/rl_hooks.c sets them). */
int qd_cmd_rl_hooked(int argc, char **argv, const qd_rl_hooks *hooks);
int qd_cmd_compare(int argc, char **argv);
int qd_cmd_report(int argc, char **argv);
int qd_cmd_sft(int argc, char **argv);
int qd_cmd_forward(int argc, char **argv);
int qd_cmd_generate(int argc, char **argv);
int qd_cmd_ablate(int argc, char **argv);

/* Option values (orchestrator/cli_parse.c); each returns 1 and sets *out only
 * when the whole of s is valid, else 0. qd_cli_real: a number in [lo, hi]
 * (NaN and overflow refused). qd_cli_uint: a decimal integer in [0, max], no
 * sign or leading space (a seed above 2^53 stays exact). */
int qd_cli_real(const char *s, double lo, double hi, double *out);
int qd_cli_uint(const char *s, uint64_t max, uint64_t *out);

/* --backend and --mode of the commands that make a backend (forward,
 * generate, eval; rl sets its config keys instead), checked together once
 * every option is read: QD_ERR_ARG with a message naming the option and its
 * valid values when backend is not auto, cpu or cuda or mode not exact or
 * fast, or naming both when fast mode is asked of the CPU backend (it runs
 * exact mode only). NULL backend or mode: the default (auto, exact). */
qd_status qd_cli_backend_mode(const char *backend, const char *mode, qd_exec_mode *out);

#endif
