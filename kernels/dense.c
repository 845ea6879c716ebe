/* dense.c — one dense weight matrix (a linear projection, y = W x): the single-expert case
 * of the expert kernels (in the default table's packed layout for the dtype where it has
 * one). Threads split the rows, aligned to the kernels' register block;
 * every thread runs cbk_rows_acc on its rows for all tokens (the gemm path from its
 * dtype's threshold of tokens on, the dot kernels below it). */
#include <omp.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"
#include "kernels.h"

#define CB_DENSE_MAX_DIM (1 << 20)

struct colibri_dense {
    cb_mat m;
    int dtype;
    colibri_pool *pool; /* weights then scales, 64-aligned, owned */
    size_t weight_bytes;
};

colibri_dense *colibri_dense_create(int rows, int cols, int weight_dtype, const void *w, const float *scales) {
    cb_clear_error();
    if (rows < 1 || rows > CB_DENSE_MAX_DIM || cols < 1 || cols > CB_DENSE_MAX_DIM) {
        cb_fail(COLIBRI_ERR_INVALID, "dense matrix [%d, %d]: rows and cols must be in [1, %d]", rows, cols,
                CB_DENSE_MAX_DIM);
        return NULL;
    }
    if (!cb_dtype_valid(weight_dtype)) {
        cb_fail(COLIBRI_ERR_INVALID, "weight_dtype %d is not 0 (f32), 1 (bf16), 2 (int8), 3 (int4) or 4 (int4k)",
                weight_dtype);
        return NULL;
    }
    const size_t nb = cb_mat_data_bytes(weight_dtype, (size_t)rows, (size_t)cols);
    const size_t ns = cb_mat_scale_count(weight_dtype, (size_t)rows, (size_t)cols);
    if (!w || (ns && !scales)) {
        cb_fail(COLIBRI_ERR_INVALID, "dense weights%s must not be NULL", ns ? " and scales" : "");
        return NULL;
    }
    /* packed once, here, where the default table reads the dtype in a layout of its own
     * (as a layer's experts are): the same kernels then serve the matrix */
    const cbk_part *part = cbk_part_of(&cbk_kernels_default, weight_dtype);
    const size_t pb = part->pack_bytes(weight_dtype, rows, cols);
    const size_t wb = pb ? pb : nb;
    colibri_dense *d = calloc(1, sizeof *d);
    const size_t at = (wb + 63) / 64 * 64, bytes = at + ns * sizeof(float);
    /* a pool, on the build's page policy as a loaded model's experts (decode streams it) */
    if (d) d->pool = colibri_pool_create(bytes, CB_DEFAULT_HUGEPAGES, -1);
    char *mem = d && d->pool ? colibri_pool_alloc(d->pool, bytes, 64) : NULL;
    if (!mem) {
        if (d) colibri_pool_free(d->pool);
        free(d);
        cb_fail(COLIBRI_ERR_NOMEM, "out of memory for a %zu-byte dense matrix", bytes);
        return NULL;
    }
    if (pb) part->pack(weight_dtype, w, scales, rows, cols, mem);
    else memcpy(mem, w, nb);
    if (ns) memcpy(mem + at, scales, ns * sizeof(float));
    d->m = (cb_mat){pb ? NULL : mem, ns ? (const float *)(const void *)(mem + at) : NULL, rows, cols,
                    pb ? mem : NULL, 0};
    d->dtype = weight_dtype;
    d->weight_bytes = bytes;
    return d;
}

size_t colibri_dense_weight_bytes(const colibri_dense *d) { return d ? d->weight_bytes : 0; }

void colibri_dense_free(colibri_dense *d) {
    if (!d) return;
    colibri_pool_free(d->pool);
    free(d);
}

