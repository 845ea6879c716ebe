/* The engine's threads, for a race detector (tests/engine/test_races.py builds this against
 * the tsan profile's library and runs it under ThreadSanitizer with OpenMP's Archer tool).
 *
 * Every weight dtype, with a shared expert, at 1, 2 and 4 threads, on token counts that take
 * each kernel path (decode, prefill, the gemm paths) and two routings: spread over the
 * experts, and every token on the same two experts (the router's rows all zero: ties go to
 * the lowest indices). The threads split rows, so an output never depends on how many there
 * are: the 2- and 4-thread outputs must equal the 1-thread one bit for bit. With a model
 * file (argv[1]) the same for colibri_infer, whose load packs the experts on the threads,
 * and for the model under memory budgets of one and three experts, whose cache the call's
 * threads fill together.
 * Prints "test_race: N checks, M failed" and exits 1 if any failed. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "colibri.h"

enum { H = 96, I = 64, E = 8, S = 48, G = (H + 31) / 32, GI = (I + 31) / 32, GS = (S + 31) / 32, TMAX = 80 };

static int checks, failed;

static void check(int ok, const char *what) {
    ++checks;
    if (!ok) {
        ++failed;
        printf("FAIL: %s (%s)\n", what, colibri_last_error());
    }
}

static uint32_t rng = 12345u;
static float frand(void) { /* [-0.5, 0.5) */
    rng = rng * 1664525u + 1013904223u;
    return (float)(rng >> 8) / 16777216.0f - 0.5f;
}

/* n weights of dtype into a fresh buffer (bf16: the top half of the f32 bits; int8 and
 * int4: random levels; int4 rows hold `cols` weights in ceil(cols/32) * 16 bytes) */
static void *weights(int dtype, int rows, int cols) {
    const size_t n = (size_t)rows * cols;
    switch (dtype) {
    case COLIBRI_F32: {
        float *w = malloc(n * sizeof *w);
        for (size_t i = 0; i < n; ++i) w[i] = frand() * 0.2f;
        return w;
    }
    case COLIBRI_BF16: {
        uint16_t *w = malloc(n * sizeof *w);
        for (size_t i = 0; i < n; ++i) {
            float f = frand() * 0.2f;
            uint32_t b;
            memcpy(&b, &f, 4);
            w[i] = (uint16_t)(b >> 16);
        }
        return w;
    }
    case COLIBRI_INT8: {
        int8_t *w = malloc(n);
        for (size_t i = 0; i < n; ++i) w[i] = (int8_t)(frand() * 250.0f);
        return w;
    }
    default: {
        const size_t bytes = (size_t)rows * ((cols + 31) / 32) * 16;
        uint8_t *w = malloc(bytes);
        for (size_t i = 0; i < bytes; ++i) w[i] = (uint8_t)((frand() + 0.5f) * 255.0f);
        return w;
    }
    }
}

static float *scales(int dtype, int rows, int cols) {
    const size_t n = dtype == COLIBRI_INT8 ? (size_t)rows : (size_t)rows * ((cols + 31) / 32);
    float *s = malloc(n * sizeof *s);
    for (size_t i = 0; i < n; ++i) s[i] = 0.001f + (frand() + 0.5f) * 0.001f;
    return s;
}

