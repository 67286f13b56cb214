/* dist/rendezvous: the TCP star of rendezvous.h.
 *
 * Wire format (big-endian): every message is a 24-byte header
 *   u8 type, u8 kind, u16 label_len, u32 seq, u64 size, u64 payload_len
 * then label_len bytes of label, then payload_len bytes of payload.
 *   HELLO   rank -> 0   payload: u32 magic, u32 version, u32 rank, u32 world, u64 run_id
 *   WELCOME 0 -> rank   every rank has joined
 *   REFUSE  0 -> rank   payload: why (text); the connection is then closed
 *   ARRIVE  rank -> 0   a rank entered collective seq (kind, label, size);
 *                       allgather: payload = its n bytes
 *   RESULT  0 -> rank   collective seq done; payload: bcast n bytes, allgather world*n
 *   ABORT   either way  payload: the failure, a sentence naming the failed rank;
 *                       rank 0 relays the ones it receives to every rank */
#define _GNU_SOURCE /* MSG_NOSIGNAL */
#include <errno.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <fcntl.h>
#include <unistd.h>
#include "dist/rendezvous.h"

enum { T_HELLO = 1, T_WELCOME, T_REFUSE, T_ARRIVE, T_RESULT, T_ABORT };
enum { K_NONE = 0, K_BCAST, K_ALLGATHER, K_BARRIER };

#define HDR_BYTES 24
#define HELLO_BYTES 24
#define HELLO_MAGIC 0x5144525au /* "QDRZ" */
#define HELLO_VERSION 1u
#define LABEL_MAX 64
#define TEXT_MAX 512
/* how long a failing rank tries to deliver its abort message */
#define ABORT_SEND_S 0.5

struct qd_rdzv {
    int rank, world;
    double op_timeout;
    uint32_t seq; /* collectives so far */
    int *fd;      /* rank 0: fd[i] = rank i's connection (-1: none); others: fd[0] = rank 0 */
    int dead;     /* after the first failure every call returns `why` */
    char why[TEXT_MAX];
};

typedef struct {
    uint8_t type, kind;
    uint32_t seq;
    uint64_t size, len;
    char label[LABEL_MAX + 1];
} msg_hdr;

/* one collective, as rank 0 and its messages describe it */
typedef struct {
    int kind;
    const char *label;
    size_t size;
} op_desc;

typedef enum { IO_OK, IO_EOF, IO_TIMEOUT, IO_ERR } io_res;

/* ---- time and bytes */

