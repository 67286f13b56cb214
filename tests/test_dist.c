/* Check suite of dist/: the launcher environment on fake environments (torchrun,
 * mpirun, srun, none, and every malformed case naming its variable), and the
 * rendezvous between fork()ed ranks on 127.0.0.1: bcast, allgather order,
 * barriers at world sizes 1, 2 and 4, and the failures (a rank that exits, a
 * rank that hangs, rank 0 that exits, a rank that never comes, an abort, a
 * wrong run id, mismatched barriers) reaching every surviving rank with the
 * failed rank's number within the timeout; a port in use is named. */
#include <dirent.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>
#include "dist/launch.h"
#include "dist/rendezvous.h"
#include "tests/dist_ranks.h"
#include "tests/suites.h"

/* ---- launcher environment */

/* A fake environment: NULL-terminated "NAME=value" strings. */
static const char *fake_getenv(void *ctx, const char *name)
{
    size_t n = strlen(name);
    for (const char *const *e = ctx; *e; e++)
        if (strncmp(*e, name, n) == 0 && (*e)[n] == '=')
            return *e + n + 1;
    return NULL;
}

static qd_dist_env parse_ok(const char *const *env)
{
    qd_dist_env d;
    qd_status st = qd_dist_env_parse(&d, fake_getenv, (void *)env);
    ck_assert_msg(st == QD_OK, "%s", qd_last_error());
    return d;
}

START_TEST(test_env_none)
{
    static const char *const env[] = {"PATH=/bin", "HOME=/root", NULL};
    qd_dist_env d = parse_ok(env);
    ck_assert_int_eq(d.launcher, QD_LAUNCHER_NONE);
    ck_assert_int_eq(d.rank, 0);
    ck_assert_int_eq(d.world_size, 1);
    ck_assert_int_eq(d.local_rank, 0);
    ck_assert_int_eq(d.local_world_size, 1);
    ck_assert_str_eq(d.master_addr, "");
    /* one process needs no address, even from torchrun */
    static const char *const one[] = {"RANK=0", "WORLD_SIZE=1", NULL};
    d = parse_ok(one);
    ck_assert_int_eq(d.launcher, QD_LAUNCHER_TORCHRUN);
    ck_assert_int_eq(d.world_size, 1);
    ck_assert_str_eq(qd_dist_launcher_name(d.launcher), "torchrun");
}
END_TEST

START_TEST(test_env_torchrun)
{
    static const char *const env[] = {
        "RANK=5", "WORLD_SIZE=8", "LOCAL_RANK=1", "LOCAL_WORLD_SIZE=4", "MASTER_ADDR=node7",
        "MASTER_PORT=29400", "TORCHELASTIC_USE_AGENT_STORE=True",
        /* an outer srun's variables must not win over torchrun's */
        "SLURM_PROCID=0", "SLURM_NTASKS=2", NULL};
    qd_dist_env d = parse_ok(env);
    ck_assert_int_eq(d.launcher, QD_LAUNCHER_TORCHRUN);
    ck_assert_int_eq(d.rank, 5);
    ck_assert_int_eq(d.world_size, 8);
    ck_assert_int_eq(d.local_rank, 1);
    ck_assert_int_eq(d.local_world_size, 4);
    ck_assert_str_eq(d.master_addr, "node7");
    ck_assert_int_eq(d.master_port, 29400);
    /* torchrun's own store listens on MASTER_PORT: the rendezvous takes the next */
    ck_assert_int_eq(d.rdzv_port, 29401);
    static const char *const plain[] = {"RANK=1", "WORLD_SIZE=2", "MASTER_ADDR=10.1.2.3", "MASTER_PORT=1234",
                                        "TORCHELASTIC_USE_AGENT_STORE=False", NULL};
    d = parse_ok(plain);
    ck_assert_int_eq(d.rdzv_port, 1234);
    /* without local variables: one node */
    ck_assert_int_eq(d.local_rank, 1);
    ck_assert_int_eq(d.local_world_size, 2);
    static const char *const forced[] = {"RANK=1", "WORLD_SIZE=2", "MASTER_ADDR=h", "QUADS_RDZV_PORT=31000",
                                         "TORCHELASTIC_USE_AGENT_STORE=True", NULL};
    d = parse_ok(forced);
    ck_assert_int_eq(d.master_port, QD_DIST_DEFAULT_PORT);
    ck_assert_int_eq(d.rdzv_port, 31000);
}
END_TEST

