/* kernels.h — entry points of the rendered kernel templates (templates/). */
#ifndef COLIBRI_KERNELS_H
#define COLIBRI_KERNELS_H

#include <stddef.h>

#include "internal.h"

/* Hout[t, r] = silu(gate[r] . X[tok[t]]) * (up[r] . X[tok[t]]), rows r in [r0, r1).
 * ws: the calling thread's workspace of cbk_workspace_bytes(dtype, cols, ntok) bytes,
 * 64-aligned (NULL when that is 0). */
typedef void (*cbk_gateup_fn)(int dtype, const cb_mat *gate, const cb_mat *up, const float *X, int ldx,
                              const int32_t *tok, int ntok, int r0, int r1, float *Hout, int ldh, void *ws);
/* Y[tok[t], r] += tw[t] * (m[r] . Hin[t]), rows r in [r0, r1). */
typedef void (*cbk_rows_acc_fn)(int dtype, const cb_mat *m, const float *Hin, int ldh, int ntok,
                                const float *tw, const int32_t *tok, int r0, int r1, float *Y, int ldy,
                                void *ws);
/* Per-thread workspace for matrices of up to max_cols columns and max_tokens tokens
 * (the int4 kernels quantize their activations into it; 0 for the other dtypes). */
typedef size_t (*cbk_workspace_fn)(int dtype, int max_cols, int max_tokens);
/* Bytes of a [rows, cols] matrix of dtype in the table's packed layout for it, 0 when the
 * table reads that dtype in its stored layout; and the packing of such a matrix (its
 * stored data, cb_mat's w) into dst (cb_mat's pk). */
typedef size_t (*cbk_pack_bytes_fn)(int dtype, int rows, int cols);
typedef void (*cbk_pack_fn)(int dtype, const void *src, int rows, int cols, void *dst);

/* One rendering of the kernel template: the base knobs ("default") or a tuned shape
 * class's knobs (docs/shape-classes.md). */
struct cbk_kernels {
    const char *name;
    cbk_gateup_fn gateup;
    cbk_rows_acc_fn rows_acc;
    cbk_workspace_fn workspace_bytes;
    cbk_pack_bytes_fn pack_bytes;
    cbk_pack_fn pack;
};

/* The default table's functions under their own names (the router, colibri.Linear and
 * tests call them directly). */
void cbk_gateup(int dtype, const cb_mat *gate, const cb_mat *up, const float *X, int ldx,
                const int32_t *tok, int ntok, int r0, int r1, float *Hout, int ldh, void *ws);
void cbk_rows_acc(int dtype, const cb_mat *m, const float *Hin, int ldh, int ntok, const float *tw,
                  const int32_t *tok, int r0, int r1, float *Y, int ldy, void *ws);
size_t cbk_workspace_bytes(int dtype, int max_cols, int max_tokens);
extern const cbk_kernels cbk_kernels_default;

/* Register block height the kernels were rendered with (row splits align to it; one value
 * for every table). */
extern const int cbk_rows_block;

/* The tuned shape classes this library carries (gen/shape_table.c, written by SConstruct
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
