/* sample.c — where a process spends its CPU time, on hosts without perf (the lent AMX
 * machine has none): a SIGPROF every period of the process's CPU time, and the address of
 * the instruction it interrupted, in whichever thread was running. `colibri_bench profile`
 * starts it around timed layer calls and names the addresses from /proc/self/maps, nm and
 * objdump. Only between start and stop is a handler installed; stop puts the old one back. */
#include <errno.h>
#include <signal.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/time.h>
#include <ucontext.h>

#include "colibri.h"
#include "internal.h"

#if defined(__linux__) && (defined(__x86_64__) || defined(__aarch64__))
#define CB_SAMPLE 1
#else
#define CB_SAMPLE 0
#endif

static uint64_t *s_ips;
static size_t s_cap;
static size_t s_n; /* samples taken, kept or not (atomic: any thread's signal) */
static int s_on;
#if CB_SAMPLE
static struct sigaction s_old;

static void on_sigprof(int sig, siginfo_t *si, void *ucv) {
    (void)sig, (void)si;
    const ucontext_t *uc = ucv;
#if defined(__x86_64__)
    const uint64_t ip = (uint64_t)uc->uc_mcontext.gregs[REG_RIP];
#else
    const uint64_t ip = (uint64_t)uc->uc_mcontext.pc;
#endif
    const size_t i = __atomic_fetch_add(&s_n, 1, __ATOMIC_RELAXED);
    if (i < s_cap) s_ips[i] = ip;
}
#endif

int colibri_sample_start(int period_us, size_t capacity) {
    cb_clear_error();
#if !CB_SAMPLE
    (void)period_us, (void)capacity;
    return cb_fail(COLIBRI_ERR_INVALID, "sampling needs Linux on x86-64 or aarch64");
#else
    if (s_on) return cb_fail(COLIBRI_ERR_INVALID, "sampling is already running");
    if (period_us < 100 || period_us > 1000000)
        return cb_fail(COLIBRI_ERR_INVALID, "period %d us is outside [100, 1000000]", period_us);
    if (capacity < 1 || capacity > ((size_t)1 << 28))
        return cb_fail(COLIBRI_ERR_INVALID, "capacity %zu is outside [1, 2^28]", capacity);
    s_ips = malloc(capacity * sizeof *s_ips);
    if (!s_ips) return cb_fail(COLIBRI_ERR_NOMEM, "no memory for %zu samples", capacity);
    s_cap = capacity;
    __atomic_store_n(&s_n, 0, __ATOMIC_RELAXED);
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_sigaction = on_sigprof;
    sa.sa_flags = SA_SIGINFO | SA_RESTART;
    sigemptyset(&sa.sa_mask);
    if (sigaction(SIGPROF, &sa, &s_old)) {
        free(s_ips), s_ips = NULL;
        return cb_fail(COLIBRI_ERR_INVALID, "sigaction(SIGPROF): %s", strerror(errno));
    }
    struct itimerval it = {{0, period_us}, {0, period_us}};
    if (setitimer(ITIMER_PROF, &it, NULL)) {
        sigaction(SIGPROF, &s_old, NULL);
        free(s_ips), s_ips = NULL;
        return cb_fail(COLIBRI_ERR_INVALID, "setitimer(ITIMER_PROF): %s", strerror(errno));
    }
    s_on = 1;
    return COLIBRI_OK;
#endif
}

int colibri_sample_stop(uint64_t *ips, size_t cap, size_t *n_out, size_t *taken_out) {
    cb_clear_error();
    if (!n_out || (cap && !ips)) return cb_fail(COLIBRI_ERR_INVALID, "n_out (and ips, with cap > 0) must not be NULL");
    if (!s_on) return cb_fail(COLIBRI_ERR_INVALID, "sampling is not running");
#if CB_SAMPLE
    struct itimerval off;
    memset(&off, 0, sizeof off);
    setitimer(ITIMER_PROF, &off, NULL);
    sigaction(SIGPROF, &s_old, NULL);
#endif
    const size_t taken = __atomic_load_n(&s_n, __ATOMIC_RELAXED);
    size_t n = taken < s_cap ? taken : s_cap;
    if (n > cap) n = cap;
    if (n) memcpy(ips, s_ips, n * sizeof *ips);
    free(s_ips);
    s_ips = NULL;
    s_on = 0;
    *n_out = n;
    if (taken_out) *taken_out = taken;
    return COLIBRI_OK;
}
