/* One MoE layer in ggml, for colibri_bench's side-by-side rows (colibri_bench/peers/ggml.py
 * builds this file against a ggml checkout the user names; nothing of ggml is in this tree).
 *
 * The layer is the graph llama.cpp builds for a softmax-routed MoE block: router matmul,
 * softmax, top-k (ggml_argsort_top_k), the selected probabilities (renormalised where the
 * shape says so), gate and up through ggml_mul_mat_id, SwiGLU, down through
 * ggml_mul_mat_id, weighting and the sum over the k experts. Each weight goes to the first
 * of the CPU device's extra buffer types (AMX, repack) that supports its op, as llama.cpp
 * places model weights, else to the plain CPU buffer: the repacked q4_0/q4_K layouts are
 * ggml's fastest CPU path. Errors come back as a status and a message, never an abort
 * that this file can see coming (shapes are checked before ggml gets them). */
#include <ggml.h>
#include <ggml-alloc.h>
#include <ggml-backend.h>
#include <ggml-cpu.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define MAX_COPIES 16
#define MAX_BUFS 8

typedef struct {
    struct ggml_context *ctx;     /* the graph's tensors (no data) */
    struct ggml_cgraph *graph;
    ggml_gallocr_t alloc;         /* activations in a plain CPU buffer */
    struct ggml_tensor *x, *out;
} gm_graph;

typedef struct gm_layer {
    ggml_backend_t backend;
    int H, I, E, k, T, copies;
    struct ggml_context *wctx[MAX_BUFS];   /* weights, one context per buffer type */
    ggml_backend_buffer_t wbuf[MAX_BUFS];
    int nbuf;
    gm_graph g[MAX_COPIES];
    size_t expert_bytes;                   /* one expert's gate + up + down as stored */
    char placed[256];                      /* where the expert weights went */
} gm_layer;

static void set_err(char *err, int errlen, const char *msg) {
    if (err && errlen > 0)
        snprintf(err, (size_t)errlen, "%s", msg);
}

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + 1e-9 * ts.tv_nsec;
}

/* The buffer type llama.cpp would give a weight of this type and shape used as src[0] of
 * a mul_mat (ne2 == 1) or mul_mat_id: the first extra buffer type whose supports_op
 * accepts the op with the weight in it, else the device's own. */
static ggml_backend_buffer_type_t pick_buft(ggml_backend_dev_t dev, enum ggml_type type,
                                            int64_t ne0, int64_t ne1, int64_t ne2, int k, int T) {
    ggml_backend_reg_t reg = ggml_backend_dev_backend_reg(dev);
    ggml_backend_dev_get_extra_bufts_t get_extra =
        (ggml_backend_dev_get_extra_bufts_t)ggml_backend_reg_get_proc_address(reg, "ggml_backend_dev_get_extra_bufts");
    ggml_backend_buffer_type_t def = ggml_backend_dev_buffer_type(dev);
    if (!get_extra)
        return def;
    struct ggml_init_params ip = {16 * ggml_tensor_overhead() + ggml_graph_overhead(), NULL, true};
    struct ggml_context *ctx = ggml_init(ip);
    struct ggml_tensor *w, *op;
    if (ne2 == 1) {
        w = ggml_new_tensor_2d(ctx, type, ne0, ne1);
        op = ggml_mul_mat(ctx, w, ggml_new_tensor_2d(ctx, GGML_TYPE_F32, ne0, T));
    } else {
        w = ggml_new_tensor_3d(ctx, type, ne0, ne1, ne2);
        struct ggml_tensor *b = ggml_new_tensor_3d(ctx, GGML_TYPE_F32, ne0, 1, T);
        struct ggml_tensor *ids = ggml_new_tensor_2d(ctx, GGML_TYPE_I32, k, T);
        op = ggml_mul_mat_id(ctx, w, b, ids);
    }
    ggml_backend_buffer_type_t chosen = def;
    for (ggml_backend_buffer_type_t *b = get_extra(dev); b && *b; b++) {
        ggml_backend_buffer_t dummy = ggml_backend_buft_alloc_buffer(*b, 0);
        w->buffer = dummy;
        int ok = ggml_backend_dev_supports_op(dev, op);
        w->buffer = NULL;
        ggml_backend_buffer_free(dummy);
        if (ok) {
            chosen = *b;
            break;
        }
    }
    ggml_free(ctx);
    return chosen;
}

