/* layer.c — the fused MoE layer: route, group tokens by expert, run each active
 * expert once over its tokens, combine into the output.
 *
 * The threads claim the work in chunks at run time (claim.c), with one barrier between
 * the phases: phase 1 computes every active expert's gate/up rows (a job's rows in
 * chunks), phase 2 the down projections, each chunk a slice of output columns across all
 * experts, so it accumulates straight into y with no reduction (run_turn). Decode on
 * several threads claims the down rows of each expert instead, into partials summed at the
 * end (run_decode_claimed): a slice of columns over a few experts is too little work. */
#include <math.h>
#include <omp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"
#include "kernels.h"

#define CB_MAX_DIM (1 << 20)
#define CB_ALIGN 64

static int cb_default_threads = 0;

/* Shared by every entry point that takes a thread count: OpenMP aborts the process when it
 * cannot create the threads asked for, so an absurd count must be refused before that. */
int cb_check_threads(const char *who, int n_threads) {
    if (n_threads < 0 || n_threads > COLIBRI_MAX_THREADS)
        return cb_fail(COLIBRI_ERR_INVALID, "%s: n_threads %d out of range [0, %d] (0 = default)",
                       who, n_threads, COLIBRI_MAX_THREADS);
    return COLIBRI_OK;
}

int colibri_set_num_threads(int n_threads) {
    cb_clear_error();
    int st = cb_check_threads("colibri_set_num_threads", n_threads);
    if (st) return st;
    cb_default_threads = n_threads;
    return COLIBRI_OK;
}

/* Guarded mode: a gap of canary floats (a NaN bit pattern no kernel computes) before the
 * first expert's h block and after every one, checked after the call. */
#define CB_GUARD_FLOATS 16
#define CB_CANARY 0x7fc0deadu
static int cb_guards = 0;

int colibri_set_guards(int on) {
    int was = cb_guards;
    cb_guards = on != 0;
    return was;
}

static void guard_fill(float *p) {
    const uint32_t c = CB_CANARY;
    for (int i = 0; i < CB_GUARD_FLOATS; ++i) memcpy(p + i, &c, sizeof c);
}

static int guard_intact(const float *p) {
    for (int i = 0; i < CB_GUARD_FLOATS; ++i) {
        uint32_t v;
        memcpy(&v, p + i, sizeof v);
        if (v != CB_CANARY) return 0;
    }
    return 1;
}

int colibri_get_num_threads(void) {
    return cb_default_threads > 0 ? cb_default_threads : omp_get_num_procs();
}

/* ---------------------------------------------------------------- create */

static size_t align_up(size_t v) { return (v + CB_ALIGN - 1) / CB_ALIGN * CB_ALIGN; }

/* Bytes of a [rows, cols] matrix of dtype plus its scales, each 64-aligned: packed in
 * the layout of table K where K packs the dtype. */
size_t cb_mat_bytes(const cbk_kernels *K, int dtype, size_t rows, size_t cols) {
    size_t pb = cbk_part_of(K, dtype)->pack_bytes(dtype, (int)rows, (int)cols);
    size_t b = align_up(pb ? pb : cb_mat_data_bytes(dtype, rows, cols));
    size_t ns = cb_mat_scale_count(dtype, rows, cols);
    if (ns) b += align_up(ns * sizeof(float));
    return b;
}

/* The matrix at dst (cb_mat_bytes of it, 64-aligned): packed once, here, where table K packs
 * its dtype (w is then NULL: no kernel of K reads the stored layout), else copied as stored;
 * its scales after it. */
void cb_place_mat(const cbk_kernels *K, int dtype, const void *src, const float *scales, size_t rows,
                  size_t cols, void *dst, cb_mat *out) {
    const size_t pb = cbk_part_of(K, dtype)->pack_bytes(dtype, (int)rows, (int)cols);
    const size_t n = pb ? pb : cb_mat_data_bytes(dtype, rows, cols);
    if (pb) cbk_part_of(K, dtype)->pack(dtype, src, scales, (int)rows, (int)cols, dst);
    else memcpy(dst, src, n);
    out->w = pb ? NULL : dst;
    out->pk = pb ? dst : NULL;
    out->scales = NULL;
    out->rows = (int)rows;
    out->cols = (int)cols;
    const size_t ns = cb_mat_scale_count(dtype, rows, cols);
    if (ns) {
        float *s = (float *)(void *)((char *)dst + align_up(n));
        memcpy(s, scales, ns * sizeof(float));
        out->scales = s;
    }
}

