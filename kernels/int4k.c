/* int4k.c — quantizing float32 rows into int4k (COLIBRI_INT4K, internal.h has the layout).
 *
 * Each group of 32 weights gets the scale s >= 0 and min m >= 0 of w ~ s q - m (q in 0..15)
 * with the least squared error found from five starting ranges (100% to 80% of the group's
 * span, with 0 always inside it), each refined by two rounds of assign-q-then-refit; the
 * super-block then stores d = max s / 63 and dmin = max m / 63 in f16 and per group the 6-bit
 * codes sc = rint(s / d), mn = rint(m / dmin), and q is assigned again against d sc and
 * dmin mn. The same fit as colibri_bench/qformats.py's NumPy k4 (the issue 29 candidate),
 * in double, so the two agree but for rounding ties. */
#include <math.h>
#include <omp.h>
#include <stdint.h>
#include <string.h>

#include "internal.h"

#define G CB_INT4_GROUP

/* The fit runs on finite numbers only (a super-block with NaN or Inf skips it, and float32
 * weights keep 1 / s finite in double): this lets GCC vectorize its clamps (max/min) across
 * the groups of a super-block, with results unchanged. It also makes isfinite() always
 * true, so the checks below read the bits. */
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC optimize("finite-math-only", "no-signed-zeros")
#endif

/* q of x against w = s q - m, inv = 1 / s (0 when s is 0) */
static inline double k4_assign(double x, double inv, double m) {
    const double q = rint((x + m) * inv);
    return q < 0 ? 0.0 : q > 15 ? 15.0 : q;
}
static inline double k4_inv(double s) { return s > 0 ? 1.0 / s : 0.0; }

/* s[g], m[g] of the CB_K4_SUPER groups x[i][g] (zero-padded past the row): each group's
 * arithmetic is its own, in the same order, but the groups run side by side, which the
 * compiler vectorizes (a group alone is a chain of dependent sums) */
typedef double k4v[CB_K4_SUPER];
static void k4_fit(const k4v *x, double *s_out, double *m_out) {
    static const double shrink[5] = {1.0, 0.95, 0.9, 0.85, 0.8};
    k4v lo, hi, best_s, best_m, best_e;
    for (int g = 0; g < CB_K4_SUPER; ++g) lo[g] = 0.0, hi[g] = x[0][g];
    for (int i = 0; i < G; ++i)
        for (int g = 0; g < CB_K4_SUPER; ++g) {
            lo[g] = x[i][g] < lo[g] ? x[i][g] : lo[g];
            hi[g] = x[i][g] > hi[g] ? x[i][g] : hi[g];
        }
    for (int g = 0; g < CB_K4_SUPER; ++g)
        best_s[g] = (hi[g] - lo[g]) / 15.0, best_m[g] = -lo[g], best_e[g] = INFINITY;
    for (int k = 0; k < 5; ++k) {
        k4v s, m, inv;
        for (int g = 0; g < CB_K4_SUPER; ++g) s[g] = (hi[g] - lo[g]) * shrink[k] / 15.0, m[g] = -lo[g] * shrink[k];
        for (int it = 0; it < 2; ++it) {
            k4v sq = {0}, sx = {0}, sqq = {0}, sqx = {0};
            for (int g = 0; g < CB_K4_SUPER; ++g) inv[g] = k4_inv(s[g]);
            for (int i = 0; i < G; ++i)
                for (int g = 0; g < CB_K4_SUPER; ++g) {
                    const double q = k4_assign(x[i][g], inv[g], m[g]);
                    sq[g] += q, sx[g] += x[i][g], sqq[g] += q * q, sqx[g] += q * x[i][g];
                }
            /* least squares of x on [q, -1]; with m < 0 the fit through the origin */
            for (int g = 0; g < CB_K4_SUPER; ++g) {
                const double det = G * sqq[g] - sq[g] * sq[g];
                const double s_ls = det > 0 ? (G * sqx[g] - sq[g] * sx[g]) / det : s[g];
                const double m_ls = det > 0 ? (sq[g] * s_ls - sx[g]) / G : m[g];
                const double s_0 = sqq[g] > 0 ? sqx[g] / sqq[g] : s[g];
                double sn = m_ls >= 0 ? s_ls : s_0;
                m[g] = m_ls >= 0 ? m_ls : 0.0;
                s[g] = sn >= 0 ? sn : 0.0;
            }
        }
        k4v e = {0};
        for (int g = 0; g < CB_K4_SUPER; ++g) inv[g] = k4_inv(s[g]);
        for (int i = 0; i < G; ++i)
            for (int g = 0; g < CB_K4_SUPER; ++g) {
                const double r = s[g] * k4_assign(x[i][g], inv[g], m[g]) - m[g] - x[i][g];
                e[g] += r * r;
            }
        for (int g = 0; g < CB_K4_SUPER; ++g)
            if (e[g] < best_e[g]) best_s[g] = s[g], best_m[g] = m[g], best_e[g] = e[g];
    }
    for (int g = 0; g < CB_K4_SUPER; ++g) s_out[g] = best_s[g], m_out[g] = best_m[g];
}

