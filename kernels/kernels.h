/* kernels.h — entry points of the rendered kernel templates (templates/). */
#ifndef COLIBRI_KERNELS_H
#define COLIBRI_KERNELS_H

#include "internal.h"

/* Hout[t, r] = silu(gate[r] . X[tok[t]]) * (up[r] . X[tok[t]]), rows r in [r0, r1).
 * ws: the calling thread's workspace of cbk_workspace_bytes(dtype, cols, ntok) bytes,
 * 64-aligned (NULL when that is 0). */
void cbk_gateup(int dtype, const cb_mat *gate, const cb_mat *up, const float *X, int ldx,
                const int32_t *tok, int ntok, int r0, int r1, float *Hout, int ldh, void *ws);

/* Y[tok[t], r] += tw[t] * (m[r] . Hin[t]), rows r in [r0, r1). */
void cbk_rows_acc(int dtype, const cb_mat *m, const float *Hin, int ldh, int ntok, const float *tw,
                  const int32_t *tok, int r0, int r1, float *Y, int ldy, void *ws);

/* Per-thread workspace for matrices of up to max_cols columns and max_tokens tokens
 * (the int4 kernels quantize their activations into it; 0 for the other dtypes). */
size_t cbk_workspace_bytes(int dtype, int max_cols, int max_tokens);

/* Register block height the kernels were rendered with (row splits align to it). */
extern const int cbk_rows_block;

#endif
