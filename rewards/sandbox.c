/* The sandbox for model-written code (sandbox.h; docs/sandbox.md).
 *
 * The child is made with clone(2) rather than fork(2) so that, as root, it
 * starts in its own pid, network, mount and IPC namespaces: killing its pid 1
 * kills everything it started, it has no network but a loopback that is
 * down, and the filesystem it sees is a tmpfs built here. Between clone and
 * execve the child only makes system calls (the parent may be threaded, so
 * no malloc, no stdio, no locks there). */
#define _GNU_SOURCE
#include "rewards/sandbox.h"

#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <linux/close_range.h>
#include <limits.h>
#include <poll.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <sys/syscall.h>
#include <sys/time.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define SBX_ID 65534                /* nobody / nogroup */
#define SBX_ROOT "/tmp"             /* where the jail's tmpfs is mounted (in its own mount namespace) */
#define SBX_TMPFS "size=64m,nr_inodes=4096,mode=0755"
#define SBX_STACK (256 * 1024)
#define SBX_MAX_BINDS 16

/* A directory of the host shown read-only inside the jail (or a symlink to
 * one, recreated as a symlink: /bin -> usr/bin on merged-/usr systems). */
typedef struct {
    char path[PATH_MAX];
    char link[PATH_MAX]; /* symlink target; "" for a directory */
    unsigned long flags; /* the host mount's nosuid/nodev/noexec, which a read-only remount must keep */
} bind_dir;

static struct {
    pthread_once_t once;
    qd_status st;
    char err[PATH_MAX + 1024];
    qd_sandbox_level level;
    char python[PATH_MAX];
    bind_dir binds[SBX_MAX_BINDS];
    int nbinds;
} g = {.once = PTHREAD_ONCE_INIT};

qd_sandbox_limits qd_sandbox_limits_default(void)
{
    return (qd_sandbox_limits){
        .wall_s = 6.0, .cpu_s = 6, .mem_bytes = (size_t)4 << 30, .nproc = 64,
        .nofile = 64, .fsize_bytes = (size_t)16 << 20, .output_bytes = (size_t)16 << 20,
    };
}

const char *qd_sandbox_level_name(qd_sandbox_level level)
{
    static const char *const names[] = {"jail", "uid", "rlimits"};
    return (unsigned)level < 3 ? names[level] : "?";
}

/* ---- the child (system calls only) */

typedef struct {
    qd_sandbox_level level;
    const qd_sandbox_limits *lim;
    const qd_sandbox_file *files;
    int nfiles;
    const char *workdir; /* host directory (UID, RLIMITS); NULL in the jail */
    int in_fd, out_fd, err_fd, report_fd;
    char *const *argv;
    char *const *envp;
} child_args;

/* What failed before execve: a step name and errno, sent over report_fd. */
typedef struct {
    char step[48];
    int err;
} child_report;

static __attribute__((noreturn)) void child_fail(const child_args *a, const char *step)
{
    child_report r = {.err = errno};
    size_t n = strlen(step);
    memcpy(r.step, step, n < sizeof r.step - 1 ? n : sizeof r.step - 1);
    if (write(a->report_fd, &r, sizeof r) < 0)
        _exit(126);
    _exit(127);
}

/* dst = a + b, truncation-safe (no snprintf between clone and exec). */
static void cat2(char *dst, size_t cap, const char *a, const char *b)
{
    size_t i = 0;
    for (; *a && i + 1 < cap; a++)
        dst[i++] = *a;
    for (; *b && i + 1 < cap; b++)
        dst[i++] = *b;
    dst[i] = '\0';
}

static int mkdir_p(char *path, mode_t mode)
{
    for (char *p = path + 1; *p; p++)
        if (*p == '/') {
            *p = '\0';
            int rc = mkdir(path, mode);
            *p = '/';
            if (rc && errno != EEXIST)
                return -1;
        }
    return mkdir(path, mode) && errno != EEXIST ? -1 : 0;
}

