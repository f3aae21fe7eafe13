/* Handles rsmpi's C shim does not export: in Open MPI they are addresses of library globals and in
 * MPICH integer macros, so Rust cannot name them portably. Each is returned by a tiny function. */
#include <mpi.h>

MPI_Op asap_mpi_op_replace(void) { return MPI_REPLACE; }
MPI_Op asap_mpi_op_no_op(void) { return MPI_NO_OP; }

#ifdef ASAP_ULFM
/* ULFM (Open MPI 5's fault tolerance; src/comm/ulfm.rs). An error handler that, for a process
 * failure, revokes the communicator it happened on and MPI_COMM_WORLD (so every rank's pending
 * and later calls on them return instead of waiting for the dead one), records it in a flag the
 * program polls, and returns -- while the program can go on from a loss (the training loop).
 * Elsewhere (`asap_ulfm_outside` names where) it ends this process at once with that reason:
 * returning would let the program go on with what the failed call left (a failed MPI_Comm_dup
 * leaves MPI_COMM_NULL, which rsmpi wraps without looking, and the next call on it failed with
 * "MPI_ERR_COMM: invalid communicator"). Any other error ends the job as MPI_ERRORS_ARE_FATAL
 * would. Once a process has failed the job is ended with _exit, never MPI_Abort: under
 * `mpirun --with-ft ulfm` (Open MPI 5.0.11's prterun) MPI_Abort by the survivors of a SIGKILLed
 * rank left the launcher hung until SIGKILL in 4 of 6 runs of an 8-rank C program, while _exit
 * of every survivor ended the job in 1.9-2.5 s with their status in 6 of 6. */
#include <mpi-ext.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

static volatile int asap_ulfm_lost_flag = 0;
static volatile int asap_ulfm_failed_flag = 0;
static const char *volatile asap_ulfm_outside = "before training started";
/* Set for a run without `--on-rank-loss continue`: every loss ends the job, naming the dead. */
static volatile int asap_ulfm_stop = 0;

/* Writes `line` to stderr in one write (a launcher forwarding ranks' output cannot cut it). */
static void asap_ulfm_say(const char *line) {
    ssize_t ignored = write(2, line, strlen(line));
    (void)ignored;
}

/* Writes the MPI_COMM_WORLD ranks of the processes `comm` knows to have failed ("2" or "2 5") into
 * `out`, or "unknown" where it knows none yet (MPIX_Comm_get_failed: the failures this process
 * has been told of). */
static void asap_ulfm_failed_ranks(MPI_Comm comm, char *out, size_t n) {
    snprintf(out, n, "unknown");
    MPI_Group failed, world;
    if (MPIX_Comm_get_failed(comm, &failed) != MPI_SUCCESS) return;
    MPI_Comm_group(MPI_COMM_WORLD, &world);
    int size = 0;
    MPI_Group_size(failed, &size);
    size_t used = 0;
    for (int i = 0; i < size && used + 16 < n; i++) {
        int w = MPI_UNDEFINED;
        MPI_Group_translate_ranks(failed, 1, &i, world, &w);
        used += (size_t)snprintf(out + used, n - used, used ? " %d" : "%d", w);
    }
    MPI_Group_free(&failed);
    MPI_Group_free(&world);
}

