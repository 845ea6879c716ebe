/* test_capi.c — every function of colibri.h called with bad arguments, from C.
 *
 * Checks the status (or NULL / sentinel) and a word of colibri_last_error() for each
 * case, and the documented results for zero tokens, NaN/Inf and borrowed layers.
 * Run by tests/engine/test_capi.py against whichever library it links (the default build,
 * $COLIBRI_LIB, the asan build): usage  test_capi MODEL_FILE DIRECTORY
 * Prints one line per failed check and "test_capi: N checks, M failed"; exit 1 on any failure.
 */
#include <limits.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "colibri.h"

static int n_checks, n_failed;

/* cond must hold and, when `word` is non-NULL, the last error must contain it. */
static void check_at(int line, int cond, const char *word, const char *what) {
    ++n_checks;
    const char *msg = colibri_last_error();
    if (cond && (!word || strstr(msg, word))) return;
    ++n_failed;
    printf("FAIL line %d: %s (last error: \"%s\"%s%s)\n", line, what, msg,
           word ? ", wanted a message with " : "", word ? word : "");
}
#define CHECK(cond, word) check_at(__LINE__, (cond), (word), #cond)
#define INVALID(call, word) check_at(__LINE__, (call) == COLIBRI_ERR_INVALID, (word), #call)

enum { H = 16, I = 8, E = 4, K = 2, T = 3 };

static float router[E * H], gate[E * I * H], up[E * I * H], down[E * H * I];
static float scales_i[E * I], scales_h[E * H];
static int8_t q8[E * I * H];

static colibri_layer_desc good_desc(void) {
    colibri_layer_desc d;
    memset(&d, 0, sizeof d);
    d.hidden = H;
    d.inter = I;
    d.n_experts = E;
    d.route.scoring = COLIBRI_SCORING_SOFTMAX;
    d.route.top_k = K;
    d.route.norm_topk_prob = 1;
    d.weight_dtype = COLIBRI_F32;
    d.router = router;
    d.gate = gate;
    d.up = up;
    d.down = down;
    d.numa_node = -1;
    return d;
}

