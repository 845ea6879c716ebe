/* bf16io.c — what the layer and dense entry points for bf16 activations share (a bf16
 * model's hidden states): the caller passes and receives bf16 rows, and the f32 rows the kernels and the
 * router take live in the calling thread's scratch (scratch.c), converted in parallel (bf16 -> f32 is
 * exact; f32 -> bf16 rounds to nearest even). */
#include <omp.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"

static uint16_t to_bf16(float f) {
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x0040u); /* NaN stays (quiet) NaN */
    return (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

/* Runs fn on f32 copies of x [T, in] into y [T, out] (bf16 bits). x and y may be the same
 * buffer: all of x is read before any of y is written. */
int cb_forward_bf16(const char *who, void *obj, cb_f32_forward_fn fn, int in, int out, const uint16_t *x,
                        uint16_t *y, int T, int n_threads) {
    if (T < 0) return cb_fail(COLIBRI_ERR_INVALID, "%s: n_tokens %d < 0", who, T);
    if (T == 0) return COLIBRI_OK;
    if (!x || !y) return cb_fail(COLIBRI_ERR_INVALID, "%s: x and y must not be NULL", who);
    int st = cb_check_threads(who, n_threads);
    if (st) return st;
    const size_t width = (size_t)in + (size_t)out;
    if ((size_t)T > SIZE_MAX / 4 / sizeof(float) / width)
        return cb_fail(COLIBRI_ERR_INVALID, "%s: n_tokens %d is too large", who, T);
    const size_t nx = (size_t)T * in, ny = (size_t)T * out;
    float *buf = cb_scratch(CB_SCRATCH_BF16, (nx + ny) * sizeof(float));
    if (!buf)
        return cb_fail(COLIBRI_ERR_NOMEM, "%s: out of memory for %zu bytes of f32 rows", who,
                       (nx + ny) * sizeof(float));
    float *xf = buf, *yf = buf + nx;
    const int nt = n_threads > 0 ? n_threads : colibri_get_num_threads();
    /* below a few thousand values a thread team costs more than the conversion */
    const int ct = nx + ny < 16384 ? 1 : nt;
#pragma omp parallel for num_threads(ct) schedule(static)
    for (size_t i = 0; i < nx; ++i) {
        const uint32_t u = (uint32_t)x[i] << 16;
        memcpy(&xf[i], &u, sizeof u);
    }
    st = fn(obj, xf, yf, T, n_threads);
    if (st == COLIBRI_OK) {
#pragma omp parallel for num_threads(ct) schedule(static)
        for (size_t i = 0; i < ny; ++i) y[i] = to_bf16(yf[i]);
    }
    return st;
}
