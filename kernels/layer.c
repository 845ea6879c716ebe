/* layer.c — the fused MoE layer: route, group tokens by expert, run each active
 * expert once over its tokens, combine into the output.
 *
 * Threads split work by rows with one barrier per layer: phase 1 computes every
 * active expert's gate/up rows (split by rows x tokens of work), phase 2 the down
 * projections, each thread owning a slice of output columns across all experts
 * so it accumulates straight into y with no reduction and no barrier between
 * experts. */
#include <math.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"
#include "kernels.h"

#define CB_MAX_DIM (1 << 20)
#define CB_ALIGN 64

static int cb_default_threads = 0;

int colibri_set_num_threads(int n_threads) {
    cb_clear_error();
    if (n_threads < 0) return cb_fail(COLIBRI_ERR_INVALID, "n_threads %d < 0", n_threads);
    cb_default_threads = n_threads;
    return COLIBRI_OK;
}

int colibri_get_num_threads(void) {
    return cb_default_threads > 0 ? cb_default_threads : omp_get_num_procs();
}

/* ---------------------------------------------------------------- create */

static size_t align_up(size_t v) { return (v + CB_ALIGN - 1) / CB_ALIGN * CB_ALIGN; }

/* Bytes of a [rows, cols] matrix of dtype plus its int8 scales, each 64-aligned. */
static size_t mat_bytes(int dtype, size_t rows, size_t cols) {
    size_t b = align_up(rows * cols * cb_dtype_elem_bytes(dtype));
    if (dtype == COLIBRI_INT8) b += align_up(rows * sizeof(float));
    return b;
}

static int copy_mat(colibri_pool *pool, int dtype, const void *src, const float *scales, size_t rows,
                    size_t cols, cb_mat *out) {
    size_t n = rows * cols * cb_dtype_elem_bytes(dtype);
    void *w = colibri_pool_alloc(pool, n, CB_ALIGN);
    if (!w) return COLIBRI_ERR_NOMEM;
    memcpy(w, src, n);
    out->w = w;
    out->scales = NULL;
    out->rows = (int)rows;
    out->cols = (int)cols;
    if (dtype == COLIBRI_INT8) {
        float *s = colibri_pool_alloc(pool, rows * sizeof(float), CB_ALIGN);
        if (!s) return COLIBRI_ERR_NOMEM;
        memcpy(s, scales, rows * sizeof(float));
        out->scales = s;
    }
    return COLIBRI_OK;
}

static int check_desc(const colibri_layer_desc *d) {
    if (!d) return cb_fail(COLIBRI_ERR_INVALID, "layer descriptor is NULL");
    if (d->hidden < 1 || d->hidden > CB_MAX_DIM)
        return cb_fail(COLIBRI_ERR_INVALID, "hidden %d out of range [1, %d]", d->hidden, CB_MAX_DIM);
    if (d->inter < 1 || d->inter > CB_MAX_DIM)
        return cb_fail(COLIBRI_ERR_INVALID, "inter %d out of range [1, %d]", d->inter, CB_MAX_DIM);
    if (d->shared_inter < 0 || d->shared_inter > CB_MAX_DIM)
        return cb_fail(COLIBRI_ERR_INVALID, "shared_inter %d out of range [0, %d]", d->shared_inter,
                       CB_MAX_DIM);
    if (cb_dtype_elem_bytes(d->weight_dtype) == 0)
        return cb_fail(COLIBRI_ERR_INVALID, "weight_dtype %d is not 0 (f32), 1 (bf16) or 2 (int8)",
                       d->weight_dtype);
    int st = cb_route_config_check(&d->route, d->n_experts);
    if (st) return st;
    if (!d->router || !d->gate || !d->up || !d->down)
        return cb_fail(COLIBRI_ERR_INVALID, "router, gate, up and down must not be NULL");
    int q = d->weight_dtype == COLIBRI_INT8;
    if (q && (!d->gate_scales || !d->up_scales || !d->down_scales))
        return cb_fail(COLIBRI_ERR_INVALID, "int8 weights need gate_scales, up_scales and down_scales");
    if (d->shared_inter > 0) {
        if (!d->shared_gate || !d->shared_up || !d->shared_down)
            return cb_fail(COLIBRI_ERR_INVALID,
                           "shared_inter > 0 needs shared_gate, shared_up and shared_down");
        if (q && (!d->shared_gate_scales || !d->shared_up_scales || !d->shared_down_scales))
            return cb_fail(COLIBRI_ERR_INVALID, "int8 shared expert needs its three scale arrays");
    } else if (d->shared_expert_gate) {
        return cb_fail(COLIBRI_ERR_INVALID, "shared_expert_gate given without a shared expert");
    }
    if (d->hugepages != COLIBRI_HUGEPAGES_OFF && d->hugepages != COLIBRI_HUGEPAGES_AUTO)
        return cb_fail(COLIBRI_ERR_INVALID, "hugepages must be 0 (off) or 1 (auto), got %d",
                       d->hugepages);
    return COLIBRI_OK;
}