START_TEST(test_env_mpirun)
{
    static const char *const env[] = {
        "OMPI_COMM_WORLD_RANK=13", "OMPI_COMM_WORLD_SIZE=16", "OMPI_COMM_WORLD_LOCAL_RANK=5",
        "OMPI_COMM_WORLD_LOCAL_SIZE=8", "MASTER_ADDR=10.0.0.1",
        /* sbatch sets these for the batch script that runs mpirun */
        "SLURM_PROCID=0", "SLURM_NTASKS=16", NULL};
    qd_dist_env d = parse_ok(env);
    ck_assert_int_eq(d.launcher, QD_LAUNCHER_MPI);
    ck_assert_int_eq(d.rank, 13);
    ck_assert_int_eq(d.world_size, 16);
    ck_assert_int_eq(d.local_rank, 5);
    ck_assert_int_eq(d.local_world_size, 8);
    ck_assert_str_eq(d.master_addr, "10.0.0.1");
    ck_assert_int_eq(d.master_port, QD_DIST_DEFAULT_PORT);
    ck_assert_int_eq(d.rdzv_port, QD_DIST_DEFAULT_PORT);
}
END_TEST

START_TEST(test_env_srun)
{
    /* 12 tasks on nodes of 4, 4, 2, 2: task 9 is the second on node 2 */
    static const char *const env[] = {
        "SLURM_PROCID=9", "SLURM_STEP_NUM_TASKS=12", "SLURM_NTASKS=99", "SLURM_LOCALID=1", "SLURM_NODEID=2",
        "SLURM_STEP_TASKS_PER_NODE=4(x2),2(x2)", "SLURM_STEP_NODELIST=gpu[003-005,9],cpu1",
        "SLURM_JOB_NODELIST=other1", "MASTER_PORT=40000", NULL};
    qd_dist_env d = parse_ok(env);
    ck_assert_int_eq(d.launcher, QD_LAUNCHER_SLURM);
    ck_assert_int_eq(d.rank, 9);
    ck_assert_int_eq(d.world_size, 12);
    ck_assert_int_eq(d.local_rank, 1);
    ck_assert_int_eq(d.local_world_size, 2);
    ck_assert_str_eq(d.master_addr, "gpu003");
    ck_assert_int_eq(d.rdzv_port, 40000);
    static const char *const job[] = {"SLURM_PROCID=1", "SLURM_NTASKS=2", "SLURM_LOCALID=0", "SLURM_NODEID=1",
                                      "SLURM_TASKS_PER_NODE=1(x2)", "SLURM_JOB_NODELIST=rack[1-2]-n[07-08]",
                                      NULL};
    d = parse_ok(job);
    ck_assert_int_eq(d.world_size, 2);
    ck_assert_int_eq(d.local_world_size, 1);
    ck_assert_str_eq(d.master_addr, "rack1-n07");
    static const char *const given[] = {"SLURM_PROCID=0", "SLURM_NTASKS=2", "SLURM_JOB_NODELIST=a,b",
                                        "MASTER_ADDR=head", NULL};
    d = parse_ok(given);
    ck_assert_str_eq(d.master_addr, "head");
    static const char *const plain[] = {"SLURM_PROCID=0", "SLURM_NTASKS=2", "SLURM_NODELIST=a,b", NULL};
    d = parse_ok(plain);
    ck_assert_str_eq(d.master_addr, "a");
    ck_assert_int_eq(d.local_world_size, 0); /* srun said nothing about nodes */
}
END_TEST

