/* membw.c — memory bandwidth of this host: STREAM-style read-only and triad kernels.
 *
 * The probe (tuner/bandwidth.py) calls these to learn what DRAM can deliver, so the
 * tuner can quote each kernel's weight streaming as a fraction of it. Built into
 * libcolibri.so under every profile: portable C plus GCC/clang vector extensions
 * and OpenMP, no intrinsics; -O3 and the profile's -march pick the vector width.
 *
 * Method
 *  - The arrays (doubles) are mmap'ed (page-aligned, transparent huge pages
 *    requested) and first touched by the same OpenMP threads, with the same static
 *    partition, that later stream them: each thread's pages sit on its NUMA node.
 *  - `bytes` is the footprint of all arrays together: read streams one array of
 *    `bytes`; triad three arrays of bytes/3 each. The caller sizes it several times
 *    the last-level cache, so passes come from DRAM.
 *  - One untimed warm-up pass, then timed passes (CLOCK_MONOTONIC, between
 *    barriers, so a pass ends when the slowest thread ends) until the timed passes
 *    add up to min_seconds and there are at least CB_MEMBW_MIN_PASSES of them.
 *  - Reported figure: the MEDIAN pass. A bound used as the denominator of "fraction
 *    of bandwidth" must be robust on noisy, shared machines: the best pass is a
 *    single lucky sample (a neighbour idle for a moment), the worst one is a
 *    neighbour's burst. Best and worst are returned too, as the spread.
 *
 * Counted bytes (GB/s = 1e9 bytes/s)
 *  - read:  8 bytes per element (each double loaded once).
 *  - triad: a[i] = b[i] + s*c[i], the STREAM convention: 3 x 8 = 24 bytes per element
 *    (two loads, one store). The write-allocate read of a[] that most caches perform
 *    before a store is NOT counted (as in STREAM), so triad GB/s understates the
 *    traffic on such hosts by up to 4/3.
 *
 * Results are checked: every read pass must sum to the element count exactly (the
 * array holds 1.0), and triad's output must hold b + s*c; a mismatch (broken
 * memory, a miscompiled kernel) is an error, never a figure.
 */
#include <omp.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include "internal.h"

#define CB_MEMBW_MIN_PASSES 3
#define CB_MEMBW_MAX_PASSES 100000
/* Elements per block: 256 bytes (one to four iterations of read_sum). Threads own whole blocks,
 * so no two threads store into the same cache line. */
#define CB_MEMBW_BLOCK 32
/* Distance between the arrays beyond page rounding (17 cache lines): arrays that all
 * start on a page boundary make b[i] and c[i] alias in the L1 sets and in the 4 KiB
 * store-forwarding check, which would slow the kernel for reasons unrelated to DRAM. */
#define CB_MEMBW_STAGGER (17 * 64)

/* The target's native vector width: generic vectors wider than the registers are
 * lowered through the stack by GCC, which would measure the spills, not DRAM. */
#if defined(__AVX512F__)
#define CB_VEC_BYTES 64
#elif defined(__AVX__)
#define CB_VEC_BYTES 32
#else
#define CB_VEC_BYTES 16 /* SSE2, NEON, and a safe width elsewhere */
#endif
#define CB_VEC_LANES (CB_VEC_BYTES / 8)
typedef double cb_vd __attribute__((vector_size(CB_VEC_BYTES)));

/* Sum of a[0..n) (n a multiple of CB_MEMBW_BLOCK, a 64-byte aligned) with four
 * independent vector accumulators, so loads are not serialised behind one add chain. */
static double read_sum(const double *a, size_t n) {
    const cb_vd *v = (const cb_vd *)(const void *)a;
    cb_vd s0, s1, s2, s3;
    memset(&s0, 0, sizeof s0);
    s1 = s2 = s3 = s0;
    for (size_t i = 0; i < n / CB_VEC_LANES; i += 4) {
        s0 += v[i];
        s1 += v[i + 1];
        s2 += v[i + 2];
        s3 += v[i + 3];
    }
    const cb_vd s = (s0 + s1) + (s2 + s3);
    double total = 0.0;
    for (int k = 0; k < CB_VEC_LANES; ++k) total += s[k];
    return total;
}

static void triad(double *restrict a, const double *restrict b, const double *restrict c,
                  double scalar, size_t n) {
    for (size_t i = 0; i < n; ++i) a[i] = b[i] + scalar * c[i];
}

