/* The sandbox (rewards/sandbox.h): one test per attack, each run through the
 * code grader so that it shows both the verdict and that nothing escaped.
 * Attacks that only the jail stops (network, other users' files, processes
 * that leave their session) are skipped, with a note, where this process
 * cannot make one (not root, or namespaces refused). */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <check.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>
#include "rewards/code.h"
#include "rewards/sandbox.h"
#include "tests/suites.h"

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static qd_sandbox_level level(void)
{
    qd_sandbox_level lv;
    ck_assert_msg(qd_sandbox_isolation(&lv, NULL) == QD_OK, "%s", qd_last_error());
    return lv;
}

static bool jail_or_skip(const char *what)
{
    if (level() == QD_SANDBOX_JAIL)
        return true;
    fprintf(stderr, "sandbox: skipping '%s': isolation is '%s', not the jail\n", what,
            qd_sandbox_level_name(level()));
    return false;
}

/* Grades `code` (a stdin program) against one test whose expected output is
 * `expected`, with a test_s time limit and 512 MiB; returns the result and
 * the wall time it took. */
static qd_code_result grade_attack(const char *code, const char *expected, double test_s, double *took)
{
    qd_code_test t = {.input = "", .output = (char *)expected};
    qd_code_problem p = {.func_name = NULL, .tests = &t, .ntests = 1};
    const qd_code_problem *pp = &p;
    char *out = NULL;
    ck_assert_int_ge(asprintf(&out, "```python\n%s\n```\n", code), 0);
    qd_code_opts o = qd_code_opts_default();
    o.test_s = test_s;
    o.mem_bytes = (size_t)512 << 20;
    qd_code_result r;
    double t0 = now_s();
    const char *outs[1] = {out};
    ck_assert_int_eq(qd_code_grade(&o, outs, &pp, 1, &r), QD_OK);
    if (took)
        *took = now_s() - t0;
    free(out);
    return r;
}

/* Processes of the sandbox user (nobody) now on the host. */
static int nobody_processes(void)
{
    DIR *d = opendir("/proc");
    ck_assert_ptr_nonnull(d);
    int n = 0;
    for (struct dirent *e; (e = readdir(d));) {
        char p[300];
        struct stat st;
        snprintf(p, sizeof p, "/proc/%s", e->d_name);
        if (e->d_name[0] >= '1' && e->d_name[0] <= '9' && !stat(p, &st) && st.st_uid == 65534)
            n++;
    }
    closedir(d);
    return n;
}

/* Does any host process have `marker` in its command line? */
static bool process_with_marker(const char *marker)
{
    DIR *d = opendir("/proc");
    ck_assert_ptr_nonnull(d);
    bool found = false;
    for (struct dirent *e; (e = readdir(d)) && !found;) {
        if (e->d_name[0] < '1' || e->d_name[0] > '9')
            continue;
        char p[300], buf[4096];
        snprintf(p, sizeof p, "/proc/%s/cmdline", e->d_name);
        FILE *f = fopen(p, "rb");
        if (!f)
            continue;
        size_t n = fread(buf, 1, sizeof buf - 1, f);
        fclose(f);
        for (size_t i = 0; i < n; i++)
            buf[i] = buf[i] ? buf[i] : ' ';
        buf[n] = '\0';
        found = strstr(buf, marker) != NULL;
    }
    closedir(d);
    return found;
}

