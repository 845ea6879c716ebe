/* amx_emu.c — an AMX tile unit in plain C (amx_tiles.h's cb_emu_*), following the
 * operations' pseudocode in the Intel SDM (LDTILECFG, TILELOADD, TILESTORED, TILEZERO,
 * TILERELEASE, TDPBF16PS, TDP[BSSD|BSUD|BUSD|BUUD]):
 *  - state per thread, as the tiles are: a configuration and 8 tiles of 16 x 64 bytes;
 *  - a load writes the configured rows and columns and zeroes the rest of the tile, as
 *    do the products (write_row_and_zero, zero_upper_rows);
 *  - TDPBF16PS: for each row m, k-pair and column n, tmp += a[2k] * b[2k] then
 *    tmp += a[2k+1] * b[2k+1], each an f32 add rounded to nearest even; bf16 inputs
 *    that are denormal count as zero and a denormal f32 result is flushed to zero
 *    (MXCSR is not consulted);
 *  - the int8 products: four byte products summed into the int32 lane, which wraps.
 * A refused operation (unconfigured state or tile, shapes the instruction rejects) does
 * nothing but call the fault handler. Slow by design: it checks kernels, it is never timed. */
#include "amx_tiles.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    int configured;          /* palette 1 loaded */
    uint16_t colsb[8];
    uint8_t rows[8];
    uint8_t t[8][16][64];    /* tiles: 16 rows of 64 bytes */
} emu_state;

static __thread emu_state st;

static void fault_default(const char *why) {
    fprintf(stderr, "colibri: emulated AMX tile unit: %s (the instruction would fault)\n", why);
    abort();
}

static cb_emu_fault_fn on_fault = fault_default;
static unsigned long long products; /* every thread's, atomically */

unsigned long long cb_emu_products(void) { return __atomic_load_n(&products, __ATOMIC_RELAXED); }

cb_emu_fault_fn cb_emu_on_fault(cb_emu_fault_fn fn) {
    cb_emu_fault_fn old = on_fault;
    on_fault = fn ? fn : fault_default;
    return old;
}

void cb_emu_loadconfig(const void *cfg) {
    cb_tilecfg c;
    memcpy(&c, cfg, sizeof c);
    if (c.palette == 0) { /* the init state: as TILERELEASE */
        cb_emu_release();
        return;
    }
    const char *why = c.palette != 1 ? "palette other than 0 or 1"
                    : c.start_row ? "start_row not zero" : NULL;
    for (int i = 0; i < 14 && !why; ++i)
        if (c.reserved[i]) why = "reserved bytes not zero";
    for (int i = 0; i < 16 && !why; ++i) {
        if (i >= 8 && (c.rows[i] || c.colsb[i]))
            why = "a tile past 7 configured";
        else if (c.rows[i] > 16 || c.colsb[i] > 64)
            why = "more than 16 rows or 64 bytes";
        else if (!c.rows[i] != !c.colsb[i])
            why = "rows or colsb zero, not both";
    }
    if (why) {
        static __thread char msg[96];
        snprintf(msg, sizeof msg, "ldtilecfg: %s", why);
        on_fault(msg);
        return;
    }
    memset(&st, 0, sizeof st);
    st.configured = 1;
    for (int i = 0; i < 8; ++i) {
        st.rows[i] = c.rows[i];
        st.colsb[i] = c.colsb[i];
    }
}

void cb_emu_release(void) { memset(&st, 0, sizeof st); }

/* tile t usable: configured state, t in 0..7 and a shape */
static int usable(int t, const char *op) {
    static __thread char msg[96];
    if (!st.configured) {
        snprintf(msg, sizeof msg, "%s: tiles not configured (ldtilecfg first)", op);
    } else if (t < 0 || t > 7) {
        snprintf(msg, sizeof msg, "%s: tile %d does not exist", op, t);
    } else if (!st.rows[t]) {
        snprintf(msg, sizeof msg, "%s: tile %d is not configured", op, t);
    } else {
        return 1;
    }
    on_fault(msg);
    return 0;
}

void cb_emu_zero(int t) {
    if (usable(t, "tilezero")) memset(st.t[t], 0, sizeof st.t[t]);
}

void cb_emu_loadd(int t, const void *base, size_t stride) {
    if (!usable(t, "tileloadd")) return;
    uint8_t tmp[16][64];
    memset(tmp, 0, sizeof tmp);
    for (int r = 0; r < st.rows[t]; ++r)
        memcpy(tmp[r], (const uint8_t *)base + (size_t)r * stride, st.colsb[t]);
    memcpy(st.t[t], tmp, sizeof tmp);
}

void cb_emu_stored(int t, void *base, size_t stride) {
    if (!usable(t, "tilestored")) return;
    for (int r = 0; r < st.rows[t]; ++r)
        memcpy((uint8_t *)base + (size_t)r * stride, st.t[t][r], st.colsb[t]);
}

