/* test_amx_emu.c — the emulated AMX tile unit (kernels/amx_emu.c) against tile products
 * computed by hand: bf16 pair products with the manual's order of rounding, denormal
 * inputs and outputs, the int8 products' signedness and 32-bit wrap-around, strided loads
 * and stores, and the operations the instructions refuse. Built and run by
 * tests/engine/test_amx_emu.py; prints "test_amx_emu: N checks, F failed". */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "amx_tiles.h"

static int checks, failed, faults;
static char last_fault[128];

static void count_fault(const char *why) {
    ++faults;
    snprintf(last_fault, sizeof last_fault, "%s", why);
}

#define CHECK(cond, ...)                                             \
    do {                                                             \
        ++checks;                                                    \
        if (!(cond)) {                                               \
            ++failed;                                                \
            printf("FAIL line %d: ", __LINE__);                      \
            printf(__VA_ARGS__);                                     \
            printf("\n");                                            \
        }                                                            \
    } while (0)

/* configure tiles 0..7 as rows x colsb each (0 rows: unconfigured) */
static void config(const int rows[8], const int colsb[8]) {
    cb_tilecfg c;
    memset(&c, 0, sizeof c);
    c.palette = 1;
    for (int i = 0; i < 8; ++i) {
        c.rows[i] = (uint8_t)rows[i];
        c.colsb[i] = (uint16_t)colsb[i];
    }
    cb_emu_loadconfig(&c);
}

static void config_all(int rows, int colsb) {
    int r[8], c[8];
    for (int i = 0; i < 8; ++i) r[i] = rows, c[i] = colsb;
    config(r, c);
}

static uint16_t bf(float f) { /* exact values only: the upper half of f */
    uint32_t u;
    memcpy(&u, &f, 4);
    return (uint16_t)(u >> 16);
}

static uint32_t bits(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}

static void test_bf16_product(void) {
    /* C (2 x 2) = A (2 rows, 2 k-pairs) . B (2 k-pair rows, 2 columns of pairs) */
    config_all(2, 8);
    const float a[2][4] = {{1, 2, 3, 4}, {-1, 0.5f, 8, -2}};
    const float b[2][4] = {{1, 10, 2, 20}, {3, 30, 4, 40}}; /* [k][n][pair] */
    uint16_t A[2][4], B[2][4];
    for (int i = 0; i < 2; ++i)
        for (int j = 0; j < 4; ++j) A[i][j] = bf(a[i][j]), B[i][j] = bf(b[i][j]);
    float C[2][2] = {{100, 0}, {0, -1}};
    cb_emu_loadd(0, C, 8);
    cb_emu_loadd(1, A, 8);
    cb_emu_loadd(2, B, 8);
    cb_emu_dpbf16ps(0, 1, 2);
    float out[2][2];
    cb_emu_stored(0, out, 8);
    /* out[m][n] = C + sum_k a[m][2k] b[k][2n] + a[m][2k+1] b[k][2n+1] */
    float want[2][2];
    for (int m = 0; m < 2; ++m)
        for (int n = 0; n < 2; ++n) {
            want[m][n] = C[m][n];
            for (int k = 0; k < 2; ++k)
                want[m][n] += a[m][2 * k] * b[k][2 * n] + a[m][2 * k + 1] * b[k][2 * n + 1];
        }
    /* by hand: row 0: 100 + 1*1 + 2*10 + 3*3 + 4*30 = 250; 0 + 1*2 + 2*20 + 3*4 + 4*40 = 214 */
    CHECK(out[0][0] == 250 && out[0][1] == 214, "bf16 row 0: %g %g", out[0][0], out[0][1]);
    for (int m = 0; m < 2; ++m)
        for (int n = 0; n < 2; ++n)
            CHECK(out[m][n] == want[m][n], "bf16 [%d][%d]: %g, want %g", m, n, out[m][n], want[m][n]);
}