static double now_s(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static int ms_left(double deadline)
{
    double ms = (deadline - now_s()) * 1e3;
    return ms <= 0 ? 0 : ms > 1e9 ? 1000000000 : (int)ms + 1;
}

static void put_be(uint8_t *p, uint64_t x, int bytes)
{
    for (int i = bytes - 1; i >= 0; i--, x >>= 8)
        p[i] = (uint8_t)x;
}

static uint64_t get_be(const uint8_t *p, int bytes)
{
    uint64_t x = 0;
    for (int i = 0; i < bytes; i++)
        x = x << 8 | p[i];
    return x;
}

/* ---- socket I/O with deadlines (every socket is non-blocking) */

static io_res io_errno(int e) { return e == ECONNRESET || e == EPIPE ? IO_EOF : IO_ERR; }

static io_res wait_fd(int fd, short events, double deadline)
{
    struct pollfd p = {.fd = fd, .events = events};
    int k;
    while ((k = poll(&p, 1, ms_left(deadline))) < 0 && errno == EINTR) {
    }
    return k > 0 ? IO_OK : k == 0 ? IO_TIMEOUT : IO_ERR;
}

static io_res read_full(int fd, void *buf, size_t n, double deadline)
{
    for (uint8_t *p = buf; n > 0;) {
        ssize_t k = recv(fd, p, n, 0);
        if (k == 0)
            return IO_EOF;
        if (k < 0 && errno != EAGAIN && errno != EINTR)
            return io_errno(errno);
        if (k < 0) {
            io_res w = wait_fd(fd, POLLIN, deadline);
            if (w != IO_OK)
                return w;
            continue;
        }
        p += k;
        n -= (size_t)k;
    }
    return IO_OK;
}

static io_res write_full(int fd, const void *buf, size_t n, double deadline)
{
    for (const uint8_t *p = buf; n > 0;) {
        ssize_t k = send(fd, p, n, MSG_NOSIGNAL);
        if (k < 0 && errno != EAGAIN && errno != EINTR)
            return io_errno(errno);
        if (k < 0) {
            io_res w = wait_fd(fd, POLLOUT, deadline);
            if (w != IO_OK)
                return w;
            continue;
        }
        p += k;
        n -= (size_t)k;
    }
    return IO_OK;
}

/* ---- messages */

static io_res send_msg(int fd, int type, int kind, uint32_t seq, const char *label, uint64_t size,
                       const void *payload, size_t len, double deadline)
{
    uint8_t h[HDR_BYTES + LABEL_MAX];
    size_t ll = label ? strnlen(label, LABEL_MAX) : 0;
    h[0] = (uint8_t)type;
    h[1] = (uint8_t)kind;
    put_be(h + 2, ll, 2);
    put_be(h + 4, seq, 4);
    put_be(h + 8, size, 8);
    put_be(h + 16, len, 8);
    if (ll)
        memcpy(h + HDR_BYTES, label, ll);
    io_res r = write_full(fd, h, HDR_BYTES + ll, deadline);
    return r == IO_OK && len ? write_full(fd, payload, len, deadline) : r;
}

static io_res send_text(int fd, int type, const char *text, double deadline)
{
    return send_msg(fd, type, K_NONE, 0, NULL, 0, text, strlen(text), deadline);
}

/* Reads a header and its label; a label longer than LABEL_MAX is an error. */
static io_res read_hdr(int fd, msg_hdr *m, double deadline)
{
    uint8_t h[HDR_BYTES];
    io_res r = read_full(fd, h, HDR_BYTES, deadline);
    if (r != IO_OK)
        return r;
    size_t ll = get_be(h + 2, 2);
    *m = (msg_hdr){.type = h[0], .kind = h[1], .seq = (uint32_t)get_be(h + 4, 4),
                   .size = get_be(h + 8, 8), .len = get_be(h + 16, 8)};
    if (ll > LABEL_MAX)
        return IO_ERR;
    r = read_full(fd, m->label, ll, deadline);
    m->label[ll] = '\0';
    return r;
}

/* Reads a text payload (ABORT, REFUSE) of m into text, truncating what does not fit. */
static io_res read_text(int fd, const msg_hdr *m, char *text, double deadline)
{
    size_t keep = m->len < TEXT_MAX - 1 ? (size_t)m->len : TEXT_MAX - 1;
    io_res r = read_full(fd, text, keep, deadline);
    text[r == IO_OK ? keep : 0] = '\0';
    for (uint64_t rest = m->len - keep; r == IO_OK && rest > 0;) {
        char sink[256];
        size_t k = rest < sizeof sink ? (size_t)rest : sizeof sink;
        r = read_full(fd, sink, k, deadline);
        rest -= k;
    }
    return r;
}

/* ---- failure: the first one is kept and told to the others */

static const char *kind_name(int kind)
{
    return kind == K_BCAST ? "bcast" : kind == K_ALLGATHER ? "allgather" : kind == K_BARRIER ? "barrier" : "?";
}

static const char *describe(const op_desc *op, uint32_t seq, char *buf, size_t n)
{
    if (op->kind == K_BARRIER)
        snprintf(buf, n, "barrier '%s'", op->label);
    else
        snprintf(buf, n, "%s of %zu bytes (collective #%u)", kind_name(op->kind), op->size, seq);
    return buf;
}

static qd_status dead_error(const qd_rdzv *r)
{
    return qd_error(QD_ERR_IO, "rendezvous: %s [seen by rank %d of %d]", r->why, r->rank, r->world);
}

/* Marks r dead with the message why; rank 0 tells every rank still connected,
 * another rank tells rank 0 unless the failure came from rank 0 (relay = 0). */
static qd_status fail_text(qd_rdzv *r, int relay, const char *why)
{
    if (!r->dead) {
        snprintf(r->why, sizeof r->why, "%s", why);
        r->dead = 1;
        double deadline = now_s() + ABORT_SEND_S;
        for (int i = 0; relay && i < (r->rank == 0 ? r->world : 1); i++)
            if (r->fd[i] >= 0)
                send_text(r->fd[i], T_ABORT, r->why, deadline);
    }
    return dead_error(r);
}

static qd_status fail(qd_rdzv *r, int relay, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static qd_status fail(qd_rdzv *r, int relay, const char *fmt, ...)
{
    char why[TEXT_MAX];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(why, sizeof why, fmt, ap);
    va_end(ap);
    return fail_text(r, relay, why);
}

/* The failure of an exchange with rank peer during `during`. */
static qd_status fail_io(qd_rdzv *r, io_res res, int peer, const char *during, double timeout)
{
    if (res == IO_EOF)
        return fail(r, 1, "rank %d closed its connection during %s", peer, during);
    if (res == IO_TIMEOUT)
        return fail(r, 1, "%s timed out after %.1f s waiting for rank %d", during, timeout, peer);
    return fail(r, 1, "%s: exchange with rank %d failed (socket error or malformed message)", during, peer);
}

/* An ABORT message from peer: its text becomes everyone's failure. */
static qd_status take_abort(qd_rdzv *r, int peer, const msg_hdr *m, double deadline)
{
    char text[TEXT_MAX];
    if (read_text(r->fd[r->rank == 0 ? peer : 0], m, text, deadline) != IO_OK)
        snprintf(text, sizeof text, "rank %d aborted", peer);
    return fail_text(r, r->rank == 0, text);
}

/* ---- connecting */

static void tune(int fd)
{
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    setsockopt(fd, SOL_SOCKET, SO_KEEPALIVE, &one, sizeof one);
    fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK);
}

/* A listening socket of one family on every interface (IPv6: dual-stack);
 * -1 with errno set on failure. */
static int listen_family(int family, int port, int backlog)
{
    int one = 1, zero = 0;
    struct sockaddr_in6 a6 = {.sin6_family = AF_INET6, .sin6_port = htons((uint16_t)port), .sin6_addr = in6addr_any};
    struct sockaddr_in a4 = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port),
                             .sin_addr.s_addr = htonl(INADDR_ANY)};
    int fd = socket(family, SOCK_STREAM, 0);
    if (fd < 0)
        return -1;
    if (family == AF_INET6)
        setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &zero, sizeof zero);
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    int bad = family == AF_INET6 ? bind(fd, (struct sockaddr *)&a6, sizeof a6) < 0
                                 : bind(fd, (struct sockaddr *)&a4, sizeof a4) < 0;
    if (bad || listen(fd, backlog) < 0) {
        int e = errno;
        close(fd);
        errno = e;
        return -1;
    }
    fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK);
    return fd;
}

