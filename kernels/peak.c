/* peak.c — compute peaks of this host: how many multiply-adds per second each unit the
 * kernels can use delivers, the other half (beside membw.c's bandwidth) of a roofline.
 *
 * Method
 *  - Register-resident loops: every thread repeats one instruction on CB_PEAK_ACC
 *    independent accumulators (or, for AMX, four C tiles from two A and two B tiles), so
 *    nothing is loaded and no chain waits on another; the figure is the unit's
 *    throughput, the most any kernel could get from it.
 *  - One untimed warm-up pass (frequency ramp, AMX state), then timed passes between
 *    barriers (CLOCK_MONOTONIC, a pass ends when the slowest thread ends) until they add
 *    up to min_seconds and there are at least CB_PEAK_MIN_PASSES. The figure is the
 *    MEDIAN pass; best and worst are the spread, as for bandwidth.
 *  - Counted operations: a multiply-add is 2 (GFLOP/s, or GOP/s for int8).
 *      f32_fma   fused multiply-add on f32 vectors (AVX-512: vfmadd231ps zmm, 32 per
 *                instruction; AVX2: ymm, 16; elsewhere the compiler's vector a*b+c)
 *      bf16_dot  vdpbf16ps zmm: 32 bf16 pairs into 16 f32 lanes, 64 per instruction
 *      int8_dot  vpdpbusd zmm (AVX-512 VNNI, 128 per instruction) or ymm (AVX-VNNI, 64);
 *                AVX2 alone: vpmaddubsw + vpmaddwd + vpaddd ymm, 64 per triple
 *      amx_bf16  tdpbf16ps on 16x32 by 32x16 tiles: 16384 per instruction
 *      amx_int8  tdpbssd on 16x64 by 64x16 tiles: 32768 per instruction
 *    A unit this build's flags do not enable, or AMX that Linux does not grant, is
 *    COLIBRI_ERR_INVALID with "peak: unavailable: <why>" in colibri_last_error(): no
 *    figure, never 0 (tuner/host/peak.py tells it from other errors by that prefix).
 */
#include <omp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#endif

#include "internal.h"

#define CB_PEAK_MIN_PASSES 5
#define CB_PEAK_MAX_PASSES 100000
#define CB_PEAK_ACC 16     /* independent accumulators: > latency x issue width of any unit */
#define CB_PEAK_ITERS 4096 /* loop trips per pass (x CB_PEAK_ACC instructions) */
#define CB_PEAK_REPS 16    /* inner repetitions: a pass is ITERS x REPS x ACC instructions */

/* ---- the loops: each returns a value that depends on every accumulator (kept live),
 * and the operations it performed per call go in *ops. ---- */

#if defined(__AVX512F__)
#define F32_INSTR "vfmadd231ps zmm"
static double loop_f32(double *ops) {
    __m512 a[CB_PEAK_ACC];
    const __m512 m = _mm512_set1_ps(0.999999f), c = _mm512_set1_ps(1e-7f);
    for (int i = 0; i < CB_PEAK_ACC; ++i) a[i] = _mm512_set1_ps((float)i);
    for (int it = 0; it < CB_PEAK_ITERS * CB_PEAK_REPS; ++it)
        for (int i = 0; i < CB_PEAK_ACC; ++i) a[i] = _mm512_fmadd_ps(a[i], m, c);
    __m512 s = a[0];
    for (int i = 1; i < CB_PEAK_ACC; ++i) s = _mm512_add_ps(s, a[i]);
    *ops = 2.0 * 16 * CB_PEAK_ACC * (double)CB_PEAK_ITERS * CB_PEAK_REPS;
    return _mm512_reduce_add_ps(s);
}
#elif defined(__AVX2__) && defined(__FMA__)
#define F32_INSTR "vfmadd231ps ymm"
static double loop_f32(double *ops) {
    __m256 a[CB_PEAK_ACC];
    const __m256 m = _mm256_set1_ps(0.999999f), c = _mm256_set1_ps(1e-7f);
    for (int i = 0; i < CB_PEAK_ACC; ++i) a[i] = _mm256_set1_ps((float)i);
    for (int it = 0; it < CB_PEAK_ITERS * CB_PEAK_REPS; ++it)
        for (int i = 0; i < CB_PEAK_ACC; ++i) a[i] = _mm256_fmadd_ps(a[i], m, c);
    float f[8];
    __m256 s = a[0];
    for (int i = 1; i < CB_PEAK_ACC; ++i) s = _mm256_add_ps(s, a[i]);
    _mm256_storeu_ps(f, s);
    *ops = 2.0 * 8 * CB_PEAK_ACC * (double)CB_PEAK_ITERS * CB_PEAK_REPS;
    return f[0] + f[7];
}
#else
/* the compiler's vectors: a fused multiply-add where the target has one (NEON fmla) */
#define F32_INSTR "vector a*b+c (compiler's choice)"
typedef float cb_pv __attribute__((vector_size(16)));
static double loop_f32(double *ops) {
    cb_pv a[CB_PEAK_ACC];
    const cb_pv m = {0.999999f, 0.999999f, 0.999999f, 0.999999f}, c = {1e-7f, 1e-7f, 1e-7f, 1e-7f};
    for (int i = 0; i < CB_PEAK_ACC; ++i) a[i] = (cb_pv){(float)i, (float)i, (float)i, (float)i};
    for (int it = 0; it < CB_PEAK_ITERS * CB_PEAK_REPS; ++it)
        for (int i = 0; i < CB_PEAK_ACC; ++i) a[i] = a[i] * m + c;
    cb_pv s = a[0];
    for (int i = 1; i < CB_PEAK_ACC; ++i) s += a[i];
    *ops = 2.0 * 4 * CB_PEAK_ACC * (double)CB_PEAK_ITERS * CB_PEAK_REPS;
    return s[0] + s[3];
}
#endif