static int write_all(int fd, const char *p, size_t n)
{
    while (n) {
        ssize_t w = write(fd, p, n);
        if (w < 0 && errno == EINTR)
            continue;
        if (w <= 0)
            return -1;
        p += w;
        n -= (size_t)w;
    }
    return 0;
}

/* Writes the program's files into dir (owned by root, read-only). */
static int place_files(const child_args *a, const char *dir)
{
    char p[PATH_MAX];
    for (int i = 0; i < a->nfiles; i++) {
        char name[NAME_MAX + 2];
        cat2(name, sizeof name, "/", a->files[i].name);
        cat2(p, sizeof p, dir, name);
        int fd = open(p, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0444);
        if (fd < 0)
            return -1;
        int rc = write_all(fd, a->files[i].data, a->files[i].len);
        close(fd);
        if (rc)
            return -1;
    }
    return 0;
}

/* The jail: a tmpfs root with the system directories bound read-only, a
 * few device nodes, its own /proc, and /tmp (the working directory) as the
 * only place the sandbox user may write. */
static void build_jail(const child_args *a)
{
    char p[PATH_MAX];
    if (mount(NULL, "/", NULL, MS_REC | MS_PRIVATE, NULL))
        child_fail(a, "make mounts private");
    if (mount("tmpfs", SBX_ROOT, "tmpfs", MS_NOSUID | MS_NODEV, SBX_TMPFS))
        child_fail(a, "mount tmpfs");
    for (int i = 0; i < g.nbinds; i++) {
        const bind_dir *b = &g.binds[i];
        cat2(p, sizeof p, SBX_ROOT, b->path);
        if (b->link[0]) {
            if (symlink(b->link, p))
                child_fail(a, "symlink system directory");
            continue;
        }
        if (mkdir_p(p, 0755))
            child_fail(a, "mkdir system directory");
        if (mount(b->path, p, NULL, MS_BIND | MS_REC, NULL))
            child_fail(a, "bind system directory");
        if (mount(NULL, p, NULL, MS_REMOUNT | MS_BIND | MS_RDONLY | b->flags, NULL))
            child_fail(a, "remount system directory read-only");
    }
    static const char *const devs[] = {"/dev/null", "/dev/zero", "/dev/urandom", "/dev/random"};
    cat2(p, sizeof p, SBX_ROOT, "/dev");
    if (mkdir(p, 0755))
        child_fail(a, "mkdir /dev");
    for (int i = 0; i < 4; i++) {
        cat2(p, sizeof p, SBX_ROOT, devs[i]);
        int fd = open(p, O_WRONLY | O_CREAT | O_CLOEXEC, 0666);
        if (fd < 0)
            child_fail(a, "create device node");
        close(fd);
        if (mount(devs[i], p, NULL, MS_BIND, NULL))
            child_fail(a, "bind device node");
    }
    cat2(p, sizeof p, SBX_ROOT, "/proc");
    if (mkdir(p, 0555))
        child_fail(a, "mkdir /proc");
    /* Its own /proc shows only its own processes; a container may refuse a
     * new proc mount, and Python runs without one. */
    (void)mount("proc", p, "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC, NULL);
    cat2(p, sizeof p, SBX_ROOT, "/tmp");
    if (mkdir(p, 0700))
        child_fail(a, "mkdir /tmp");
    if (place_files(a, p))
        child_fail(a, "write program files");
    if (chown(p, SBX_ID, SBX_ID))
        child_fail(a, "chown /tmp");
    if (chdir(SBX_ROOT) || chroot(SBX_ROOT) || chdir("/tmp"))
        child_fail(a, "chroot");
}

static void set_limit(const child_args *a, int res, rlim_t soft, rlim_t hard)
{
    struct rlimit rl = {soft, hard};
    if (setrlimit(res, &rl))
        child_fail(a, "setrlimit");
}

/* Every descriptor above 2 closes at exec: the grader may hold files open
 * without O_CLOEXEC (its logs, its inputs), and the program must not get
 * them. The report pipe stays usable until then. */
static void cloexec_all(const child_args *a)
{
    if (!syscall(SYS_close_range, 3U, ~0U, CLOSE_RANGE_CLOEXEC))
        return;
    struct rlimit rl;
    rlim_t max = !getrlimit(RLIMIT_NOFILE, &rl) && rl.rlim_cur < (1u << 20) ? rl.rlim_cur : (1u << 20);
    for (rlim_t fd = 3; fd < max; fd++) /* Linux < 5.11 */
        if (fcntl((int)fd, F_SETFD, FD_CLOEXEC) && errno != EBADF)
            child_fail(a, "close-on-exec");
}

static int child_main(void *arg)
{
    const child_args *a = arg;
    const qd_sandbox_limits *lim = a->lim;
    if (dup2(a->in_fd, 0) < 0 || dup2(a->out_fd, 1) < 0 || dup2(a->err_fd, 2) < 0)
        child_fail(a, "dup2");
    cloexec_all(a);
    /* Ignored signals and the signal mask survive exec: the program starts
     * with neither of the grader's (a blocked SIGXCPU would void RLIMIT_CPU). */
    sigset_t none;
    sigemptyset(&none);
    if (sigprocmask(SIG_SETMASK, &none, NULL))
        child_fail(a, "sigprocmask");
    for (int sig = 1; sig < NSIG; sig++)
        signal(sig, SIG_DFL); /* fails harmlessly for SIGKILL, SIGSTOP and glibc's own */
    if (a->level == QD_SANDBOX_JAIL)
        build_jail(a);
    else if (setsid() < 0 || chdir(a->workdir))
        child_fail(a, "setsid/chdir");
    /* Raw system calls: glibc's setuid() in a process it believes threaded
     * (the child's memory is a copy of a threaded parent's) waits for the
     * other threads to follow, and they do not exist here. */
    if (a->level != QD_SANDBOX_RLIMITS &&
        (syscall(SYS_setgroups, 0, NULL) || syscall(SYS_setresgid, SBX_ID, SBX_ID, SBX_ID) ||
         syscall(SYS_setresuid, SBX_ID, SBX_ID, SBX_ID)))
        child_fail(a, "drop to nobody");
    /* Limits after setuid: setuid past RLIMIT_NPROC would fail the exec. */
    set_limit(a, RLIMIT_CPU, (rlim_t)lim->cpu_s, (rlim_t)lim->cpu_s + 1);
    set_limit(a, RLIMIT_AS, lim->mem_bytes, lim->mem_bytes);
    set_limit(a, RLIMIT_NPROC, (rlim_t)lim->nproc, (rlim_t)lim->nproc);
    set_limit(a, RLIMIT_NOFILE, (rlim_t)lim->nofile, (rlim_t)lim->nofile);
    set_limit(a, RLIMIT_FSIZE, lim->fsize_bytes, lim->fsize_bytes);
    set_limit(a, RLIMIT_CORE, 0, 0);
    if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0))
        child_fail(a, "no_new_privs");
    /* After setuid, which clears it: if the grader dies, so does the run. */
    if (prctl(PR_SET_PDEATHSIG, SIGKILL, 0, 0, 0))
        child_fail(a, "pdeathsig");
    execve(g.python, a->argv, a->envp);
    child_fail(a, "execve python3");
}