/* Rank 0's listening socket: IPv6 dual-stack, else IPv4 (a kernel without
 * IPv6); a port in use is an error either way. */
static int listen_on(int port, int backlog)
{
    int fd = listen_family(AF_INET6, port, backlog);
    return fd >= 0 || errno == EADDRINUSE ? fd : listen_family(AF_INET, port, backlog);
}

/* A connected non-blocking socket to ai, or -1 with *err set. */
static int connect_addr(const struct addrinfo *ai, double deadline, char *err, size_t n)
{
    int fd = socket(ai->ai_family, ai->ai_socktype, ai->ai_protocol), e = 0;
    socklen_t el = sizeof e;
    if (fd < 0) {
        snprintf(err, n, "%s", strerror(errno));
        return -1;
    }
    tune(fd);
    if (connect(fd, ai->ai_addr, ai->ai_addrlen) == 0)
        return fd;
    if (errno != EINPROGRESS)
        e = errno;
    else if (wait_fd(fd, POLLOUT, deadline) != IO_OK)
        e = ETIMEDOUT;
    else if (getsockopt(fd, SOL_SOCKET, SO_ERROR, &e, &el) < 0)
        e = errno;
    if (e == 0)
        return fd;
    snprintf(err, n, "%s", strerror(e));
    close(fd);
    return -1;
}

/* One connection attempt to each address of host:port; -1 with *err set on failure. */
static int connect_once(const char *host, int port, double deadline, char *err, size_t n)
{
    char ps[16];
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM}, *res;
    snprintf(ps, sizeof ps, "%d", port);
    int g = getaddrinfo(host, ps, &hints, &res);
    if (g != 0) {
        snprintf(err, n, "%s", gai_strerror(g));
        return -1;
    }
    int fd = -1;
    for (struct addrinfo *ai = res; ai && fd < 0; ai = ai->ai_next)
        fd = connect_addr(ai, deadline, err, n);
    freeaddrinfo(res);
    return fd;
}

