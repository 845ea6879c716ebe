/*
 * colibri.h — public API of the Colibri MoE inference engine.
 *
 * Every function reports failure through its return value (a status code, or
 * NULL) and a thread-local message readable with colibri_last_error(). No
 * function aborts or exits the process on bad input.
 *
 * Bad input (tests/engine/test_capi.py and tests/engine/test_api_errors.py check each case):
 *  - A NULL pointer argument is COLIBRI_ERR_INVALID (NULL from constructors) with a
 *    message naming it. Getters given NULL return their sentinel (0 or -1) and set the
 *    message. The free functions accept NULL (no-op). Exceptions, by design: `counts`
 *    of colibri_route and `shared_expert_gate` of a layer may be NULL, and with
 *    n_tokens == 0 colibri_route / colibri_layer_forward read no array at all.
 *  - Counts out of range (negative tokens, top_k < 1 or > n_experts, k_min > k_max, a
 *    dtype or scoring code that does not exist, dims above the limits) are
 *    COLIBRI_ERR_INVALID. n_tokens == 0 is a successful no-op, except for colibri_infer,
 *    whose seq_len must be >= 1.
 *  - Thread counts: 0 means the library default; < 0 or > COLIBRI_MAX_THREADS is
 *    COLIBRI_ERR_INVALID (OpenMP would abort the process on a count it cannot create).
 *  - Array lengths cannot be checked in C: every array must hold the elements its
 *    comment states. Using a handle after its free function is undefined in C; the
 *    Python binding raises instead.
 *  - NaN and Inf: see colibri_route and colibri_layer_forward.
 *
 * The block between CFFI-BEGIN and CFFI-END holds plain declarations only (no
 * preprocessor lines): the Python binding feeds it to cffi verbatim.
 */
#ifndef COLIBRI_H
#define COLIBRI_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define COLIBRI_FORMAT_MAGIC 0xCAFE1234u
#define COLIBRI_FORMAT_VERSION 1u
#define COLIBRI_MAX_EXPERTS 4096
#define COLIBRI_MAX_THREADS 1024

/* CFFI-BEGIN */
typedef enum {
    COLIBRI_OK = 0,
    COLIBRI_ERR_INVALID = 1, /* a bad argument: NULL, wrong size, out of range */
    COLIBRI_ERR_NOMEM = 2,   /* allocation or mapping failed */
    COLIBRI_ERR_FORMAT = 3,  /* malformed model file */
    COLIBRI_ERR_IO = 4,      /* open/stat/mmap of a file failed */
    COLIBRI_ERR_CORRUPT = 5  /* guarded mode: a kernel wrote outside its buffer */
} colibri_status;

typedef enum {
    COLIBRI_F32 = 0,
    COLIBRI_BF16 = 1, /* upper 16 bits of an IEEE float, round-to-nearest-even */
    COLIBRI_INT8 = 2, /* symmetric, one float scale per output row: w = q * scale; the
                       * kernels quantize activations to int8 per group of 32 (as int4) */
    COLIBRI_INT4 = 3, /* the older int4 format, "int4g32" in Python and the tools (files
                       * of it still load); symmetric, one float scale per group of 32 along a row; a row is
                       * ceil(cols/32) groups of 16 bytes: byte j = (q[j] + 8) | (q[16+j] + 8) << 4,
                       * q in [-7, 7], w = q * scale (padding weights q = 0). The kernels
                       * also quantize activations to int8 per group of 32 (FORMAT.md) */
    COLIBRI_INT4K = 4 /* "int4" in Python and the tools, what they write for int4: 4.5 bits
                       * per weight, no separate scales: a row is super-blocks of
                       * up to 8 groups of 32, each a 16-byte header (6-bit scale and min
                       * codes per group, f16 d and dmin) and then its groups' 16 bytes of
                       * nibbles q in [0, 15]: w = d * sc * q - dmin * mn (FORMAT.md,
                       * colibri_quantize_int4k writes it) */
} colibri_dtype;