static void run_layer(int dtype, int skewed) {
    const int q = dtype == COLIBRI_INT8 || dtype == COLIBRI_INT4;
    float *router = malloc((size_t)E * H * sizeof *router);
    for (int i = 0; i < E * H; ++i) router[i] = skewed ? 0.0f : frand();
    void *gate = weights(dtype, E * I, H), *up = weights(dtype, E * I, H), *down = weights(dtype, E * H, I);
    void *sg = weights(dtype, S, H), *su = weights(dtype, S, H), *sd = weights(dtype, H, S);
    float *gs = q ? scales(dtype, E * I, H) : NULL, *us = q ? scales(dtype, E * I, H) : NULL;
    float *ds = q ? scales(dtype, E * H, I) : NULL;
    float *sgs = q ? scales(dtype, S, H) : NULL, *sus = q ? scales(dtype, S, H) : NULL;
    float *sds = q ? scales(dtype, H, S) : NULL;
    colibri_layer_desc d = {0};
    d.hidden = H, d.inter = I, d.n_experts = E, d.weight_dtype = dtype;
    d.route.scoring = COLIBRI_SCORING_SOFTMAX, d.route.top_k = 2, d.route.norm_topk_prob = 1;
    d.router = router, d.gate = gate, d.up = up, d.down = down;
    d.gate_scales = gs, d.up_scales = us, d.down_scales = ds;
    d.shared_inter = S, d.shared_gate = sg, d.shared_up = su, d.shared_down = sd;
    d.shared_gate_scales = sgs, d.shared_up_scales = sus, d.shared_down_scales = sds;
    d.numa_node = -1;
    colibri_layer *L = colibri_layer_create(&d);
    char what[96];
    snprintf(what, sizeof what, "create dtype %d%s", dtype, skewed ? " skewed" : "");
    check(L != NULL, what);
    if (L) {
        static float x[TMAX * H], y1[TMAX * H], yn[TMAX * H];
        for (int i = 0; i < TMAX * H; ++i) x[i] = frand() * 2.0f;
        const int tokens[] = {1, 2, 5, 17, TMAX};
        for (size_t t = 0; t < sizeof tokens / sizeof *tokens; ++t) {
            const int T = tokens[t];
            check(colibri_layer_forward(L, x, y1, T, 1) == COLIBRI_OK, "forward 1 thread");
            for (int nt = 2; nt <= 4; nt += 2) {
                memset(yn, 0, sizeof yn);
                snprintf(what, sizeof what, "dtype %d%s T=%d: %d threads equal 1", dtype, skewed ? " skewed" : "", T, nt);
                check(colibri_layer_forward(L, x, yn, T, nt) == COLIBRI_OK
                          && memcmp(y1, yn, (size_t)T * H * sizeof *y1) == 0, what);
            }
        }
        colibri_layer_free(L);
    }
    free(router), free(gate), free(up), free(down), free(sg), free(su), free(sd);
    free(gs), free(us), free(ds), free(sgs), free(sus), free(sds);
}

static void run_model(const char *path) {
    for (int nt = 1; nt <= 4; nt *= 2) {
        check(colibri_set_num_threads(nt) == COLIBRI_OK, "set threads");
        colibri_model *m = colibri_load_model(path); /* packs on nt threads where the build packs */
        check(m != NULL, "load model");
        if (!m) return;
        const int h = colibri_model_hidden(m), T = 9;
        float *x = malloc((size_t)T * h * sizeof *x), *y = malloc((size_t)T * h * sizeof *y);
        static float *y1;
        for (int i = 0; i < T * h; ++i) x[i] = sinf((float)i);
        check(colibri_infer(m, x, y, T) == COLIBRI_OK, "infer");
        if (nt == 1) {
            y1 = malloc((size_t)T * h * sizeof *y1);
            memcpy(y1, y, (size_t)T * h * sizeof *y);
        } else {
            char what[64];
            snprintf(what, sizeof what, "model: %d threads equal 1", nt);
            check(memcmp(y1, y, (size_t)T * h * sizeof *y) == 0, what);
        }
        colibri_free_model(m);
        /* under memory budgets of one and three experts: the call's threads read a turn's
         * misses together; the outputs stay those of the 1-thread unbudgeted run */
        colibri_load_options o;
        colibri_memory_stats a, b;
        memset(&o, 0, sizeof o);
        memset(&a, 0, sizeof a);
        memset(&b, 0, sizeof b);
        o.memory_budget = (size_t)1 << 30; /* a probe: the resident parts, then one expert's size */
        m = colibri_load_model_with(path, &o);
        check(m && colibri_model_stats(m, &a) == COLIBRI_OK && colibri_infer(m, x, y, T) == COLIBRI_OK &&
                  colibri_model_stats(m, &b) == COLIBRI_OK && b.misses > 0,
              "budget probe");
        colibri_free_model(m);
        const size_t slot = b.misses ? (b.resident_bytes - a.resident_bytes) / b.misses : 0;
        for (int slots = 1; slots <= 3 && slot; slots += 2) {
            o.memory_budget = a.resident_bytes + (size_t)slots * slot;
            m = colibri_load_model_with(path, &o);
            char what[64];
            snprintf(what, sizeof what, "model, %d threads, budget of %d experts, equals 1 thread", nt, slots);
            check(m && colibri_infer(m, x, y, T) == COLIBRI_OK && memcmp(y1, y, (size_t)T * h * sizeof *y) == 0,
                  what);
            colibri_free_model(m);
        }
        free(x), free(y);
    }
    colibri_set_num_threads(0);
}

int main(int argc, char **argv) {
    for (int dtype = COLIBRI_F32; dtype <= COLIBRI_INT4; ++dtype)
        for (int skewed = 0; skewed <= 1; ++skewed) run_layer(dtype, skewed);
    if (argc > 1) run_model(argv[1]);
    printf("test_race: %d checks, %d failed\n", checks, failed);
    return failed != 0;
}