START_TEST(test_sandbox_basics)
{
    /* stdin is fed while stdout is read (1 MiB each way), the environment is
     * scrubbed, the directory holds only the program, and as root the
     * program is not root. */
    static const char prog[] =
        "import os, signal, sys\n"
        "data = sys.stdin.read()\n"
        "sys.stdout.write(data)\n"
        "sig = '%d%d' % (len(signal.pthread_sigmask(signal.SIG_BLOCK, [])), signal.getsignal(signal.SIGUSR2) == signal.SIG_DFL)\n"
        "sys.stderr.write(' '.join(sorted(os.environ)) + '|' + ' '.join(sorted(os.listdir('.'))) + '|sig' + sig + '|' + str(os.getuid()))\n";
    size_t n = 1 << 20;
    char *in = malloc(n + 1);
    for (size_t i = 0; i < n; i++)
        in[i] = (char)('a' + i % 26);
    in[n] = '\0';
    qd_sandbox_file f = {"main.py", prog, sizeof prog - 1};
    qd_sandbox_limits lim = qd_sandbox_limits_default();
    lim.wall_s = 20;
    qd_sandbox_result r;
    setenv("QD_SECRET_TOKEN", "grader-only", 1);
    /* the grader's blocked and ignored signals are not the program's */
    sigset_t usr1;
    sigemptyset(&usr1);
    sigaddset(&usr1, SIGUSR1);
    pthread_sigmask(SIG_BLOCK, &usr1, NULL);
    signal(SIGUSR2, SIG_IGN);
    ck_assert_int_eq(qd_sandbox_run(&lim, &f, 1, "main.py", in, n, &r), QD_OK);
    ck_assert_int_eq(r.outcome, QD_SANDBOX_EXITED);
    ck_assert_int_eq(r.exit_code, 0);
    ck_assert_uint_eq(r.out_len, n);
    ck_assert(!memcmp(r.out, in, n));
    ck_assert_msg(!strstr(r.err, "QD_SECRET_TOKEN"), "environment leaked: %s", r.err);
    ck_assert_msg(strstr(r.err, "|main.py|") != NULL, "directory not empty: %s", r.err);
    ck_assert_msg(strstr(r.err, "|sig01|") != NULL, "signals inherited: %s", r.err);
    if (geteuid() == 0)
        ck_assert_msg(strstr(r.err, "|65534") != NULL, "runs as: %s", r.err);
    qd_sandbox_result_free(&r);
    free(in);
    /* a bad file name is an argument error, not a run */
    qd_sandbox_file bad = {"../x.py", prog, 3};
    ck_assert_int_eq(qd_sandbox_run(&lim, &bad, 1, "../x.py", "", 0, &r), QD_ERR_ARG);
}
END_TEST

START_TEST(test_attack_fork_bomb)
{
    int before = geteuid() == 0 ? nobody_processes() : 0;
    double took;
    qd_code_result r = grade_attack("import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass\n",
                                    "ok", 2, &took);
    ck_assert(!r.correct);
    ck_assert_msg(r.verdict == QD_CODE_TIME_LIMIT || r.verdict == QD_CODE_RUNTIME_ERROR, "%s",
                  qd_code_verdict_name(r.verdict));
    ck_assert_msg(took < 6, "took %.1f s", took);
    if (jail_or_skip("fork bomb leaves no process"))
        ck_assert_int_le(nobody_processes(), before);
    qd_code_result_free(&r);
}
END_TEST

START_TEST(test_attack_memory_bomb)
{
    qd_code_result r = grade_attack("x = []\nwhile True:\n    x.append(bytearray(1 << 26))\n", "ok", 5, NULL);
    ck_assert_str_eq(qd_code_verdict_name(r.verdict), "memory_limit");
    qd_code_result_free(&r);
    r = grade_attack("x = bytearray(1 << 36)\n", "ok", 5, NULL);
    ck_assert_str_eq(qd_code_verdict_name(r.verdict), "memory_limit");
    qd_code_result_free(&r);
}
END_TEST

/* A program that never ends by itself fails with time_limit at the limit. */
static void expect_time_limit(const char *code)
{
    double took;
    qd_code_result r = grade_attack(code, "ok", 1, &took);
    ck_assert_str_eq(qd_code_verdict_name(r.verdict), "time_limit");
    ck_assert_msg(took < 3, "took %.1f s", took);
    qd_code_result_free(&r);
}

START_TEST(test_attack_infinite_loop) { expect_time_limit("while True:\n    pass\n"); }
END_TEST

START_TEST(test_attack_sleep) { expect_time_limit("import time\ntime.sleep(100)\nprint('ok')\n"); }
END_TEST

START_TEST(test_attack_endless_output)
{
    double took;
    qd_code_result r = grade_attack("while True:\n    print('x' * 4096)\n", "ok", 10, &took);
    ck_assert_str_eq(qd_code_verdict_name(r.verdict), "runtime_error");
    ck_assert_msg(strstr(r.detail, "output limit") != NULL, "%s", r.detail);
    ck_assert_msg(took < 8, "took %.1f s", took);
    qd_code_result_free(&r);
}
END_TEST