/* ---- the parent */

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

typedef struct {
    char *buf;
    size_t len, cap, limit;
    int fd;
} sink;

/* Reads what is there; 1 at EOF, -1 past the limit, 0 otherwise. */
static int sink_read(sink *s)
{
    char tmp[65536];
    ssize_t r = read(s->fd, tmp, sizeof tmp);
    if (r < 0)
        return errno == EAGAIN || errno == EINTR ? 0 : 1;
    if (r == 0)
        return 1;
    if (s->len + (size_t)r > s->limit)
        return -1;
    if (s->len + (size_t)r + 1 > s->cap) {
        size_t cap = s->cap ? s->cap : 4096;
        while (cap < s->len + (size_t)r + 1)
            cap *= 2;
        char *nb = realloc(s->buf, cap);
        if (!nb)
            return -1;
        s->buf = nb;
        s->cap = cap;
    }
    memcpy(s->buf + s->len, tmp, (size_t)r);
    s->len += (size_t)r;
    return 0;
}

static void close_fd(int *fd)
{
    if (*fd >= 0)
        close(*fd);
    *fd = -1;
}

static void kill_tree(qd_sandbox_level level, pid_t pid)
{
    /* In the jail the child is its pid namespace's init: the kernel then
     * kills every process in the namespace. Elsewhere it leads a session. */
    if (level != QD_SANDBOX_JAIL)
        kill(-pid, SIGKILL);
    kill(pid, SIGKILL);
}

