/* Throughput of the code sandbox (rewards/sandbox.h, rewards/code.h): runs
 * per second of a trivial program, of a plain fork+exec of the same
 * interpreter with no sandbox (the floor), and LiveCodeBench tests per second
 * through the grader at 1 and 2 jobs, on the 24 written solutions of
 * tests/fixtures/code/solutions.jsonl against their real problems.
 *
 * usage: bench/bench_sandbox [REPS]   (from the repository root; REPS 3) */
#define _GNU_SOURCE
#include <jansson.h>
#include <fcntl.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>
#include "bench/bench_util.h"
#include "rewards/code.h"
#include "rewards/sandbox.h"

#define LCB "tests/fixtures/benchmarks/livecodebench_release_v1_nopriv_mavencoder.jsonl"
#define SOLUTIONS "tests/fixtures/code/solutions.jsonl"
#define RUNS 40

extern char **environ;

/* CPU seconds used so far by this process and its reaped children (the
 * sandboxed programs): independent of how busy the machine is. */
static double cpu_now(void)
{
    struct rusage a, b;
    getrusage(RUSAGE_SELF, &a);
    getrusage(RUSAGE_CHILDREN, &b);
    return (double)(a.ru_utime.tv_sec + a.ru_stime.tv_sec + b.ru_utime.tv_sec + b.ru_stime.tv_sec) +
           1e-6 * (double)(a.ru_utime.tv_usec + a.ru_stime.tv_usec + b.ru_utime.tv_usec + b.ru_stime.tv_usec);
}

static json_t *load_jsonl(const char *path)
{
    FILE *f = fopen(path, "r");
    if (!f) {
        fprintf(stderr, "bench_sandbox: cannot open %s (run from the repository root)\n", path);
        exit(1);
    }
    json_t *arr = json_array();
    char *line = NULL;
    size_t cap = 0;
    while (getline(&line, &cap, f) > 0) {
        json_t *o = json_loads(line, 0, NULL);
        if (!o) {
            fprintf(stderr, "bench_sandbox: %s: a line is not JSON\n", path);
            exit(1);
        }
        json_array_append_new(arr, o);
    }
    free(line);
    fclose(f);
    return arr;
}

/* Runs of print(1) per second. */
static double sandbox_rate(void)
{
    static const char prog[] = "print(1)\n";
    qd_sandbox_file f = {"main.py", prog, sizeof prog - 1};
    qd_sandbox_limits lim = qd_sandbox_limits_default();
    double t0 = qd_bench_now();
    for (int i = 0; i < RUNS; i++) {
        qd_sandbox_result r;
        if (qd_sandbox_run(&lim, &f, 1, "main.py", "", 0, &r) || r.exit_code != 0) {
            fprintf(stderr, "bench_sandbox: %s\n", qd_last_error());
            exit(1);
        }
        qd_sandbox_result_free(&r);
    }
    return RUNS / (qd_bench_now() - t0);
}

/* The same interpreter started with posix_spawn and no isolation. */
static double plain_rate(const char *python)
{
    char *argv[] = {(char *)python, "-sB", "-c", "print(1)", NULL};
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_addopen(&fa, 1, "/dev/null", O_WRONLY, 0);
    double t0 = qd_bench_now();
    for (int i = 0; i < RUNS; i++) {
        pid_t pid;
        int st;
        if (posix_spawn(&pid, python, &fa, NULL, argv, environ) || waitpid(pid, &st, 0) != pid) {
            fprintf(stderr, "bench_sandbox: cannot run %s\n", python);
            exit(1);
        }
    }
    posix_spawn_file_actions_destroy(&fa);
    return RUNS / (qd_bench_now() - t0);
}

/* LCB tests per second grading every written solution (all accepted, so
 * every test runs). */
static double grade_rate(int jobs, const char *const *outs, const qd_code_problem *const *pp, int n, int tests)
{
    qd_code_opts o = qd_code_opts_default();
    o.jobs = jobs;
    qd_code_result *res = calloc((size_t)n, sizeof *res);
    double t0 = qd_bench_now();
    if (qd_code_grade(&o, outs, pp, n, res)) {
        fprintf(stderr, "bench_sandbox: %s\n", qd_last_error());
        exit(1);
    }
    double dt = qd_bench_now() - t0;
    for (int i = 0; i < n; i++) {
        if (!res[i].correct) {
            fprintf(stderr, "bench_sandbox: solution %d graded %s\n", i, qd_code_verdict_name(res[i].verdict));
            exit(1);
        }
        qd_code_result_free(&res[i]);
    }
    free(res);
    return tests / dt;
}

