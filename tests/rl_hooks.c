/* `quads rl` with the RL loop's test hooks, for the tests that need a run to
 * crash or to meet a NaN in a process of its own (libgomp does not survive
 * a fork, and data-parallel ranks are processes). Usage: rl_hooks rl ARGS...
 * as quads; the hooks come from the environment:
 *   QD_RL_TEST_KILL_STEP=k  _exit(QD_TEST_KILL_EXIT) after step k's rollouts
 *   QD_RL_TEST_NAN_STEP=k   the trainer's first log-prob of step k is NaN */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "orchestrator/commands.h"
#include "tests/rl_hooks.h"

typedef struct {
    long kill_step, nan_step; /* 0: off */
} env_hooks;

static void after_rollout(void *ctx, int64_t step)
{
    if (((const env_hooks *)ctx)->kill_step == step)
        _exit(QD_TEST_KILL_EXIT); /* a crash in the middle of a step */
}

static void trainer_logp(void *ctx, int64_t step, int first, float *logp, int n, int M)
{
    (void)n, (void)M;
    if (((const env_hooks *)ctx)->nan_step == step && first == 0)
        logp[0] = NAN;
}

static long env_long(const char *name)
{
    const char *s = getenv(name);
    return s ? strtol(s, NULL, 10) : 0;
}

int main(int argc, char **argv)
{
    if (argc < 2 || strcmp(argv[1], "rl") != 0) {
        fprintf(stderr, "usage: rl_hooks rl [quads rl arguments]\n");
        return 2;
    }
    env_hooks e = {.kill_step = env_long("QD_RL_TEST_KILL_STEP"), .nan_step = env_long("QD_RL_TEST_NAN_STEP")};
    qd_rl_hooks h = {.ctx = &e, .after_rollout = after_rollout, .trainer_logp = trainer_logp};
    return qd_cmd_rl_hooked(argc - 1, argv + 1, &h);
}