/* Feeds stdin, collects stdout/stderr, and enforces the wall clock and the
 * output cap until the child has exited and its outputs are closed. */
static void supervise(qd_sandbox_level level, const qd_sandbox_limits *lim, pid_t pid,
                      int *in_w, const char *in, size_t in_len, sink *out, sink *err,
                      qd_sandbox_result *res, int *status, struct rusage *ru)
{
    double t0 = now_s();
    size_t in_off = 0;
    bool exited = false, killed = false;
    int pidfd = (int)syscall(SYS_pidfd_open, pid, 0);
    if (in_len == 0)
        close_fd(in_w);
    for (;;) {
        if (!exited && wait4(pid, status, WNOHANG, ru) == pid) {
            exited = true;
            close_fd(&pidfd);
            if (level != QD_SANDBOX_JAIL)
                kill(-pid, SIGKILL); /* what it left behind in its session */
        }
        if (exited && out->fd < 0 && err->fd < 0)
            break;
        double left = lim->wall_s - (now_s() - t0);
        if (left <= 0 || killed) {
            if (!exited) {
                kill_tree(level, pid);
                if (!killed)
                    res->outcome = QD_SANDBOX_TIMEOUT;
                wait4(pid, status, 0, ru);
                exited = true;
            }
            close_fd(&out->fd);
            close_fd(&err->fd);
            break;
        }
        struct pollfd p[4];
        int n = 0;
        int io = -1, oo = -1, eo = -1;
        if (*in_w >= 0)
            p[io = n++] = (struct pollfd){.fd = *in_w, .events = POLLOUT};
        if (out->fd >= 0)
            p[oo = n++] = (struct pollfd){.fd = out->fd, .events = POLLIN};
        if (err->fd >= 0)
            p[eo = n++] = (struct pollfd){.fd = err->fd, .events = POLLIN};
        if (pidfd >= 0)
            p[n++] = (struct pollfd){.fd = pidfd, .events = POLLIN};
        int ms = (int)(left * 1000) + 1;
        if (pidfd < 0 && !exited && ms > 20)
            ms = 20; /* no pidfd (Linux < 5.3): look for the exit now and then */
        if (poll(p, (nfds_t)n, ms) < 0 && errno != EINTR) {
            killed = true; /* cannot watch it any more: stop it (next turn) */
            continue;
        }
        if (io >= 0 && p[io].revents) {
            ssize_t w = send(*in_w, in + in_off, in_len - in_off, MSG_NOSIGNAL | MSG_DONTWAIT);
            if (w > 0)
                in_off += (size_t)w;
            if ((w < 0 && errno != EAGAIN && errno != EINTR) || in_off == in_len)
                close_fd(in_w);
        }
        sink *sk[2] = {out, err};
        int idx[2] = {oo, eo};
        for (int k = 0; k < 2; k++) {
            if (idx[k] < 0 || !p[idx[k]].revents)
                continue;
            int r = sink_read(sk[k]);
            if (r > 0)
                close_fd(&sk[k]->fd);
            else if (r < 0) {
                res->outcome = QD_SANDBOX_OUTPUT_LIMIT;
                killed = true;
            }
        }
    }
    close_fd(&pidfd);
    close_fd(in_w);
    res->wall_s = now_s() - t0;
}

static int rm_entry(const char *path, const struct stat *sb, int type, struct FTW *ftw)
{
    return remove(path);
}