colibri_layer *colibri_layer_create(const colibri_layer_desc *d) {
    cb_clear_error();
    if (check_desc(d)) return NULL;
    const size_t H = (size_t)d->hidden, I = (size_t)d->inter, E = (size_t)d->n_experts;
    const size_t S = (size_t)d->shared_inter;
    const int dt = d->weight_dtype;
    const size_t es = cb_dtype_elem_bytes(dt);
    const size_t per_expert = 2 * mat_bytes(dt, I, H) + mat_bytes(dt, H, I);
    size_t total = align_up(E * H * sizeof(float)) + E * per_expert;
    if (S) total += 2 * mat_bytes(dt, S, H) + mat_bytes(dt, H, S) + align_up(H * sizeof(float));

    colibri_layer *L = calloc(1, sizeof *L);
    cb_expert *ex = calloc(E, sizeof *ex);
    colibri_pool *pool = NULL;
    if (L && ex) pool = colibri_pool_create(total, d->hugepages, d->numa_node);
    if (!L || !ex || !pool) {
        if (!L || !ex) cb_fail(COLIBRI_ERR_NOMEM, "out of memory for the layer descriptor");
        free(L);
        free(ex);
        return NULL;
    }
    L->hidden = d->hidden;
    L->inter = d->inter;
    L->n_experts = d->n_experts;
    L->dtype = dt;
    L->route = d->route;
    L->experts = ex;
    L->pool = pool;
    L->page_kind = colibri_pool_page_kind(pool);

    int st = COLIBRI_OK;
    float *router = colibri_pool_alloc(pool, E * H * sizeof(float), CB_ALIGN);
    if (!router) st = COLIBRI_ERR_NOMEM;
    else memcpy(router, d->router, E * H * sizeof(float));
    L->router = router;
    /* experts contiguous: [gate | gate scales | up | up scales | down | down scales] */
    for (size_t e = 0; e < E && !st; ++e) {
        const char *g = (const char *)d->gate + e * I * H * es;
        const char *u = (const char *)d->up + e * I * H * es;
        const char *dn = (const char *)d->down + e * H * I * es;
        st = copy_mat(pool, dt, g, d->gate_scales ? d->gate_scales + e * I : NULL, I, H, &ex[e].gate);
        if (!st) st = copy_mat(pool, dt, u, d->up_scales ? d->up_scales + e * I : NULL, I, H, &ex[e].up);
        if (!st) st = copy_mat(pool, dt, dn, d->down_scales ? d->down_scales + e * H : NULL, H, I, &ex[e].down);
        ex[e].inter = (int)I;
    }
    if (!st && S) {
        L->has_shared = 1;
        st = copy_mat(pool, dt, d->shared_gate, d->shared_gate_scales, S, H, &L->shared.gate);
        if (!st) st = copy_mat(pool, dt, d->shared_up, d->shared_up_scales, S, H, &L->shared.up);
        if (!st) st = copy_mat(pool, dt, d->shared_down, d->shared_down_scales, H, S, &L->shared.down);
        L->shared.inter = (int)S;
        if (!st && d->shared_expert_gate) {
            float *sg = colibri_pool_alloc(pool, H * sizeof(float), CB_ALIGN);
            if (!sg) st = COLIBRI_ERR_NOMEM;
            else memcpy(sg, d->shared_expert_gate, H * sizeof(float));
            L->shared_expert_gate = sg;
        }
    }
    if (st) {
        cb_layer_destroy(L);
        free(L);
        return NULL;
    }
    L->weight_bytes = colibri_pool_used(pool);
    return L;
}

void cb_layer_destroy(colibri_layer *L) {
    if (!L) return;
    free(L->experts);
    L->experts = NULL;
    colibri_pool_free(L->pool);
    L->pool = NULL;
}

void colibri_layer_free(colibri_layer *L) {
    if (!L || L->borrowed) return;
    cb_layer_destroy(L);
    free(L);
}

int colibri_layer_page_kind(const colibri_layer *L) { return L ? L->page_kind : -1; }
size_t colibri_layer_weight_bytes(const colibri_layer *L) { return L ? L->weight_bytes : 0; }