static void test_bf16_rounding(void) {
    config_all(1, 4);
    /* 1 + 2^-24 + 2^-24, one add at a time: each sum is a tie and rounds to even (1.0);
     * summing the pair first would give 1 + 2^-23 */
    float c = 1.0f, out;
    const uint16_t a[2] = {bf(ldexpf(1, -12)), bf(ldexpf(1, -12))};
    const uint16_t b[2] = {bf(ldexpf(1, -12)), bf(ldexpf(1, -12))};
    cb_emu_loadd(0, &c, 4);
    cb_emu_loadd(1, a, 4);
    cb_emu_loadd(2, b, 4);
    cb_emu_dpbf16ps(0, 1, 2);
    cb_emu_stored(0, &out, 4);
    CHECK(out == 1.0f, "pair added one product at a time, ties to even: %a", out);
    /* 1 + 0.75 ulp (1.5 * 2^-24) rounds to the nearer 1 + 2^-23 */
    const uint16_t a3[2] = {bf(1.5f * ldexpf(1, -12)), bf(0)};
    cb_emu_loadd(1, a3, 4);
    cb_emu_loadd(0, &c, 4);
    cb_emu_dpbf16ps(0, 1, 2);
    cb_emu_stored(0, &out, 4);
    CHECK(out == 1.0f + ldexpf(1, -23), "1 + 1.5 * 2^-24 rounds to nearest: %a", out);
    /* a denormal bf16 input counts as zero: 2^-130 (a bf16 denormal) * 2^100 would be
     * 2^-30 */
    const uint16_t den[2] = {0x0020, 0}, big[2] = {bf(ldexpf(1, 100)), 0};
    float z = 0.0f;
    cb_emu_loadd(0, &z, 4);
    cb_emu_loadd(1, den, 4);
    cb_emu_loadd(2, big, 4);
    cb_emu_dpbf16ps(0, 1, 2);
    cb_emu_stored(0, &out, 4);
    CHECK(out == 0.0f, "denormal bf16 input treated as zero: %a", out);
    /* a denormal f32 result is flushed: 2^-70 * 2^-70 = 2^-140 */
    const uint16_t tiny[2] = {bf(ldexpf(1, -70)), 0};
    cb_emu_loadd(0, &z, 4);
    cb_emu_loadd(1, tiny, 4);
    cb_emu_loadd(2, tiny, 4);
    cb_emu_dpbf16ps(0, 1, 2);
    cb_emu_stored(0, &out, 4);
    CHECK(bits(out) == 0, "denormal result flushed to zero: %a", out);
    /* the sign of a flushed negative result stays */
    const uint16_t ntiny[2] = {bf(-ldexpf(1, -70)), 0};
    cb_emu_loadd(1, ntiny, 4);
    cb_emu_loadd(0, &z, 4);
    cb_emu_dpbf16ps(0, 1, 2);
    cb_emu_stored(0, &out, 4);
    CHECK(bits(out) == 0x80000000u || bits(out) == 0, "negative denormal flushed: %a", out);
}

static void test_int8_products(void) {
    config_all(1, 4);
    const uint8_t ff[4] = {0xff, 0, 0, 0};
    int32_t c = 0, out;
    cb_emu_loadd(1, ff, 4);
    cb_emu_loadd(2, ff, 4);
    /* 0xff is -1 signed, 255 unsigned: the four forms */
    cb_emu_loadd(0, &c, 4);
    cb_emu_dpbssd(0, 1, 2);
    cb_emu_stored(0, &out, 4);
    CHECK(out == 1, "tdpbssd (-1)(-1) = %d", out);
    cb_emu_loadd(0, &c, 4);
    cb_emu_dpbusd(0, 1, 2);
    cb_emu_stored(0, &out, 4);
    CHECK(out == -255, "tdpbusd 255 (-1) = %d", out);
    cb_emu_loadd(0, &c, 4);
    cb_emu_dpbsud(0, 1, 2);
    cb_emu_stored(0, &out, 4);
    CHECK(out == -255, "tdpbsud (-1) 255 = %d", out);
    cb_emu_loadd(0, &c, 4);
    cb_emu_dpbuud(0, 1, 2);
    cb_emu_stored(0, &out, 4);
    CHECK(out == 65025, "tdpbuud 255 255 = %d", out);
    /* four products summed: 127 * -128 * 4 = -65024 */
    const int8_t p[4] = {127, 127, 127, 127}, q[4] = {-128, -128, -128, -128};
    cb_emu_loadd(0, &c, 4);
    cb_emu_loadd(1, p, 4);
    cb_emu_loadd(2, q, 4);
    cb_emu_dpbssd(0, 1, 2);
    cb_emu_stored(0, &out, 4);
    CHECK(out == -65024, "four byte products summed: %d", out);
    /* the int32 lane wraps: INT32_MAX + 1 */
    const int8_t one[4] = {1, 0, 0, 0};
    int32_t max = 0x7fffffff;
    cb_emu_loadd(0, &max, 4);
    cb_emu_loadd(1, one, 4);
    cb_emu_loadd(2, one, 4);
    cb_emu_dpbssd(0, 1, 2);
    cb_emu_stored(0, &out, 4);
    CHECK((uint32_t)out == 0x80000000u, "INT32_MAX + 1 wraps: %d", out);
}

static void test_int8_matrix(void) {
    /* 3 x 2 int32 = (3 rows, 8 bytes: 2 groups of 4) . (2 rows, 8 bytes) */
    config_all(3, 8);
    int r[8] = {3, 3, 2}, w[8] = {8, 8, 8};
    config(r, w);
    int8_t A[3][8], B[2][8];
    for (int i = 0; i < 3; ++i)
        for (int j = 0; j < 8; ++j) A[i][j] = (int8_t)(i * 8 + j - 11);
    for (int i = 0; i < 2; ++i)
        for (int j = 0; j < 8; ++j) B[i][j] = (int8_t)(5 - 3 * i - j);
    cb_emu_zero(0);
    cb_emu_loadd(1, A, 8);
    cb_emu_loadd(2, B, 8);
    cb_emu_dpbssd(0, 1, 2);
    int32_t out[3][2];
    cb_emu_stored(0, out, 8);
    for (int m = 0; m < 3; ++m)
        for (int n = 0; n < 2; ++n) {
            int32_t want = 0;
            for (int k = 0; k < 2; ++k)
                for (int i = 0; i < 4; ++i) want += A[m][4 * k + i] * B[k][4 * n + i];
            CHECK(out[m][n] == want, "int8 [%d][%d]: %d, want %d", m, n, out[m][n], want);
        }
}