typedef enum {
    COLIBRI_SCORING_SOFTMAX = 0,      /* softmax over all experts, top-k, optional renorm */
    COLIBRI_SCORING_SOFTMAX_TOPK = 1  /* top-k logits, softmax over those k */
} colibri_scoring;

typedef enum {
    COLIBRI_HUGEPAGES_OFF = 0,  /* normal pages */
    COLIBRI_HUGEPAGES_AUTO = 1  /* explicit huge pages, else THP advice, else normal */
} colibri_hugepages;

typedef enum {
    COLIBRI_PAGES_NORMAL = 0,
    COLIBRI_PAGES_THP = 1,      /* madvise(MADV_HUGEPAGE) accepted */
    COLIBRI_PAGES_HUGETLB = 2,  /* MAP_HUGETLB mapping */
    COLIBRI_PAGES_FILE = 3      /* read-only mapping of a model file */
} colibri_page_kind;

/* Last error message of the calling thread ("" when none). */
const char *colibri_last_error(void);
/* Library version string, e.g. "0.1.0". */
const char *colibri_version(void);
/* JSON object describing the build: profile, kernel ISA, knob values, flags. */
const char *colibri_build_info(void);

/* Default thread count for colibri_infer and n_threads 0 (0 = one per online CPU);
 * < 0 or > COLIBRI_MAX_THREADS: COLIBRI_ERR_INVALID, the default is kept. */
int colibri_set_num_threads(int n_threads);
int colibri_get_num_threads(void);
/* Forward calls (layers, dense matrices, their bf16 forms) keep their scratch memory per
 * calling thread, grown to the largest call so far, and reuse it; it is freed when the
 * thread exits. This frees the calling thread's at once (the next call allocates again). */
void colibri_release_scratch(void);
/* Guarded mode (for checking generated kernels, not for production): every layer call
 * surrounds each expert's scratch with canaries and fails with COLIBRI_ERR_CORRUPT if a
 * kernel overwrote one. Process-wide; returns the previous setting. */
int colibri_set_guards(int on);
/* 1 when this library runs f32/bf16 experts with many tokens on AMX tiles in this process
 * (built for a target with AMX, the amx knob on, and Linux granted the tile state: asked
 * on the first call), else 0. */
int colibri_uses_amx(void);

/* ---- memory pool: one page-aligned arena, bump-allocated ---- */
typedef struct colibri_pool colibri_pool;
/* numa_node < 0: no binding. A node that cannot be bound is an error. */
colibri_pool *colibri_pool_create(size_t capacity, int hugepages, int numa_node);
void *colibri_pool_alloc(colibri_pool *pool, size_t bytes, size_t align);
size_t colibri_pool_used(const colibri_pool *pool);
size_t colibri_pool_capacity(const colibri_pool *pool);
int colibri_pool_page_kind(const colibri_pool *pool);
int colibri_pool_numa_node(const colibri_pool *pool);
void colibri_pool_free(colibri_pool *pool);

/* ---- routing ---- */
typedef struct {
    int scoring;        /* colibri_scoring */
    int top_k;          /* fixed mode: experts per token, 1..n_experts */
    int norm_topk_prob; /* softmax scoring: renormalise the chosen weights to sum 1 */
    float dyn_p;        /* > 0: dynamic mode, smallest set with mass >= dyn_p */
    int k_min;          /* dynamic mode bounds, 1 <= k_min <= k_max <= n_experts */
    int k_max;
} colibri_route_config;

/* Slots per token in the index/weight arrays: k_max in dynamic mode, else top_k
 * (0 with a message for a NULL cfg). */
int colibri_route_slots(const colibri_route_config *cfg);