/* the shape checks every TDP* makes (#UD otherwise): distinct tiles, each a multiple of 4
 * bytes wide, c rows = a rows, c width = b width, a's 4-byte columns = b rows */
static int product_ok(int c, int a, int b, const char *op) {
    if (!usable(c, op) || !usable(a, op) || !usable(b, op)) return 0;
    const char *why = NULL;
    if (c == a || c == b || a == b)
        why = "the three tiles must differ";
    else if (st.colsb[c] % 4 || st.colsb[a] % 4 || st.colsb[b] % 4)
        why = "a tile's width is not a multiple of 4 bytes";
    else if (st.rows[c] != st.rows[a])
        why = "C and A differ in rows";
    else if (st.colsb[c] != st.colsb[b])
        why = "C and B differ in width";
    else if (st.colsb[a] / 4 != st.rows[b])
        why = "A's 4-byte columns differ from B's rows";
    if (!why) return 1;
    static __thread char msg[96];
    snprintf(msg, sizeof msg, "%s: %s", op, why);
    on_fault(msg);
    return 0;
}

/* bf16 to f32, a denormal input as a zero of its sign */
static float bf16_in(uint16_t v) {
    if (!(v & 0x7f80)) v &= 0x8000;
    const uint32_t u = (uint32_t)v << 16;
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

static float ftz(float f) { return fpclassify(f) == FP_SUBNORMAL ? copysignf(0.0f, f) : f; }

/* Keeps the compiler from fusing tmp + p into an fma: the product of two bf16 values is
 * exact in f32 anyway, but each add must round on its own as the pseudocode does. */
static float add_rne(float a, float b) {
    volatile float s = a + b;
    return s;
}

void cb_emu_dpbf16ps(int c, int a, int b) {
    if (!product_ok(c, a, b, "tdpbf16ps")) return;
    __atomic_fetch_add(&products, 1, __ATOMIC_RELAXED);
    const int M = st.rows[c], N = st.colsb[c] / 4, K = st.colsb[a] / 4;
    float out[16][16];
    memset(out, 0, sizeof out);
    for (int m = 0; m < M; ++m) {
        float tmp[16];
        memcpy(tmp, st.t[c][m], sizeof tmp);
        for (int k = 0; k < K; ++k)
            for (int n = 0; n < N; ++n) {
                uint16_t a0, a1, b0, b1;
                memcpy(&a0, &st.t[a][m][4 * k], 2);
                memcpy(&a1, &st.t[a][m][4 * k + 2], 2);
                memcpy(&b0, &st.t[b][k][4 * n], 2);
                memcpy(&b1, &st.t[b][k][4 * n + 2], 2);
                tmp[n] = ftz(add_rne(tmp[n], bf16_in(a0) * bf16_in(b0)));
                tmp[n] = ftz(add_rne(tmp[n], bf16_in(a1) * bf16_in(b1)));
            }
        memcpy(out[m], tmp, (size_t)N * 4);
    }
    memcpy(st.t[c], out, sizeof out);
}

/* C[m][n] += sum over k, i < 4 of A[m][4k + i] * B[k][4n + i], wrapping in 32 bits */
static void dpb(int c, int a, int b, int a_signed, int b_signed, const char *op) {
    if (!product_ok(c, a, b, op)) return;
    __atomic_fetch_add(&products, 1, __ATOMIC_RELAXED);
    const int M = st.rows[c], N = st.colsb[c] / 4, K = st.colsb[a] / 4;
    uint32_t out[16][16];
    memset(out, 0, sizeof out);
    for (int m = 0; m < M; ++m) {
        uint32_t tmp[16];
        memcpy(tmp, st.t[c][m], sizeof tmp);
        for (int k = 0; k < K; ++k)
            for (int n = 0; n < N; ++n) {
                uint32_t s = 0;
                for (int i = 0; i < 4; ++i) {
                    const uint8_t x = st.t[a][m][4 * k + i], y = st.t[b][k][4 * n + i];
                    const int32_t xv = a_signed ? (int8_t)x : x, yv = b_signed ? (int8_t)y : y;
                    s += (uint32_t)(xv * yv); /* |product| <= 2^16: exact in int32 */
                }
                tmp[n] += s;
            }
        memcpy(out[m], tmp, (size_t)N * 4);
    }
    memcpy(st.t[c], out, sizeof out);
}

void cb_emu_dpbssd(int c, int a, int b) { dpb(c, a, b, 1, 1, "tdpbssd"); }
void cb_emu_dpbsud(int c, int a, int b) { dpb(c, a, b, 1, 0, "tdpbsud"); }
void cb_emu_dpbusd(int c, int a, int b) { dpb(c, a, b, 0, 1, "tdpbusd"); }
void cb_emu_dpbuud(int c, int a, int b) { dpb(c, a, b, 0, 0, "tdpbuud"); }
