/* amx_perm.c — whether Linux grants this process the AMX tile state.
 *
 * Linux leaves the tile data (XFEATURE_XTILEDATA = 18) off until a process asks for it
 * (arch_prctl ARCH_REQ_XCOMP_PERM = 0x1023); a tile instruction before that faults. The
 * AMX gemm (templates/expert_ffn/amx.j2) and the compute-peak probe (peak.c) both ask
 * here, once per process. */
#include "internal.h"

#if defined(__linux__) && defined(__x86_64__)
#include <sys/syscall.h>
#include <unistd.h>
#endif

/* 1: granted, -1: refused (no AMX, an old kernel, a signal stack too small for the tile
 * state) or not x86-64 Linux, 0: not asked yet. */
static int amx_state;

int cb_amx_granted(void) {
    int s = __atomic_load_n(&amx_state, __ATOMIC_ACQUIRE);
    if (s == 0) {
#if defined(__linux__) && defined(__x86_64__)
        s = syscall(SYS_arch_prctl, 0x1023, 18) == 0 ? 1 : -1; /* asking twice is harmless */
#else
        s = -1;
#endif
        __atomic_store_n(&amx_state, s, __ATOMIC_RELEASE);
    }
    return s > 0;
}