/* The host directory of a UID/RLIMITS run, with the program's files. */
static qd_status make_workdir(qd_sandbox_level level, const qd_sandbox_file *files, int nfiles,
                              char *dir, size_t cap)
{
    const char *tmp = getenv("TMPDIR");
    snprintf(dir, cap, "%s/qd_sandbox_XXXXXX", tmp && *tmp ? tmp : "/tmp");
    if (!mkdtemp(dir))
        return qd_error(QD_ERR_IO, "sandbox: mkdtemp %s: %s", dir, strerror(errno));
    for (int i = 0; i < nfiles; i++) {
        char p[PATH_MAX];
        snprintf(p, sizeof p, "%s/%s", dir, files[i].name);
        int fd = open(p, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0444);
        int rc = fd < 0 ? -1 : write_all(fd, files[i].data, files[i].len);
        if (fd >= 0)
            close(fd);
        if (rc)
            return qd_error(QD_ERR_IO, "sandbox: writing %s: %s", p, strerror(errno));
    }
    if (level == QD_SANDBOX_UID && chown(dir, SBX_ID, SBX_ID))
        return qd_error(QD_ERR_IO, "sandbox: chown %s: %s", dir, strerror(errno));
    return QD_OK;
}

static bool valid_files(const qd_sandbox_file *files, int nfiles, const char *script)
{
    bool has_script = false;
    for (int i = 0; i < nfiles; i++) {
        const char *n = files[i].name;
        if (!*n || strchr(n, '/') || !strcmp(n, ".") || !strcmp(n, "..") || strlen(n) > NAME_MAX)
            return false;
        has_script |= !strcmp(n, script);
    }
    return has_script;
}