static void test_strides(void) {
    /* rows loaded and stored at a stride; bytes between rows untouched */
    config_all(3, 8);
    uint8_t src[3 * 20], dst[3 * 20];
    for (int i = 0; i < 60; ++i) src[i] = (uint8_t)i, dst[i] = 0xee;
    cb_emu_loadd(3, src, 20);
    cb_emu_stored(3, dst, 20);
    int ok = 1;
    for (int r = 0; r < 3; ++r)
        for (int j = 0; j < 20; ++j)
            ok &= dst[r * 20 + j] == (j < 8 ? src[r * 20 + j] : 0xee);
    CHECK(ok, "strided load and store copy rows x colsb bytes and nothing else");
    cb_emu_zero(3);
    cb_emu_stored(3, dst, 20);
    CHECK(dst[0] == 0 && dst[47] == 0 && dst[8] == 0xee, "tilezero");
}

static void test_refusals(void) {
    cb_emu_fault_fn old = cb_emu_on_fault(count_fault);
    uint8_t buf[1024] = {0};
    int r[8] = {2, 2, 3}, c[8] = {8, 8, 8};
    config(r, c);
    int f0 = faults;
    cb_emu_dpbssd(0, 1, 2); /* B has 3 rows, A has 2 groups of 4 bytes */
    CHECK(faults == f0 + 1 && strstr(last_fault, "B's rows"), "A columns vs B rows: %s", last_fault);
    f0 = faults;
    cb_emu_dpbssd(0, 0, 1);
    CHECK(faults == f0 + 1 && strstr(last_fault, "differ"), "same tile twice: %s", last_fault);
    f0 = faults;
    cb_emu_loadd(5, buf, 8);
    CHECK(faults == f0 + 1 && strstr(last_fault, "not configured"), "unconfigured tile: %s", last_fault);
    f0 = faults;
    cb_emu_zero(8);
    CHECK(faults == f0 + 1 && strstr(last_fault, "does not exist"), "tile 8: %s", last_fault);
    int r2[8] = {2, 3, 2}, c2[8] = {8, 8, 8};
    config(r2, c2);
    f0 = faults;
    cb_emu_dpbf16ps(0, 1, 2);
    CHECK(faults == f0 + 1 && strstr(last_fault, "rows"), "C rows vs A rows: %s", last_fault);
    int r3[8] = {2, 2, 2}, c3[8] = {12, 8, 8};
    config(r3, c3);
    f0 = faults;
    cb_emu_dpbf16ps(0, 1, 2);
    CHECK(faults == f0 + 1 && strstr(last_fault, "width"), "C width vs B width: %s", last_fault);
    cb_tilecfg bad;
    memset(&bad, 0, sizeof bad);
    bad.palette = 1;
    bad.rows[0] = 17;
    bad.colsb[0] = 64;
    f0 = faults;
    cb_emu_loadconfig(&bad);
    CHECK(faults == f0 + 1, "17 rows refused");
    bad.rows[0] = 16;
    bad.colsb[0] = 0;
    f0 = faults;
    cb_emu_loadconfig(&bad);
    CHECK(faults == f0 + 1, "rows without colsb refused");
    bad.colsb[0] = 64;
    bad.palette = 2;
    f0 = faults;
    cb_emu_loadconfig(&bad);
    CHECK(faults == f0 + 1, "palette 2 refused");
    bad.palette = 1;
    bad.rows[9] = 1;
    bad.colsb[9] = 4;
    f0 = faults;
    cb_emu_loadconfig(&bad);
    CHECK(faults == f0 + 1, "tile 9 configured refused");
    /* after a release nothing runs until the next ldtilecfg */
    config_all(2, 8);
    cb_emu_release();
    f0 = faults;
    cb_emu_zero(0);
    CHECK(faults == f0 + 1 && strstr(last_fault, "ldtilecfg"), "use after release: %s", last_fault);
    /* a refused product leaves C as it was */
    config(r, c);
    int32_t c0[2][2] = {{7, 7}, {7, 7}}, out[2][2];
    cb_emu_loadd(0, c0, 8);
    cb_emu_dpbssd(0, 1, 2);
    cb_emu_stored(0, out, 8);
    CHECK(out[0][0] == 7 && out[1][1] == 7, "a refused product changes nothing");
    cb_emu_on_fault(old);
}

int main(void) {
    test_bf16_product();
    test_bf16_rounding();
    test_int8_products();
    test_int8_matrix();
    test_strides();
    test_refusals();
    cb_emu_release();
    printf("test_amx_emu: %d checks, %d failed\n", checks, failed);
    return failed != 0;
}
