/* rewards/sandbox: runs model-written Python in a child process that cannot
 * harm the machine or see the grader (docs/sandbox.md says what that means
 * and what it does not). The parent feeds stdin and reads stdout/stderr
 * through pipes; nothing the child writes survives the run.
 *
 * Isolation, strongest first (qd_sandbox_isolation says which one applies):
 *   JAIL     as root with namespaces: new pid, network, mount and IPC
 *            namespaces; a fresh tmpfs root holding read-only binds of the
 *            system directories and a private /tmp as the working directory;
 *            the user nobody (65534), no new privileges; rlimits.
 *   UID      as root where namespaces are refused: nobody, a fresh 0700
 *            directory, its own session, rlimits.
 *   RLIMITS  not root: a fresh directory, its own session, rlimits only.
 * Thread-safe: runs may go on in several threads at once. */
#ifndef QD_SANDBOX_H
#define QD_SANDBOX_H

#include <stdbool.h>
#include <stddef.h>
#include "quant/status.h"

typedef enum { QD_SANDBOX_JAIL, QD_SANDBOX_UID, QD_SANDBOX_RLIMITS } qd_sandbox_level;

typedef struct {
    double wall_s;       /* wall clock; the whole process tree is killed then */
    int cpu_s;           /* RLIMIT_CPU of each process (SIGXCPU) */
    size_t mem_bytes;    /* RLIMIT_AS of each process */
    int nproc;           /* RLIMIT_NPROC (processes and threads of the sandbox user) */
    int nofile;          /* RLIMIT_NOFILE */
    size_t fsize_bytes;  /* RLIMIT_FSIZE: largest file it may write */
    size_t output_bytes; /* stdout and stderr kept, each; more kills the run */
} qd_sandbox_limits;

/* 6 s wall and CPU (LiveCodeBench's per-test limit), 4 GiB address space,
 * 64 processes, 64 files, 16 MiB files, 16 MiB of output. */
qd_sandbox_limits qd_sandbox_limits_default(void);

typedef enum {
    QD_SANDBOX_EXITED,       /* exited by itself; see exit_code */
    QD_SANDBOX_SIGNALED,     /* killed by a signal it raised or got (not ours); see signal */
    QD_SANDBOX_TIMEOUT,      /* past wall_s or cpu_s */
    QD_SANDBOX_OUTPUT_LIMIT, /* wrote more than output_bytes */
} qd_sandbox_outcome;

typedef struct {
    qd_sandbox_outcome outcome;
    int exit_code; /* EXITED */
    int signal;    /* SIGNALED */
    char *out;     /* stdout, NUL-terminated (owned) */
    size_t out_len;
    char *err;     /* stderr, NUL-terminated (owned) */
    size_t err_len;
    double wall_s;
} qd_sandbox_result;

/* A file placed in the working directory before the program starts. */
typedef struct {
    const char *name; /* plain name, no '/' */
    const char *data;
    size_t len;
} qd_sandbox_file;

/* Runs `python3 -sB SCRIPT` (SCRIPT one of files) in a fresh sandbox with
 * stdin, returning what happened in res (free with qd_sandbox_result_free).
 * A failure to set the sandbox up is a non-OK status, never a result. */
qd_status qd_sandbox_run(const qd_sandbox_limits *lim, const qd_sandbox_file *files, int nfiles,
                         const char *script, const char *stdin_data, size_t stdin_len,
                         qd_sandbox_result *res);
void qd_sandbox_result_free(qd_sandbox_result *res);

/* The isolation this process gets (decided once, on first use), and the
 * interpreter it runs: $QD_PYTHON, else the first python3 on PATH, else
 * /usr/bin/python3, whichever is a real executable. Errors when there is no
 * usable python3. */
qd_status qd_sandbox_isolation(qd_sandbox_level *level, const char **python);
const char *qd_sandbox_level_name(qd_sandbox_level level);

#endif