/* Each malformed environment and what its message must contain. */
static const struct {
    const char *env[8];
    const char *needs[2];
} bad_envs[] = {
    {{"RANK=abc", "WORLD_SIZE=2", "MASTER_ADDR=h"}, {"RANK='abc'", "not a decimal integer"}},
    {{"RANK=2", "WORLD_SIZE=2", "MASTER_ADDR=h"}, {"RANK=2 is not below WORLD_SIZE=2"}},
    {{"RANK=-1", "WORLD_SIZE=2", "MASTER_ADDR=h"}, {"RANK='-1'"}},
    {{"RANK=0", "WORLD_SIZE=0"}, {"WORLD_SIZE=0"}},
    {{"RANK=0", "WORLD_SIZE=99999999999"}, {"WORLD_SIZE='99999999999'"}},
    {{"RANK=0", "WORLD_SIZE=2x"}, {"WORLD_SIZE='2x'"}},
    {{"WORLD_SIZE=2", "MASTER_ADDR=h"}, {"WORLD_SIZE=2 is set but RANK is not"}},
    {{"RANK=1", "MASTER_ADDR=h"}, {"RANK=1 is set but WORLD_SIZE is not"}},
    {{"RANK=0", "WORLD_SIZE=2"}, {"MASTER_ADDR is not set", "torchrun"}},
    {{"RANK=0", "WORLD_SIZE=2", "MASTER_ADDR=h", "MASTER_PORT=70000"}, {"MASTER_PORT=70000"}},
    {{"RANK=0", "WORLD_SIZE=2", "MASTER_ADDR=h", "MASTER_PORT=0"}, {"MASTER_PORT=0"}},
    {{"RANK=0", "WORLD_SIZE=2", "MASTER_ADDR=h", "MASTER_PORT=29x"}, {"MASTER_PORT='29x'"}},
    {{"RANK=0", "WORLD_SIZE=2", "MASTER_ADDR=h", "QUADS_RDZV_PORT=65536"}, {"QUADS_RDZV_PORT=65536"}},
    {{"RANK=0", "WORLD_SIZE=2", "MASTER_ADDR=h", "MASTER_PORT=65535", "TORCHELASTIC_USE_AGENT_STORE=True"},
     {"MASTER_PORT=65535", "QUADS_RDZV_PORT"}},
    {{"RANK=0", "WORLD_SIZE=8", "LOCAL_RANK=4", "LOCAL_WORLD_SIZE=4", "MASTER_ADDR=h"},
     {"LOCAL_RANK=4 is not below LOCAL_WORLD_SIZE=4"}},
    {{"RANK=0", "WORLD_SIZE=8", "LOCAL_RANK=0", "LOCAL_WORLD_SIZE=9", "MASTER_ADDR=h"}, {"LOCAL_WORLD_SIZE=9"}},
    {{"RANK=0", "WORLD_SIZE=8", "LOCAL_RANK=0", "MASTER_ADDR=h"}, {"LOCAL_RANK=0 is set but LOCAL_WORLD_SIZE"}},
    {{"OMPI_COMM_WORLD_RANK=1", "OMPI_COMM_WORLD_SIZE=2"}, {"MASTER_ADDR is not set", "mpirun"}},
    {{"OMPI_COMM_WORLD_RANK=0", "OMPI_COMM_WORLD_SIZE=x"}, {"OMPI_COMM_WORLD_SIZE='x'"}},
    {{"SLURM_PROCID=0", "SLURM_NTASKS=2"}, {"MASTER_ADDR is not set", "SLURM_JOB_NODELIST"}},
    {{"SLURM_PROCID=0"}, {"SLURM_PROCID=0 is set but SLURM_NTASKS is not"}},
    {{"SLURM_PROCID=0", "SLURM_NTASKS=2", "SLURM_STEP_NODELIST=gpu[01-02"}, {"SLURM_STEP_NODELIST='gpu[01-02'"}},
    {{"SLURM_PROCID=0", "SLURM_NTASKS=2", "MASTER_ADDR=h", "SLURM_STEP_TASKS_PER_NODE=2(x"},
     {"SLURM_STEP_TASKS_PER_NODE='2(x'"}},
    {{"SLURM_PROCID=1", "SLURM_NTASKS=4", "SLURM_LOCALID=2", "SLURM_NODEID=0", "MASTER_ADDR=h",
      "SLURM_TASKS_PER_NODE=2(x2)"},
     {"SLURM_LOCALID=2"}},
};

