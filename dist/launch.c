/* dist/launch: the launcher's environment -> rank, world size, local rank and
 * the rendezvous address (launch.h lists the variables). */
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "dist/launch.h"

typedef struct {
    qd_dist_getenv_fn get;
    void *ctx;
} env_src;

/* The variables one launcher sets; local_size NULL where it has none. */
typedef struct {
    qd_launcher launcher;
    const char *rank, *size, *local_rank, *local_size;
} launcher_vars;

static const launcher_vars launchers[] = {
    {QD_LAUNCHER_TORCHRUN, "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE"},
    {QD_LAUNCHER_MPI, "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK",
     "OMPI_COMM_WORLD_LOCAL_SIZE"},
    /* srun's step size first: sbatch alone sets SLURM_NTASKS for the batch script */
    {QD_LAUNCHER_SLURM, "SLURM_PROCID", "SLURM_STEP_NUM_TASKS", "SLURM_LOCALID", NULL},
};

/* An unset or empty variable reads as NULL. */
static const char *env(const env_src *e, const char *name)
{
    const char *v = e->get(e->ctx, name);
    return v && *v ? v : NULL;
}

/* *out = the decimal value of name in lo..hi. */
static qd_status env_int(const env_src *e, const char *name, long lo, long hi, int *out)
{
    const char *v = env(e, name);
    char *end;
    errno = 0;
    long x = strtol(v, &end, 10);
    if (*v < '0' || *v > '9' || *end != '\0' || errno == ERANGE || x > INT_MAX)
        return qd_error(QD_ERR_ARG, "environment: %s='%s' is not a decimal integer", name, v);
    if (x < lo || x > hi)
        return qd_error(QD_ERR_ARG, "environment: %s=%ld is outside %ld..%ld", name, x, lo, hi);
    *out = (int)x;
    return QD_OK;
}

/* Reads an optional integer: *out is left alone when name is unset. */
static qd_status env_int_opt(const env_src *e, const char *name, long lo, long hi, int *out)
{
    return env(e, name) ? env_int(e, name, lo, hi, out) : QD_OK;
}

static qd_status need_both(const env_src *e, const char *a, const char *b)
{
    if (env(e, a) && !env(e, b))
        return qd_error(QD_ERR_ARG, "environment: %s=%s is set but %s is not", a, env(e, a), b);
    return QD_OK;
}

/* *out = name's value, which must be below limit (limit_name's value). */
static qd_status env_below(const env_src *e, const char *name, const char *limit_name, int limit, int *out)
{
    QD_TRY(env_int(e, name, 0, INT_MAX, out));
    if (*out >= limit)
        return qd_error(QD_ERR_ARG, "environment: %s=%d is not below %s=%d", name, *out, limit_name, limit);
    return QD_OK;
}

/* Local rank and size; without the launcher's local variables, one node. */
static qd_status read_local(const env_src *e, const launcher_vars *v, qd_dist_env *o)
{
    o->local_rank = o->rank;
    o->local_world_size = v->local_size ? o->world_size : 0; /* srun: slurm_local_size */
    if (!v->local_size)
        return env(e, v->local_rank) ? env_int(e, v->local_rank, 0, o->world_size - 1, &o->local_rank) : QD_OK;
    QD_TRY(need_both(e, v->local_rank, v->local_size));
    QD_TRY(need_both(e, v->local_size, v->local_rank));
    if (!env(e, v->local_rank))
        return QD_OK;
    QD_TRY(env_int(e, v->local_size, 1, o->world_size, &o->local_world_size));
    return env_below(e, v->local_rank, v->local_size, o->local_world_size, &o->local_rank);
}

/* rank and world size of launcher v (size_var: the variable it is read from). */
static qd_status read_ranks(const env_src *e, const launcher_vars *v, const char *size_var, qd_dist_env *o)
{
    QD_TRY(need_both(e, v->rank, size_var));
    QD_TRY(need_both(e, size_var, v->rank));
    QD_TRY(env_int(e, size_var, 1, INT_MAX, &o->world_size));
    QD_TRY(env_below(e, v->rank, size_var, o->world_size, &o->rank));
    return read_local(e, v, o);
}

/* The n-th count of a SLURM tasks-per-node list such as "2(x3),1" (= 2,2,2,1);
 * 0 when the list is shorter. */
static qd_status slurm_tasks_on_node(const char *name, const char *list, int node, int *out)
{
    const char *p = list;
    *out = 0;
    while (*p) {
        char *end;
        long count = strtol(p, &end, 10), rep = 1;
        if (end == p || count < 1)
            goto bad;
        if (strncmp(end, "(x", 2) == 0) {
            const char *q = end + 2;
            rep = strtol(q, &end, 10);
            if (end == q || rep < 1 || *end != ')')
                goto bad;
            end++;
        }
        if (node < rep) {
            *out = (int)count;
            return QD_OK;
        }
        node -= (int)rep;
        if (*end != ',' && *end != '\0')
            goto bad;
        p = *end ? end + 1 : end;
    }
    return QD_OK;
bad:
    return qd_error(QD_ERR_ARG, "environment: %s='%s' is not a SLURM tasks-per-node list", name, list);
}