/* Retries with doubling pauses (10 ms .. 0.5 s) until rank 0 accepts. */
static qd_status connect_retry(qd_rdzv *r, const qd_rdzv_opts *o, double deadline)
{
    char err[128] = "timed out";
    double pause = 0.01;
    while ((r->fd[0] = connect_once(o->master_addr, o->port, deadline, err, sizeof err)) < 0) {
        double left = deadline - now_s();
        if (left <= 0)
            return fail(r, 0, "rank %d could not connect to rank 0 at %s:%d within %.1f s (%s)", r->rank,
                        o->master_addr, o->port, o->connect_timeout_s, err);
        double s = pause < left ? pause : left;
        nanosleep(&(struct timespec){.tv_sec = (time_t)s, .tv_nsec = (long)((s - (double)(time_t)s) * 1e9)}, NULL);
        pause = pause * 2 < 0.5 ? pause * 2 : 0.5;
    }
    return QD_OK;
}

/* A rank's side of open(): connect, hello, wait for welcome. */
static qd_status join(qd_rdzv *r, const qd_rdzv_opts *o)
{
    double deadline = now_s() + o->connect_timeout_s;
    qd_status st = connect_retry(r, o, deadline);
    if (st)
        return st;
    uint8_t hello[HELLO_BYTES];
    put_be(hello, HELLO_MAGIC, 4);
    put_be(hello + 4, HELLO_VERSION, 4);
    put_be(hello + 8, (uint64_t)r->rank, 4);
    put_be(hello + 12, (uint64_t)r->world, 4);
    put_be(hello + 16, o->run_id, 8);
    /* rank 0 answers once every rank joined: it may wait its whole connect timeout */
    deadline = now_s() + 2 * o->connect_timeout_s;
    msg_hdr m;
    io_res res = send_msg(r->fd[0], T_HELLO, K_NONE, 0, NULL, 0, hello, sizeof hello, deadline);
    if (res == IO_OK)
        res = read_hdr(r->fd[0], &m, deadline);
    if (res != IO_OK)
        return fail_io(r, res, 0, "the rendezvous (open)", 2 * o->connect_timeout_s);
    if (m.type == T_WELCOME)
        return QD_OK;
    if (m.type == T_ABORT)
        return take_abort(r, 0, &m, deadline);
    char text[TEXT_MAX] = "";
    read_text(r->fd[0], &m, text, deadline);
    return fail(r, 0, "rank 0 at %s:%d refused rank %d: %s", o->master_addr, o->port, r->rank, text);
}

/* Rank 0's check of one hello; NULL when rank `*rank` may join, else why not. */
static const char *check_hello(const qd_rdzv *r, const uint8_t *h, uint64_t run_id, int *rank, char *why, size_t n)
{
    uint64_t rk = get_be(h + 8, 4), w = get_be(h + 12, 4), id = get_be(h + 16, 8);
    *rank = -1;
    if (get_be(h, 4) != HELLO_MAGIC || get_be(h + 4, 4) != HELLO_VERSION)
        snprintf(why, n, "not a quads rendezvous hello of version %u", HELLO_VERSION);
    else if (w != (uint64_t)r->world)
        snprintf(why, n, "world size %llu differs from rank 0's %d", (unsigned long long)w, r->world);
    else if (id != run_id)
        snprintf(why, n, "run id %016llx differs from rank 0's %016llx (a process of another job?)",
                 (unsigned long long)id, (unsigned long long)run_id);
    else if (rk < 1 || rk >= w)
        snprintf(why, n, "rank %llu is outside 1..%d", (unsigned long long)rk, r->world - 1);
    else if (r->fd[rk] >= 0)
        snprintf(why, n, "rank %llu has already joined", (unsigned long long)rk);
    else {
        *rank = (int)rk;
        return NULL;
    }
    return why;
}

/* Accepts one connection and reads its hello; a bad one is refused and closed.
 * Returns 1 when a rank joined. */