/* The context that holds weights of buffer type buft (made on first use). */
static struct ggml_context *ctx_for(gm_layer *L, ggml_backend_buffer_type_t bufts[], ggml_backend_buffer_type_t buft) {
    for (int i = 0; i < L->nbuf; i++)
        if (bufts[i] == buft)
            return L->wctx[i];
    if (L->nbuf == MAX_BUFS)
        return NULL;
    struct ggml_init_params ip = {4 * MAX_COPIES * ggml_tensor_overhead(), NULL, true};
    bufts[L->nbuf] = buft;
    return L->wctx[L->nbuf++] = ggml_init(ip);
}

/* rows x cols floats -> type, in dst (ggml_row_size(type, cols) bytes per row). */
static void convert(enum ggml_type type, const float *src, void *dst, int64_t rows, int64_t cols) {
    const int64_t chunk = 64;
#pragma omp parallel for schedule(dynamic)
    for (int64_t r = 0; r < rows; r += chunk) {
        int64_t n = rows - r < chunk ? rows - r : chunk;
        ggml_quantize_chunk(type, src, dst, r * cols, n, cols, NULL);
    }
}

/* src (rows of t->ne[0] floats) converted once to t's type and written into each of the
 * n tensors ts (the copies of one weight; a repack buffer repacks in tensor_set). */
static int set_weight(struct ggml_tensor **ts, int n, const float *src, char *err, int errlen) {
    struct ggml_tensor *t = ts[0];
    const void *data = src;
    void *tmp = NULL;
    if (t->type != GGML_TYPE_F32) {
        data = tmp = malloc(ggml_nbytes(t));
        if (!tmp) {
            set_err(err, errlen, "out of memory converting a weight for ggml");
            return 1;
        }
        convert(t->type, src, tmp, ggml_nrows(t), t->ne[0]);
    }
    for (int c = 0; c < n; c++)
        ggml_backend_tensor_set(ts[c], data, 0, ggml_nbytes(t));
    free(tmp);
    return 0;
}

void gm_free(gm_layer *L) {
    if (!L)
        return;
    for (int c = 0; c < MAX_COPIES; c++) {
        if (L->g[c].alloc)
            ggml_gallocr_free(L->g[c].alloc);
        if (L->g[c].ctx)
            ggml_free(L->g[c].ctx);
    }
    for (int i = 0; i < L->nbuf; i++) {
        if (L->wbuf[i])
            ggml_backend_buffer_free(L->wbuf[i]);
        if (L->wctx[i])
            ggml_free(L->wctx[i]);
    }
    if (L->backend)
        ggml_backend_free(L->backend);
    free(L);
}