/* srun's local world size: this node's count in the step's tasks-per-node list. */
static qd_status slurm_local_size(const env_src *e, qd_dist_env *o)
{
    const char *name = env(e, "SLURM_STEP_TASKS_PER_NODE") ? "SLURM_STEP_TASKS_PER_NODE" : "SLURM_TASKS_PER_NODE";
    int node = 0;
    qd_status st = env_int_opt(e, "SLURM_NODEID", 0, INT_MAX, &node);
    if (st || !env(e, name))
        return st;
    QD_TRY(slurm_tasks_on_node(name, env(e, name), node, &o->local_world_size));
    if (o->local_world_size && o->local_rank >= o->local_world_size)
        return qd_error(QD_ERR_ARG, "environment: SLURM_LOCALID=%d is not below %s's count %d for node %d",
                        o->local_rank, name, o->local_world_size, node);
    return QD_OK;
}

/* The first host of a SLURM hostlist: "gpu[03-05,9],cpu1" -> "gpu03". Each
 * bracket group contributes its first number, zero padding kept. */
static qd_status slurm_first_host(const char *name, const char *list, char *out, size_t n)
{
    size_t k = 0;
    for (const char *p = list; *p && *p != ','; p++) {
        if (*p == '[') {
            for (p++; *p >= '0' && *p <= '9'; p++)
                if (k + 1 < n)
                    out[k++] = *p;
            while (*p && *p != ']')
                p++;
            if (!*p)
                return qd_error(QD_ERR_ARG, "environment: %s='%s' has an unclosed '['", name, list);
        } else if (k + 1 < n) {
            out[k++] = *p;
        }
    }
    out[k] = '\0';
    if (k == 0 || k + 1 >= n)
        return qd_error(QD_ERR_ARG, "environment: %s='%s' does not start with a host name", name, list);
    return QD_OK;
}

static qd_status copy_addr(const char *name, const char *v, char *out)
{
    if (strlen(v) >= QD_DIST_ADDR_MAX)
        return qd_error(QD_ERR_ARG, "environment: %s is longer than %d bytes", name, QD_DIST_ADDR_MAX - 1);
    strcpy(out, v);
    return QD_OK;
}

/* MASTER_ADDR, or under srun the first host of the step. */
static qd_status read_addr(const env_src *e, qd_dist_env *o)
{
    static const char *const lists[] = {"SLURM_STEP_NODELIST", "SLURM_JOB_NODELIST", "SLURM_NODELIST"};
    if (env(e, "MASTER_ADDR"))
        return copy_addr("MASTER_ADDR", env(e, "MASTER_ADDR"), o->master_addr);
    if (o->launcher == QD_LAUNCHER_SLURM) {
        for (size_t i = 0; i < sizeof lists / sizeof lists[0]; i++)
            if (env(e, lists[i]))
                return slurm_first_host(lists[i], env(e, lists[i]), o->master_addr, QD_DIST_ADDR_MAX);
        return qd_error(QD_ERR_ARG, "environment: MASTER_ADDR is not set and neither is SLURM_STEP_NODELIST "
                        "or SLURM_JOB_NODELIST: set MASTER_ADDR to the host of SLURM_PROCID 0");
    }
    return qd_error(QD_ERR_ARG, "environment: MASTER_ADDR is not set: %s with %d processes needs the "
                    "address of rank 0's host in MASTER_ADDR", qd_dist_launcher_name(o->launcher),
                    o->world_size);
}

/* MASTER_PORT and the port the rendezvous listens on (launch.h). */
static qd_status read_ports(const env_src *e, qd_dist_env *o)
{
    qd_status st;
    o->master_port = QD_DIST_DEFAULT_PORT;
    if ((st = env_int_opt(e, "MASTER_PORT", 1, 65535, &o->master_port)))
        return st;
    o->rdzv_port = o->master_port;
    const char *agent = env(e, "TORCHELASTIC_USE_AGENT_STORE");
    if (o->launcher == QD_LAUNCHER_TORCHRUN && agent && strcmp(agent, "True") == 0) {
        if (o->master_port == 65535)
            return qd_error(QD_ERR_ARG, "environment: MASTER_PORT=65535 leaves no port above torchrun's "
                            "store for the rendezvous: set QUADS_RDZV_PORT");
        o->rdzv_port = o->master_port + 1;
    }
    return env_int_opt(e, "QUADS_RDZV_PORT", 1, 65535, &o->rdzv_port);
}

qd_status qd_dist_env_parse(qd_dist_env *out, qd_dist_getenv_fn get, void *ctx)
{
    const env_src e = {get, ctx};
    qd_dist_env o = {.launcher = QD_LAUNCHER_NONE, .world_size = 1, .local_world_size = 1};
    for (size_t i = 0; i < sizeof launchers / sizeof launchers[0]; i++) {
        const launcher_vars *v = &launchers[i];
        /* srun's step size, or SLURM_NTASKS where srun runs outside a step list */
        const char *size = v->launcher == QD_LAUNCHER_SLURM && !env(&e, v->size) ? "SLURM_NTASKS" : v->size;
        if (!env(&e, v->rank) && !env(&e, size))
            continue;
        o.launcher = v->launcher;
        QD_TRY(read_ranks(&e, v, size, &o));
        if (o.launcher == QD_LAUNCHER_SLURM)
            QD_TRY(slurm_local_size(&e, &o));
        break;
    }
    if (o.world_size > 1) {
        QD_TRY(read_addr(&e, &o));
        QD_TRY(read_ports(&e, &o));
    }
    *out = o;
    return QD_OK;
}

static const char *process_getenv(void *ctx, const char *name) { return getenv(name); }

qd_status qd_dist_env_read(qd_dist_env *out) { return qd_dist_env_parse(out, process_getenv, NULL); }

const char *qd_dist_launcher_name(qd_launcher l)
{
    static const char *const names[] = {"none", "torchrun", "mpirun", "srun"};
    return (unsigned)l < sizeof names / sizeof names[0] ? names[l] : "unknown";
}