/* logits [n_tokens, n_experts] -> indices/weights [n_tokens, slots], counts [n_tokens].
 * Chosen experts are in descending weight order (ties: lower index first);
 * unused slots hold index -1 and weight 0. counts may be NULL.
 * NaN logits are never chosen; a token whose logits are all NaN gets count 0 (every
 * slot -1 / 0). +Inf logits share the whole mass equally, -Inf ones get weight 0:
 * weights are always finite, in [0, 1]. */
int colibri_route(const float *logits, int n_tokens, int n_experts,
                  const colibri_route_config *cfg,
                  int32_t *indices, float *weights, int32_t *counts);

/* ---- one MoE layer ---- */
typedef struct {
    int hidden;       /* H */
    int inter;        /* I, per routed expert */
    int n_experts;    /* E */
    colibri_route_config route;
    int weight_dtype; /* colibri_dtype of gate/up/down and the shared expert */
    const float *router;       /* [E, H] f32 */
    const void *gate;          /* [E, I, H] of weight_dtype */
    const void *up;            /* [E, I, H] */
    const void *down;          /* [E, H, I] */
    const float *gate_scales;  /* int8: [E, I]; int4: [E, I, ceil(H/32)] */
    const float *up_scales;    /* int8: [E, I]; int4: [E, I, ceil(H/32)] */
    const float *down_scales;  /* int8: [E, H]; int4: [E, H, ceil(I/32)] */
    int shared_inter;          /* S, 0 = no shared expert */
    const void *shared_gate;   /* [S, H] */
    const void *shared_up;     /* [S, H] */
    const void *shared_down;   /* [H, S] */
    const float *shared_gate_scales; /* int8: [S]; int4: [S, ceil(H/32)] */
    const float *shared_up_scales;   /* int8: [S]; int4: [S, ceil(H/32)] */
    const float *shared_down_scales; /* int8: [H]; int4: [H, ceil(S/32)] */
    const float *shared_expert_gate; /* [H]: output scaled by sigmoid(w.x); NULL = ungated */
    int hugepages;    /* colibri_hugepages for the weight arena */
    int numa_node;    /* < 0: no binding */
} colibri_layer_desc;

typedef struct colibri_layer colibri_layer;

/* Copies the weights into one arena (experts contiguous). */
colibri_layer *colibri_layer_create(const colibri_layer_desc *desc);
/* y[T,H] = moe(x[T,H]) (no residual). n_threads 0 = library default. x and y must not
 * overlap (COLIBRI_ERR_INVALID). A token whose row of x holds a NaN or an Inf, or whose
 * router logits are all NaN (finite x whose products overflow), gets a row of NaN in y
 * and takes no part in routing or the shared expert: the other tokens' outputs are the
 * same as without it. */
int colibri_layer_forward(colibri_layer *layer, const float *x, float *y,
                          int n_tokens, int n_threads);
/* The same for bf16 activations (a bf16 model's hidden states, as uint16 bits): x and y
 * [T, H] bf16; the engine computes in f32 from x's exact f32 values and rounds y to nearest
 * even, so y is colibri_layer_forward's output rounded to bf16. x and y may be the same
 * buffer. */
int colibri_layer_forward_bf16(colibri_layer *layer, const uint16_t *x, uint16_t *y,
                               int n_tokens, int n_threads);
/* Arena facts: page kind (colibri_page_kind) and bytes of weights held. */
int colibri_layer_page_kind(const colibri_layer *layer);
size_t colibri_layer_weight_bytes(const colibri_layer *layer);
/* The kernels a layer runs, picked when it is created (or loaded) from its shapes:
 * "default" (the build's base knobs) or the tuned shape class its hidden and expert
 * inter sizes fall in, e.g. "h22_i19" (docs/shape-classes.md). NULL with a message for
 * a NULL layer. */
const char *colibri_layer_kernels(const colibri_layer *layer);
/* The shape-class bin of a matrix dimension: round(2 log2 n), a half-octave grid
 * (-1 with a message for n < 1). */