/* The graph of copy c over its weights (router [E,H] f32, gate/up [E,I,H], down [E,H,I]). */
static int build_graph(gm_layer *L, gm_graph *g, struct ggml_tensor *router, struct ggml_tensor *gate,
                       struct ggml_tensor *up, struct ggml_tensor *down, int norm) {
    const int H = L->H, E = L->E, k = L->k, T = L->T;
    struct ggml_init_params ip = {64 * ggml_tensor_overhead() + ggml_graph_overhead(), NULL, true};
    struct ggml_context *ctx = g->ctx = ggml_init(ip);
    if (!ctx)
        return 1;
    g->x = ggml_new_tensor_2d(ctx, GGML_TYPE_F32, H, T);
    ggml_set_input(g->x);
    struct ggml_tensor *probs = ggml_soft_max(ctx, ggml_mul_mat(ctx, router, g->x));   /* [E, T] */
    struct ggml_tensor *sel = ggml_argsort_top_k(ctx, probs, k);                       /* [k, T] */
    struct ggml_tensor *w = ggml_get_rows(ctx, ggml_reshape_3d(ctx, probs, 1, E, T), sel); /* [1, k, T] */
    if (norm) {
        struct ggml_tensor *w2 = ggml_reshape_2d(ctx, w, k, T);
        w = ggml_reshape_3d(ctx, ggml_div(ctx, w2, ggml_sum_rows(ctx, w2)), 1, k, T);
    }
    struct ggml_tensor *xr = ggml_reshape_3d(ctx, g->x, H, 1, T);
    struct ggml_tensor *gt = ggml_mul_mat_id(ctx, gate, xr, sel);                      /* [I, k, T] */
    struct ggml_tensor *ut = ggml_mul_mat_id(ctx, up, xr, sel);
    struct ggml_tensor *d = ggml_mul_mat_id(ctx, down, ggml_swiglu_split(ctx, gt, ut), sel); /* [H, k, T] */
    d = ggml_mul(ctx, d, w);
    struct ggml_tensor *out = ggml_view_2d(ctx, d, H, T, d->nb[2], 0);
    for (int j = 1; j < k; j++)
        out = ggml_add(ctx, out, ggml_view_2d(ctx, d, H, T, d->nb[2], (size_t)j * d->nb[1]));
    ggml_set_output(out);
    g->out = out;
    g->graph = ggml_new_graph(ctx);
    ggml_build_forward_expand(g->graph, out);
    g->alloc = ggml_gallocr_new(ggml_backend_get_default_buffer_type(L->backend));
    return !g->alloc || !ggml_gallocr_alloc_graph(g->alloc, g->graph);
}

/* A layer of E experts (H hidden, I intermediate, top-k, T tokens per call) in ggml type
 * wtype, `copies` copies of its weights (a call cycles through them, as the bench's
 * Colibri layers do). norm: renormalise the k probabilities. NULL on error, with err set. */
gm_layer *gm_create(int H, int I, int E, int k, int T, int norm, int wtype, int copies,
                    const float *router, const float *gate, const float *up, const float *down,
                    char *err, int errlen) {
    enum ggml_type type = (enum ggml_type)wtype;
    if (H <= 0 || I <= 0 || E <= 0 || k <= 0 || k > E || T <= 0 || copies <= 0 || copies > MAX_COPIES) {
        set_err(err, errlen, "bad layer dimensions or copy count");
        return NULL;
    }
    if (wtype < 0 || wtype >= GGML_TYPE_COUNT || ggml_blck_size(type) <= 0 ||
        H % ggml_blck_size(type) || I % ggml_blck_size(type)) {
        set_err(err, errlen, "the rows are not whole blocks of this ggml type");
        return NULL;
    }
    gm_layer *L = calloc(1, sizeof *L);
    if (!L) {
        set_err(err, errlen, "out of memory");
        return NULL;
    }
    L->H = H, L->I = I, L->E = E, L->k = k, L->T = T, L->copies = copies;
    ggml_backend_dev_t dev = ggml_backend_dev_by_type(GGML_BACKEND_DEVICE_TYPE_CPU);
    L->backend = dev ? ggml_backend_dev_init(dev, NULL) : NULL;
    if (!L->backend) {
        set_err(err, errlen, "ggml has no CPU backend");
        gm_free(L);
        return NULL;
    }
    ggml_backend_buffer_type_t bufts[MAX_BUFS] = {0};
    ggml_backend_buffer_type_t b_router = pick_buft(dev, GGML_TYPE_F32, H, E, 1, k, T);
    ggml_backend_buffer_type_t b_gu = pick_buft(dev, type, H, I, E, k, T);
    ggml_backend_buffer_type_t b_down = pick_buft(dev, type, I, H, E, k, T);
    snprintf(L->placed, sizeof L->placed, "gate/up: %s, down: %s", ggml_backend_buft_name(b_gu),
             ggml_backend_buft_name(b_down));
    struct ggml_tensor *w[MAX_COPIES][4];
    for (int c = 0; c < copies; c++) {
        struct ggml_context *cr = ctx_for(L, bufts, b_router), *cg = ctx_for(L, bufts, b_gu),
                            *cd = ctx_for(L, bufts, b_down);
        if (!cr || !cg || !cd) {
            set_err(err, errlen, "ggml context allocation failed");
            gm_free(L);
            return NULL;
        }
        w[c][0] = ggml_new_tensor_2d(cr, GGML_TYPE_F32, H, E);
        w[c][1] = ggml_new_tensor_3d(cg, type, H, I, E);
        w[c][2] = ggml_new_tensor_3d(cg, type, H, I, E);
        w[c][3] = ggml_new_tensor_3d(cd, type, I, H, E);
    }
    L->expert_bytes = (ggml_nbytes(w[0][1]) + ggml_nbytes(w[0][2]) + ggml_nbytes(w[0][3])) / E;
    for (int i = 0; i < L->nbuf; i++) {
        L->wbuf[i] = ggml_backend_alloc_ctx_tensors_from_buft(L->wctx[i], bufts[i]);
        if (!L->wbuf[i]) {
            set_err(err, errlen, "out of memory for ggml's weights");
            gm_free(L);
            return NULL;
        }
        ggml_backend_buffer_set_usage(L->wbuf[i], GGML_BACKEND_BUFFER_USAGE_WEIGHTS);
    }
    const float *src[4] = {router, gate, up, down};
    for (int j = 0; j < 4; j++) {
        struct ggml_tensor *ts[MAX_COPIES];
        for (int c = 0; c < copies; c++)
            ts[c] = w[c][j];
        if (set_weight(ts, copies, src[j], err, errlen)) {
            gm_free(L);
            return NULL;
        }
    }
    for (int c = 0; c < copies; c++) {
        if (build_graph(L, &L->g[c], w[c][0], w[c][1], w[c][2], w[c][3], norm)) {
            set_err(err, errlen, "ggml graph allocation failed");
            gm_free(L);
            return NULL;
        }
    }
    return L;
}