static qd_status run_at(qd_sandbox_level level, const qd_sandbox_limits *lim,
                        const qd_sandbox_file *files, int nfiles, const char *script,
                        const char *in, size_t in_len, qd_sandbox_result *res)
{
    memset(res, 0, sizeof *res);
    if (!valid_files(files, nfiles, script))
        return qd_error(QD_ERR_ARG, "sandbox: file names must be plain names and include the script '%s'", script);
    char workdir[PATH_MAX] = "";
    qd_status st = QD_OK;
    if (level != QD_SANDBOX_JAIL && (st = make_workdir(level, files, nfiles, workdir, sizeof workdir)))
        goto cleanup_dir;
    bool jail = level == QD_SANDBOX_JAIL;
    char home[PATH_MAX + 8], tmpdir[PATH_MAX + 8];
    snprintf(home, sizeof home, "HOME=%s", jail ? "/tmp" : workdir);
    snprintf(tmpdir, sizeof tmpdir, "TMPDIR=%s", jail ? "/tmp" : workdir);
    char *envp[] = {"PATH=/usr/local/bin:/usr/bin:/bin", home, tmpdir, "LANG=C.UTF-8",
                    "LC_ALL=C.UTF-8", "PYTHONHASHSEED=0", "PYTHONIOENCODING=utf-8", NULL};
    char *argv[] = {g.python, "-sB", (char *)script, NULL};
    int sin[2] = {-1, -1}, sout[2] = {-1, -1}, serr[2] = {-1, -1}, rep[2] = {-1, -1};
    /* stdin is a socket so that writing to a child that stopped reading is
     * EPIPE (MSG_NOSIGNAL), not a SIGPIPE in the grader. Every descriptor is
     * close-on-exec so that runs in other threads do not inherit it. */
    if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sin) || pipe2(sout, O_CLOEXEC) ||
        pipe2(serr, O_CLOEXEC) || pipe2(rep, O_CLOEXEC)) {
        st = qd_error(QD_ERR_IO, "sandbox: pipes: %s", strerror(errno));
        goto cleanup_fds;
    }
    child_args ca = {.level = level, .lim = lim, .files = files, .nfiles = nfiles,
                     .workdir = workdir, .in_fd = sin[1], .out_fd = sout[1], .err_fd = serr[1],
                     .report_fd = rep[1], .argv = argv, .envp = envp};
    char *stack = malloc(SBX_STACK);
    if (!stack) {
        st = qd_error(QD_ERR_NOMEM, "sandbox: no memory for the child's stack");
        goto cleanup_fds;
    }
    int flags = SIGCHLD;
    if (jail)
        flags |= CLONE_NEWPID | CLONE_NEWNET | CLONE_NEWNS | CLONE_NEWIPC | CLONE_NEWUTS;
    pid_t pid = clone(child_main, stack + SBX_STACK, flags, &ca);
    int clone_errno = errno;
    free(stack);
    if (pid < 0) {
        st = qd_error(QD_ERR_UNSUPPORTED, "sandbox: clone: %s", strerror(clone_errno));
        goto cleanup_fds;
    }
    close_fd(&sin[1]);
    close_fd(&sout[1]);
    close_fd(&serr[1]);
    close_fd(&rep[1]);
    fcntl(sout[0], F_SETFL, O_NONBLOCK);
    fcntl(serr[0], F_SETFL, O_NONBLOCK);
    sink out = {.fd = sout[0], .limit = lim->output_bytes};
    sink err = {.fd = serr[0], .limit = lim->output_bytes};
    sout[0] = serr[0] = -1;
    int in_w = sin[0];
    sin[0] = -1;
    int status = 0;
    struct rusage ru = {0};
    supervise(level, lim, pid, &in_w, in, in_len, &out, &err, res, &status, &ru);
    child_report cr;
    ssize_t rr = read(rep[0], &cr, sizeof cr);
    if (rr == (ssize_t)sizeof cr) {
        cr.step[sizeof cr.step - 1] = '\0';
        st = qd_error(QD_ERR_UNSUPPORTED, "sandbox (%s): %s: %s", qd_sandbox_level_name(level),
                      cr.step, strerror(cr.err));
        free(out.buf);
        free(err.buf);
        goto cleanup_fds;
    }
    res->out = out.buf ? out.buf : calloc(1, 1);
    res->out_len = out.len;
    res->err = err.buf ? err.buf : calloc(1, 1);
    res->err_len = err.len;
    if (!res->out || !res->err) {
        qd_sandbox_result_free(res);
        st = qd_error(QD_ERR_NOMEM, "sandbox: no memory for the output");
        goto cleanup_fds;
    }
    res->out[res->out_len] = '\0';
    res->err[res->err_len] = '\0';
    if (res->outcome == QD_SANDBOX_EXITED) { /* not TIMEOUT / OUTPUT_LIMIT already */
        double cpu = (double)ru.ru_utime.tv_sec + (double)ru.ru_stime.tv_sec;
        if (WIFEXITED(status))
            res->exit_code = WEXITSTATUS(status);
        else if (WTERMSIG(status) == SIGXCPU || (WTERMSIG(status) == SIGKILL && cpu >= lim->cpu_s))
            res->outcome = QD_SANDBOX_TIMEOUT;
        else {
            res->outcome = QD_SANDBOX_SIGNALED;
            res->signal = WTERMSIG(status);
        }
    }
cleanup_fds:
    for (int i = 0; i < 2; i++) {
        close_fd(&sin[i]);
        close_fd(&sout[i]);
        close_fd(&serr[i]);
        close_fd(&rep[i]);
    }
cleanup_dir:
    if (workdir[0])
        nftw(workdir, rm_entry, 16, FTW_DEPTH | FTW_PHYS);
    return st;
}

void qd_sandbox_result_free(qd_sandbox_result *res)
{
    free(res->out);
    free(res->err);
    res->out = res->err = NULL;
}

/* ---- choosing the interpreter and the isolation (once per process) */

static bool is_elf(const char *path)
{
    char m[4] = {0};
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return false;
    bool ok = read(fd, m, 4) == 4 && !memcmp(m, "\177ELF", 4);
    close(fd);
    return ok && access(path, X_OK) == 0;
}

/* Can everyone reach and run path (every directory searchable by others,
 * the file executable by others)? nobody must, where there is no jail. */