/* The matrix into the pool (cb_place_mat). */
static int copy_mat(colibri_pool *pool, const cbk_kernels *K, int dtype, const void *src, const float *scales,
                    size_t rows, size_t cols, cb_mat *out) {
    void *w = colibri_pool_alloc(pool, cb_mat_bytes(K, dtype, rows, cols), CB_ALIGN);
    if (!w) return COLIBRI_ERR_NOMEM;
    cb_place_mat(K, dtype, src, scales, rows, cols, w, out);
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
    if (!cb_dtype_valid(d->weight_dtype))
        return cb_fail(COLIBRI_ERR_INVALID,
                       "weight_dtype %d is not 0 (f32), 1 (bf16), 2 (int8), 3 (int4) or 4 (int4k)",
                       d->weight_dtype);
    int st = cb_route_config_check(&d->route, d->n_experts);
    if (st) return st;
    if (!d->router || !d->gate || !d->up || !d->down)
        return cb_fail(COLIBRI_ERR_INVALID, "router, gate, up and down must not be NULL");
    int q = d->weight_dtype == COLIBRI_INT8 || d->weight_dtype == COLIBRI_INT4;
    if (q && (!d->gate_scales || !d->up_scales || !d->down_scales))
        return cb_fail(COLIBRI_ERR_INVALID, "%s weights need gate_scales, up_scales and down_scales",
                       d->weight_dtype == COLIBRI_INT8 ? "int8" : "int4");
    if (d->shared_inter > 0) {
        if (!d->shared_gate || !d->shared_up || !d->shared_down)
            return cb_fail(COLIBRI_ERR_INVALID,
                           "shared_inter > 0 needs shared_gate, shared_up and shared_down");
        if (q && (!d->shared_gate_scales || !d->shared_up_scales || !d->shared_down_scales))
            return cb_fail(COLIBRI_ERR_INVALID, "a quantized shared expert needs its three scale arrays");
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
    const size_t nb_ih = cb_mat_data_bytes(dt, I, H), nb_hi = cb_mat_data_bytes(dt, H, I);
    const size_t ns_ih = cb_mat_scale_count(dt, I, H), ns_hi = cb_mat_scale_count(dt, H, I);
    const cbk_kernels *K = cbk_kernels_for(d->hidden, d->inter);
    const size_t per_expert = 2 * cb_mat_bytes(K, dt, I, H) + cb_mat_bytes(K, dt, H, I);
    size_t total = align_up(E * H * sizeof(float)) + E * per_expert;
    if (S) total += 2 * cb_mat_bytes(K, dt, S, H) + cb_mat_bytes(K, dt, H, S) + align_up(H * sizeof(float));

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
    L->kernels = K;
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
        const char *g = (const char *)d->gate + e * nb_ih;
        const char *u = (const char *)d->up + e * nb_ih;
        const char *dn = (const char *)d->down + e * nb_hi;
        st = copy_mat(pool, K, dt, g, d->gate_scales ? d->gate_scales + e * ns_ih : NULL, I, H, &ex[e].gate);
        if (!st) st = copy_mat(pool, K, dt, u, d->up_scales ? d->up_scales + e * ns_ih : NULL, I, H, &ex[e].up);
        if (!st) st = copy_mat(pool, K, dt, dn, d->down_scales ? d->down_scales + e * ns_hi : NULL, H, I, &ex[e].down);
        ex[e].inter = (int)I;
    }
    if (!st && S) {
        L->has_shared = 1;
        st = copy_mat(pool, K, dt, d->shared_gate, d->shared_gate_scales, S, H, &L->shared.gate);
        if (!st) st = copy_mat(pool, K, dt, d->shared_up, d->shared_up_scales, S, H, &L->shared.up);
        if (!st) st = copy_mat(pool, K, dt, d->shared_down, d->shared_down_scales, H, S, &L->shared.down);
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

int colibri_layer_page_kind(const colibri_layer *L) {
    if (!L) return cb_fail(COLIBRI_ERR_INVALID, "colibri_layer_page_kind: layer is NULL"), -1;
    return L->page_kind;
}

size_t colibri_layer_weight_bytes(const colibri_layer *L) {
    if (!L) {
        cb_fail(COLIBRI_ERR_INVALID, "colibri_layer_weight_bytes: layer is NULL");
        return 0;
    }
    return L->weight_bytes;
}

/* --------------------------------------------------------------- forward */

/* bad[t] = 1 where row t of x (n wide) holds a NaN or an Inf (an exponent of all ones), else
 * 0, for rows [t0, t1): on the bits, an OR over the row, which the compiler vectorizes */
static void flag_nonfinite(const float *x, int n, int t0, int t1, unsigned char *bad) {
    for (int t = t0; t < t1; ++t) {
        const float *xt = x + (size_t)t * n;
        uint32_t any = 0;
        for (int k = 0; k < n; ++k) {
            uint32_t u;
            memcpy(&u, xt + k, sizeof u);
            any |= (u & 0x7f800000u) + 0x00800000u; /* bit 31 set only by an all-ones exponent */
        }
        bad[t] = (unsigned char)(any >> 31);
    }
}

/* Splits [0, n) into nt parts at multiples of `align` (the last part takes the rest). */
void cb_split_range(int n, int nt, int tid, int align, int *lo, int *hi) {
    long a = (long)n * tid / nt, b = (long)n * (tid + 1) / nt;
    a = a / align * align;
    b = tid + 1 == nt ? n : b / align * align;
    *lo = (int)a;
    *hi = (int)b;
}

/* The part [*a, *b) of a job's len items, each costing `per`, whose work starts in [lo, hi)
 * of the total the threads share, the job's own work starting at base; both ends rounded up
 * to blk items. */
static void share_of(long base, long per, long len, long lo, long hi, int blk, long *a, long *b) {
    long r0 = lo > base ? (lo - base + per - 1) / per : 0;
    long r1 = (hi - base + per - 1) / per;
    if (r1 > len) r1 = len;
    r0 = (r0 + blk - 1) / blk * blk;
    r1 = r1 >= len ? len : (r1 + blk - 1) / blk * blk;
    *a = r0;
    *b = r1;
}

/* The bytes in which a job's h is prepared once for its down projection, for every thread
 * that multiplies it with its rows, where the path converts it (0: it does not): the panels
 * of its path (cbk_prep_fn) where it takes them, else the rows its packed weight-as-vector
 * kernels take (cbk_xprep_fn; sets jb->prep_rows). */
static size_t job_prep_bytes(const cbk_part *part, int dtype, cb_job *jb) {
    const size_t b = part->prep_bytes ? part->prep_bytes(dtype, &jb->ex->down, jb->ntok) : 0;
    jb->prep_rows = !b && part->xprep_bytes && jb->ex->down.pk;
    return b ? b : jb->prep_rows ? part->xprep_bytes(dtype, jb->ex->inter, jb->ntok) : 0;
}

/* Between the phases, for one thread: its slice of the jobs' h to prepare for the down
 * projection (job_prep_bytes), in units of 32 columns of a token: panels by 32-column
 * units, rows by tokens (every thread reads all of a job's h for its rows of the output,
 * and would otherwise convert all of it). */
static void phase_prep(const colibri_layer *L, const cb_job *jobs, int njobs, int tid, int nt) {
    const cbk_part *part = cbk_part_of(L->kernels, L->dtype);
    long total = 0;
    for (int j = 0; j < njobs; ++j)
        if (jobs[j].prep) total += (long)(jobs[j].ex->inter + 31) / 32 * jobs[j].ntok;
    const long lo = total * tid / nt, hi = total * (tid + 1) / nt;
    long base = 0;
    for (int j = 0; j < njobs && base < hi; ++j) {
        const cb_job *jb = &jobs[j];
        if (!jb->prep) continue;
        const int cols = jb->ex->inter;
        const long units = (cols + 31) / 32, cost = units * jb->ntok;
        if (base + cost > lo && cost > 0) {
            long u0, u1;
            if (jb->prep_rows) {
                share_of(base, units, jb->ntok, lo, hi, 1, &u0, &u1);
                if (u0 < u1) part->xprep(L->dtype, jb->h, cols, cols, (int)u0, (int)u1, jb->prep);
            } else {
                share_of(base, jb->ntok, units, lo, hi, 1, &u0, &u1);
                if (u0 < u1)
                    part->prep(L->dtype, &jb->ex->down, jb->h, cols, jb->ntok, (int)u0 * 32,
                               u1 * 32 < cols ? (int)u1 * 32 : cols, jb->prep);
            }
        }
        base += cost;
    }
}

/* The work items of a call (claim.c): items[3 k ..] = (job, r0, r1) for every job's rows [0,
 * rows) in chunks; returns their count (with items NULL: only counts them). down: the down
 * projections' rows (H each), else the gate/up rows (inter each, two matrices of H columns).
 * On nt == 1 threads one item per job (one thread has nothing to even out). A job of a
 * decode's few tokens is chunked by its weights, a prefill's by weights x tokens and into
 * at most a few items per thread (claim.c). */
static int list_items(const cb_job *jobs, int njobs, int H, int down, int nt, int *items) {
    int k = 0;
    for (int j = 0; j < njobs; ++j) {
        const int R = down ? H : jobs[j].ex->inter;
        const long per_row = down ? jobs[j].ex->inter : 2L * H;
        const int rc = nt == 1 ? R
                       : jobs[j].ntok <= CB_DECODE_MAX_TOKENS ? cb_chunk_rows(per_row * jobs[j].ntok)
                                                              : cb_prefill_chunk_rows(per_row, jobs[j].ntok, R, nt);
        for (int r = 0; r < R; r += rc, ++k)
            if (items) items[3 * k] = j, items[3 * k + 1] = r, items[3 * k + 2] = r + rc < R ? r + rc : R;
    }
    return k;
}

/* One turn of a forward call, or part of one: the gate and up projections of gjobs[0,
 * ngjobs) (after preparing the gateups' activations where xfill asks: into xfill, on the
 * first turn; xprep is where they are), then where do_down asks, the down projections of
 * all the turn's jobs[0, njobs), added into y (zeroed first on the first turn).
 *
 * The threads claim this work at run time (claim.c): the gate/up items (a job's rows in
 * chunks), then the down projections' output columns in chunks, each chunk over all the
 * turn's jobs in their order. A static split of equal estimated work lost to whichever
 * thread ran slower (a shared vCPU), and its estimate (rows x tokens) misjudged experts of
 * few tokens, which stream their weights rather than compute. Each output is computed by
 * the same operations however the work falls, so the bits do not depend on the thread
 * count. */
static int run_turn(const colibri_layer *L, cb_job *jobs, int njobs, const cb_job *gjobs, int ngjobs,
                    const float *x, float *y, int T, int nt, char *wsbase, size_t wstride, size_t wsb,
                    char *xfill, const char *xprep, int first, int do_down) {
    const int H = L->hidden;
    const cbk_part *part = cbk_part_of(L->kernels, L->dtype);
    /* the down projection's activations, prepared once where its path takes them and more
     * than one thread would convert them (each thread multiplies all of a job's h with its
     * rows). At one thread there is nothing to save, and the buffer's fresh pages cost
     * time; without memory for it, each thread converts its own. */
    char *prepbuf = NULL;
    if (do_down && wsb && nt > 1) {
        size_t pb = 0;
        for (int j = 0; j < njobs; ++j) pb += (job_prep_bytes(part, L->dtype, &jobs[j]) + 63) / 64 * 64;
        if (pb) prepbuf = cb_scratch(CB_SCRATCH_PREP, pb); /* a multiple of 64 */
        for (size_t at = 0, j = 0; prepbuf && j < (size_t)njobs; ++j) {
            const size_t b = job_prep_bytes(part, L->dtype, &jobs[j]);
            jobs[j].prep = b ? prepbuf + at : NULL;
            if (b && !jobs[j].prep_rows) memset(prepbuf + at, 0, 64); /* the panels' header: nothing found yet */
            at += (b + 63) / 64 * 64;
        }
    }
    const int ngu = list_items(gjobs, ngjobs, H, 0, nt, NULL);
    /* down: CB_DOWN_ITEMS_PER_THREAD column chunks per thread, of 64 columns at least (two
     * threads never share a cache line of y) */
    int cw = H;
    if (nt > 1) {
        cw = (H + CB_DOWN_ITEMS_PER_THREAD * nt - 1) / (CB_DOWN_ITEMS_PER_THREAD * nt);
        cw = (cw + 63) / 64 * 64;
    }
    const int ndn = do_down ? (H + cw - 1) / cw : 0;
    const size_t ib = (size_t)(ngu + ndn + 3 * ngu) * sizeof(int);
    int *taken = ib ? cb_scratch(CB_SCRATCH_ITEMS, ib) : NULL, *items = taken ? taken + ngu + ndn : NULL;
    if (ib && !taken) return cb_fail(COLIBRI_ERR_NOMEM, "out of memory for %zu bytes of work items", ib);
    if (ib) {
        memset(taken, 0, (size_t)(ngu + ndn) * sizeof(int));
        list_items(gjobs, ngjobs, H, 0, nt, items);
    }
#pragma omp parallel num_threads(nt)
    {
        const int tid = omp_get_thread_num(), nth = omp_get_num_threads();
        void *ws = wsb ? wsbase + (size_t)tid * wstride : NULL;
        if (xfill) {
            int t0, t1;
            cb_split_range(T, nth, tid, 1, &t0, &t1);
            if (t0 < t1) part->xprep(L->dtype, x, H, H, t0, t1, xfill);
#pragma omp barrier
        }
        cb_walk w = cb_walk_from(ngu, tid, nth);
        for (int i; (i = cb_walk_next(taken, ngu, &w)) >= 0;) {
            const cb_job *jb = &gjobs[items[3 * i]];
            part->gateup(L->dtype, &jb->ex->gate, &jb->ex->up, x, H, jb->tok, jb->ntok, items[3 * i + 1],
                         items[3 * i + 2], jb->h, jb->ex->inter, ws, xprep);
        }
        if (do_down) {
#pragma omp barrier
            if (prepbuf) {
                phase_prep(L, jobs, njobs, tid, nth);
#pragma omp barrier
            }
            cb_walk d = cb_walk_from(ndn, tid, nth);
            for (int i; (i = cb_walk_next(taken + ngu, ndn, &d)) >= 0;) {
                const int c0 = i * cw, c1 = c0 + cw < H ? c0 + cw : H;
                if (first)
                    for (int t = 0; t < T; ++t) memset(y + (size_t)t * H + c0, 0, (size_t)(c1 - c0) * sizeof(float));
                for (int j = 0; j < njobs; ++j)
                    part->rows_acc(L->dtype, &jobs[j].ex->down, jobs[j].h, jobs[j].ex->inter, jobs[j].ntok,
                                   jobs[j].tw, jobs[j].tok, c0, c1, y, H, ws, jobs[j].prep);
            }
        }
    }
    return COLIBRI_OK;
}

/* ------------------------------------------------ decode on several threads: claimed work
 *
 * A decode call's work is items the threads claim at run time (claim.c): the gate/up items
 * (a job's rows in chunks), then the down items (a job's output columns in chunks); within
 * a job the chunks lie side by side, so a thread mostly streams one matrix after another
 * as in the static split. Down items of different jobs may share output columns, so each
 * job adds into its own zeroed partial rows, and the last step sums the partials into y in
 * the jobs' order: the same operations as adding every job into y in turn (y starts at +0,
 * and +0 + v is v), so the outputs are the same bits as the static split's at every thread
 * count. */

/* A decode call's experts (jobs) on nt > 1 threads, claimed as above. The kernels' prepared
 * activations (cbk_xprep_fn, where the part has one and the weights are packed) are each
 * thread's own: the token's row for its gate/up items, a job's h before its first down item
 * of that job, each prepared once per thread rather than once per item. */
static int run_decode_claimed(const colibri_layer *L, cb_job *jobs, int njobs, const float *x, float *y, int T,
                              int nt, char *wsbase, size_t wstride, size_t wsb) {
    const int H = L->hidden;
    const cbk_part *part = cbk_part_of(L->kernels, L->dtype);
    const size_t xb = part->xprep_bytes && jobs[0].ex->gate.pk ? (part->xprep_bytes(L->dtype, H, T) + 63) / 64 * 64 : 0;
    size_t hb = 0, hoff[njobs];
    for (int j = 0; j < njobs; ++j) {
        const cb_expert *ex = jobs[j].ex;
        /* the path's own prepared layout (the int gemm's) where it has one; never at decode */
        const int hp = part->xprep_bytes && ex->down.pk &&
                       !(part->prep_bytes && part->prep_bytes(L->dtype, &ex->down, jobs[j].ntok));
        hoff[j] = hp ? hb : (size_t)-1;
        if (hp) hb += (part->xprep_bytes(L->dtype, ex->inter, jobs[j].ntok) + 63) / 64 * 64;
    }
    const int ngu = list_items(jobs, njobs, H, 0, nt, NULL), ndn = list_items(jobs, njobs, H, 1, nt, NULL);
    const size_t nparts = (size_t)njobs * T * H; /* the down items' partial rows, per job */
    const size_t head = ((size_t)(ngu + ndn) * 4 * sizeof(int) + 63) / 64 * 64 + (nparts * sizeof(float) + 63) / 64 * 64;
    const size_t per = xb + hb + (size_t)(njobs + 63) / 64 * 64; /* + which jobs' h it prepared */
    char *buf = cb_scratch(CB_SCRATCH_XPREP, head + (size_t)nt * per);
    if (!buf) return cb_fail(COLIBRI_ERR_NOMEM, "out of memory for %zu bytes of decode scratch", head + (size_t)nt * per);
    int *taken = (int *)(void *)buf, *items = taken + ngu + ndn; /* items: (job, r0, r1) */
    float *parts = (float *)(void *)(buf + ((size_t)(ngu + ndn) * 4 * sizeof(int) + 63) / 64 * 64);
    memset(taken, 0, (size_t)(ngu + ndn) * sizeof(int));
    list_items(jobs, njobs, H, 0, nt, items);
    list_items(jobs, njobs, H, 1, nt, items + 3 * ngu);
#pragma omp parallel num_threads(nt)
    {
        const int tid = omp_get_thread_num(), nth = omp_get_num_threads();
        void *ws = wsb ? wsbase + (size_t)tid * wstride : NULL;
        char *mine = buf + head + (size_t)tid * per, *hmine = mine + xb, *ready = hmine + hb;
        memset(ready, 0, (size_t)njobs);
        if (xb) part->xprep(L->dtype, x, H, H, 0, T, mine);
        cb_walk w = cb_walk_from(ngu, tid, nth);
        for (int i; (i = cb_walk_next(taken, ngu, &w)) >= 0;) {
            const cb_job *jb = &jobs[items[3 * i]];
            part->gateup(L->dtype, &jb->ex->gate, &jb->ex->up, x, H, jb->tok, jb->ntok, items[3 * i + 1],
                         items[3 * i + 2], jb->h, jb->ex->inter, ws, xb ? mine : NULL);
        }
#pragma omp barrier
        const int *dit = items + 3 * ngu;
        cb_walk d = cb_walk_from(ndn, tid, nth);
        for (int i; (i = cb_walk_next(taken + ngu, ndn, &d)) >= 0;) {
            const int j = dit[3 * i], c0 = dit[3 * i + 1], c1 = dit[3 * i + 2];
            const cb_job *jb = &jobs[j];
            float *pj = parts + (size_t)j * T * H;
            if (hoff[j] != (size_t)-1 && !ready[j]) {
                part->xprep(L->dtype, jb->h, jb->ex->inter, jb->ex->inter, 0, jb->ntok, hmine + hoff[j]);
                ready[j] = 1;
            }
            for (int t = 0; t < T; ++t) memset(pj + (size_t)t * H + c0, 0, (size_t)(c1 - c0) * sizeof(float));
            part->rows_acc(L->dtype, &jb->ex->down, jb->h, jb->ex->inter, jb->ntok, jb->tw, jb->tok, c0, c1, pj, H,
                           ws, hoff[j] != (size_t)-1 ? hmine + hoff[j] : NULL);
        }
#pragma omp barrier
        int c0, c1;
        cb_split_range(H, nth, tid, 16, &c0, &c1);
        for (int t = 0; t < T; ++t) {
            float *yt = y + (size_t)t * H;
            for (int c = c0; c < c1; ++c) yt[c] = 0.0f;
            for (int j = 0; j < njobs; ++j) {
                const float *p = parts + ((size_t)j * T + t) * H;
                for (int c = c0; c < c1; ++c) yt[c] += p[c];
            }
        }
    }
    return COLIBRI_OK;
}

/* One turn of a budgeted layer (its cache): the gate and up projections of the experts
 * resident now, then of the missing ones as their reads complete, then every down
 * projection in the jobs' order. jobs from j0 on; sets *j1 where the turn ends. */
static int run_cached_turn(colibri_layer *L, cb_job *jobs, int j0, int njobs, int *j1, cb_job *gjobs, int *ready,
                           const float *x, float *y, int T, int nt, char *wsbase, size_t wstride, size_t wsb,
                           char *xprep) {
    int nr, st = cb_cache_acquire(L->cache, L, jobs, j0, njobs, j1, ready, &nr);
    char *xfill = j0 == 0 ? xprep : NULL;
    while (!st) {
        if (nr || xfill) {
            for (int i = 0; i < nr; ++i) gjobs[i] = jobs[ready[i]];
            st = run_turn(L, NULL, 0, gjobs, nr, x, y, T, nt, wsbase, wstride, wsb, xfill, xprep, 0, 0);
            xfill = NULL;
            if (st) break;
        }
        st = cb_cache_next(L->cache, ready, &nr, nt);
        if (!nr) break;
    }
    if (!st)
        st = run_turn(L, jobs + j0, *j1 - j0, NULL, 0, x, y, T, nt, wsbase, wstride, wsb, NULL, xprep, j0 == 0, 1);
    return st;
}

int colibri_layer_forward(colibri_layer *L, const float *x, float *y, int T, int n_threads) {
    cb_clear_error();
    if (!L) return cb_fail(COLIBRI_ERR_INVALID, "layer is NULL");
    if (T < 0) return cb_fail(COLIBRI_ERR_INVALID, "n_tokens %d < 0", T);
    if (T == 0) return COLIBRI_OK;
    if (!x || !y) return cb_fail(COLIBRI_ERR_INVALID, "x and y must not be NULL");
    int st = cb_check_threads("colibri_layer_forward", n_threads);
    if (st) return st;
    const int H = L->hidden, E = L->n_experts;
    if ((size_t)T > (SIZE_MAX / sizeof(float)) / (size_t)(H > E ? H : E))
        return cb_fail(COLIBRI_ERR_INVALID, "n_tokens %d is too large", T);
    const float *xe = x + (size_t)T * H, *ye = y + (size_t)T * H;
    if (x < ye && y < xe) return cb_fail(COLIBRI_ERR_INVALID, "x and y overlap");
    const int nt = n_threads > 0 ? n_threads : colibri_get_num_threads();
    const int slots = colibri_route_slots(&L->route);
    const int S = L->has_shared ? L->shared.inter : 0;

    /* one allocation for all scratch of this call; a conservative bound in double first,
     * so the size_t products below cannot wrap (T * slots * inter reaches 2^63) */
    const double est = (double)T * ((double)slots * (L->inter + 4.0) + S + E + 8.0) * 4.0 +
                       (double)(E + 1) * 64.0;
    if (est > (double)(SIZE_MAX / 2))
        return cb_fail(COLIBRI_ERR_INVALID, "n_tokens %d is too large for this layer's scratch", T);
    size_t n_sel = (size_t)T * slots;
    size_t f_logits = (size_t)T * E, f_w = n_sel, f_tw = n_sel + (size_t)T;
    size_t i_idx = n_sel, i_cnt = (size_t)T, i_tok = n_sel + (size_t)T, i_off = (size_t)E + 1;
    const int guards = cb_guards;
    size_t h_floats = n_sel * (size_t)L->inter + (size_t)T * S +
                      (guards ? (size_t)(E + 2) * CB_GUARD_FLOATS : 0);
    /* per-thread kernel workspace (int4: the quantized activations), 64-aligned */
    int max_cols = H > L->inter ? H : L->inter;
    if (S > max_cols) max_cols = S;
    const cbk_kernels *K = L->kernels;
    const size_t wsb = (cbk_part_of(K, L->dtype)->workspace_bytes(L->dtype, max_cols, T) + 63) / 64 * 64;
    /* the router's too: without one its f32 rows take the dot kernels, which cost a prefill
     * of many experts (Qwen3's 128 x 2048) 6% of its time, where the gemm needs under 1% */
    const size_t rwsb = (cbk_part_of(K, COLIBRI_F32)->workspace_bytes(COLIBRI_F32, H, T) + 63) / 64 * 64;
    const size_t wstride = wsb > rwsb ? wsb : rwsb; /* each thread's slot */
    size_t bytes = (f_logits + f_w + f_tw + h_floats) * sizeof(float) +
                   (i_idx + i_cnt + i_tok + 2 * i_off) * sizeof(int32_t) +
                   (size_t)(E + 1) * sizeof(cb_job) + (size_t)T;
    if (L->cache) bytes += (size_t)(E + 1) * (sizeof(cb_job) + sizeof(int)); /* the cache's turns' lists */
    const size_t ws_off = (bytes + 63) / 64 * 64;
    if (wstride && (size_t)nt > (SIZE_MAX - ws_off - 64) / wstride)
        return cb_fail(COLIBRI_ERR_INVALID, "n_tokens %d: kernel workspace too large", T);
    bytes = ws_off + (size_t)nt * wstride + 64;
    char *scratch = cb_scratch(CB_SCRATCH_CALL, bytes);
    if (!scratch) return cb_fail(COLIBRI_ERR_NOMEM, "out of memory for %zu bytes of scratch", bytes);
    /* the jobs first: the buffer's alignment suits them, the arrays after them need less */
    cb_job *jobs = (cb_job *)(void *)scratch;
    cb_job *gjobs = jobs + E + 1; /* with a cache: the jobs one gateup pass runs, and theirs in jobs */
    int *ready = (int *)(void *)(gjobs + (L->cache ? E + 1 : 0));
    float *logits = (float *)(void *)(ready + (L->cache ? E + 1 : 0));
    float *wsel = logits + f_logits;
    float *tw = wsel + f_w;
    float *hbuf = tw + f_tw;
    int32_t *isel = (int32_t *)(hbuf + h_floats);
    int32_t *cnt = isel + i_idx;
    int32_t *tok = cnt + i_cnt;
    int32_t *off = tok + i_tok;
    int32_t *fill = off + i_off;
    char *wsbase = scratch + ws_off; /* both 64-aligned */
    unsigned char *bad = (unsigned char *)(fill + i_off); /* [T]: token's output row is NaN */

    /* router logits: logits[t, e] = router[e] . x[t], split by experts; then the tokens'
     * checks (bad[]) and routing, split by tokens where each thread gets a few (on one
     * thread, Qwen3's 128 experts took 1.4 us a token to route and 0.5 us to check) */
    memset(logits, 0, f_logits * sizeof(float));
    for (int t = 0; t < T; ++t) tok[t] = t, tw[t] = 1.0f;
    const cb_mat rmat = {L->router, NULL, E, H, NULL, 1};
    const int split = nt > 1 && T >= CB_ROUTE_SPLIT_TOKENS * nt;
#pragma omp parallel num_threads(nt)
    {
        const int tid = omp_get_thread_num(), nth = omp_get_num_threads();
        int lo, hi;
        cb_split_range(E, nth, tid, 1, &lo, &hi);
        if (lo < hi)
            cbk_part_of(K, COLIBRI_F32)->rows_acc(COLIBRI_F32, &rmat, x, H, T, tw, tok, lo, hi, logits, E,
                                                  rwsb ? wsbase + (size_t)tid * wstride : NULL, NULL);
        if (split) {
#pragma omp barrier
            cb_split_range(T, nth, tid, 1, &lo, &hi);
            flag_nonfinite(x, H, lo, hi, bad);
            cb_route_rows(logits, lo, hi, E, &L->route, isel, wsel, cnt);
        }
    }
    if (!split) {
        flag_nonfinite(x, H, 0, T, bad);
        cb_route_rows(logits, 0, T, E, &L->route, isel, wsel, cnt);
    }
    /* A token with a NaN or Inf activation gets a NaN output row and takes no part in the
     * rest of the call, so it cannot disturb the other tokens (see colibri.h). */
    int nbad = 0;
    for (int t = 0; t < T; ++t) nbad += bad[t];
    /* Drop the bad tokens' selections; a token whose logits were all NaN (finite x whose
     * dot products overflowed) chose nothing and is bad too. */
    for (int t = 0; t < T; ++t) {
        if (!bad[t] && cnt[t] > 0) continue;
        if (!bad[t]) bad[t] = 1, ++nbad;
        for (int s = 0; s < slots; ++s) isel[(size_t)t * slots + s] = -1;
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
    if (guards) guard_fill(h), h += CB_GUARD_FLOATS;
    for (int e = 0; e < E; ++e) {
        int n = off[e + 1] - off[e];
        if (!n) continue;
        jobs[njobs++] = (cb_job){&L->experts[e], tok + T + off[e], etw + off[e], n, h, NULL, 0};
        h += (size_t)n * L->experts[e].inter;
        if (guards) guard_fill(h), h += CB_GUARD_FLOATS;
    }
    if (S && nbad < T) {
        /* shared expert: every good token, weighted by sigmoid(w . x) or 1; tok[0..n) and
         * tw[0..n) are free again once the router ran */
        int n = 0;
        for (int t = 0; t < T; ++t) {
            if (bad[t]) continue;
            float g = 1.0f;
            if (L->shared_expert_gate) {
                double z = 0.0;
                const float *xt = x + (size_t)t * H;
                for (int k = 0; k < H; ++k) z += (double)L->shared_expert_gate[k] * xt[k];
                g = (float)(1.0 / (1.0 + exp(-z)));
            }
            tok[n] = t;
            tw[n++] = g;
        }
        jobs[njobs++] = (cb_job){&L->shared, tok, tw, n, h, NULL, 0};
        if (guards) guard_fill(h + (size_t)n * S);
    }

    const cbk_part *part = cbk_part_of(K, L->dtype);
    /* the gateups' activations, prepared once where the part's kernels take them so: each
     * token meets up to top-k experts, whose gateups would each prepare it again */
    char *xprep = NULL;
    const int claimed = !L->cache && nt > 1 && T <= CB_DECODE_MAX_TOKENS && njobs > 0;
    if (wsb && part->xprep_bytes && T > CB_DECODE_MAX_TOKENS) { /* decode: each thread its own (above) */
        const size_t xb = part->xprep_bytes(L->dtype, H, T);
        if (xb) xprep = cb_scratch(CB_SCRATCH_XPREP, xb);
    }
    if (!njobs) memset(y, 0, (size_t)T * H * sizeof(float)); /* every token bad: NaN rows below */
    /* The experts in turns: one turn of all of them, or with a budgeted model's cache as many
     * as it holds at once, each turn's read before it runs. The turns keep the experts'
     * order, so each output sums the same terms in the same order either way. */
    if (L->cache) {
        cb_cache_begin(L->cache);
        for (int j0 = 0, j1; j0 < njobs && !st; j0 = j1)
            st = run_cached_turn(L, jobs, j0, njobs, &j1, gjobs, ready, x, y, T, nt, wsbase, wstride, wsb, xprep);
        cb_cache_end(L->cache);
    } else if (claimed) {
        st = run_decode_claimed(L, jobs, njobs, x, y, T, nt, wsbase, wstride, wsb);
    } else if (njobs) {
        st = run_turn(L, jobs, njobs, jobs, njobs, x, y, T, nt, wsbase, wstride, wsb, xprep, xprep, 1, 1);
    }
    if (st) return st;
    if (guards) {
        int hit = guard_intact(hbuf) ? -2 : -1;
        for (int j = 0; j < njobs && hit == -2; ++j)
            if (!guard_intact(jobs[j].h + (size_t)jobs[j].ntok * jobs[j].ex->inter)) hit = j;
        if (hit != -2) {
            char who[64] = "before the scratch of the first expert";
            if (hit >= 0 && jobs[hit].ex == &L->shared)
                snprintf(who, sizeof who, "past the scratch of the shared expert");
            else if (hit >= 0)
                snprintf(who, sizeof who, "past the scratch of expert %d", (int)(jobs[hit].ex - L->experts));
            return cb_fail(COLIBRI_ERR_CORRUPT, "out-of-bounds write: a kernel wrote %s", who);
        }
    }
    for (int t = 0; t < T && nbad; ++t)
        if (bad[t])
            for (int c = 0; c < H; ++c) y[(size_t)t * H + c] = NAN;
    return COLIBRI_OK;
}

static int layer_f32(void *obj, const float *x, float *y, int T, int nt) {
    return colibri_layer_forward((colibri_layer *)obj, x, y, T, nt);
}

int colibri_layer_forward_bf16(colibri_layer *L, const uint16_t *x, uint16_t *y, int T, int n_threads) {
    cb_clear_error();
    if (!L) return cb_fail(COLIBRI_ERR_INVALID, "layer is NULL");
    return cb_forward_bf16("colibri_layer_forward_bf16", L, layer_f32, L->hidden, L->hidden, x, y, T, n_threads);
}