int colibri_shape_bin(int n);
void colibri_layer_free(colibri_layer *layer);

/* ---- one dense matrix: a linear projection y = W x on the expert kernels ---- */
typedef struct colibri_dense colibri_dense;

/* Copies W [rows, cols] of weight_dtype (int8 scales [rows]; int4 packed rows of
 * ceil(cols/32) * 16 bytes with scales [rows, ceil(cols/32)]). NULL with a message. */
colibri_dense *colibri_dense_create(int rows, int cols, int weight_dtype, const void *w,
                                    const float *scales);
/* y[T, rows] = x[T, cols] W^T; n_threads 0 = library default; x and y must not overlap.
 * (Inf and NaN propagate as the products give them: no per-token masking as in the layer.) */
int colibri_dense_forward(colibri_dense *dense, const float *x, float *y, int n_tokens,
                          int n_threads);
/* The same for bf16 activations, x [T, cols] and y [T, rows] (colibri_layer_forward_bf16). */
int colibri_dense_forward_bf16(colibri_dense *dense, const uint16_t *x, uint16_t *y, int n_tokens,
                               int n_threads);
size_t colibri_dense_weight_bytes(const colibri_dense *dense);
void colibri_dense_free(colibri_dense *dense);

/* ---- int4k: the 4.5-bit format (COLIBRI_INT4K) ---- */
/* Bytes of one row of cols weights in int4k. */
size_t colibri_int4k_row_bytes(int cols);
/* Quantizes w [rows, cols] (float32, row-major) into out (rows * colibri_int4k_row_bytes(cols)
 * bytes): per group of 32 the scale and min of the least squared error over a few starting
 * ranges, rounded to 6 bits against the super-block's f16 d and dmin. NaN or Inf in a
 * super-block makes it NaN; a super-block whose scale overflows f16 fails the call
 * (COLIBRI_ERR_INVALID, out then partly written). n_threads 0 = library default. */
int colibri_quantize_int4k(const float *w, int rows, int cols, void *out, int n_threads);

/* ---- model files (format v2, reads v1; see FORMAT.md) ---- */
typedef struct colibri_model colibri_model;
/* Maps the file read-only and validates it; NULL with a message naming the
 * field and byte offset on any defect. */
colibri_model *colibri_load_model(const char *path);
/* What colibri_load_model_with does differently (zero-initialise it; NULL: the defaults). */
typedef struct colibri_load_options {
    int skip_crc; /* 1: leave the tensors' CRC-32 unchecked (a corrupt payload then loads); for a
                   * caller that wrote the file itself and checks the outputs (the tuner's timing
                   * workers). The header and the tensor table are checked as always. */
    size_t memory_budget; /* 0: every expert resident (packed at load, or read in place from the
                   * mapping). Else the bytes of weights to hold: the routers and shared experts
                   * stay resident, and the routed experts take turns in an expert cache of what
                   * is left, read from the file when a call needs them (their CRC-32 checked on
                   * first read). Too small for the resident parts plus one expert: an error. */
    int io_threads; /* with a budget: threads that read the missing experts while the call
                   * computes the resident ones (0: the build's default, 4; -1: none, the
                   * call's threads read them before computing) */
    int read_depth; /* with a budget: tensors read at once, each through a staging buffer of
                   * the largest stored tensor, paid from the budget (0: the build's
                   * default, 8; fewer where the budget would otherwise hold no expert) */
    int direct_io;  /* with a budget: 1 reads with O_DIRECT, past the page cache (a read that
                   * fails so goes through it); -1 through the page cache; 0 the build's default */
    int policy;     /* with a budget: the cached expert a miss replaces, COLIBRI_CACHE_LRU the least
                   * recently used, COLIBRI_CACHE_LFU the least often used (ties: the least
                   * recently used; the counts halve about every 1024 calls per layer, so old
                   * favourites fade); 0 the build's default (LRU) */
} colibri_load_options;
enum { COLIBRI_CACHE_LRU = 1, COLIBRI_CACHE_LFU = 2 };
colibri_model *colibri_load_model_with(const char *path, const colibri_load_options *opts);
/* Each layer in order: h = h + moe(h). input/output [seq_len, hidden]; they may alias.
 * seq_len must be >= 1. A token with NaN/Inf in input ends as a NaN row (see forward). */