int colibri_membw_run(int kind, size_t bytes, int n_threads, double min_seconds,
                      colibri_membw_result *out) {
    cb_clear_error();
    if (!out) return cb_fail(COLIBRI_ERR_INVALID, "membw: out is NULL");
    memset(out, 0, sizeof *out);
    if (kind != COLIBRI_MEMBW_READ && kind != COLIBRI_MEMBW_TRIAD)
        return cb_fail(COLIBRI_ERR_INVALID, "membw: kind %d is neither 0 (read) nor 1 (triad)", kind);
    if (n_threads < 0 || n_threads > COLIBRI_MAX_THREADS)
        return cb_fail(COLIBRI_ERR_INVALID, "membw: n_threads %d out of range [0, %d] (0 = default)",
                       n_threads, COLIBRI_MAX_THREADS);
    /* Rounding each array up to pages and staggering them must not wrap size_t. */
    if (bytes > SIZE_MAX / 4)
        return cb_fail(COLIBRI_ERR_INVALID, "membw: %zu bytes is too large", bytes);
    if (!(min_seconds >= 0.0 && min_seconds <= 3600.0))
        return cb_fail(COLIBRI_ERR_INVALID, "membw: min_seconds must be in [0, 3600]");
    if (n_threads == 0) n_threads = omp_get_max_threads();

    const int n_arrays = kind == COLIBRI_MEMBW_READ ? 1 : 3;
    /* Elements per array: whole blocks, at least one block per thread. */
    const size_t n_blocks = bytes / ((size_t)n_arrays * sizeof(double) * CB_MEMBW_BLOCK);
    if (n_blocks < (size_t)n_threads)
        return cb_fail(COLIBRI_ERR_INVALID, "membw: %zu bytes is too small for %d threads "
                       "(need %zu)", bytes, n_threads,
                       (size_t)n_threads * n_arrays * sizeof(double) * CB_MEMBW_BLOCK);
    const size_t n = n_blocks * CB_MEMBW_BLOCK;
    const size_t page = (size_t)sysconf(_SC_PAGESIZE);
    const size_t array_span = (n * sizeof(double) + page - 1) / page * page + CB_MEMBW_STAGGER;
    const size_t map_len = array_span * (size_t)n_arrays;

    double *times = malloc(sizeof(double) * CB_MEMBW_MAX_PASSES);
    if (!times) return cb_fail(COLIBRI_ERR_NOMEM, "membw: out of memory for the pass times");
    const double t_setup = cb_now_s();
    unsigned char *base = mmap(NULL, map_len, PROT_READ | PROT_WRITE,
                               MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (base == MAP_FAILED) {
        free(times);
        return cb_fail(COLIBRI_ERR_NOMEM, "membw: cannot map %zu bytes", map_len);
    }
#ifdef MADV_HUGEPAGE
    (void)madvise(base, map_len, MADV_HUGEPAGE); /* fewer TLB misses; a refusal is harmless */
#endif
    double *a = (double *)(void *)base;
    double *b = (double *)(void *)(base + array_span);
    double *c = (double *)(void *)(base + 2 * array_span);
    const double scalar = 3.0;

    int threads_run = 0, passes = 0, bad = 0;
    double setup_seconds = 0.0, checksum = 0.0;
    double t0 = 0.0, timed = 0.0;
    volatile int stop = 0;

#pragma omp parallel num_threads(n_threads) reduction(+ : checksum) reduction(| : bad)
    {
        const int nt = omp_get_num_threads(), t = omp_get_thread_num();
        const size_t lo = n_blocks * (size_t)t / (size_t)nt * CB_MEMBW_BLOCK;
        const size_t hi = n_blocks * (size_t)(t + 1) / (size_t)nt * CB_MEMBW_BLOCK;
        /* First touch: this thread's pages, by this thread. */
        for (size_t i = lo; i < hi; ++i) a[i] = 1.0;
        if (n_arrays == 3) {
            for (size_t i = lo; i < hi; ++i) b[i] = 2.0;
            for (size_t i = lo; i < hi; ++i) c[i] = 0.5;
        }
#pragma omp barrier
#pragma omp single
        {
            threads_run = nt;
            setup_seconds = cb_now_s() - t_setup;
        }
        for (int pass = -1;; ++pass) { /* pass -1: warm-up, not timed */
#pragma omp single
            t0 = cb_now_s();
            /* implicit barrier: every thread starts after t0 */
            if (n_arrays == 1) {
                const double s = read_sum(a + lo, hi - lo);
                checksum += s;
                bad |= s != (double)(hi - lo);
            } else {
                triad(a + lo, b + lo, c + lo, scalar, hi - lo);
            }
#pragma omp barrier
#pragma omp single
            {
                const double t1 = cb_now_s();
                if (pass >= 0) {
                    times[pass] = t1 - t0;
                    timed += t1 - t0;
                    passes = pass + 1;
                    if ((passes >= CB_MEMBW_MIN_PASSES && timed >= min_seconds) ||
                        passes >= CB_MEMBW_MAX_PASSES)
                        stop = 1;
                }
            }
            /* implicit barrier: every thread sees `stop` */
            if (stop) break;
        }
        if (n_arrays == 3) { /* verify the output, on this thread's own part */
            const double want = 2.0 + scalar * 0.5;
            for (size_t i = lo; i < hi; ++i) bad |= a[i] != want;
            checksum += a[lo] + a[hi - 1];
        }
    }
    munmap(base, map_len);
    if (bad) {
        free(times);
        return cb_fail(COLIBRI_ERR_INVALID, "membw: the %s kernel produced wrong values",
                       kind == COLIBRI_MEMBW_READ ? "read" : "triad");
    }

    const size_t per_pass = n * sizeof(double) * (size_t)n_arrays;
    const double median = cb_sort_median(times, passes);
    out->kind = kind;
    out->n_threads = threads_run;
    out->bytes = n * sizeof(double) * (size_t)n_arrays;
    out->bytes_per_pass = per_pass;
    out->passes = passes;
    out->gbps_median = (double)per_pass / median * 1e-9;
    out->gbps_best = (double)per_pass / times[0] * 1e-9;
    out->gbps_worst = (double)per_pass / times[passes - 1] * 1e-9;
    out->seconds_timed = timed;
    out->setup_seconds = setup_seconds;
    out->checksum = checksum;
    free(times);
    return COLIBRI_OK;
}

int colibri_membw(int kind, size_t bytes, int n_threads, double min_seconds, double *gbps_out) {
    colibri_membw_result r;
    if (!gbps_out) return cb_fail(COLIBRI_ERR_INVALID, "membw: gbps_out is NULL");
    const int status = colibri_membw_run(kind, bytes, n_threads, min_seconds, &r);
    if (status == COLIBRI_OK) *gbps_out = r.gbps_median;
    return status;
}