int main(int argc, char **argv)
{
    int reps = argc > 1 ? atoi(argv[1]) : 3;
    if (reps < 1)
        reps = 1;
    qd_sandbox_level level;
    const char *python;
    if (qd_sandbox_isolation(&level, &python)) {
        fprintf(stderr, "bench_sandbox: %s\n", qd_last_error());
        return 1;
    }
    json_t *rows = load_jsonl(LCB), *sols = load_jsonl(SOLUTIONS);
    int n = (int)json_array_size(sols), tests = 0;
    qd_code_problem *probs = calloc((size_t)n, sizeof *probs);
    const qd_code_problem **pp = calloc((size_t)n, sizeof *pp);
    char **outs = calloc((size_t)n, sizeof *outs);
    for (int i = 0; i < n; i++) {
        json_t *s = json_array_get(sols, (size_t)i);
        const char *qid = json_string_value(json_object_get(s, "question_id"));
        json_t *row = NULL;
        for (size_t k = 0; k < json_array_size(rows) && !row; k++)
            if (!strcmp(json_string_value(json_object_get(json_array_get(rows, k), "question_id")), qid))
                row = json_array_get(rows, k);
        if (!row || qd_code_problem_from_json(row, qid, &probs[i])) {
            fprintf(stderr, "bench_sandbox: problem %s: %s\n", qid, qd_last_error());
            return 1;
        }
        pp[i] = &probs[i];
        tests += probs[i].ntests;
        if (asprintf(&outs[i], "```python\n%s```\n", json_string_value(json_object_get(s, "correct"))) < 0)
            return 1;
    }
    double plain[16], sbx[16], g1[16], g2[16], cpu[3][16];
    reps = reps > 16 ? 16 : reps;
    for (int r = 0; r < reps; r++) {
        double c0 = cpu_now();
        plain[r] = plain_rate(python);
        double c1 = cpu_now();
        sbx[r] = sandbox_rate();
        double c2 = cpu_now();
        g1[r] = grade_rate(1, (const char *const *)outs, pp, n, tests);
        double c3 = cpu_now();
        g2[r] = grade_rate(2, (const char *const *)outs, pp, n, tests);
        cpu[0][r] = 1e3 * (c1 - c0) / RUNS;
        cpu[1][r] = 1e3 * (c2 - c1) / RUNS;
        cpu[2][r] = 1e3 * (c3 - c2) / tests;
    }
    double cms[3];
    for (int k = 0; k < 3; k++)
        cms[k] = qd_bench_median(cpu[k], reps);
    long cores = sysconf(_SC_NPROCESSORS_ONLN);
    printf("isolation: %s; python: %s; %ld cores online; median of %d repetitions\n\n",
           qd_sandbox_level_name(level), python, cores, reps);
    printf("| what | jobs | per second (measured) | CPU ms each | per second on 2 idle cores (2000 / CPU ms) |\n"
           "|---|---|---|---|---|\n");
    printf("| python3 -c 'print(1)', plain posix_spawn, no sandbox | 1 | %.1f runs | %.1f | %.0f |\n",
           qd_bench_median(plain, reps), cms[0], 2000 / cms[0]);
    printf("| print(1) in the sandbox | 1 | %.1f runs | %.1f | %.0f |\n", qd_bench_median(sbx, reps), cms[1],
           2000 / cms[1]);
    printf("| LCB tests (%d solutions, %d tests, harness + LCB prelude) | 1 | %.1f tests | %.1f | %.0f |\n", n,
           tests, qd_bench_median(g1, reps), cms[2], 2000 / cms[2]);
    printf("| LCB tests (same) | 2 | %.1f tests | | |\n", qd_bench_median(g2, reps));
    for (int i = 0; i < n; i++) {
        free(outs[i]);
        qd_code_problem_free(&probs[i]);
    }
    free(outs);
    free(pp);
    free(probs);
    json_decref(rows);
    json_decref(sols);
    return 0;
}