int colibri_dense_forward(colibri_dense *d, const float *x, float *y, int T, int n_threads) {
    cb_clear_error();
    if (!d) return cb_fail(COLIBRI_ERR_INVALID, "dense matrix is NULL");
    if (T < 0) return cb_fail(COLIBRI_ERR_INVALID, "n_tokens %d < 0", T);
    if (T == 0) return COLIBRI_OK;
    if (!x || !y) return cb_fail(COLIBRI_ERR_INVALID, "x and y must not be NULL");
    int st = cb_check_threads("colibri_dense_forward", n_threads);
    if (st) return st;
    const int R = d->m.rows, C = d->m.cols;
    const int big = R > C ? R : C;
    if ((size_t)T > (SIZE_MAX / 2 / sizeof(float)) / (size_t)big)
        return cb_fail(COLIBRI_ERR_INVALID, "n_tokens %d is too large", T);
    const float *xe = x + (size_t)T * C;
    const float *ye = y + (size_t)T * R;
    if (x < ye && y < xe) return cb_fail(COLIBRI_ERR_INVALID, "x and y overlap");
    const int nt = n_threads > 0 ? n_threads : colibri_get_num_threads();
    const size_t wsb = (cbk_workspace_bytes(d->dtype, C, T) + 63) / 64 * 64;
    if (wsb && (size_t)nt > (SIZE_MAX / 4) / wsb)
        return cb_fail(COLIBRI_ERR_INVALID, "n_tokens %d: kernel workspace too large", T);
    /* decode on several threads: rows in chunks the threads claim (claim.c), each thread
     * with x prepared once for all of its chunks where the part's packed kernels take it */
    const int claimed = nt > 1 && T <= CB_DECODE_MAX_TOKENS;
    const cbk_part *part = cbk_part_of(&cbk_kernels_default, d->dtype);
    const int rc = cb_chunk_rows((long)C * T), nitems = claimed ? (R + rc - 1) / rc : 0;
    const size_t xb = claimed && part->xprep_bytes && d->m.pk ? (part->xprep_bytes(d->dtype, C, T) + 63) / 64 * 64 : 0;
    const size_t head = ((size_t)T * (sizeof(int32_t) + sizeof(float)) + (size_t)nitems * sizeof(int) + 63) / 64 * 64;
    char *scratch = cb_scratch(CB_SCRATCH_CALL, head + (size_t)nt * (wsb + xb));
    if (!scratch) return cb_fail(COLIBRI_ERR_NOMEM, "out of memory for dense scratch");
    int32_t *tok = (int32_t *)(void *)scratch;
    float *tw = (float *)(void *)(tok + T);
    int *taken = (int *)(void *)(tw + T);
    for (int t = 0; t < T; ++t) tok[t] = t, tw[t] = 1.0f;
    if (claimed) {
        memset(taken, 0, (size_t)nitems * sizeof(int));
#pragma omp parallel num_threads(nt)
        {
            const int tid = omp_get_thread_num();
            char *ws = wsb ? scratch + head + (size_t)tid * (wsb + xb) : NULL, *xp = NULL;
            if (xb) part->xprep(d->dtype, x, C, C, 0, T, xp = scratch + head + (size_t)tid * (wsb + xb) + wsb);
            cb_walk w = cb_walk_from(nitems, tid, omp_get_num_threads());
            for (int i; (i = cb_walk_next(taken, nitems, &w)) >= 0;) {
                const int a = i * rc, b = a + rc < R ? a + rc : R;
                for (int t = 0; t < T; ++t) memset(y + (size_t)t * R + a, 0, (size_t)(b - a) * sizeof(float));
                part->rows_acc(d->dtype, &d->m, x, C, T, tw, tok, a, b, y, R, ws, xp);
            }
        }
        return COLIBRI_OK;
    }
    /* a packed matrix computes whole blocks of 16 rows: splits on them compute none twice */
    const int blk = d->m.pk ? 16 : cbk_rows_block;
#pragma omp parallel num_threads(nt)
    {
        const int tid = omp_get_thread_num();
        int a, b;
        cb_split_range(R, omp_get_num_threads(), tid, blk, &a, &b);
        if (a < b) {
            for (int t = 0; t < T; ++t) memset(y + (size_t)t * R + a, 0, (size_t)(b - a) * sizeof(float));
            cbk_rows_acc(d->dtype, &d->m, x, C, T, tw, tok, a, b, y, R,
                         wsb ? scratch + head + (size_t)tid * wsb : NULL);
        }
    }
    return COLIBRI_OK;
}

static int dense_f32(void *obj, const float *x, float *y, int T, int nt) {
    return colibri_dense_forward((colibri_dense *)obj, x, y, T, nt);
}

int colibri_dense_forward_bf16(colibri_dense *d, const uint16_t *x, uint16_t *y, int T, int n_threads) {
    cb_clear_error();
    if (!d) return cb_fail(COLIBRI_ERR_INVALID, "dense matrix is NULL");
    return cb_forward_bf16("colibri_dense_forward_bf16", d, dense_f32, d->m.cols, d->m.rows, x, y, T, n_threads);
}