static int admit(qd_rdzv *r, int lfd, uint64_t run_id, char *refusal, size_t n)
{
    int c = accept(lfd, NULL, NULL);
    if (c < 0)
        return 0;
    tune(c);
    double deadline = now_s() + 1.0; /* a rank sends its hello right after connecting */
    uint8_t h[HELLO_BYTES];
    msg_hdr m;
    int rank;
    if (read_hdr(c, &m, deadline) != IO_OK || m.type != T_HELLO || m.len != HELLO_BYTES ||
        read_full(c, h, HELLO_BYTES, deadline) != IO_OK) {
        close(c);
        return 0;
    }
    char why[TEXT_MAX - 64];
    if (check_hello(r, h, run_id, &rank, why, sizeof why)) {
        snprintf(refusal, n, "refused a connection: %s", why);
        send_text(c, T_REFUSE, why, deadline);
        close(c);
        return 0;
    }
    r->fd[rank] = c;
    return 1;
}

/* "rank 3" or "ranks 1, 3": the ranks not done (done NULL: not connected). */
static const char *missing(const qd_rdzv *r, const int *done, char *buf, size_t n)
{
    int count = 0;
    size_t k = 0;
    for (int i = 1; i < r->world; i++)
        count += done ? !done[i] : r->fd[i] < 0;
    k = (size_t)snprintf(buf, n, "rank%s ", count > 1 ? "s" : "");
    for (int i = 1, first = 1; i < r->world && k + 16 < n; i++)
        if (done ? !done[i] : r->fd[i] < 0) {
            k += (size_t)snprintf(buf + k, n - k, "%s%d", first ? "" : ", ", i);
            first = 0;
        }
    return buf;
}

/* Rank 0's side of open(): accept every rank, then welcome them all. */
static qd_status host(qd_rdzv *r, const qd_rdzv_opts *o)
{
    int lfd = listen_on(o->port, r->world);
    if (lfd < 0)
        return fail(r, 0, "rank 0 cannot listen on port %d: %s (another job on this port? choose another "
                    "with MASTER_PORT or QUADS_RDZV_PORT)", o->port, strerror(errno));
    double deadline = now_s() + o->connect_timeout_s;
    char refusal[TEXT_MAX] = "", who[256];
    for (int joined = 0; joined < r->world - 1;) {
        if (wait_fd(lfd, POLLIN, deadline) != IO_OK) {
            close(lfd);
            return fail(r, 1, "rank 0 waited %.1f s on port %d for %s to join%s%s", o->connect_timeout_s,
                        o->port, missing(r, NULL, who, sizeof who), *refusal ? "; it " : "", refusal);
        }
        joined += admit(r, lfd, o->run_id, refusal, sizeof refusal);
    }
    close(lfd);
    for (int i = 1; i < r->world; i++) {
        io_res res = send_msg(r->fd[i], T_WELCOME, K_NONE, 0, NULL, 0, NULL, 0, now_s() + o->op_timeout_s);
        if (res != IO_OK)
            return fail_io(r, res, i, "the rendezvous (open)", o->op_timeout_s);
    }
    return QD_OK;
}

qd_status qd_rdzv_open(const qd_rdzv_opts *o, qd_rdzv **out)
{
    *out = NULL;
    if (o->world_size < 1 || o->rank < 0 || o->rank >= o->world_size)
        return qd_error(QD_ERR_ARG, "rendezvous: rank %d of world size %d", o->rank, o->world_size);
    if (o->world_size > 1 && (!o->master_addr || !*o->master_addr || o->port < 1 || o->port > 65535 ||
                              !(o->connect_timeout_s > 0) || !(o->op_timeout_s > 0)))
        return qd_error(QD_ERR_ARG, "rendezvous: world size %d needs a master address, a port in 1..65535 "
                        "and positive timeouts", o->world_size);
    qd_rdzv *r = calloc(1, sizeof *r);
    int nfd = o->rank == 0 ? o->world_size : 1;
    if (!r || !(r->fd = malloc((size_t)nfd * sizeof *r->fd))) {
        free(r);
        return qd_error(QD_ERR_NOMEM, "rendezvous: out of memory");
    }
    *r = (qd_rdzv){.rank = o->rank, .world = o->world_size, .op_timeout = o->op_timeout_s, .fd = r->fd};
    for (int i = 0; i < nfd; i++)
        r->fd[i] = -1;
    qd_status st = r->world == 1 ? QD_OK : r->rank == 0 ? host(r, o) : join(r, o);
    if (st) {
        char msg[TEXT_MAX + 64];
        snprintf(msg, sizeof msg, "%s", qd_last_error());
        qd_rdzv_close(r);
        return qd_error(st, "%s", msg);
    }
    *out = r;
    return QD_OK;
}

