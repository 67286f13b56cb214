/* tests/rl_hooks: quads rl with the loop's test hooks (see rl_hooks.c). */
#ifndef QD_TEST_RL_HOOKS_H
#define QD_TEST_RL_HOOKS_H

/* The exit status of a run killed by QD_RL_TEST_KILL_STEP. */
#define QD_TEST_KILL_EXIT 75

#endif
