/* The quads subcommands: each takes the arguments after its name and returns
 * the process exit status. */
#ifndef QD_COMMANDS_H
#define QD_COMMANDS_H

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
int qd_cmd_compare(int argc, char **argv);
int qd_cmd_report(int argc, char **argv);
int qd_cmd_sft(int argc, char **argv);
int qd_cmd_forward(int argc, char **argv);
int qd_cmd_generate(int argc, char **argv);

#endif