/* --------------------------------------------------------------- forward */

/* One expert's share of the call: its tokens (rows of x), their weights, its h. */
typedef struct {
    const cb_expert *ex;
    const int32_t *tok;
    const float *tw;
    int ntok;
    float *h; /* [ntok, inter] */
} cb_job;

/* Splits [0, n) into nt parts at multiples of `align` (the last part takes the rest). */
static void split_range(int n, int nt, int tid, int align, int *lo, int *hi) {
    long a = (long)n * tid / nt, b = (long)n * (tid + 1) / nt;
    a = a / align * align;
    b = tid + 1 == nt ? n : b / align * align;
    *lo = (int)a;
    *hi = (int)b;
}

/* Phase 1 for one thread: its slice of the rows x tokens work over all jobs. */
static void phase_gateup(const colibri_layer *L, const cb_job *jobs, int njobs, const float *x,
                         int tid, int nt) {
    long total = 0;
    for (int j = 0; j < njobs; ++j) total += (long)jobs[j].ex->inter * jobs[j].ntok;
    const long lo = total * tid / nt, hi = total * (tid + 1) / nt;
    const int blk = cbk_rows_block;
    long base = 0;
    for (int j = 0; j < njobs && base < hi; ++j) {
        const cb_job *jb = &jobs[j];
        const long cost = (long)jb->ex->inter * jb->ntok;
        if (base + cost > lo && cost > 0) {
            /* rows of this job whose work starts in [lo, hi), aligned to the block */
            long r0 = lo > base ? (lo - base + jb->ntok - 1) / jb->ntok : 0;
            long r1 = (hi - base + jb->ntok - 1) / jb->ntok;
            if (r1 > jb->ex->inter) r1 = jb->ex->inter;
            r0 = (r0 + blk - 1) / blk * blk;
            r1 = r1 >= jb->ex->inter ? jb->ex->inter : (r1 + blk - 1) / blk * blk;
            if (r0 < r1)
                cbk_gateup(L->dtype, &jb->ex->gate, &jb->ex->up, x, L->hidden, jb->tok, jb->ntok,
                           (int)r0, (int)r1, jb->h, jb->ex->inter);
        }
        base += cost;
    }
}