void qd_rdzv_close(qd_rdzv *r)
{
    if (!r)
        return;
    for (int i = 0; i < (r->rank == 0 ? r->world : 1); i++)
        if (r->fd[i] >= 0)
            close(r->fd[i]);
    free(r->fd);
    free(r);
}

/* ---- collectives: every rank sends ARRIVE to rank 0, rank 0 answers RESULT */

/* Checks an ARRIVE header of rank i against rank 0's collective. */
static qd_status check_arrive(qd_rdzv *r, int i, const msg_hdr *m, const op_desc *op, const char *what)
{
    char theirs[LABEL_MAX + 64];
    op_desc t = {m->kind, m->label, (size_t)m->size};
    if (m->type == T_ARRIVE && m->seq == r->seq && m->kind == op->kind && m->size == op->size &&
        strcmp(m->label, op->label) == 0 && m->len == (op->kind == K_ALLGATHER ? op->size : 0))
        return QD_OK;
    if (m->type != T_ARRIVE)
        return fail(r, 1, "rank %d sent message type %d during %s", i, m->type, what);
    return fail(r, 1, "rank %d entered %s while rank 0 is in %s", i, describe(&t, m->seq, theirs, sizeof theirs),
                what);
}

/* Rank 0 reads one message of rank i during the collective. */
static qd_status hub_read(qd_rdzv *r, int i, const op_desc *op, const char *what, void *all, double deadline)
{
    msg_hdr m;
    io_res res = read_hdr(r->fd[i], &m, deadline);
    if (res != IO_OK)
        return fail_io(r, res, i, what, r->op_timeout);
    if (m.type == T_ABORT)
        return take_abort(r, i, &m, deadline);
    qd_status st = check_arrive(r, i, &m, op, what);
    if (st)
        return st;
    if (m.len) /* an allgather's part */
        res = read_full(r->fd[i], (uint8_t *)all + (size_t)i * op->size, m.len, deadline);
    return res == IO_OK ? QD_OK : fail_io(r, res, i, what, r->op_timeout);
}

/* Rank 0 waits for every rank to arrive, whichever comes first. */
static qd_status hub_gather(qd_rdzv *r, const op_desc *op, const char *what, void *all)
{
    double deadline = now_s() + r->op_timeout;
    struct pollfd p[r->world];
    int done[r->world], rank_of[r->world], left = r->world - 1;
    memset(done, 0, sizeof done);
    while (left > 0) {
        int np = 0;
        for (int i = 1; i < r->world; i++)
            if (!done[i]) {
                rank_of[np] = i;
                p[np++] = (struct pollfd){.fd = r->fd[i], .events = POLLIN};
            }
        int k = poll(p, (nfds_t)np, ms_left(deadline));
        if (k < 0 && errno == EINTR)
            continue;
        if (k <= 0) {
            char who[256];
            return fail(r, 1, "%s timed out after %.1f s waiting for %s", what, r->op_timeout,
                        missing(r, done, who, sizeof who));
        }
        for (int j = 0; j < np; j++) {
            int i = rank_of[j];
            if (!p[j].revents)
                continue;
            qd_status st = hub_read(r, i, op, what, all, deadline);
            if (st)
                return st;
            done[i] = 1;
            left--;
        }
    }
    return QD_OK;
}

static qd_status hub_collective(qd_rdzv *r, const op_desc *op, const char *what, void *out, size_t out_len)
{
    qd_status st = hub_gather(r, op, what, out);
    double deadline = now_s() + r->op_timeout;
    for (int i = 1; !st && i < r->world; i++) {
        io_res res = send_msg(r->fd[i], T_RESULT, op->kind, r->seq, NULL, 0, out, out_len, deadline);
        if (res != IO_OK)
            st = fail_io(r, res, i, what, r->op_timeout);
    }
    return st;
}