static bool world_runnable(const char *path)
{
    char p[PATH_MAX];
    snprintf(p, sizeof p, "%s", path);
    struct stat st;
    if (stat(p, &st) || !(st.st_mode & S_IXOTH))
        return false;
    for (char *s = strrchr(p, '/'); s && s != p; s = strrchr(p, '/')) {
        *s = '\0';
        if (stat(p, &st) || !(st.st_mode & S_IXOTH))
            return false;
    }
    return true;
}

/* A python3 that is a real executable (pyenv-style shims are shell scripts
 * that need their own environment: they are skipped): $QD_PYTHON, else the
 * first on PATH, then /usr/bin/python3; as root, the first of those that
 * nobody can run (an interpreter under /root is not) wins over the others. */
static bool find_python(char *out)
{
    const char *env = getenv("QD_PYTHON");
    if (env && *env)
        return realpath(env, out) && is_elf(out);
    const char *path = getenv("PATH");
    size_t len = strlen(path ? path : "");
    char *copy = malloc(len + sizeof ":/usr/bin");
    if (!copy)
        return false;
    snprintf(copy, len + sizeof ":/usr/bin", "%s:/usr/bin", path ? path : "");
    bool found = false, root = geteuid() == 0;
    char real[PATH_MAX];
    for (char *save = NULL, *d = strtok_r(copy, ":", &save); d; d = strtok_r(NULL, ":", &save)) {
        char cand[PATH_MAX];
        snprintf(cand, sizeof cand, "%s/python3", d);
        if (!realpath(cand, real) || !is_elf(real))
            continue;
        if (!found)
            snprintf(out, PATH_MAX, "%s", real);
        found = true;
        if (!root || world_runnable(real)) {
            snprintf(out, PATH_MAX, "%s", real);
            break;
        }
    }
    free(copy);
    return found;
}

static void add_bind(const char *path)
{
    struct stat st;
    if (g.nbinds == SBX_MAX_BINDS || lstat(path, &st))
        return;
    bind_dir *b = &g.binds[g.nbinds];
    snprintf(b->path, sizeof b->path, "%s", path);
    b->link[0] = '\0';
    if (S_ISLNK(st.st_mode)) {
        ssize_t n = readlink(path, b->link, sizeof b->link - 1);
        if (n <= 0)
            return;
        b->link[n] = '\0';
    } else if (!S_ISDIR(st.st_mode))
        return;
    struct statvfs vfs;
    b->flags = 0;
    if (!statvfs(path, &vfs))
        b->flags = (vfs.f_flag & ST_NOSUID ? MS_NOSUID : 0) | (vfs.f_flag & ST_NODEV ? MS_NODEV : 0) |
                   (vfs.f_flag & ST_NOEXEC ? MS_NOEXEC : 0);
    g.nbinds++;
}

/* System directories, and the interpreter's installation when it lives
 * elsewhere (/opt/python, ~/.pyenv/versions/X). */
static void plan_binds(void)
{
    static const char *const sys_dirs[] = {"/usr", "/bin", "/sbin", "/lib", "/lib64", "/lib32", "/etc"};
    for (size_t i = 0; i < sizeof sys_dirs / sizeof sys_dirs[0]; i++)
        add_bind(sys_dirs[i]);
    char prefix[PATH_MAX];
    snprintf(prefix, sizeof prefix, "%s", g.python);
    for (int up = 0; up < 2; up++) { /* PREFIX/bin/python3.X -> PREFIX */
        char *s = strrchr(prefix, '/');
        if (s && s != prefix)
            *s = '\0';
    }
    for (int i = 0; i < g.nbinds; i++) {
        size_t n = strlen(g.binds[i].path);
        if (!strncmp(prefix, g.binds[i].path, n) && (prefix[n] == '/' || !prefix[n]))
            return;
    }
    add_bind(prefix);
}