#if defined(__AVX512BF16__)
#define BF16_INSTR "vdpbf16ps zmm"
static double loop_bf16(double *ops) {
    __m512 a[CB_PEAK_ACC];
    const __m512bh x = (__m512bh)_mm512_set1_epi16(0x3f80), y = (__m512bh)_mm512_set1_epi16(0x3380);
    for (int i = 0; i < CB_PEAK_ACC; ++i) a[i] = _mm512_set1_ps((float)i);
    for (int it = 0; it < CB_PEAK_ITERS * CB_PEAK_REPS; ++it)
        for (int i = 0; i < CB_PEAK_ACC; ++i) a[i] = _mm512_dpbf16_ps(a[i], x, y);
    __m512 s = a[0];
    for (int i = 1; i < CB_PEAK_ACC; ++i) s = _mm512_add_ps(s, a[i]);
    *ops = 2.0 * 32 * CB_PEAK_ACC * (double)CB_PEAK_ITERS * CB_PEAK_REPS;
    return _mm512_reduce_add_ps(s);
}
#endif

#if defined(__AVX512VNNI__) || defined(__AVXVNNI__)
/* The instruction in asm: from the intrinsic (an array of accumulators or 16 named ones
 * alike) GCC 12 copied every accumulator each trip and kept two on the stack, and the
 * store-to-load chain through them capped the measured rate */
#define CB_ACC16(X) X(0) X(1) X(2) X(3) X(4) X(5) X(6) X(7) X(8) X(9) X(10) X(11) X(12) X(13) X(14) X(15)
static double loop_int8(double *ops) {
#if defined(__AVX512VNNI__)
#define VT __m512i
#define DP(a) __asm__("vpdpbusd %2, %1, %0" : "+v"(a) : "v"(x), "v"(y));
#define ADD _mm512_add_epi32
#define ZERO _mm512_setzero_si512
    const __m512i x = _mm512_set1_epi8(3), y = _mm512_set1_epi8(-2);
#define INIT(i) __m512i a##i = _mm512_set1_epi32(i);
    const double lanes = 64;
#else
#define VT __m256i
#define DP(a) __asm__("{vex} vpdpbusd %2, %1, %0" : "+v"(a) : "v"(x), "v"(y));
#define ADD _mm256_add_epi32
#define ZERO _mm256_setzero_si256
    const __m256i x = _mm256_set1_epi8(3), y = _mm256_set1_epi8(-2);
#define INIT(i) __m256i a##i = _mm256_set1_epi32(i);
    const double lanes = 32;
#endif
    CB_ACC16(INIT)
#define STEP(i) DP(a##i)
    for (int it = 0; it < CB_PEAK_ITERS * CB_PEAK_REPS; ++it) {
        CB_ACC16(STEP)
    }
#define SUM(i) s = ADD(s, a##i);
    VT s = ZERO();
    CB_ACC16(SUM)
    *ops = 2.0 * lanes * CB_PEAK_ACC * (double)CB_PEAK_ITERS * CB_PEAK_REPS;
    int32_t out[sizeof(VT) / 4];
    memcpy(out, &s, sizeof out);
    return (double)out[0];
#undef VT
#undef DP
#undef ADD
#undef ZERO
#undef INIT
#undef STEP
#undef SUM
}
#if defined(__AVX512VNNI__)
#define INT8_INSTR "vpdpbusd zmm"
#else
#define INT8_INSTR "vpdpbusd ymm (AVX-VNNI)"
#endif
#elif defined(__AVX2__)
/* AVX2 alone: the kernels' dot product (templates/expert_ffn/isa/avx2.j2), 32 byte
 * products per vpmaddubsw, widened by vpmaddwd and added; 8 accumulators (plus the
 * temporaries and constants, within the 16 ymm registers: the chain through an accumulator
 * is one vpaddd). In asm, so that the constant product is not hoisted out of the loop. */