START_TEST(test_env_malformed)
{
    for (size_t i = 0; i < sizeof bad_envs / sizeof bad_envs[0]; i++) {
        qd_dist_env d;
        qd_status st = qd_dist_env_parse(&d, fake_getenv, (void *)bad_envs[i].env);
        ck_assert_msg(st == QD_ERR_ARG, "case %zu (%s): status %d", i, bad_envs[i].env[0], st);
        for (int k = 0; k < 2 && bad_envs[i].needs[k]; k++)
            ck_assert_msg(strstr(qd_last_error(), bad_envs[i].needs[k]), "case %zu: '%s' lacks '%s'", i,
                          qd_last_error(), bad_envs[i].needs[k]);
    }
}
END_TEST

START_TEST(test_env_process)
{
    /* the process environment reader sees what setenv put there */
    setenv("RANK", "1", 1);
    setenv("WORLD_SIZE", "3", 1);
    setenv("MASTER_ADDR", "127.0.0.1", 1);
    qd_dist_env d;
    ck_assert_int_eq(qd_dist_env_read(&d), QD_OK);
    ck_assert_int_eq(d.rank, 1);
    ck_assert_int_eq(d.world_size, 3);
    unsetenv("RANK");
    unsetenv("WORLD_SIZE");
    unsetenv("MASTER_ADDR");
}
END_TEST

/* ---- rendezvous between fork()ed ranks */

#define BLOB 128 /* an NCCL unique id */
#define PART 16  /* each rank's allgather part */
#define CONNECT_S 2.0
#define OP_S 1.0

typedef qd_rank_result rank_result;

static void run_ranks(int world, qd_rank_body body, rank_result *res)
{
    qd_test_run_ranks(world, body, res, CONNECT_S, OP_S);
}

static double now_s(void) { return qd_test_now(); }
static int note(rank_result *res, qd_status st, double t0) { return qd_test_note(res, st, t0); }

/* where a rank keeps the broadcast blob and the allgathered parts in its report */
#define BLOB_OF(res) ((res)->data)
#define ALL_OF(res) ((res)->data + BLOB)

static uint8_t blob_byte(int rank, int j) { return (uint8_t)(rank * 101 + j * 7 + 3); }
static uint8_t part_byte(int rank, int j) { return (uint8_t)(rank * 37 + j + 1); }

/* open, bcast rank 0's blob, allgather every rank's part, barrier, close */
static void body_basic(qd_rdzv_opts *o, rank_result *res)
{
    qd_rdzv *r;
    uint8_t part[PART];
    double t0 = now_s();
    for (int j = 0; j < BLOB; j++)
        BLOB_OF(res)[j] = blob_byte(o->rank, j);
    for (int j = 0; j < PART; j++)
        part[j] = part_byte(o->rank, j);
    if (note(res, qd_rdzv_open(o, &r), t0))
        return;
    if (!note(res, qd_rdzv_bcast(r, BLOB_OF(res), BLOB), t0) &&
        !note(res, qd_rdzv_allgather(r, part, PART, ALL_OF(res)), t0))
        note(res, qd_rdzv_barrier(r, "done"), t0);
    qd_rdzv_close(r);
}

static void check_basic(int world)
{
    rank_result res[QD_TEST_MAX_WORLD];
    run_ranks(world, body_basic, res);
    for (int r = 0; r < world; r++) {
        ck_assert_msg(res[r].st == QD_OK, "world %d rank %d: %s", world, r, res[r].msg);
        for (int j = 0; j < BLOB; j++)
            ck_assert_msg(BLOB_OF(&res[r])[j] == blob_byte(0, j), "world %d rank %d: blob byte %d", world, r, j);
        for (int k = 0; k < world; k++)
            for (int j = 0; j < PART; j++)
                ck_assert_msg(ALL_OF(&res[r])[k * PART + j] == part_byte(k, j), "world %d rank %d: part of rank %d",
                              world, r, k);
    }
}