/* create must fail with COLIBRI_ERR_INVALID-style NULL and a message containing word. */
static void create_fails(int line, colibri_layer_desc d, const char *word, const char *what) {
    colibri_layer *L = colibri_layer_create(&d);
    check_at(line, L == NULL, word, what);
    colibri_layer_free(L);
}
#define CREATE_FAILS(stmt, word)                                                                   \
    do {                                                                                           \
        colibri_layer_desc d_ = good_desc();                                                       \
        stmt;                                                                                      \
        create_fails(__LINE__, d_, word, #stmt);                                                   \
    } while (0)

static void test_misc(void) {
    CHECK(colibri_version() && colibri_version()[0], NULL);
    CHECK(colibri_build_info() && colibri_build_info()[0] == '{', NULL);
    const int amx = colibri_uses_amx(); /* asks Linux once; the answer stays */
    CHECK((amx == 0 || amx == 1) && colibri_uses_amx() == amx, NULL);
    const int before = colibri_get_num_threads();
    INVALID(colibri_set_num_threads(-1), "n_threads");
    INVALID(colibri_set_num_threads(COLIBRI_MAX_THREADS + 1), "n_threads");
    INVALID(colibri_set_num_threads(INT_MAX), "n_threads");
    CHECK(colibri_get_num_threads() == before, NULL);
    CHECK(colibri_set_num_threads(0) == COLIBRI_OK && colibri_last_error()[0] == '\0', NULL);
}

static void test_pool(void) {
    CHECK(colibri_pool_create(0, 0, -1) == NULL, "capacity");
    CHECK(colibri_pool_create(4096, 2, -1) == NULL, "hugepages");
    CHECK(colibri_pool_create(4096, -1, -1) == NULL, "hugepages");
    CHECK(colibri_pool_create(SIZE_MAX, 0, -1) == NULL, "too large");
    CHECK(colibri_pool_create(4096, 0, 100000) == NULL, "NUMA node");
    CHECK(colibri_pool_alloc(NULL, 8, 8) == NULL, "NULL");
    CHECK(colibri_pool_used(NULL) == 0, "NULL");
    CHECK(colibri_pool_capacity(NULL) == 0, "NULL");
    CHECK(colibri_pool_page_kind(NULL) == -1, "NULL");
    CHECK(colibri_pool_numa_node(NULL) == -1, "NULL");
    colibri_pool_free(NULL);
    colibri_pool *p = colibri_pool_create(4096, 0, -1);
    CHECK(p != NULL, NULL);
    if (!p) return;
    CHECK(colibri_pool_alloc(p, 8, 3) == NULL, "power of two");
    CHECK(colibri_pool_alloc(p, 4097, 8) == NULL, "exhausted");
    CHECK(colibri_pool_alloc(p, SIZE_MAX, 8) == NULL, "exhausted");
    CHECK(colibri_pool_alloc(p, 8, (size_t)1 << 62) != NULL, NULL); /* at offset 0: fits */
    CHECK(colibri_pool_alloc(p, 8, (size_t)1 << 62) == NULL, "exhausted");
    CHECK(colibri_pool_used(p) == 8, NULL);
    colibri_pool_free(p);
}

static void test_route(void) {
    colibri_route_config cfg = {COLIBRI_SCORING_SOFTMAX, K, 1, 0.0f, 0, 0};
    float logits[T * E] = {0};
    int32_t idx[T * E], cnt[T];
    float w[T * E];
    CHECK(colibri_route_slots(NULL) == 0, "NULL");
    CHECK(colibri_route_slots(&cfg) == K, NULL);
    INVALID(colibri_route(logits, T, E, NULL, idx, w, cnt), "NULL");
    INVALID(colibri_route(NULL, T, E, &cfg, idx, w, cnt), "NULL");
    INVALID(colibri_route(logits, T, E, &cfg, NULL, w, cnt), "NULL");
    INVALID(colibri_route(logits, T, E, &cfg, idx, NULL, cnt), "NULL");
    INVALID(colibri_route(logits, -1, E, &cfg, idx, w, cnt), "n_tokens");
    INVALID(colibri_route(logits, T, 0, &cfg, idx, w, cnt), "n_experts");
    INVALID(colibri_route(logits, T, -5, &cfg, idx, w, cnt), "n_experts");
    INVALID(colibri_route(logits, T, COLIBRI_MAX_EXPERTS + 1, &cfg, idx, w, cnt), "n_experts");
    CHECK(colibri_route(NULL, 0, E, &cfg, NULL, NULL, NULL) == COLIBRI_OK, NULL); /* no tokens */
    CHECK(colibri_route(logits, T, E, &cfg, idx, w, NULL) == COLIBRI_OK, NULL);   /* no counts */
    colibri_route_config bad = cfg;
    bad.top_k = E + 1;
    INVALID(colibri_route(logits, T, E, &bad, idx, w, cnt), "top_k");
    bad.top_k = 0;
    INVALID(colibri_route(logits, T, E, &bad, idx, w, cnt), "top_k");
    bad.top_k = -3;
    INVALID(colibri_route(logits, T, E, &bad, idx, w, cnt), "top_k");
    bad = cfg;
    bad.scoring = 7;
    INVALID(colibri_route(logits, T, E, &bad, idx, w, cnt), "scoring");
    bad = cfg;
    bad.dyn_p = NAN;
    INVALID(colibri_route(logits, T, E, &bad, idx, w, cnt), "dyn_p");
    bad.dyn_p = 1.5f;
    INVALID(colibri_route(logits, T, E, &bad, idx, w, cnt), "dyn_p");
    bad.dyn_p = 0.5f, bad.k_min = 3, bad.k_max = 2;
    INVALID(colibri_route(logits, T, E, &bad, idx, w, cnt), "k_min");
    bad.k_min = 1, bad.k_max = E + 1;
    INVALID(colibri_route(logits, T, E, &bad, idx, w, cnt), "k_max");

    /* NaN and Inf: row 0 all NaN, row 1 two +Inf, row 2 all -Inf */
    for (int e = 0; e < E; ++e) {
        logits[e] = NAN;
        logits[E + e] = e == 1 || e == 3 ? INFINITY : 1.0f;
        logits[2 * E + e] = -INFINITY;
    }
    cfg.norm_topk_prob = 0;
    CHECK(colibri_route(logits, T, E, &cfg, idx, w, cnt) == COLIBRI_OK, NULL);
    CHECK(cnt[0] == 0 && idx[0] == -1 && idx[1] == -1 && w[0] == 0.0f && w[1] == 0.0f, NULL);
    CHECK(cnt[1] == 2 && idx[K] == 1 && idx[K + 1] == 3, NULL);
    CHECK(w[K] == 0.5f && w[K + 1] == 0.5f, NULL);
    CHECK(cnt[2] == K && w[2 * K] == 1.0f / E && w[2 * K + 1] == 1.0f / E, NULL);
}

static void test_layer(void) {
    CHECK(colibri_layer_create(NULL) == NULL, "NULL");
    CREATE_FAILS(d_.router = NULL, "NULL");
    CREATE_FAILS(d_.gate = NULL, "NULL");
    CREATE_FAILS(d_.up = NULL, "NULL");
    CREATE_FAILS(d_.down = NULL, "NULL");
    CREATE_FAILS(d_.hidden = 0, "hidden");
    CREATE_FAILS(d_.hidden = -1, "hidden");
    CREATE_FAILS(d_.hidden = INT_MAX, "hidden");
    CREATE_FAILS(d_.inter = 0, "inter");
    CREATE_FAILS(d_.n_experts = 0, "n_experts");
    CREATE_FAILS(d_.n_experts = -1, "n_experts");
    CREATE_FAILS(d_.shared_inter = -1, "shared_inter");
    CREATE_FAILS(d_.weight_dtype = 5, "weight_dtype");
    CREATE_FAILS(d_.weight_dtype = 3, "int4 weights need");  /* int4 without its scales */
    CREATE_FAILS(d_.weight_dtype = -1, "weight_dtype");
    CREATE_FAILS(d_.hugepages = 2, "hugepages");
    CREATE_FAILS(d_.route.top_k = E + 1, "top_k");
    CREATE_FAILS(d_.route.top_k = 0, "top_k");
    CREATE_FAILS(d_.route.scoring = 2, "scoring");
    CREATE_FAILS(d_.numa_node = 100000, "NUMA");
    CREATE_FAILS((d_.weight_dtype = COLIBRI_INT8, d_.gate = q8, d_.up = q8, d_.down = q8), "scales");
    CREATE_FAILS((d_.weight_dtype = COLIBRI_INT8, d_.gate = q8, d_.up = q8, d_.down = q8,
                  d_.gate_scales = scales_i, d_.up_scales = scales_i), "scales");
    CREATE_FAILS((d_.shared_inter = I, d_.shared_gate = gate, d_.shared_up = up), "shared");
    CREATE_FAILS(d_.shared_expert_gate = router, "shared_expert_gate");
    CREATE_FAILS((d_.weight_dtype = COLIBRI_INT8, d_.gate = q8, d_.up = q8, d_.down = q8,
                  d_.gate_scales = scales_i, d_.up_scales = scales_i, d_.down_scales = scales_h,
                  d_.shared_inter = I, d_.shared_gate = q8, d_.shared_up = q8, d_.shared_down = q8),
                 "scale");
    CHECK(colibri_layer_page_kind(NULL) == -1, "NULL");
    CHECK(colibri_layer_weight_bytes(NULL) == 0, "NULL");
    colibri_layer_free(NULL);

    colibri_layer_desc d = good_desc();
    colibri_layer *L = colibri_layer_create(&d);
    CHECK(L != NULL, NULL);
    if (!L) return;
    float x[T * H], y[T * H], y1[H];
    for (int i = 0; i < T * H; ++i) x[i] = (float)((i * 7) % 11) / 11.0f - 0.5f;
    INVALID(colibri_layer_forward(NULL, x, y, T, 1), "NULL");
    INVALID(colibri_layer_forward(L, NULL, y, T, 1), "NULL");
    INVALID(colibri_layer_forward(L, x, NULL, T, 1), "NULL");
    INVALID(colibri_layer_forward(L, x, y, -1, 1), "n_tokens");
    INVALID(colibri_layer_forward(L, x, y, INT_MIN, 1), "n_tokens");
    INVALID(colibri_layer_forward(L, x, y, T, -1), "n_threads");
    INVALID(colibri_layer_forward(L, x, y, T, COLIBRI_MAX_THREADS + 1), "n_threads");
    INVALID(colibri_layer_forward(L, x, y, T, INT_MAX), "n_threads");
    INVALID(colibri_layer_forward(L, x, x, T, 1), "overlap");
    INVALID(colibri_layer_forward(L, x, x + H, T, 1), "overlap");
    CHECK(colibri_layer_forward(L, NULL, NULL, 0, 1) == COLIBRI_OK, NULL);
    CHECK(colibri_layer_forward(L, x, y, T, 0) == COLIBRI_OK, NULL);
    CHECK(colibri_layer_weight_bytes(L) > 0 && colibri_layer_page_kind(L) >= 0, NULL);

    /* token 1 gets a NaN, token 2 an Inf: their rows are NaN, token 0's row unchanged */
    CHECK(colibri_layer_forward(L, x, y1, 1, 1) == COLIBRI_OK, NULL);
    x[H + 5] = NAN;
    x[2 * H] = -INFINITY;
    CHECK(colibri_layer_forward(L, x, y, T, 2) == COLIBRI_OK, NULL);
    /* token 0's router logits are summed in a call of 3 tokens, not 1: equal to rounding */
    int nan_rows = 1, same = 1;
    for (int c = 0; c < H; ++c) {
        nan_rows &= isnan(y[H + c]) && isnan(y[2 * H + c]);
        same &= fabsf(y[c] - y1[c]) <= 1e-5f * (fabsf(y1[c]) + 1e-3f);
    }
    CHECK(nan_rows, NULL);
    CHECK(same, NULL);

    double samples[4];
    int ns = 99;
    INVALID(colibri_bench_layer(NULL, x, 1, 1, y, 1, 0, 0.0, 4, samples, &ns), "NULL");
    CHECK(ns == 0, NULL);
    INVALID(colibri_bench_layer(L, NULL, 1, 1, y, 1, 0, 0.0, 4, samples, &ns), "NULL");
    INVALID(colibri_bench_layer(L, x, 1, 1, NULL, 1, 0, 0.0, 4, samples, &ns), "NULL");
    INVALID(colibri_bench_layer(L, x, 1, 1, y, 1, 0, 0.0, 4, NULL, &ns), "NULL");
    INVALID(colibri_bench_layer(L, x, 1, 1, y, 1, 0, 0.0, 4, samples, NULL), "NULL");
    INVALID(colibri_bench_layer(L, x, 0, 1, y, 1, 0, 0.0, 4, samples, &ns), "n_inputs");
    INVALID(colibri_bench_layer(L, x, 1, 0, y, 1, 0, 0.0, 4, samples, &ns), "n_tokens");
    INVALID(colibri_bench_layer(L, x, 1, -2, y, 1, 0, 0.0, 4, samples, &ns), "n_tokens");
    INVALID(colibri_bench_layer(L, x, 1, 1, y, 1, 0, 0.0, 0, samples, &ns), "max_samples");
    INVALID(colibri_bench_layer(L, x, 1, 1, y, 1, -1, 0.0, 4, samples, &ns), "warmup");
    INVALID(colibri_bench_layer(L, x, 1, 1, y, -1, 0, 0.0, 4, samples, &ns), "n_threads");
    INVALID(colibri_bench_layer(L, x, 1, 1, y, INT_MAX, 0, 0.0, 4, samples, &ns), "n_threads");
    INVALID(colibri_bench_layer(L, x, 1, 1, y, 1, 0, NAN, 4, samples, &ns), "NaN");
    CHECK(colibri_bench_layer(L, x, 1, 1, y, 1, 0, 0.0, 2, samples, &ns) == COLIBRI_OK && ns == 1,
          NULL);
    colibri_layer *two[2] = {L, L}, *holed[2] = {L, NULL};
    INVALID(colibri_bench_layers(NULL, 1, x, 1, 1, y, 1, 0, 0.0, 4, samples, &ns), "NULL");
    INVALID(colibri_bench_layers(two, 0, x, 1, 1, y, 1, 0, 0.0, 4, samples, &ns), "n_layers");
    INVALID(colibri_bench_layers(two, -1, x, 1, 1, y, 1, 0, 0.0, 4, samples, &ns), "n_layers");
    INVALID(colibri_bench_layers(holed, 2, x, 1, 1, y, 1, 0, 0.0, 4, samples, &ns), "layer 1 is NULL");
    CHECK(colibri_bench_layers(two, 2, x, 1, 1, y, 1, 1, 0.0, 3, samples, &ns) == COLIBRI_OK && ns == 1,
          NULL);
    colibri_layer_free(L);
}

/* int4k: quantizer arguments, and a layer of its bytes (no scales) against the f32 one */
static void test_int4k(void) {
    CHECK(colibri_int4k_row_bytes(H) == 32 && colibri_int4k_row_bytes(300) == 16 * (2 + 10), NULL);
    CHECK(colibri_int4k_row_bytes(0) == 0, NULL);
    static uint8_t g4[E * I * 32], u4[E * I * 32], d4[E * H * 32];
    INVALID(colibri_quantize_int4k(NULL, E * I, H, g4, 1), "NULL");
    INVALID(colibri_quantize_int4k(gate, E * I, H, NULL, 1), "NULL");
    INVALID(colibri_quantize_int4k(gate, 0, H, g4, 1), "rows");
    INVALID(colibri_quantize_int4k(gate, E * I, -1, g4, 1), "cols");
    INVALID(colibri_quantize_int4k(gate, E * I, H, g4, -1), "n_threads");
    CHECK(colibri_quantize_int4k(gate, E * I, H, g4, 0) == COLIBRI_OK, NULL);
    CHECK(colibri_quantize_int4k(up, E * I, H, u4, 1) == COLIBRI_OK, NULL);
    CHECK(colibri_quantize_int4k(down, E * H, I, d4, 2) == COLIBRI_OK, NULL);
    colibri_layer_desc d = good_desc();
    colibri_layer *F = colibri_layer_create(&d);
    d.weight_dtype = COLIBRI_INT4K;
    d.gate = g4, d.up = u4, d.down = d4;
    colibri_layer *L = colibri_layer_create(&d);
    CHECK(F != NULL && L != NULL, NULL);
    if (F && L) {
        float x[T * H], yf[T * H], yk[T * H];
        for (int i = 0; i < T * H; ++i) x[i] = (float)((i * 5) % 13) / 13.0f - 0.5f;
        CHECK(colibri_layer_forward(F, x, yf, T, 1) == COLIBRI_OK, NULL);
        CHECK(colibri_layer_forward(L, x, yk, T, 1) == COLIBRI_OK, NULL);
        double e = 0, n = 0;
        for (int i = 0; i < T * H; ++i) e += (yk[i] - yf[i]) * (double)(yk[i] - yf[i]), n += yf[i] * (double)yf[i];
        CHECK(n > 0 && e < 0.01 * n, NULL); /* within 10% L2 of the f32 layer: a 4.5-bit format */
    }
    colibri_layer_free(F);
    colibri_layer_free(L);
}

static void test_membw(void) {
    colibri_membw_result r;
    double g;
    INVALID(colibri_membw_run(COLIBRI_MEMBW_READ, 1 << 20, 1, 0.0, NULL), "NULL");
    INVALID(colibri_membw(COLIBRI_MEMBW_READ, 1 << 20, 1, 0.0, NULL), "NULL");
    INVALID(colibri_membw_run(7, 1 << 20, 1, 0.0, &r), "kind");
    INVALID(colibri_membw_run(-1, 1 << 20, 1, 0.0, &r), "kind");
    INVALID(colibri_membw_run(COLIBRI_MEMBW_READ, 1 << 20, -1, 0.0, &r), "n_threads");
    INVALID(colibri_membw_run(COLIBRI_MEMBW_READ, 1 << 20, INT_MAX, 0.0, &r), "n_threads");
    INVALID(colibri_membw_run(COLIBRI_MEMBW_READ, 1 << 20, 1, NAN, &r), "min_seconds");
    INVALID(colibri_membw_run(COLIBRI_MEMBW_READ, 1 << 20, 1, -1.0, &r), "min_seconds");
    INVALID(colibri_membw_run(COLIBRI_MEMBW_READ, 0, 1, 0.0, &r), "too small");
    INVALID(colibri_membw_run(COLIBRI_MEMBW_TRIAD, SIZE_MAX, 1, 0.0, &r), "too large");
    INVALID(colibri_membw(COLIBRI_MEMBW_TRIAD, SIZE_MAX, 1, 0.0, &g), "too large");
}

static void test_model(const char *model_path, const char *dir) {
    CHECK(colibri_load_model(NULL) == NULL, "NULL");
    CHECK(colibri_load_model("") == NULL, "cannot open");
    CHECK(colibri_load_model(dir) == NULL, "not a regular file");
    CHECK(colibri_load_model("/nonexistent/colibri/model") == NULL, "cannot open");
    CHECK(colibri_model_n_layers(NULL) == -1, "NULL");
    CHECK(colibri_model_hidden(NULL) == -1, "NULL");
    CHECK(colibri_model_layer(NULL, 0) == NULL, "NULL");
    colibri_free_model(NULL);
    float buf[2 * 64];
    INVALID(colibri_infer(NULL, buf, buf, 1), "NULL");

    colibri_model *m = colibri_load_model(model_path);
    CHECK(m != NULL, NULL);
    if (!m) return;
    const int n = colibri_model_n_layers(m), h = colibri_model_hidden(m);
    CHECK(n >= 1 && h >= 1 && h <= 64, NULL);
    if (h < 1 || h > 64) {
        colibri_free_model(m);
        return;
    }
    CHECK(colibri_model_layer(m, -1) == NULL, "out of range");
    CHECK(colibri_model_layer(m, n) == NULL, "out of range");
    CHECK(colibri_model_layer(m, INT_MAX) == NULL, "out of range");
    INVALID(colibri_infer(m, NULL, buf, 1), "NULL");
    INVALID(colibri_infer(m, buf, NULL, 1), "NULL");
    INVALID(colibri_infer(m, buf, buf, 0), "seq_len");
    INVALID(colibri_infer(m, buf, buf, -1), "seq_len");
    /* freeing a borrowed layer is ignored: the model still runs */
    colibri_layer_free(colibri_model_layer(m, 0));
    for (int i = 0; i < 2 * h; ++i) buf[i] = 0.01f * (float)(i % 13);
    buf[h + 1] = NAN;
    CHECK(colibri_infer(m, buf, buf, 2) == COLIBRI_OK, NULL);
    int row0_finite = 1, row1_nan = 1;
    for (int c = 0; c < h; ++c) {
        row0_finite &= isfinite(buf[c]) != 0;
        row1_nan &= isnan(buf[h + c]) != 0;
    }
    CHECK(row0_finite && row1_nan, NULL);
    colibri_free_model(m);
}

int main(int argc, char **argv) {
    if (argc != 3) {
        fprintf(stderr, "usage: %s MODEL_FILE DIRECTORY\n", argv[0]);
        return 2;
    }
    for (int i = 0; i < E * I * H; ++i) {
        gate[i] = up[i] = down[i] = (float)((i * 37) % 19) / 19.0f - 0.5f;
        q8[i] = (int8_t)(i % 7 - 3);
    }
    for (int i = 0; i < E * H; ++i) router[i] = (float)((i * 13) % 17) / 17.0f - 0.5f;
    test_misc();
    test_pool();
    test_route();
    test_layer();
    test_int4k();
    test_membw();
    test_model(argv[1], argv[2]);
    printf("test_capi: %d checks, %d failed\n", n_checks, n_failed);
    return n_failed ? 1 : 0;
}