const char *gm_placed(const gm_layer *L) { return L->placed; }
size_t gm_expert_bytes(const gm_layer *L) { return L->expert_bytes; }

static int run(gm_layer *L, int c, const float *x) {
    ggml_backend_tensor_set(L->g[c].x, x, 0, ggml_nbytes(L->g[c].x));
    return ggml_backend_graph_compute(L->backend, L->g[c].graph) != GGML_STATUS_SUCCESS;
}

/* out [T, H] = the layer on x [T, H] (copy 0), at `threads` threads. */
int gm_forward(gm_layer *L, const float *x, float *out, int threads) {
    ggml_backend_cpu_set_n_threads(L->backend, threads);
    if (run(L, 0, x))
        return 1;
    ggml_backend_tensor_get(L->g[0].out, out, 0, ggml_nbytes(L->g[0].out));
    return 0;
}

/* Seconds per call into samples (at most max_samples, *n of them): call i runs copy
 * i mod copies on input i mod nx of xs [nx, T, H] until min_seconds have passed, after one
 * untimed call per copy. Setting the input is outside the timed span (the Colibri side
 * reads its input in place). */
int gm_bench(gm_layer *L, const float *xs, int nx, int threads, double min_seconds, int max_samples,
             double *samples, int *n) {
    ggml_backend_cpu_set_n_threads(L->backend, threads);
    size_t stride = (size_t)L->T * L->H;
    for (int c = 0; c < L->copies; c++)
        if (run(L, c, xs + (size_t)(c % nx) * stride))
            return 1;
    double end = now() + min_seconds;
    int i = 0;
    while (i < max_samples && (i < 2 || now() < end)) {
        int c = i % L->copies;
        ggml_backend_tensor_set(L->g[c].x, xs + (size_t)(i % nx) * stride, 0, ggml_nbytes(L->g[c].x));
        double t0 = now();
        if (ggml_backend_graph_compute(L->backend, L->g[c].graph) != GGML_STATUS_SUCCESS)
            return 1;
        samples[i++] = now() - t0;
    }
    *n = i;
    return 0;
}