START_TEST(test_rdzv_world_2_and_4)
{
    check_basic(2);
    check_basic(4);
}
END_TEST

static int open_fds(void)
{
    int n = 0;
    DIR *d = opendir("/proc/self/fd");
    ck_assert_ptr_nonnull(d);
    while (readdir(d))
        n++;
    closedir(d);
    return n;
}

START_TEST(test_rdzv_world_1)
{
    /* no address, no port, no socket */
    qd_rdzv_opts o = {.rank = 0, .world_size = 1};
    int fds = open_fds();
    qd_rdzv *r;
    ck_assert_int_eq(qd_rdzv_open(&o, &r), QD_OK);
    uint8_t blob[BLOB], all[PART], part[PART];
    for (int j = 0; j < BLOB; j++)
        blob[j] = blob_byte(0, j);
    for (int j = 0; j < PART; j++)
        part[j] = part_byte(0, j);
    ck_assert_int_eq(qd_rdzv_bcast(r, blob, BLOB), QD_OK);
    ck_assert_int_eq(qd_rdzv_allgather(r, part, PART, all), QD_OK);
    ck_assert_int_eq(qd_rdzv_barrier(r, "one"), QD_OK);
    ck_assert_int_eq(qd_rdzv_check(r, "nothing"), QD_OK);
    ck_assert_int_eq(blob[5], blob_byte(0, 5));
    ck_assert_mem_eq(all, part, PART);
    ck_assert_int_eq(open_fds(), fds);
    ck_assert_int_eq(qd_rdzv_world_size(r), 1);
    qd_rdzv_close(r);
    /* a world of several needs an address */
    qd_rdzv_opts two = {.rank = 0, .world_size = 2, .port = 1, .connect_timeout_s = 1, .op_timeout_s = 1};
    ck_assert_int_eq(qd_rdzv_open(&two, &r), QD_ERR_ARG);
    ck_assert_ptr_null(r);
}
END_TEST

static void expect_failure(const rank_result *res, int world, int except, const char *a, const char *b,
                           double within)
{
    qd_test_expect_failure(res, world, except, QD_ERR_IO, a, b, within);
}

/* rank 3 exits after joining; the others enter barrier 'step 12' */
static void body_rank3_exits(qd_rdzv_opts *o, rank_result *res)
{
    qd_rdzv *r;
    if (note(res, qd_rdzv_open(o, &r), now_s()))
        return;
    if (o->rank == 3)
        _exit(0); /* the kernel closes its socket, as for a crash */
    double t0 = now_s();
    note(res, qd_rdzv_barrier(r, "step 12"), t0);
    /* a dead handle keeps failing with the first cause */
    if (res->st && qd_rdzv_bcast(r, BLOB_OF(res), BLOB) != QD_ERR_IO)
        res->st = -2;
    qd_rdzv_close(r);
}

START_TEST(test_rdzv_rank_exits)
{
    rank_result res[QD_TEST_MAX_WORLD];
    run_ranks(4, body_rank3_exits, res);
    /* well within the barrier's timeout: a closed connection is seen at once */
    expect_failure(res, 4, 3, "rank 3 closed its connection during barrier 'step 12'", NULL, OP_S);
}
END_TEST

/* rank 0 exits after joining; the others wait in a barrier */
static void body_rank0_exits(qd_rdzv_opts *o, rank_result *res)
{
    qd_rdzv *r;
    if (note(res, qd_rdzv_open(o, &r), now_s()))
        return;
    if (o->rank == 0)
        _exit(0);
    double t0 = now_s();
    note(res, qd_rdzv_barrier(r, "step 3"), t0);
    qd_rdzv_close(r);
}

START_TEST(test_rdzv_rank0_exits)
{
    rank_result res[QD_TEST_MAX_WORLD];
    run_ranks(3, body_rank0_exits, res);
    expect_failure(res, 3, 0, "rank 0 closed its connection during barrier 'step 3'", NULL, OP_S);
}
END_TEST

