/* kernels.h — entry points of the rendered kernel templates (templates/). */
#ifndef COLIBRI_KERNELS_H
#define COLIBRI_KERNELS_H

#include <stddef.h>

#include "internal.h"

/* Hout[t, r] = silu(gate[r] . X[tok[t]]) * (up[r] . X[tok[t]]), rows r in [r0, r1).
 * ws: the calling thread's workspace of cbk_workspace_bytes(dtype, cols, ntok) bytes,
 * 64-aligned (NULL when that is 0). xprep: every row of X as cbk_xprep_fn prepared it, where
 * cbk_xprep_bytes_fn gave bytes for the call, else NULL. */
typedef void (*cbk_gateup_fn)(int dtype, const cb_mat *gate, const cb_mat *up, const float *X, int ldx,
                              const int32_t *tok, int ntok, int r0, int r1, float *Hout, int ldh, void *ws,
                              const void *xprep);
/* Y[tok[t], r] += tw[t] * (m[r] . Hin[t]), rows r in [r0, r1). prep: Hin as cbk_prep_fn
 * prepared it, where cbk_prep_bytes_fn gave bytes for this call, else NULL. */
typedef void (*cbk_rows_acc_fn)(int dtype, const cb_mat *m, const float *Hin, int ldh, int ntok,
                                const float *tw, const int32_t *tok, int r0, int r1, float *Y, int ldy,
                                void *ws, const void *prep);
/* Activations converted once for every thread that multiplies them by m, where the path for
 * ntok tokens converts them (the bf16 hi/lo panels of the AMX and pair-dot gemms, the int
 * gemms' quantized panels); without it each thread converts all of them for its own rows.
 * prep_bytes: the bytes (0: that path takes none); prep: columns [c0, c1) of all ntok tokens
 * of Hin into dst, whose first 64 bytes (a header) are zeroed first; c0 and c1 multiples of
 * 32 or c1 = m->cols; threads may fill disjoint column ranges of one dst at once. */
typedef size_t (*cbk_prep_bytes_fn)(int dtype, const cb_mat *m, int ntok);
typedef void (*cbk_prep_fn)(int dtype, const cb_mat *m, const float *Hin, int ldh, int ntok, int c0, int c1,
                            void *dst);
/* A call's activations prepared once for all of its gateups, where the part's kernels for a
 * call of ntok tokens prepare them per call (the packed int kernels quantize their tokens'
 * rows; a token meets up to top-k experts, and a job's rows may be split between threads).
 * xprep_bytes: the bytes for ntok rows of cols (0: none); xprep: rows [t0, t1) of X into dst;
 * threads may fill disjoint row ranges of one dst at once. */
typedef size_t (*cbk_xprep_bytes_fn)(int dtype, int cols, int ntok);
typedef void (*cbk_xprep_fn)(int dtype, const float *X, int ldx, int cols, int t0, int t1, void *dst);
/* Per-thread workspace for matrices of up to max_cols columns and max_tokens tokens
 * (the int4 kernels quantize their activations into it; 0 for the other dtypes). */
typedef size_t (*cbk_workspace_fn)(int dtype, int max_cols, int max_tokens);
/* Bytes of a [rows, cols] matrix of dtype in the table's packed layout for it, 0 when the
 * table reads that dtype in its stored layout; and the packing of such a matrix (its
 * stored data, cb_mat's w) into dst (cb_mat's pk). */
typedef size_t (*cbk_pack_bytes_fn)(int dtype, int rows, int cols);
typedef void (*cbk_pack_fn)(int dtype, const void *src, const float *scales, int rows, int cols, void *dst);

/* One weight dtype's kernels as the template renders them (a "part", gen/parts/<symbol>.c):
 * the functions take the dtype for the callers' convenience and serve only their own. */
typedef struct cbk_part {
    const char *dtype;
    cbk_gateup_fn gateup;
    cbk_rows_acc_fn rows_acc;
    cbk_workspace_fn workspace_bytes;
    cbk_pack_bytes_fn pack_bytes;
    cbk_pack_fn pack;
    int (*uses_amx)(void); /* NULL: never */
    cbk_prep_bytes_fn prep_bytes; /* NULL: never */
    cbk_prep_fn prep;
    cbk_xprep_bytes_fn xprep_bytes; /* NULL: never */
    cbk_xprep_fn xprep;
} cbk_part;

/* A kernel table: the base knobs' ("default") or a tuned shape class's (docs/shape-classes.md),
 * one part per weight dtype, indexed by colibri_dtype (gen/kernel_tables.c). */
struct cbk_kernels {
    const char *name;
    const cbk_part *part[4];
};

/* dtype: a valid colibri_dtype (the layer and model loaders check it); */
/* int4k runs in the int4 part: the same knobs and dot products, its own scale decode */
static inline const cbk_part *cbk_part_of(const cbk_kernels *K, int dtype) {
    return K->part[dtype == COLIBRI_INT4K ? COLIBRI_INT4 : dtype];
}

/* The default table's functions (the router, dense layers and colibri.Linear call them). */
void cbk_gateup(int dtype, const cb_mat *gate, const cb_mat *up, const float *X, int ldx,
                const int32_t *tok, int ntok, int r0, int r1, float *Hout, int ldh, void *ws);
void cbk_rows_acc(int dtype, const cb_mat *m, const float *Hin, int ldh, int ntok, const float *tw,
                  const int32_t *tok, int r0, int r1, float *Y, int ldy, void *ws);
size_t cbk_workspace_bytes(int dtype, int max_cols, int max_tokens);
extern const cbk_kernels cbk_kernels_default;

/* Row splits between threads align to this many rows (dispatch.c), a multiple of every
 * register block height the kernels may be rendered with. */
extern const int cbk_rows_block;

/* The tuned shape classes this library carries (gen/kernel_tables.c, written by SConstruct
 * from config.h): a layer whose (hidden, inter) fall in a class's bins runs its table. */
typedef struct {
    int hidden_bin, inter_bin;
    const cbk_kernels *kernels;
} cbk_shape_entry;
extern const cbk_shape_entry cbk_shape_table[];
extern const int cbk_shape_table_len;

/* The table of a layer with these matrix sizes: its shape class's, else the default
 * (dispatch.c). */
const cbk_kernels *cbk_kernels_for(int hidden, int inter);

#endif
