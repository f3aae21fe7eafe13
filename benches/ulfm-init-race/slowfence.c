/* LD_PRELOAD shim (benches/ulfm-init-race.sh): on the rank named by SLOW_FENCE_RANK, every
 * PMIx_Fence_nb's completion reaches Open MPI SLOW_FENCE_MS late, as when that process is
 * descheduled under load; its main thread meanwhile keeps calling opal_progress in MPI_Init. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stddef.h>
#include <stdlib.h>
#include <unistd.h>

typedef void (*op_cb)(int, void *);
typedef int (*fence_nb_t)(const void *, size_t, const void *, size_t, op_cb, void *);
static op_cb real_cb;

static void late_cb(int status, void *cbdata) {
    usleep(1000 * atoi(getenv("SLOW_FENCE_MS")));
    real_cb(status, cbdata);
}

int PMIx_Fence_nb(const void *procs, size_t nprocs, const void *info, size_t ninfo, op_cb cb, void *cbdata) {
    fence_nb_t real = (fence_nb_t)dlsym(RTLD_NEXT, "PMIx_Fence_nb");
    const char *me = getenv("OMPI_COMM_WORLD_RANK"), *slow = getenv("SLOW_FENCE_RANK");
    if (me && slow && atoi(me) == atoi(slow)) {
        real_cb = cb;
        return real(procs, nprocs, info, ninfo, late_cb, cbdata);
    }
    return real(procs, nprocs, info, ninfo, cb, cbdata);
}