START_TEST(test_attack_write_outside)
{
    /* A world-writable directory and file of the host: the program tries
     * them, system directories, and its parent directory. */
    char dir[64];
    qd_test_mkdtemp(dir, sizeof dir, "sbxw");
    chmod(dir, 0777);
    char target[128];
    snprintf(target, sizeof target, "%s/target", dir);
    qd_test_write_file(target, "original");
    chmod(target, 0666);
    char *code = NULL;
    ck_assert_int_ge(asprintf(&code,
        "import os\n"
        "hits = []\n"
        "for p in ['%s', '%s/new', '/usr/qd_pwned', '/etc/qd_pwned', '/qd_pwned', '../qd_pwned', '/proc/qd_pwned', '/dev/qd_pwned']:\n"
        "    try:\n"
        "        with open(p, 'w') as f:\n"
        "            f.write('pwned')\n"
        "        hits.append(p)\n"
        "    except OSError:\n"
        "        pass\n"
        "if hits:\n"
        "    print('escaped', hits)\n"
        "else:\n"
        "    raise SystemError('contained')\n", target, dir), 0);
    qd_code_result r = grade_attack(code, "ok", 5, NULL);
    if (jail_or_skip("writing outside its directory")) {
        ck_assert_msg(r.verdict == QD_CODE_RUNTIME_ERROR, "%s: %s", qd_code_verdict_name(r.verdict), r.detail);
        ck_assert_str_eq(qd_test_read_file(target), "original");
        ck_assert_int_eq(qd_test_dir_entries(dir), 1);
    }
    ck_assert(!r.correct);
    qd_code_result_free(&r);
    free(code);
    qd_test_rm_tree(dir);
}
END_TEST

START_TEST(test_attack_read_grader_files)
{
    /* The expected output is a fresh secret; a world-readable host file
     * holds it too, and the program looks there, in the grader's /proc
     * entries, and in its own directory. Reading it would print it and be
     * accepted. */
    char dir[64], secret[64], path[128];
    qd_test_mkdtemp(dir, sizeof dir, "sbxr");
    chmod(dir, 0755);
    snprintf(secret, sizeof secret, "SECRET-%d-%ld", getpid(), (long)time(NULL));
    snprintf(path, sizeof path, "%s/expected.txt", dir);
    qd_test_write_file(path, secret);
    chmod(path, 0644);
    /* the grader holds it open without O_CLOEXEC, as a careless grader might */
    int leaked = open(path, O_RDONLY);
    ck_assert_int_ge(leaked, 3);
    char *code = NULL;
    ck_assert_int_ge(asprintf(&code,
        "import os\n"
        "cands = ['%s', '/proc/%d/environ', '/proc/%d/cmdline', '/proc/%d/mem', '/proc/1/environ']\n"
        "cands += os.listdir('.') + list(range(3, 256))\n"
        "for p in cands:\n"
        "    try:\n"
        "        with open(p, 'rb', closefd=not isinstance(p, int)) as f:\n"
        "            data = f.read(1 << 20).decode('latin-1')\n"
        "    except OSError:\n"
        "        continue\n"
        "    i = data.find('SEC' + 'RET-')\n"
        "    if i >= 0:\n"
        "        print(data[i:i + %zu])\n"
        "        raise SystemExit\n"
        "raise SystemError('nothing found')\n", path, getpid(), getpid(), getpid(), strlen(secret)), 0);
    qd_code_result r = grade_attack(code, secret, 5, NULL);
    close(leaked);
    if (jail_or_skip("reading a world-readable grader file")) {
        ck_assert(!r.correct);
        ck_assert_msg(r.verdict == QD_CODE_RUNTIME_ERROR, "%s: %s", qd_code_verdict_name(r.verdict), r.detail);
    }
    qd_code_result_free(&r);
    free(code);
    qd_test_rm_tree(dir);
}
END_TEST

START_TEST(test_attack_network)
{
    if (!jail_or_skip("network"))
        return;
    int ls = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t alen = sizeof a;
    ck_assert_int_eq(bind(ls, (struct sockaddr *)&a, sizeof a), 0);
    ck_assert_int_eq(listen(ls, 4), 0);
    ck_assert_int_eq(getsockname(ls, (struct sockaddr *)&a, &alen), 0);
    char *code = NULL;
    ck_assert_int_ge(asprintf(&code,
        "import socket\n"
        "for host, port in [('127.0.0.1', %d), ('1.1.1.1', 80), ('8.8.8.8', 53)]:\n"
        "    try:\n"
        "        socket.create_connection((host, port), timeout=1).close()\n"
        "        print('connected')\n"
        "        raise SystemExit\n"
        "    except OSError:\n"
        "        pass\n"
        "raise SystemError('no network')\n", ntohs(a.sin_port)), 0);
    qd_code_result r = grade_attack(code, "connected", 5, NULL);
    ck_assert_msg(r.verdict == QD_CODE_RUNTIME_ERROR, "%s: %s", qd_code_verdict_name(r.verdict), r.detail);
    int c = accept(ls, NULL, NULL);
    ck_assert_msg(c < 0 && (errno == EAGAIN || errno == EWOULDBLOCK), "the listener got a connection");
    close(ls);
    qd_code_result_free(&r);
    free(code);
}
END_TEST

