/* internal.h — structures shared by the engine's C files (not installed). */
#ifndef COLIBRI_INTERNAL_H
#define COLIBRI_INTERNAL_H

#include <math.h>
#include <string.h>

#include "colibri.h"

/* One weight matrix [rows, cols] of the layer's dtype; scales for int8 (one per row)
 * and int4 (one per group of CB_INT4_GROUP along a row). pk: the same weights in the
 * layout the layer's kernel table packs this dtype into (cbk_kernels.pack), or NULL: the
 * kernels then read w, the stored row-major layout (NULL itself once packed at create). */
typedef struct {
    const void *w;
    const float *scales;
    int rows, cols;
    const void *pk;
    int exact; /* f32 products only, never the tiles' bf16 split of f32 (the router: a softmax
                * magnifies its logits' error) */
} cb_mat;

/* gate/up [inter, H], down [H, inter]. */
typedef struct {
    cb_mat gate, up, down;
    int inter;
} cb_expert;

typedef struct cbk_kernels cbk_kernels; /* kernels.h */

struct colibri_layer {
    int hidden, inter, n_experts, dtype;
    const cbk_kernels *kernels;    /* the table its shape class picks (cbk_kernels_for) */
    colibri_route_config route;
    const float *router;           /* [E, H] */
    cb_expert *experts;            /* [E], malloc'd, owned */
    int has_shared;
    cb_expert shared;
    const float *shared_expert_gate; /* [H] or NULL */
    colibri_pool *pool;            /* owned arena; NULL when weights live in a mapped file */
    int page_kind;                 /* colibri_page_kind */
    size_t weight_bytes;
    int borrowed;                  /* owned by a colibri_model: colibri_layer_free ignores it */
    struct cb_cache *cache;        /* a budgeted model's expert cache (expert_cache.c), or NULL:
                                    * every expert resident */
    int index;                     /* its layer number in a model (the cache's key) */
};

/* Bytes of a [rows, cols] matrix of dtype in the layout of table K, scales included, and the
 * matrix placed at dst in that layout from its stored form (layer.c). */
size_t cb_mat_bytes(const cbk_kernels *K, int dtype, size_t rows, size_t cols);
void cb_place_mat(const cbk_kernels *K, int dtype, const void *src, const float *scales, size_t rows,
                  size_t cols, void *dst, cb_mat *out);

/* One expert's share of a forward call: its tokens (rows of x), their weights, its h. */
typedef struct {
    const cb_expert *ex;
    const int32_t *tok;
    const float *tw;
    int ntok;
    float *h;   /* [ntok, inter] */
    void *prep;    /* h prepared once for the down projection, or NULL: */
    int prep_rows; /* as cbk_xprep_fn prepares rows (packed weight-as-vector kernels), else cbk_prep_fn */
} cb_job;

/* A budgeted model's routed experts (expert_cache.c). A forward call on one of its layers
 * brackets its work with begin/end (one call at a time per model). acquire takes the
 * experts of jobs [j0, njobs) from j0 on, as many as the cache holds at once, sets *j1
 * where that turn ends, puts the turn's jobs already resident in ready[0, *nready) (the
 * shared expert's job is always resident) and starts reading the others. next waits for
 * some of them and makes them resident with nt threads, putting their jobs in ready; it
 * returns *nready == 0 once the turn has none left. An expert's CRC is checked on its
 * first read: a mismatch fails the call (COLIBRI_ERR_FORMAT), as a read error does
 * (COLIBRI_ERR_IO), reported by the next call that leaves none left. */
typedef struct cb_cache cb_cache;
void cb_cache_begin(cb_cache *c);
void cb_cache_end(cb_cache *c);
int cb_cache_acquire(cb_cache *c, colibri_layer *L, const cb_job *jobs, int j0, int njobs, int *j1, int *ready,
                     int *nready);
int cb_cache_next(cb_cache *c, int *ready, int *nready, int nt);
void cb_cache_stats(const cb_cache *c, colibri_memory_stats *out);
void cb_cache_free(cb_cache *c);