int colibri_layer_forward(colibri_layer *L, const float *x, float *y, int T, int n_threads) {
    cb_clear_error();
    if (!L) return cb_fail(COLIBRI_ERR_INVALID, "layer is NULL");
    if (T < 0) return cb_fail(COLIBRI_ERR_INVALID, "n_tokens %d < 0", T);
    if (T == 0) return COLIBRI_OK;
    if (!x || !y) return cb_fail(COLIBRI_ERR_INVALID, "x and y must not be NULL");
    if (n_threads < 0) return cb_fail(COLIBRI_ERR_INVALID, "n_threads %d < 0", n_threads);
    const int H = L->hidden, E = L->n_experts;
    if ((size_t)T > (SIZE_MAX / sizeof(float)) / (size_t)(H > E ? H : E))
        return cb_fail(COLIBRI_ERR_INVALID, "n_tokens %d is too large", T);
    const float *xe = x + (size_t)T * H, *ye = y + (size_t)T * H;
    if (x < ye && y < xe) return cb_fail(COLIBRI_ERR_INVALID, "x and y overlap");
    const int nt = n_threads > 0 ? n_threads : colibri_get_num_threads();
    const int slots = colibri_route_slots(&L->route);
    const int S = L->has_shared ? L->shared.inter : 0;

    /* one allocation for all scratch of this call */
    size_t n_sel = (size_t)T * slots;
    size_t f_logits = (size_t)T * E, f_w = n_sel, f_tw = n_sel + (size_t)T;
    size_t i_idx = n_sel, i_cnt = (size_t)T, i_tok = n_sel + (size_t)T, i_off = (size_t)E + 1;
    /* jobs first: they hold pointers, and malloc's alignment suits them; after an odd
     * count of 4-byte slots they would be misaligned (undefined behaviour). */
    const size_t jobs_bytes = (size_t)(E + 1) * sizeof(cb_job);
    /* T x slots x inter can pass 2^64 bytes (2^31 tokens, 4096 slots, 2^20 rows): checked,
     * so a wrapped size never reaches malloc. The other terms are below 2^46. */
    size_t h_floats, n_floats, bytes;
    if (__builtin_mul_overflow(n_sel, (size_t)L->inter, &h_floats) ||
        __builtin_add_overflow(h_floats, (size_t)T * S + f_logits + f_w + f_tw, &n_floats) ||
        __builtin_mul_overflow(n_floats, sizeof(float), &bytes) ||
        __builtin_add_overflow(bytes, jobs_bytes + (i_idx + i_cnt + i_tok + 2 * i_off) *
                                          sizeof(int32_t), &bytes))
        return cb_fail(COLIBRI_ERR_INVALID, "n_tokens %d: scratch for %d slots x inter %d "
                       "overflows the address space", T, slots, L->inter);
    h_floats += (size_t)T * S;
    char *scratch = malloc(bytes);
    if (!scratch) return cb_fail(COLIBRI_ERR_NOMEM, "out of memory for %zu bytes of scratch", bytes);
    cb_job *jobs = (cb_job *)(void *)scratch;
    float *logits = (float *)(void *)(scratch + jobs_bytes);
    float *wsel = logits + f_logits;
    float *tw = wsel + f_w;
    float *hbuf = tw + f_tw;
    int32_t *isel = (int32_t *)(hbuf + h_floats);
    int32_t *cnt = isel + i_idx;
    int32_t *tok = cnt + i_cnt;
    int32_t *off = tok + i_tok;
    int32_t *fill = off + i_off;

    /* router logits: logits[t, e] = router[e] . x[t], split by experts */
    memset(logits, 0, f_logits * sizeof(float));
    for (int t = 0; t < T; ++t) tok[t] = t, tw[t] = 1.0f;
    const cb_mat rmat = {L->router, NULL, E, H};
#pragma omp parallel num_threads(nt)
    {
        int lo, hi;
        split_range(E, omp_get_num_threads(), omp_get_thread_num(), 1, &lo, &hi);
        if (lo < hi) cbk_rows_acc(COLIBRI_F32, &rmat, x, H, T, tw, tok, lo, hi, logits, E);
    }
    int st = colibri_route(logits, T, E, &L->route, isel, wsel, cnt);
    if (st) {
        free(scratch);
        return st;
    }

    /* group (token, weight) pairs by expert: counting sort keeps token order */
    memset(off, 0, i_off * sizeof(int32_t));
    for (size_t s = 0; s < n_sel; ++s)
        if (isel[s] >= 0) off[isel[s] + 1]++;
    for (int e = 0; e < E; ++e) off[e + 1] += off[e];
    memcpy(fill, off, i_off * sizeof(int32_t));
    float *etw = tw + T; /* per-selection weights, grouped */
    for (int t = 0; t < T; ++t)
        for (int s = 0; s < slots; ++s) {
            int e = isel[(size_t)t * slots + s];
            if (e < 0) continue;
            int p = fill[e]++;
            tok[T + p] = t;
            etw[p] = wsel[(size_t)t * slots + s];
        }
    int njobs = 0;
    float *h = hbuf;
    for (int e = 0; e < E; ++e) {
        int n = off[e + 1] - off[e];
        if (!n) continue;
        jobs[njobs++] = (cb_job){&L->experts[e], tok + T + off[e], etw + off[e], n, h};
        h += (size_t)n * L->experts[e].inter;
    }
    if (S) {
        /* shared expert: every token, weighted by sigmoid(w . x) or 1 */
        for (int t = 0; t < T; ++t) {
            float g = 1.0f;
            if (L->shared_expert_gate) {
                double z = 0.0;
                const float *xt = x + (size_t)t * H;
                for (int k = 0; k < H; ++k) z += (double)L->shared_expert_gate[k] * xt[k];
                g = (float)(1.0 / (1.0 + exp(-z)));
            }
            tw[t] = g;
        }
        jobs[njobs++] = (cb_job){&L->shared, tok, tw, T, h};
    }

#pragma omp parallel num_threads(nt)
    {
        const int tid = omp_get_thread_num(), nth = omp_get_num_threads();
        phase_gateup(L, jobs, njobs, x, tid, nth);
#pragma omp barrier
        int c0, c1;
        split_range(H, nth, tid, 16, &c0, &c1); /* 16 floats: threads never share a cache line of y */
        for (int t = 0; t < T; ++t) memset(y + (size_t)t * H + c0, 0, (size_t)(c1 - c0) * sizeof(float));
        for (int j = 0; j < njobs && c0 < c1; ++j)
            cbk_rows_acc(L->dtype, &jobs[j].ex->down, jobs[j].h, jobs[j].ex->inter, jobs[j].ntok,
                         jobs[j].tw, jobs[j].tok, c0, c1, y, H);
    }
    free(scratch);
    return COLIBRI_OK;
}
