/* internal.h — structures shared by the engine's C files (not installed). */
#ifndef COLIBRI_INTERNAL_H
#define COLIBRI_INTERNAL_H

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
};

/* Thread-local error message (error.c). Returns the status passed in for tail calls. */
int cb_fail(int status, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void cb_clear_error(void);

#define CB_INT4_GROUP 32

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

/* Validates a route config against n_experts; sets the error on failure. */
int cb_route_config_check(const colibri_route_config *cfg, int n_experts);

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