/* Thread-local error message (error.c). Returns the status passed in for tail calls. */
int cb_fail(int status, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void cb_clear_error(void);

/* The build's page policy for the weight arenas of loaded models and dense matrices
 * (scons hugepages=auto|off; a MoELayer's descriptor names its own). */
#ifndef COLIBRI_DEFAULT_HUGEPAGES
#define COLIBRI_DEFAULT_HUGEPAGES 1
#endif
#define CB_DEFAULT_HUGEPAGES (COLIBRI_DEFAULT_HUGEPAGES ? COLIBRI_HUGEPAGES_AUTO : COLIBRI_HUGEPAGES_OFF)

/* A budgeted model's reads (colibri_load_options' io_threads, read_depth, direct_io and
 * policy when 0): I/O threads, staging buffers of one tensor each (reads in flight at
 * once), whether they go past the page cache (O_DIRECT), and which expert a miss evicts. */
#ifndef COLIBRI_IO_THREADS
#define COLIBRI_IO_THREADS 4
#endif
#ifndef COLIBRI_READ_DEPTH
#define COLIBRI_READ_DEPTH 8
#endif
#ifndef COLIBRI_DIRECT_IO
#define COLIBRI_DIRECT_IO 1
#endif
#ifndef COLIBRI_CACHE_POLICY
#define COLIBRI_CACHE_POLICY COLIBRI_CACHE_LRU
#endif
#define CB_DEFAULT_IO_THREADS COLIBRI_IO_THREADS
#define CB_DEFAULT_DIRECT_IO COLIBRI_DIRECT_IO
#define CB_DEFAULT_READ_DEPTH COLIBRI_READ_DEPTH
#define CB_DEFAULT_CACHE_POLICY COLIBRI_CACHE_POLICY
/* LFU's use counts halve every this many turns per layer (about as many decode tokens), so
 * that experts hot long ago do not hold their slots for ever in a long-running model */
#ifndef COLIBRI_LFU_HALF_LIFE
#define COLIBRI_LFU_HALF_LIFE 1024
#endif

/* An expert with at most this many tokens runs the decode-class kernels, else prefill's (the
 * kernel parts); a layer call of at most this many tokens is a decode call (layer.c). */
#define CB_DECODE_MAX_TOKENS 2

/* A layer call of at least this many tokens per thread checks and routes its tokens on all
 * its threads (layer.c), below on one: a barrier costs about as much as routing a few. */
#define CB_ROUTE_SPLIT_TOKENS 4

/* Decode work claimed at run time (claim.c). CB_ITEM_WEIGHTS: weights per item, about:
 * small enough that the last items even the threads out, large enough that claiming one
 * (an atomic exchange) and restarting a weight stream cost little (2^17 lost 2% to the
 * static split on a cache-resident Qwen3 int4 layer, 2^20 did not; docs/ARCHITECTURE.md). */
#define CB_ITEM_WEIGHTS (1 << 20)
typedef struct {
    int next, back; /* the next item to try; walking backward from the end */
} cb_walk;
/* A thread's walk over items [0, n) of a list whose taken[] flags start at 0: its first
 * item is n * tid / nt. */
static inline cb_walk cb_walk_from(int n, int tid, int nt) { return (cb_walk){(int)((long)n * tid / nt), 0}; }
/* The next item this thread claims, or -1 when none is left. */
int cb_walk_next(int *taken, int n, cb_walk *w);
/* Rows per item of a matrix of per_row weights x tokens per row: a multiple of 16 rows (a
 * packed block). */
int cb_chunk_rows(long per_row);
/* A prefill's items: CB_PREFILL_ITEM_WORK weights x tokens, about, a token count below
 * CB_PREFILL_STREAM_TOKENS costing as much (an expert of few tokens streams its weights
 * rather than computes); CB_PREFILL_MIN_ROWS rows at least, so that the kernels' register
 * blocks and k chunks stay whole; and a matrix in CB_PREFILL_ITEMS_PER_THREAD items per
 * thread at most, since each item prepares the job's activations again where its path
 * packs them per call (the gemms' panels, the tiles' A tiles: Mixtral's 128 tokens an
 * expert in 64-row items ran its int8 prefill512 on the AMX tiles 0.70x, docs/amx.md).
 * Rows per item of a matrix of `rows` rows of per_row weights for ntok tokens on nt
 * threads, a multiple of 16. */
#define CB_PREFILL_ITEM_WORK (1L << 25)
#define CB_PREFILL_STREAM_TOKENS 8
#define CB_PREFILL_MIN_ROWS 64
#define CB_PREFILL_ITEMS_PER_THREAD 2
int cb_prefill_chunk_rows(long per_row, int ntok, int rows, int nt);
/* A layer call's down projections: output columns in about this many chunks per thread
 * (each chunk over every expert, so of equal work): 4 cost Qwen3 int8 prefill512's down
 * phase about 5% against the static split's one (shorter weight streams, each expert's h
 * read again per chunk), 2 were level with it (docs/packed-layouts.md). */
#define CB_DOWN_ITEMS_PER_THREAD 2

#define CB_INT4_GROUP 32

/* int4k (COLIBRI_INT4K): a row is super-blocks of up to CB_K4_SUPER groups of 32 weights,
 * each a 16-byte header and then its groups' 16 bytes of nibbles (quant.py's int4 order:
 * byte j holds k = j low, 16 + j high). The header's four little-endian words h[0..3]
 * hold 16 six-bit codes, c = j the scale code sc of group j and c = 8 + j its min code mn:
 * code c < 15 is bits 6 (c % 5) .. 6 (c % 5) + 5 of h[c / 5] (one shift and one mask, by
 * constants, where the kernels unroll a super-block), code 15 (mn of group 7) is the top
 * two bits of h[0], h[1] and h[2] as its bits 0-1, 2-3 and 4-5; h[3] is f16 d (low half)
 * and f16 dmin (high half). A weight is d * sc * q - dmin * mn, q the nibble. */
#define CB_K4_SUPER 8
static inline uint32_t cb_k4_code(const uint32_t h[3], int c) {
    if (c < 15) return h[c / 5] >> 6 * (c % 5) & 63;
    return h[0] >> 30 | (h[1] >> 30) << 2 | (h[2] >> 30) << 4;
}
static inline void cb_k4_put_codes(uint32_t h[3], const uint32_t codes[16]) {
    h[0] = h[1] = h[2] = 0;
    for (int c = 0; c < 15; ++c) h[c / 5] |= codes[c] << 6 * (c % 5);
    for (int i = 0; i < 3; ++i) h[i] |= (codes[15] >> 2 * i & 3) << 30;
}
static inline size_t cb_k4_row_bytes(size_t cols) {
    const size_t ng = (cols + CB_INT4_GROUP - 1) / CB_INT4_GROUP;
    return 16 * ((ng + CB_K4_SUPER - 1) / CB_K4_SUPER + ng);
}
/* IEEE half <-> float, round to nearest even (written out: no compiler half type needed) */
static inline float cb_f16_to_f32(uint32_t h) {
    const uint32_t s = (h & 0x8000u) << 16, e = (h >> 10) & 0x1F, m = h & 0x3FF;
    uint32_t w;
    if (e == 0x1F) w = s | 0x7F800000u | (m << 13);          /* Inf, NaN */
    else if (e) w = s | ((e + 112) << 23) | (m << 13);      /* normal */
    else if (!m) w = s;                                     /* zero */
    else {                                                  /* subnormal: m * 2^-24 */
        float f = (float)m * 5.9604644775390625e-8f;
        memcpy(&w, &f, 4);
        w |= s;
    }
    float f;
    memcpy(&f, &w, 4);
    return f;
}
static inline uint16_t cb_f32_to_f16(float f) {
    uint32_t w;
    memcpy(&w, &f, 4);
    const uint32_t s = (w >> 16) & 0x8000u, a = w & 0x7FFFFFFFu;
    if (a > 0x7F800000u) return (uint16_t)(s | 0x7E00u);    /* NaN */
    if (a >= 0x477FF000u) return (uint16_t)(s | 0x7C00u);   /* rounds past 65504: Inf */
    if (a >= 0x38800000u) {                                 /* normal half */
        const uint32_t r = a + 0xFFFu + ((a >> 13) & 1);     /* round to nearest even */
        return (uint16_t)(s | ((r - 0x38000000u) >> 13));
    }
    /* subnormal half (or zero): the value in units of 2^-24, rounded to nearest even */
    float v;
    memcpy(&v, &a, 4);
    v *= 16777216.0f;
    return (uint16_t)(s | (uint32_t)lrintf(v));
}

/* Is dtype one the engine knows (colibri_dtype)? */
int cb_dtype_valid(int dtype);
/* Bytes of the weight data of a [rows, cols] matrix (no scales), and its scale count.
 * Callers bound rows and cols (<= 2^20 each), so neither overflows size_t. */
size_t cb_mat_data_bytes(int dtype, size_t rows, size_t cols);
size_t cb_mat_scale_count(int dtype, size_t rows, size_t cols);

/* n_threads in [0, COLIBRI_MAX_THREADS] (OpenMP aborts on an absurd count), else the error
 * set naming `who` (layer.c). */
int cb_check_threads(const char *who, int n_threads);
/* Thread tid's share [lo, hi) of n items split over nt threads, the cuts aligned to `align`
 * (the last share takes the rest) (layer.c). */
void cb_split_range(int n, int nt, int tid, int align, int *lo, int *hi);

/* The bf16-activation form of an f32 forward fn(obj, x, y, T, n_threads) of `in` inputs and
 * `out` outputs per token: converts x into f32 rows in its own scratch, runs fn, rounds y
 * back to bf16 (bf16io.c). Errors name `who`. */
typedef int (*cb_f32_forward_fn)(void *obj, const float *x, float *y, int n_tokens, int n_threads);
int cb_forward_bf16(const char *who, void *obj, cb_f32_forward_fn fn, int in, int out, const uint16_t *x,
                    uint16_t *y, int n_tokens, int n_threads);

/* A page-aligned buffer of at least `bytes` held for the calling thread in `slot` and reused
 * by its next calls (its contents are not kept), or NULL without memory (scratch.c). The
 * slots of one call do not overlap: the layer's scratch, its prepared panels and prepared
 * activations, its work items' list, and the bf16 forms' f32 rows around them. */
enum { CB_SCRATCH_CALL, CB_SCRATCH_PREP, CB_SCRATCH_BF16, CB_SCRATCH_XPREP, CB_SCRATCH_ITEMS, CB_SCRATCH_SLOTS };
void *cb_scratch(int slot, size_t bytes);

/* Validates a route config against n_experts; sets the error on failure. */
int cb_route_config_check(const colibri_route_config *cfg, int n_experts);
/* colibri_route's work for tokens [t0, t1) of a checked config, without its checks and error
 * state: for a layer's threads, each routing its own tokens (layer.c). */
void cb_route_rows(const float *logits, int t0, int t1, int n_experts, const colibri_route_config *cfg,
                   int32_t *indices, float *weights, int32_t *counts);

/* Releases what colibri_layer_create/loader allocated for a layer (not the struct's mapping). */
void cb_layer_destroy(colibri_layer *layer);

/* Seconds on CLOCK_MONOTONIC; v[0..n) sorted ascending and its median (n >= 1) (timing.c). */
double cb_now_s(void);
double cb_sort_median(double *v, int n);

/* Whether Linux grants this process the AMX tile state (asks once; amx_perm.c). */
int cb_amx_granted(void);

/* CRC-32 (ISO-HDLC, zlib's polynomial), continuing from crc (start with 0). */
uint32_t cb_crc32(uint32_t crc, const void *data, size_t n);

#endif