/* One super-block of ng (<= 8) groups from x (n valid weights) into out (16 + 16 ng bytes).
 * Returns 0, or -1 when d or dmin overflows f16 from finite weights. */
static int k4_super(const float *x, int n, int ng, uint8_t *out) {
    k4v gx[G]; /* gx[i][g]: weight i of group g; groups past ng are zero and fit to s = m = 0 */
    double s[CB_K4_SUPER], m[CB_K4_SUPER];
    int finite = 1;
    for (int i = 0; i < G; ++i)
        for (int g = 0; g < CB_K4_SUPER; ++g) {
            const int k = g * G + i;
            const float v = g < ng && k < n ? x[k] : 0.0f;
            uint32_t bits;
            memcpy(&bits, &v, 4);
            if ((bits & 0x7F800000u) == 0x7F800000u) finite = 0; /* Inf or NaN */
            gx[i][g] = (double)v;
        }
    memset(out, 0, 16 + 16 * (size_t)ng);
    if (!finite) { /* NaN in, NaN out: d and dmin NaN, as int4's NaN scale */
        const uint32_t h3 = 0x7E007E00u;
        memcpy(out + 12, &h3, 4);
        return 0;
    }
    k4_fit((const k4v *)gx, s, m);
    double smax = 0, mmax = 0;
    for (int g = 0; g < ng; ++g) {
        if (s[g] > smax) smax = s[g];
        if (m[g] > mmax) mmax = m[g];
    }
    const uint16_t d16 = cb_f32_to_f16((float)(smax / 63.0)), m16 = cb_f32_to_f16((float)(mmax / 63.0));
    if ((d16 & 0x7C00u) == 0x7C00u || (m16 & 0x7C00u) == 0x7C00u) return -1; /* overflowed f16 */
    const double d = cb_f16_to_f32(d16), dmin = cb_f16_to_f32(m16);
    uint32_t h[4] = {0, 0, 0, (uint32_t)d16 | (uint32_t)m16 << 16};
    uint32_t codes[2 * CB_K4_SUPER] = {0}; /* sc of groups 0..7, then mn */
    for (int g = 0; g < ng; ++g) {
        double sc = d > 0 ? rint(s[g] / d) : 0, mn = dmin > 0 ? rint(m[g] / dmin) : 0;
        sc = sc < 0 ? 0 : sc > 63 ? 63 : sc;
        mn = mn < 0 ? 0 : mn > 63 ? 63 : mn;
        codes[g] = (uint32_t)sc, codes[CB_K4_SUPER + g] = (uint32_t)mn;
        const double ia = k4_inv(d * sc), b = dmin * mn;
        uint8_t *o = out + 16 + 16 * g;
        for (int i = 0; i < 16; ++i)
            o[i] = (uint8_t)((int)k4_assign(gx[i][g], ia, b) | (int)k4_assign(gx[16 + i][g], ia, b) << 4);
    }
    cb_k4_put_codes(h, codes);
    memcpy(out, h, 16);
    return 0;
}

size_t colibri_int4k_row_bytes(int cols) { return cols < 1 ? 0 : cb_k4_row_bytes((size_t)cols); }

int colibri_quantize_int4k(const float *w, int rows, int cols, void *out, int n_threads) {
    cb_clear_error();
    if (!w || !out) return cb_fail(COLIBRI_ERR_INVALID, "colibri_quantize_int4k: w and out must not be NULL");
    if (rows < 1 || cols < 1 || cols > (1 << 20))
        return cb_fail(COLIBRI_ERR_INVALID, "colibri_quantize_int4k: rows %d, cols %d out of range", rows, cols);
    int st = cb_check_threads("colibri_quantize_int4k", n_threads);
    if (st) return st;
    const int nt = n_threads > 0 ? n_threads : colibri_get_num_threads();
    const size_t rb = cb_k4_row_bytes((size_t)cols);
    const int ng = (cols + G - 1) / G;
    int bad_row = -1;
#pragma omp parallel for num_threads(nt) schedule(dynamic, 16)
    for (int r = 0; r < rows; ++r) {
        const float *x = w + (size_t)r * cols;
        uint8_t *o = (uint8_t *)out + (size_t)r * rb;
        for (int g0 = 0; g0 < ng; g0 += CB_K4_SUPER) {
            const int n = ng - g0 < CB_K4_SUPER ? ng - g0 : CB_K4_SUPER;
            const int k0 = g0 * G, valid = cols - k0;
            if (k4_super(x + k0, valid, n, o)) {
#pragma omp critical
                bad_row = r;
            }
            o += 16 + 16 * (size_t)n;
        }
    }
    if (bad_row >= 0)
        return cb_fail(COLIBRI_ERR_INVALID,
                       "colibri_quantize_int4k: row %d has weights too large for f16 super-block scales "
                       "(|w| above about 1e6)", bad_row);
    return COLIBRI_OK;
}
