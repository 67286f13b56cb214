/* dist/launch: where this process sits in a multi-process job, read from the
 * environment its launcher set (one process per GPU; docs/multi-gpu.md).
 *
 * Launchers, in the order they are recognized (the first whose rank or size
 * variable is set wins, because an outer launcher's variables leak into an inner one's
 * children: sbatch sets SLURM_PROCID=0 for the batch script, which mpirun and
 * torchrun then pass on):
 *   torchrun  RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT
 *   mpirun    OMPI_COMM_WORLD_RANK, _SIZE, _LOCAL_RANK, _LOCAL_SIZE (Open MPI)
 *             + MASTER_ADDR (mpirun does not say where rank 0 runs)
 *   srun      SLURM_PROCID, SLURM_STEP_NUM_TASKS (else SLURM_NTASKS: sbatch alone
 *             sets it for the batch script), SLURM_LOCALID, SLURM_NODEID,
 *             SLURM_STEP_TASKS_PER_NODE (or SLURM_TASKS_PER_NODE),
 *             MASTER_ADDR or else the first host of SLURM_STEP_NODELIST
 *             (or SLURM_JOB_NODELIST, SLURM_NODELIST): task 0 runs there under
 *             srun's default block distribution; set MASTER_ADDR otherwise.
 *   none      rank 0 of 1; no address is needed.
 * MASTER_PORT defaults to 29500 (torchrun's default) where a launcher leaves it
 * unset. QUADS_RDZV_PORT, when set, is the port the rendezvous listens on; else
 * MASTER_PORT, except under torchrun with TORCHELASTIC_USE_AGENT_STORE=True,
 * where torchrun's own TCP store already listens on MASTER_PORT on the master
 * host, so the rendezvous takes MASTER_PORT + 1. */
#ifndef QD_DIST_LAUNCH_H
#define QD_DIST_LAUNCH_H

#include "quant/status.h"

typedef enum {
    QD_LAUNCHER_NONE = 0,
    QD_LAUNCHER_TORCHRUN,
    QD_LAUNCHER_MPI,
    QD_LAUNCHER_SLURM,
} qd_launcher;

#define QD_DIST_DEFAULT_PORT 29500
#define QD_DIST_ADDR_MAX 256

typedef struct {
    qd_launcher launcher;
    int rank, world_size;             /* 0 <= rank < world_size */
    /* on this node: which GPU to take. Without the launcher's local variables
     * one node is assumed (local = global); local_world_size is 0 where srun
     * gives no tasks-per-node list. */
    int local_rank, local_world_size;
    char master_addr[QD_DIST_ADDR_MAX]; /* "" when world_size == 1 */
    int master_port;                  /* as the launcher set it (0 when world_size == 1) */
    int rdzv_port;                    /* where dist/rendezvous listens (see above) */
} qd_dist_env;

/* A getenv: the value of name or NULL when unset. ctx is passed through. */
typedef const char *(*qd_dist_getenv_fn)(void *ctx, const char *name);

/* Fills *out from get(ctx, NAME). A value that is not a decimal integer, out of
 * range (rank >= world size, local rank >= local world size, port outside
 * 1..65535), a rank without its world size (or the reverse), or a missing master
 * address when world_size > 1 is QD_ERR_ARG with a message naming the variable
 * and its value. */
qd_status qd_dist_env_parse(qd_dist_env *out, qd_dist_getenv_fn get, void *ctx);
/* qd_dist_env_parse over the process environment. */
qd_status qd_dist_env_read(qd_dist_env *out);
/* "torchrun", "mpirun", "srun" or "none". */
const char *qd_dist_launcher_name(qd_launcher l);

#endif
