/* Test helper of dist/: every rank a fork()ed process (dist_ranks.h). */
#include <check.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#include "quant/status.h"
#include "tests/dist_ranks.h"

double qd_test_now(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

int qd_test_note(qd_rank_result *res, int st, double t0)
{
    res->st = st;
    res->elapsed = qd_test_now() - t0;
    snprintf(res->msg, sizeof res->msg, "%s", st ? qd_last_error() : "");
    return st;
}

/* A port nobody listens on now (the kernel's pick for port 0). */
static int free_port(void)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t n = sizeof a;
    ck_assert_int_eq(bind(fd, (struct sockaddr *)&a, sizeof a), 0);
    ck_assert_int_eq(getsockname(fd, (struct sockaddr *)&a, &n), 0);
    close(fd);
    return ntohs(a.sin_port);
}

static void write_all(int fd, const void *buf, size_t n)
{
    for (const char *p = buf; n > 0;) {
        ssize_t k = write(fd, p, n);
        if (k <= 0)
            _exit(3);
        p += k;
        n -= (size_t)k;
    }
}

/* The child: run body as rank r, report through fd, never return. */
static void child(int r, int world, int port, double connect_s, double op_s, qd_rank_body body, int fd)
{
    qd_rdzv_opts o = {.rank = r, .world_size = world, .master_addr = "127.0.0.1", .port = port,
                      .run_id = qd_rdzv_run_id("test run"), .connect_timeout_s = connect_s, .op_timeout_s = op_s};
    qd_rank_result mine = {.st = -1};
    body(&o, &mine);
    write_all(fd, &mine, sizeof mine);
    _exit(0);
}

/* Reads rank r's report (or marks it missing) and reaps the process. */
static void collect(int fd, pid_t pid, qd_rank_result *res)
{
    struct pollfd pf = {.fd = fd, .events = POLLIN};
    size_t got = 0;
    while (got < sizeof *res && poll(&pf, 1, 15000) > 0) {
        ssize_t k = read(fd, (char *)res + got, sizeof *res - got);
        if (k <= 0)
            break;
        got += (size_t)k;
    }
    close(fd);
    if (got != sizeof *res) { /* a rank that exits on purpose, or one that hangs */
        kill(pid, SIGKILL);
        *res = (qd_rank_result){.st = -100, .msg = "did not report"};
    }
    waitpid(pid, NULL, 0);
}

void qd_test_run_ranks(int world, qd_rank_body body, qd_rank_result *res, double connect_s, double op_s)
{
    int port = free_port(), fds[QD_TEST_MAX_WORLD];
    pid_t pid[QD_TEST_MAX_WORLD];
    ck_assert_int_le(world, QD_TEST_MAX_WORLD);
    for (int r = 0; r < world; r++) {
        int p[2];
        ck_assert_int_eq(pipe(p), 0);
        pid[r] = fork();
        ck_assert_int_ge(pid[r], 0);
        if (pid[r] == 0) {
            close(p[0]);
            child(r, world, port, connect_s, op_s, body, p[1]);
        }
        close(p[1]);
        fds[r] = p[0];
    }
    for (int r = 0; r < world; r++)
        collect(fds[r], pid[r], &res[r]);
}

void qd_test_expect_failure(const qd_rank_result *res, int world, int except, int st, const char *a,
                            const char *b, double within)
{
    for (int r = 0; r < world; r++) {
        if (r == except)
            continue;
        ck_assert_msg(res[r].st == st, "rank %d: status %d, expected %d (%s)", r, res[r].st, st, res[r].msg);
        ck_assert_msg(strstr(res[r].msg, a) && (!b || strstr(res[r].msg, b)), "rank %d: '%s' lacks '%s' / '%s'",
                      r, res[r].msg, a, b ? b : "");
        ck_assert_msg(res[r].elapsed < within, "rank %d took %.2f s", r, res[r].elapsed);
    }
}