#define CB_ACC8(X) X(0) X(1) X(2) X(3) X(4) X(5) X(6) X(7)
static double loop_int8(double *ops) {
    const __m256i x = _mm256_set1_epi8(3), y = _mm256_set1_epi8(-2), one = _mm256_set1_epi16(1);
#define INIT(i) __m256i a##i = _mm256_set1_epi32(i);
#define STEP(i)                                                                                  \
    {                                                                                            \
        __m256i t;                                                                               \
        __asm__("vpmaddubsw %2, %3, %1\n\tvpmaddwd %4, %1, %1\n\tvpaddd %1, %0, %0"              \
                : "+x"(a##i), "=&x"(t) : "x"(y), "x"(x), "x"(one));                              \
    }
    CB_ACC8(INIT)
    for (int it = 0; it < CB_PEAK_ITERS * CB_PEAK_REPS * 2; ++it) {
        CB_ACC8(STEP)
    }
#define SUM(i) s = _mm256_add_epi32(s, a##i);
    __m256i s = _mm256_setzero_si256();
    CB_ACC8(SUM)
    *ops = 2.0 * 32 * 8 * 2.0 * (double)CB_PEAK_ITERS * CB_PEAK_REPS;
    int32_t out[8];
    memcpy(out, &s, sizeof out);
    return (double)out[0];
#undef INIT
#undef STEP
#undef SUM
}
#define INT8_INSTR "vpmaddubsw+vpmaddwd ymm (AVX2)"
#endif

#if defined(__AMX_TILE__) && defined(__AMX_BF16__) && defined(__AMX_INT8__) && defined(__linux__)
#define CB_PEAK_AMX 1
#include "amx_tiles.h" /* the configuration and the memory operations with their true operands */

/* tiles 0-3: C (16 x 16 x 4 bytes); 4, 5: A; 6, 7: B (16 rows of 64 bytes each) */
static double loop_amx(int int8, double *ops) {
    cb_tilecfg cfg;
    memset(&cfg, 0, sizeof cfg);
    cfg.palette = 1;
    for (int t = 0; t < 8; ++t) {
        cfg.colsb[t] = 64;
        cfg.rows[t] = 16;
    }
    CB_TILE_LOADCONFIG(&cfg);
    static const uint8_t src[16 * 64]; /* zeros: the unit's rate does not depend on values */
    float c[16 * 16];
    for (int t = 0; t < 1; ++t) {
        _tile_zero(0);
        _tile_zero(1);
        _tile_zero(2);
        _tile_zero(3);
        CB_TILE_LOADD(4, src, 64);
        CB_TILE_LOADD(5, src, 64);
        CB_TILE_LOADD(6, src, 64);
        CB_TILE_LOADD(7, src, 64);
    }
    const int n = CB_PEAK_ITERS * CB_PEAK_REPS / 4;
    if (int8) {
        for (int it = 0; it < n; ++it) {
            _tile_dpbssd(0, 4, 6);
            _tile_dpbssd(1, 4, 7);
            _tile_dpbssd(2, 5, 6);
            _tile_dpbssd(3, 5, 7);
        }
    } else {
        for (int it = 0; it < n; ++it) {
            _tile_dpbf16ps(0, 4, 6);
            _tile_dpbf16ps(1, 4, 7);
            _tile_dpbf16ps(2, 5, 6);
            _tile_dpbf16ps(3, 5, 7);
        }
    }
    CB_TILE_STORED(0, c, 64);
    _tile_release();
    *ops = 2.0 * 16 * 16 * (int8 ? 64 : 32) * 4.0 * n;
    return (double)c[0];
}
#else
#define CB_PEAK_AMX 0
#endif

/* the loop of a kind, or NULL with the reason why this build or host cannot run it */
static double (*peak_loop(int kind, const char **instr, const char **why))(double *) {
    *why = NULL;
    switch (kind) {
    case COLIBRI_PEAK_F32_FMA:
        *instr = F32_INSTR;
        return loop_f32;
    case COLIBRI_PEAK_BF16_DOT:
#if defined(__AVX512BF16__)
        *instr = BF16_INSTR;
        return loop_bf16;
#else
        *why = "this build has no bf16 dot instruction (AVX512_BF16)";
        return NULL;
#endif
    case COLIBRI_PEAK_INT8_DOT:
#if defined(__AVX512VNNI__) || defined(__AVXVNNI__) || defined(__AVX2__)
        *instr = INT8_INSTR;
        return loop_int8;
#else
        *why = "this build has no int8 dot instruction (AVX512_VNNI, AVX-VNNI or AVX2's vpmaddubsw)";
        return NULL;
#endif
    default:
        *why = "this build has no AMX (AMX-TILE, AMX-BF16, AMX-INT8)";
        return NULL;
    }
}

#if CB_PEAK_AMX
static double amx_bf16(double *ops) { return loop_amx(0, ops); }
static double amx_int8(double *ops) { return loop_amx(1, ops); }
#endif

int colibri_peak_run(int kind, int n_threads, double min_seconds, colibri_peak_result *out) {
    cb_clear_error();
    if (!out) return cb_fail(COLIBRI_ERR_INVALID, "peak: out is NULL");
    memset(out, 0, sizeof *out);
    if (kind < COLIBRI_PEAK_F32_FMA || kind > COLIBRI_PEAK_AMX_INT8)
        return cb_fail(COLIBRI_ERR_INVALID, "peak: kind %d is not a colibri_peak_kind (0..4)", kind);
    if (n_threads < 0 || n_threads > COLIBRI_MAX_THREADS)
        return cb_fail(COLIBRI_ERR_INVALID, "peak: n_threads %d out of range [0, %d] (0 = default)",
                       n_threads, COLIBRI_MAX_THREADS);
    if (!(min_seconds >= 0.0 && min_seconds <= 3600.0))
        return cb_fail(COLIBRI_ERR_INVALID, "peak: min_seconds must be in [0, 3600]");
    const char *instr = "", *why = NULL;
    double (*loop)(double *) = NULL;
    if (kind == COLIBRI_PEAK_AMX_BF16 || kind == COLIBRI_PEAK_AMX_INT8) {
#if CB_PEAK_AMX
        if (!cb_amx_granted()) {
            why = "Linux did not grant this process the AMX tile state";
        } else {
            loop = kind == COLIBRI_PEAK_AMX_BF16 ? amx_bf16 : amx_int8;
            instr = kind == COLIBRI_PEAK_AMX_BF16 ? "tdpbf16ps" : "tdpbssd";
        }
#else
        peak_loop(kind, &instr, &why);
#endif
    } else {
        loop = peak_loop(kind, &instr, &why);
    }
    if (!loop) return cb_fail(COLIBRI_ERR_INVALID, "peak: unavailable: %s", why);
    if (n_threads == 0) n_threads = omp_get_max_threads();

    double *times = malloc(sizeof(double) * CB_PEAK_MAX_PASSES);
    if (!times) return cb_fail(COLIBRI_ERR_NOMEM, "peak: out of memory for the pass times");
    int threads_run = 0, passes = 0;
    double ops_per_pass = 0.0, t0 = 0.0, timed = 0.0, sink = 0.0;
    volatile int stop = 0;
#pragma omp parallel num_threads(n_threads) reduction(+ : sink)
    {
        double ops = 0.0;
        for (int pass = -1;; ++pass) { /* pass -1: warm-up, not timed */
#pragma omp single
            t0 = cb_now_s();
            sink += loop(&ops);
#pragma omp barrier
#pragma omp single
            {
                const double t1 = cb_now_s();
                threads_run = omp_get_num_threads();
                ops_per_pass = ops * threads_run;
                if (pass >= 0) {
                    times[pass] = t1 - t0;
                    timed += t1 - t0;
                    passes = pass + 1;
                    if ((passes >= CB_PEAK_MIN_PASSES && timed >= min_seconds) ||
                        passes >= CB_PEAK_MAX_PASSES)
                        stop = 1;
                }
            }
            if (stop) break;
        }
    }
    const double median = cb_sort_median(times, passes);
    out->kind = kind;
    out->n_threads = threads_run;
    out->ops_per_pass = ops_per_pass;
    out->passes = passes;
    out->gops_median = ops_per_pass / median * 1e-9;
    out->gops_best = ops_per_pass / times[0] * 1e-9;
    out->gops_worst = ops_per_pass / times[passes - 1] * 1e-9;
    out->seconds_timed = timed;
    out->checksum = sink;
    snprintf(out->instruction, sizeof out->instruction, "%s", instr);
    free(times);
    return COLIBRI_OK;
}