/* A rank other than 0: arrive (with mine), then wait for rank 0's result. */
static qd_status spoke_collective(qd_rdzv *r, const op_desc *op, const char *what, const void *mine, void *out,
                                  size_t out_len)
{
    double wait = 2 * r->op_timeout, deadline = now_s() + wait;
    size_t len = op->kind == K_ALLGATHER ? op->size : 0;
    msg_hdr m;
    io_res res = send_msg(r->fd[0], T_ARRIVE, op->kind, r->seq, op->label, op->size, mine, len, deadline);
    if (res == IO_OK)
        res = read_hdr(r->fd[0], &m, deadline);
    if (res != IO_OK)
        return fail_io(r, res, 0, what, wait);
    if (m.type == T_ABORT)
        return take_abort(r, 0, &m, deadline);
    if (m.type != T_RESULT || m.seq != r->seq || m.len != out_len)
        return fail(r, 1, "rank 0 answered %s with message type %d (collective #%u, %llu bytes)", what, m.type,
                    m.seq, (unsigned long long)m.len);
    if (out_len)
        res = read_full(r->fd[0], out, out_len, deadline);
    return res == IO_OK ? QD_OK : fail_io(r, res, 0, what, wait);
}

/* One collective; out (out_len bytes) receives rank 0's result. */
static qd_status collective(qd_rdzv *r, const op_desc *op, const void *mine, void *out, size_t out_len)
{
    if (r->dead)
        return dead_error(r);
    char what[LABEL_MAX + 64];
    describe(op, r->seq, what, sizeof what);
    qd_status st = r->rank == 0 ? hub_collective(r, op, what, out, out_len)
                                : spoke_collective(r, op, what, mine, out, out_len);
    r->seq++;
    return st;
}

qd_status qd_rdzv_bcast(qd_rdzv *r, void *buf, size_t n)
{
    if (r->world == 1)
        return r->dead ? dead_error(r) : QD_OK;
    const op_desc op = {K_BCAST, "", n};
    return collective(r, &op, NULL, buf, n);
}

qd_status qd_rdzv_allgather(qd_rdzv *r, const void *mine, size_t n, void *all)
{
    memmove((uint8_t *)all + (size_t)r->rank * n, mine, n);
    if (r->world == 1)
        return r->dead ? dead_error(r) : QD_OK;
    const op_desc op = {K_ALLGATHER, "", n};
    return collective(r, &op, (uint8_t *)all + (size_t)r->rank * n, all, (size_t)r->world * n);
}

qd_status qd_rdzv_barrier(qd_rdzv *r, const char *name)
{
    if (r->world == 1)
        return r->dead ? dead_error(r) : QD_OK;
    char label[LABEL_MAX + 1];
    snprintf(label, sizeof label, "%s", name ? name : "");
    const op_desc op = {K_BARRIER, label, 0};
    return collective(r, &op, NULL, NULL, 0);
}

/* ---- liveness between collectives */

/* Looks at what peer i sent without taking a collective's message. */
static qd_status peek_peer(qd_rdzv *r, int i, const char *during)
{
    int fd = r->fd[r->rank == 0 ? i : 0];
    uint8_t type;
    ssize_t k = recv(fd, &type, 1, MSG_PEEK | MSG_DONTWAIT);
    if (k == 0 || (k < 0 && (errno == ECONNRESET || errno == EPIPE)))
        return fail(r, 1, "rank %d closed its connection during %s", i, during);
    if (k < 0 || type != T_ABORT)
        return QD_OK; /* nothing yet, or a rank already in the next collective */
    msg_hdr m;
    double deadline = now_s() + ABORT_SEND_S;
    if (read_hdr(fd, &m, deadline) != IO_OK)
        return fail(r, 1, "rank %d closed its connection during %s", i, during);
    return take_abort(r, i, &m, deadline);
}

qd_status qd_rdzv_check(qd_rdzv *r, const char *during)
{
    if (r->dead)
        return dead_error(r);
    for (int i = r->rank == 0 ? 1 : 0; i < (r->rank == 0 ? r->world : 1); i++) {
        qd_status st = peek_peer(r, i, during ? during : "a check");
        if (st)
            return st;
    }
    return QD_OK;
}

qd_status qd_rdzv_abort(qd_rdzv *r, const char *why)
{
    return fail(r, 1, "rank %d aborted: %s", r->rank, why ? why : "(no reason given)");
}

int qd_rdzv_rank(const qd_rdzv *r) { return r->rank; }
int qd_rdzv_world_size(const qd_rdzv *r) { return r->world; }

uint64_t qd_rdzv_run_id(const char *text)
{
    uint64_t h = 0xcbf29ce484222325ull; /* FNV-1a 64: offset basis, prime 0x100000001b3 */
    for (const unsigned char *p = (const unsigned char *)text; *p; p++)
        h = (h ^ *p) * 0x100000001b3ull;
    return h;
}