/* Runs a program that must print 42; returns whether it did. */
static bool probe(qd_sandbox_level level)
{
    static const char prog[] = "print(6 * 7)\n";
    qd_sandbox_file f = {"probe.py", prog, sizeof prog - 1};
    qd_sandbox_limits lim = qd_sandbox_limits_default();
    lim.wall_s = 30; /* a cold start on a busy machine */
    qd_sandbox_result r;
    if (run_at(level, &lim, &f, 1, "probe.py", "", 0, &r)) {
        snprintf(g.err, sizeof g.err, "%s", qd_last_error());
        return false;
    }
    bool ok = r.outcome == QD_SANDBOX_EXITED && r.exit_code == 0 && !strcmp(r.out, "42\n");
    if (!ok)
        snprintf(g.err, sizeof g.err, "sandbox (%s): %s -c 'print(6*7)' failed: %.300s",
                 qd_sandbox_level_name(level), g.python, r.err);
    qd_sandbox_result_free(&r);
    return ok;
}

/* QD_SANDBOX_LEVEL caps the isolation (to debug, or where a probe of the
 * jail would be unwelcome); it cannot raise it. */
static bool level_cap(qd_sandbox_level *cap)
{
    const char *want = getenv("QD_SANDBOX_LEVEL");
    *cap = QD_SANDBOX_JAIL;
    if (!want || !*want)
        return true;
    for (int l = QD_SANDBOX_JAIL; l <= QD_SANDBOX_RLIMITS; l++)
        if (!strcmp(want, qd_sandbox_level_name((qd_sandbox_level)l))) {
            *cap = (qd_sandbox_level)l;
            return true;
        }
    g.st = QD_ERR_ARG;
    snprintf(g.err, sizeof g.err, "sandbox: QD_SANDBOX_LEVEL '%s': expected jail, uid or rlimits", want);
    return false;
}

static void init_once(void)
{
    qd_sandbox_level cap;
    if (!level_cap(&cap))
        return;
    if (!find_python(g.python)) {
        g.st = QD_ERR_UNSUPPORTED;
        snprintf(g.err, sizeof g.err,
                 "sandbox: no python3 found (looked at $QD_PYTHON, python3 on PATH, /usr/bin/python3; "
                 "a script such as a pyenv shim does not count): install python3 or set QD_PYTHON");
        return;
    }
    plan_binds();
    bool root = geteuid() == 0;
    if (root && cap == QD_SANDBOX_JAIL && probe(QD_SANDBOX_JAIL)) {
        g.level = QD_SANDBOX_JAIL;
        return;
    }
    if (root && cap <= QD_SANDBOX_UID) {
        fprintf(stderr, "quads: warning: the code sandbox runs without namespaces (%s); "
                        "model-written code runs as nobody with rlimits but WITH network access "
                        "(docs/sandbox.md)\n", cap == QD_SANDBOX_JAIL ? g.err : "QD_SANDBOX_LEVEL=uid");
        g.level = QD_SANDBOX_UID;
    } else {
        fprintf(stderr, "quads: warning: %s: the code sandbox runs model-written code as this "
                        "user with rlimits only, with network access and this user's files "
                        "(docs/sandbox.md)\n", root ? "QD_SANDBOX_LEVEL=rlimits" : "not root");
        g.level = QD_SANDBOX_RLIMITS;
    }
    if (!probe(g.level))
        g.st = QD_ERR_UNSUPPORTED;
}

qd_status qd_sandbox_isolation(qd_sandbox_level *level, const char **python)
{
    pthread_once(&g.once, init_once);
    if (g.st)
        return qd_error(g.st, "%s", g.err);
    if (level)
        *level = g.level;
    if (python)
        *python = g.python;
    return QD_OK;
}

qd_status qd_sandbox_run(const qd_sandbox_limits *lim, const qd_sandbox_file *files, int nfiles,
                         const char *script, const char *stdin_data, size_t stdin_len,
                         qd_sandbox_result *res)
{
    qd_sandbox_level level = QD_SANDBOX_JAIL;
    qd_status st = qd_sandbox_isolation(&level, NULL);
    if (st) {
        memset(res, 0, sizeof *res);
        return st;
    }
    return run_at(level, lim, files, nfiles, script, stdin_data, stdin_len, res);
}
