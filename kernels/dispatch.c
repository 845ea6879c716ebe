/* dispatch.c — which rendering of the kernel template a layer runs.
 *
 * A tuned library carries a kernel table for its base knobs ("default") and one per tuned
 * shape class (gen/kernel_tables.c lists them); a table is the template's four parts, one
 * per weight dtype. A class is a cell of a
 * half-octave grid over the expert matrices' sizes: the hidden size H (gate/up row length,
 * down row count) and the expert inter size I (down row length, gate/up row count). Knob
 * values that win on one cell can lose on another (decode knobs tuned on Qwen3's 2048 x 768
 * experts made Mixtral's 4096 x 14336 ones 25-28% slower), so a layer outside every tuned
 * cell runs the default table. docs/shape-classes.md has the grid and the names. */
#include <math.h>

#include "internal.h"
#include "kernels.h"

/* 2 log2 n is never within 1e-6 of a half-integer for n <= 2^20 (2^(k/4), k odd, is
 * irrational), so this rounding cannot disagree with the tuner's Python (round(2 log2 n)) */
static int bin_of(int n) { return (int)lround(2.0 * log2((double)n)); }

int colibri_shape_bin(int n) {
    cb_clear_error();
    if (n < 1) return cb_fail(COLIBRI_ERR_INVALID, "colibri_shape_bin: n %d < 1", n), -1;
    return bin_of(n);
}

const cbk_kernels *cbk_kernels_for(int hidden, int inter) {
    if (hidden < 1 || inter < 1) return &cbk_kernels_default;
    const int hb = bin_of(hidden), ib = bin_of(inter);
    for (int i = 0; i < cbk_shape_table_len; ++i)
        if (cbk_shape_table[i].hidden_bin == hb && cbk_shape_table[i].inter_bin == ib)
            return cbk_shape_table[i].kernels;
    return &cbk_kernels_default;
}

const char *colibri_layer_kernels(const colibri_layer *L) {
    cb_clear_error();
    if (!L) return cb_fail(COLIBRI_ERR_INVALID, "colibri_layer_kernels: layer is NULL"), NULL;
    return L->kernels ? L->kernels->name : cbk_kernels_default.name;
}

/* thread splits align to 4 rows, a multiple of every rows and prefill_rows value: the
 * split does not move with those knobs, so tuning the decode or prefill blocks cannot
 * change how other paths share their rows between threads (and every table shares it) */
const int cbk_rows_block = 4;

void cbk_gateup(int dtype, const cb_mat *gate, const cb_mat *up, const float *X, int ldx,
                const int32_t *tok, int ntok, int r0, int r1, float *Hout, int ldh, void *ws) {
    cbk_part_of(&cbk_kernels_default, dtype)->gateup(dtype, gate, up, X, ldx, tok, ntok, r0, r1, Hout, ldh, ws, NULL);
}

void cbk_rows_acc(int dtype, const cb_mat *m, const float *Hin, int ldh, int ntok, const float *tw,
                  const int32_t *tok, int r0, int r1, float *Y, int ldy, void *ws) {
    cbk_part_of(&cbk_kernels_default, dtype)->rows_acc(dtype, m, Hin, ldh, ntok, tw, tok, r0, r1, Y, ldy, ws, NULL);
}

size_t cbk_workspace_bytes(int dtype, int max_cols, int max_tokens) {
    return cbk_part_of(&cbk_kernels_default, dtype)->workspace_bytes(dtype, max_cols, max_tokens);
}

int colibri_uses_amx(void) {
    for (int d = 0; d < 4; ++d) {
        const cbk_part *p = cbk_kernels_default.part[d];
        if (p->uses_amx && p->uses_amx()) return 1;
    }
    return 0;
}