typedef struct {
    qd_code_result r;
} sibling_arg;

static void *sibling(void *arg)
{
    sibling_arg *s = arg;
    s->r = grade_attack("import time\ntime.sleep(1.5)\nprint('ok')\n", "ok", 10, NULL);
    return NULL;
}

START_TEST(test_attack_kill_parent_and_siblings)
{
    /* A sibling sandbox runs meanwhile; the attack signals the grader's pid,
     * every process it can see, its process group, and pid 1. The grader
     * (this process) lives on to assert, and the sibling is accepted. */
    if (level() == QD_SANDBOX_RLIMITS) {
        /* the program runs as this user there and can kill this process */
        fprintf(stderr, "sandbox: skipping 'killing its parent': isolation is 'rlimits'\n");
        return;
    }
    sibling_arg s;
    pthread_t th;
    ck_assert_int_eq(pthread_create(&th, NULL, sibling, &s), 0);
    usleep(300000);
    char *code = NULL;
    ck_assert_int_ge(asprintf(&code,
        "import os, signal, time\n"
        "killed = []\n"
        "for pid in [%d, %d, -1] + [int(p) for p in os.listdir('/proc') if p.isdigit()]:\n"
        "    if pid in (os.getpid(),):\n"
        "        continue\n"
        "    try:\n"
        "        os.kill(pid, signal.SIGKILL)\n"
        "        killed.append(pid)\n"
        "    except OSError:\n"
        "        pass\n"
        "time.sleep(0.2)\n"
        "print('killed', killed)\n", getpid(), getppid()), 0);
    qd_code_result r = grade_attack(code, "nothing", 5, NULL);
    ck_assert(!r.correct);
    ck_assert_int_eq(pthread_join(th, NULL), 0);
    if (jail_or_skip("killing a sibling"))
        ck_assert_msg(s.r.correct, "the sibling died: %s %s", qd_code_verdict_name(s.r.verdict),
                      s.r.detail ? s.r.detail : "");
    qd_code_result_free(&s.r);
    qd_code_result_free(&r);
    free(code);
}
END_TEST

START_TEST(test_attack_background_process)
{
    /* A daemon in its own session that outlives the program and holds its
     * stdout: the run still ends at once, and the daemon is gone. */
    if (!jail_or_skip("background process"))
        return;
    char marker[64], *code = NULL;
    snprintf(marker, sizeof marker, "qd_daemon_%d_%ld", getpid(), (long)time(NULL));
    ck_assert_int_ge(asprintf(&code,
        "import os, sys\n"
        "if os.fork() == 0:\n"
        "    os.setsid()\n"
        "    if os.fork() == 0:\n"
        "        os.execv(sys.executable, [sys.executable, '-c', 'import time; time.sleep(60)', '%s'])\n"
        "    os._exit(0)\n"
        "print('started')\n", marker), 0);
    double took;
    qd_code_result r = grade_attack(code, "ok", 5, &took);
    ck_assert_str_eq(qd_code_verdict_name(r.verdict), "wrong_answer");
    ck_assert_msg(took < 4, "took %.1f s", took);
    usleep(200000);
    ck_assert_msg(!process_with_marker(marker), "the daemon survived");
    qd_code_result_free(&r);
    free(code);
}
END_TEST

Suite *suite_sandbox(void)
{
    Suite *s = suite_create("sandbox");
    TCase *tc = tcase_create("attacks");
    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, test_sandbox_basics);
    tcase_add_test(tc, test_attack_fork_bomb);
    tcase_add_test(tc, test_attack_memory_bomb);
    tcase_add_test(tc, test_attack_infinite_loop);
    tcase_add_test(tc, test_attack_sleep);
    tcase_add_test(tc, test_attack_endless_output);
    tcase_add_test(tc, test_attack_write_outside);
    tcase_add_test(tc, test_attack_read_grader_files);
    tcase_add_test(tc, test_attack_network);
    tcase_add_test(tc, test_attack_kill_parent_and_siblings);
    tcase_add_test(tc, test_attack_background_process);
    suite_add_tcase(s, tc);
    return s;
}