/* rank 2 comes 2.5 s late to barrier 'step 7' (timeout 1 s) */
static void body_rank2_hangs(qd_rdzv_opts *o, rank_result *res)
{
    qd_rdzv *r;
    if (note(res, qd_rdzv_open(o, &r), now_s()))
        return;
    if (o->rank == 2)
        nanosleep(&(struct timespec){.tv_sec = 2, .tv_nsec = 500000000}, NULL);
    double t0 = now_s();
    note(res, qd_rdzv_barrier(r, "step 7"), t0);
    qd_rdzv_close(r);
}

START_TEST(test_rdzv_rank_hangs)
{
    rank_result res[QD_TEST_MAX_WORLD];
    run_ranks(3, body_rank2_hangs, res);
    /* rank 0's verdict reaches rank 1 (which waits 2 x 1 s) after rank 0's 1 s;
     * the late rank 2 finds the same verdict waiting */
    expect_failure(res, 3, -1, "barrier 'step 7' timed out after 1.0 s waiting for rank 2", NULL, 1.8);
    ck_assert_msg(res[0].elapsed > 0.9, "rank 0 gave up after %.2f s", res[0].elapsed);
}
END_TEST

/* rank 2 aborts with a reason; the others are in a barrier */
static void body_rank2_aborts(qd_rdzv_opts *o, rank_result *res)
{
    qd_rdzv *r;
    if (note(res, qd_rdzv_open(o, &r), now_s()))
        return;
    double t0 = now_s();
    if (o->rank == 2)
        note(res, qd_rdzv_abort(r, "NaN in the gradients"), t0);
    else
        note(res, qd_rdzv_barrier(r, "step 9"), t0);
    qd_rdzv_close(r);
}

START_TEST(test_rdzv_abort)
{
    rank_result res[QD_TEST_MAX_WORLD];
    run_ranks(3, body_rank2_aborts, res);
    expect_failure(res, 3, -1, "rank 2 aborted: NaN in the gradients", NULL, OP_S);
}
END_TEST

/* rank 3 exits; the others poll qd_rdzv_check while "in" an NCCL collective */
static void body_check(qd_rdzv_opts *o, rank_result *res)
{
    qd_rdzv *r;
    if (note(res, qd_rdzv_open(o, &r), now_s()))
        return;
    if (o->rank == 3)
        _exit(0);
    double t0 = now_s();
    qd_status st;
    while ((st = qd_rdzv_check(r, "all_reduce of step 5")) == QD_OK && now_s() - t0 < 3)
        nanosleep(&(struct timespec){.tv_nsec = 10000000}, NULL);
    note(res, st, t0);
    qd_rdzv_close(r);
}

START_TEST(test_rdzv_check)
{
    rank_result res[QD_TEST_MAX_WORLD];
    run_ranks(4, body_check, res);
    expect_failure(res, 4, 3, "rank 3 closed its connection during all_reduce of step 5", NULL, 1.0);
}
END_TEST

/* rank 1 joins with another job's run id */
static void body_wrong_id(qd_rdzv_opts *o, rank_result *res)
{
    qd_rdzv *r = NULL;
    o->connect_timeout_s = 1.0;
    if (o->rank == 1)
        o->run_id = qd_rdzv_run_id("another run");
    note(res, qd_rdzv_open(o, &r), now_s());
    qd_rdzv_close(r);
}

START_TEST(test_rdzv_wrong_run_id)
{
    rank_result res[QD_TEST_MAX_WORLD];
    run_ranks(2, body_wrong_id, res);
    expect_failure(res, 2, 0, "refused rank 1", "run id", 2.0);
    /* rank 0 waits for the right rank 1 and says why it refused the wrong one */
    expect_failure(res, 2, 1, "waited 1.0 s", "for rank 1 to join; it refused a connection: run id", 2.0);
}
END_TEST

/* rank 0 in barrier 'a', rank 1 in barrier 'b' */
static void body_mismatch(qd_rdzv_opts *o, rank_result *res)
{
    qd_rdzv *r;
    if (note(res, qd_rdzv_open(o, &r), now_s()))
        return;
    note(res, qd_rdzv_barrier(r, o->rank == 0 ? "a" : "b"), now_s());
    qd_rdzv_close(r);
}