int colibri_infer(colibri_model *model, const float *input, float *output, int seq_len);
void colibri_free_model(colibri_model *model);
int colibri_model_n_layers(const colibri_model *model);
int colibri_model_hidden(const colibri_model *model);
/* Borrowed pointer to layer i, valid until colibri_free_model (colibri_layer_free
 * ignores it). NULL for a NULL model or an index outside [0, n_layers). The two getters
 * above return -1 for a NULL model. */
colibri_layer *colibri_model_layer(colibri_model *model, int index);
/* A model's weight memory and its expert cache's traffic since load. Without a budget the
 * counters stay 0 and resident_bytes is every weight's. */
typedef struct colibri_memory_stats {
    uint64_t hits, misses;  /* routed experts a call found resident / had to read */
    uint64_t evictions;     /* experts dropped to make room */
    uint64_t bytes_read;    /* expert bytes read from the file */
    double stall_seconds;   /* time calls waited on those reads (reading, checking, packing) */
    size_t resident_bytes;  /* weights held now: resident parts + cached experts */
    size_t budget_bytes;    /* the budget (0: none) */
    int cache_slots;        /* experts the cache holds at once (0: no cache) */
    double wait_seconds;    /* the part of stall_seconds spent waiting for the disk */
    size_t staging_bytes;   /* the buffers reads go through (inside the budget) */
    int io_threads;         /* I/O threads running (0: none yet, or the calls' threads read) */
    int direct_io;          /* 1: reads go past the page cache (O_DIRECT) */
    int policy;             /* COLIBRI_CACHE_LRU or COLIBRI_CACHE_LFU (0: no cache) */
} colibri_memory_stats;
int colibri_model_stats(const colibri_model *model, colibri_memory_stats *out);

/* ---- timing (for the tuner and benchmarks) ---- */
/* Runs `warmup` calls, then times calls (clock_gettime, one sample per call) until
 * min_seconds have passed or max_samples were taken. Call i uses input
 * (i mod n_inputs) of inputs [n_inputs, n_tokens, hidden]; out [n_tokens, hidden]. */
int colibri_bench_layer(colibri_layer *layer, const float *inputs, int n_inputs, int n_tokens,
                        float *out, int n_threads, int warmup, double min_seconds,
                        int max_samples, double *samples, int *n_samples);
/* The same over n_layers layers of one hidden size: call i runs layer (i mod n_layers),
 * as a model's layers follow each other, so weights several times the last-level
 * cache can be streamed even where one layer's would fit in it. */
int colibri_bench_layers(colibri_layer *const *layers, int n_layers, const float *inputs,
                         int n_inputs, int n_tokens, float *out, int n_threads, int warmup,
                         double min_seconds, int max_samples, double *samples, int *n_samples);

/* Times colibri_route alone on logits [n_tokens, n_experts] (same loop as above);
 * idx and weights [n_tokens, colibri_route_slots(cfg)] receive the last result. */
int colibri_bench_route(const float *logits, int n_tokens, int n_experts,
                        const colibri_route_config *cfg, int32_t *idx, float *weights,
                        int warmup, double min_seconds, int max_samples, double *samples,
                        int *n_samples);

/* ---- memory bandwidth (membw.c; the host probe's bandwidth figures) ---- */
typedef enum {
    COLIBRI_MEMBW_READ = 0,  /* sum of one array: 8 bytes counted per element */
    COLIBRI_MEMBW_TRIAD = 1  /* a = b + s*c: 24 bytes per element (STREAM; no write-allocate) */
} colibri_membw_kind;