static void asap_ulfm_on_error(MPI_Comm *comm, int *code, ...) {
    int cls = MPI_ERR_OTHER;
    MPI_Error_class(*code, &cls);
    char line[MPI_MAX_ERROR_STRING + 256];
    int rank = -1;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    if (cls == MPIX_ERR_PROC_FAILED || cls == MPIX_ERR_PROC_FAILED_PENDING || cls == MPIX_ERR_REVOKED) {
        __atomic_store_n(&asap_ulfm_failed_flag, 1, __ATOMIC_SEQ_CST);
        char dead[128];
        if (asap_ulfm_stop) {
            asap_ulfm_failed_ranks(*comm, dead, sizeof dead);
            /* Without this the wheel's default handler (MPI_ERRORS_ARE_FATAL) ended an ssp job
             * whose rank 2 was SIGKILLed in 1.6 s naming no rank, with status 75, which
             * slurm/asap-train.sbatch takes for a preemption (2026-11-29). */
            snprintf(line, sizeof line,
                     "asap-train: error on rank %d: rank(s) %s of MPI_COMM_WORLD lost (a process failure); this run "
                     "cannot go on without them, so the job ends (--on-rank-loss continue goes on for --sync "
                     "asap, none and allreduce; asap-train elastic restarts any mode on fewer ranks)\n",
                     rank, dead);
            asap_ulfm_say(line);
            _exit(4);
        }
        const char *outside = asap_ulfm_outside;
        if (outside) {
            asap_ulfm_failed_ranks(*comm, dead, sizeof dead);
            snprintf(line, sizeof line,
                     "asap-train: error on rank %d: a rank was lost %s; --on-rank-loss continue goes on only from a "
                     "loss during training, so the job ends (lost: rank(s) %s of MPI_COMM_WORLD)\n",
                     rank, outside, dead);
            asap_ulfm_say(line);
            _exit(4);
        }
        if (!asap_ulfm_lost_flag) {
            __atomic_store_n(&asap_ulfm_lost_flag, 1, __ATOMIC_SEQ_CST);
            MPIX_Comm_revoke(*comm);
            MPIX_Comm_revoke(MPI_COMM_WORLD);
        }
        return;
    }
    char text[MPI_MAX_ERROR_STRING + 1];
    int len = 0;
    MPI_Error_string(*code, text, &len);
    text[len] = 0;
    snprintf(line, sizeof line, "asap-train: error on rank %d: MPI error: %s\n", rank, text);
    asap_ulfm_say(line);
    if (__atomic_load_n(&asap_ulfm_failed_flag, __ATOMIC_SEQ_CST)) _exit(1);
    MPI_Abort(MPI_COMM_WORLD, 1);
}

/* Sets the handler on `comm`; communicators derived from it later inherit it. (Windows keep
 * MPI_ERRORS_RETURN, src/comm/window.rs: their errors come back as codes already.) With `stop`
 * every process failure ends the job, naming the dead ranks (a run without --on-rank-loss
 * continue); without, a loss in the training loop is recorded for the program to recover. */
int asap_ulfm_install(MPI_Comm comm, int stop) {
    asap_ulfm_stop = stop;
    MPI_Errhandler eh;
    int rc = MPI_Comm_create_errhandler(asap_ulfm_on_error, &eh);
    if (rc != MPI_SUCCESS) return rc;
    return MPI_Comm_set_errhandler(comm, eh);
}

/* Where a loss ends the job instead (a static NUL-terminated phrase, "before training started"),
 * or NULL: in the training loop, where the handler records it and returns. */
void asap_ulfm_set_outside(const char *where) { asap_ulfm_outside = where; }

/* Whether a process has failed in this job (never cleared: the dead stay in MPI_COMM_WORLD). */
int asap_ulfm_failed_ever(void) { return __atomic_load_n(&asap_ulfm_failed_flag, __ATOMIC_SEQ_CST); }

int asap_ulfm_lost(void) { return __atomic_load_n(&asap_ulfm_lost_flag, __ATOMIC_SEQ_CST); }

/* Collective over the survivors of `comm`: revokes it, shrinks it to the live processes into
 * `*out` (with the handler), agrees that every survivor got there, and clears the flag. Writes
 * into `dead` (up to `max`) the ranks of `comm` that are gone and returns how many, or a
 * negative MPI error code. */
int asap_ulfm_shrink(MPI_Comm comm, MPI_Comm *out, int *dead, int max) {
    MPIX_Comm_revoke(comm);
    int rc = MPIX_Comm_shrink(comm, out);
    if (rc != MPI_SUCCESS) return -rc;
    int flag = 1;
    rc = MPIX_Comm_agree(*out, &flag);
    if (rc != MPI_SUCCESS) return -rc;
    MPI_Group old_g, new_g;
    MPI_Comm_group(comm, &old_g);
    MPI_Comm_group(*out, &new_g);
    int n_old = 0;
    MPI_Group_size(old_g, &n_old);
    int found = 0;
    for (int r = 0; r < n_old; r++) {
        int there = MPI_UNDEFINED;
        MPI_Group_translate_ranks(old_g, 1, &r, new_g, &there);
        if (there == MPI_UNDEFINED) {
            if (found < max) dead[found] = r;
            found++;
        }
    }
    MPI_Group_free(&old_g);
    MPI_Group_free(&new_g);
    __atomic_store_n(&asap_ulfm_lost_flag, 0, __ATOMIC_SEQ_CST);
    return found;
}
#endif