START_TEST(test_rdzv_mismatch)
{
    rank_result res[QD_TEST_MAX_WORLD];
    run_ranks(2, body_mismatch, res);
    expect_failure(res, 2, -1, "rank 1 entered barrier 'b' while rank 0 is in barrier 'a'", NULL, OP_S);
}
END_TEST

/* rank 2 never comes (connect timeout 1 s) */
static void body_rank2_absent(qd_rdzv_opts *o, qd_rank_result *res)
{
    qd_rdzv *r = NULL;
    o->connect_timeout_s = 1.0;
    if (o->rank == 2)
        return;
    note(res, qd_rdzv_open(o, &r), now_s());
    qd_rdzv_close(r);
}

START_TEST(test_rdzv_rank_absent)
{
    rank_result res[QD_TEST_MAX_WORLD];
    run_ranks(3, body_rank2_absent, res);
    /* rank 0 gives up after its 1 s and tells rank 1, which already joined */
    expect_failure(res, 3, 2, "rank 0 waited 1.0 s on port", "for rank 2 to join", 1.5);
}
END_TEST

START_TEST(test_rdzv_port_in_use)
{
    int fd = socket(AF_INET6, SOCK_STREAM, 0);
    struct sockaddr_in6 a = {.sin6_family = AF_INET6, .sin6_addr = in6addr_any};
    socklen_t n = sizeof a;
    ck_assert_int_eq(bind(fd, (struct sockaddr *)&a, sizeof a), 0);
    ck_assert_int_eq(listen(fd, 1), 0);
    ck_assert_int_eq(getsockname(fd, (struct sockaddr *)&a, &n), 0);
    qd_rdzv_opts o = {.rank = 0, .world_size = 2, .master_addr = "127.0.0.1", .port = ntohs(a.sin6_port),
                      .connect_timeout_s = 1, .op_timeout_s = 1};
    qd_rdzv *r;
    ck_assert_int_eq(qd_rdzv_open(&o, &r), QD_ERR_IO);
    char want[64];
    snprintf(want, sizeof want, "rank 0 cannot listen on port %d", o.port);
    ck_assert_msg(strstr(qd_last_error(), want) && strstr(qd_last_error(), "QUADS_RDZV_PORT"), "%s", qd_last_error());
    close(fd);
}
END_TEST

START_TEST(test_rdzv_run_id)
{
    /* FNV-1a 64 test vectors (Fowler/Noll/Vo reference: "" and "a") */
    ck_assert_uint_eq(qd_rdzv_run_id(""), 0xcbf29ce484222325ull);
    ck_assert_uint_eq(qd_rdzv_run_id("a"), 0xaf63dc4c8601ec8cull);
}
END_TEST

Suite *suite_dist(void)
{
    Suite *s = suite_create("dist");
    TCase *env = tcase_create("env");
    tcase_add_test(env, test_env_none);
    tcase_add_test(env, test_env_torchrun);
    tcase_add_test(env, test_env_mpirun);
    tcase_add_test(env, test_env_srun);
    tcase_add_test(env, test_env_malformed);
    tcase_add_test(env, test_env_process);
    suite_add_tcase(s, env);
    TCase *rz = tcase_create("rendezvous");
    tcase_set_timeout(rz, 30);
    tcase_add_test(rz, test_rdzv_run_id);
    tcase_add_test(rz, test_rdzv_world_1);
    tcase_add_test(rz, test_rdzv_world_2_and_4);
    tcase_add_test(rz, test_rdzv_rank_exits);
    tcase_add_test(rz, test_rdzv_rank0_exits);
    tcase_add_test(rz, test_rdzv_rank_hangs);
    tcase_add_test(rz, test_rdzv_abort);
    tcase_add_test(rz, test_rdzv_check);
    tcase_add_test(rz, test_rdzv_wrong_run_id);
    tcase_add_test(rz, test_rdzv_rank_absent);
    tcase_add_test(rz, test_rdzv_port_in_use);
    tcase_add_test(rz, test_rdzv_mismatch);
    suite_add_tcase(s, rz);
    return s;
}