typedef struct {
    int kind;               /* colibri_membw_kind */
    int n_threads;          /* OpenMP threads that ran */
    size_t bytes;           /* footprint of all arrays (bytes rounded down to whole blocks) */
    size_t bytes_per_pass;  /* bytes counted per pass (see the kind) */
    int passes;             /* timed passes (after one warm-up pass) */
    double gbps_median;     /* the figure to use: median pass, 1e9 bytes/s */
    double gbps_best;       /* fastest pass */
    double gbps_worst;      /* slowest pass */
    double seconds_timed;   /* sum of the timed passes */
    double setup_seconds;   /* map + first touch */
    double checksum;        /* keeps the results live; checked inside */
} colibri_membw_result;

/* Streams `bytes` (all arrays together; several times the last-level cache for
 * DRAM figures) with n_threads OpenMP threads (0 = default) for at least
 * min_seconds of timed passes. Arrays are page-aligned and first touched by the
 * threads that stream them. */
int colibri_membw_run(int kind, size_t bytes, int n_threads, double min_seconds,
                      colibri_membw_result *out);
/* The same, returning only the median GB/s. */
int colibri_membw(int kind, size_t bytes, int n_threads, double min_seconds, double *gbps_out);
/* ---- compute peaks (peak.c; the host probe's roofline figures) ---- */
typedef enum {
    COLIBRI_PEAK_F32_FMA = 0,   /* f32 fused multiply-add on the widest vectors */
    COLIBRI_PEAK_BF16_DOT = 1,  /* vdpbf16ps (AVX512_BF16) */
    COLIBRI_PEAK_INT8_DOT = 2,  /* vpdpbusd (AVX512_VNNI, else AVX-VNNI) */
    COLIBRI_PEAK_AMX_BF16 = 3,  /* tdpbf16ps */
    COLIBRI_PEAK_AMX_INT8 = 4   /* tdpbssd */
} colibri_peak_kind;

typedef struct {
    int kind;               /* colibri_peak_kind */
    int n_threads;          /* OpenMP threads that ran */
    double ops_per_pass;    /* operations of one pass, all threads (a multiply-add is 2) */
    int passes;             /* timed passes (after one warm-up pass) */
    double gops_median;     /* the figure to use: median pass, 1e9 operations/s */
    double gops_best;       /* fastest pass */
    double gops_worst;      /* slowest pass */
    double seconds_timed;   /* sum of the timed passes */
    double checksum;        /* keeps the results live */
    char instruction[48];   /* what was timed, e.g. "vdpbf16ps zmm" */
} colibri_peak_result;

/* Times a register-resident loop of one instruction kind on n_threads OpenMP threads
 * (0 = default) for at least min_seconds of timed passes. A kind this build or host
 * cannot run (no such instruction in the flags, AMX not granted) is COLIBRI_ERR_INVALID
 * with the reason in colibri_last_error(). */
int colibri_peak_run(int kind, int n_threads, double min_seconds, colibri_peak_result *out);
/* ---- where the time goes (sample.c; colibri_bench profile, for hosts without perf) ---- */
/* Starts sampling this process: every period_us microseconds of its CPU time (all threads
 * together) a SIGPROF, whose handler keeps the interrupted instruction's address, up to
 * capacity of them. COLIBRI_ERR_INVALID: already running, a period outside [100, 1e6], a
 * capacity outside [1, 2^28], or a platform other than Linux on x86-64/aarch64. */
int colibri_sample_start(int period_us, size_t capacity);
/* Stops it, restores the previous SIGPROF handler, copies up to cap addresses into ips and
 * their count into *n_out; *taken_out (if not NULL): the samples taken, kept or not. */
int colibri_sample_stop(uint64_t *ips, size_t cap, size_t *n_out, size_t *taken_out);
/* CFFI-END */

#ifdef __cplusplus
}
#endif
#endif /* COLIBRI_H */
