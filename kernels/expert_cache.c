/* expert_cache.c — a model's routed experts under a memory budget (colibri_load_options).
 *
 * The cache is one pool of equal slots, each one expert (gate, up, down) in the layout its
 * kernel table wants, shared by all of the model's layers. A forward call groups its
 * tokens by expert as always, then runs its experts in turns of at most the slot count:
 * each turn makes its experts resident (reading the misses from the file with pread,
 * packing them into their slots) and computes them. Turns keep the experts' order, so the
 * outputs are bit-identical to an unbudgeted model's.
 *
 * Eviction: the least recently used slot that the current turn does not hold.
 * A turn's misses are read, checked and packed by the call's threads together, before the
 * turn computes: the call waits for them, and that wait is counted (colibri_model_stats'
 * stall_seconds). */
#include <errno.h>
#include <omp.h>
#include <stdio.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "expert_cache.h"
#include "kernels.h"

struct cb_cache {
    pthread_mutex_t lock;
    int fd;
    const cb_model_file *mf;
    int check_crc;
    int n_layers, n_experts, dtype;
    size_t slot_bytes;
    int n_slots;
    colibri_pool *pool;
    unsigned char *base;    /* n_slots x slot_bytes in the pool */
    unsigned char *staging; /* per loading thread, one stored tensor read before it is packed */
    size_t staging_bytes;
    int staging_threads;
    /* one turn's misses, loaded together: expert, slot, status, bytes read, CRCs checked */
    struct cb_miss {
        int e, s, st;
        uint64_t bytes;
        unsigned verified; /* bit k: tensor k (gate, up, down) passed its first check */
        char msg[320];
    } *miss;
    int32_t *slot_of;        /* [n_layers * E]: the expert's slot, or -1 */
    int32_t *owner;          /* [n_slots]: layer * E + expert, or -1 */
    uint64_t *last_use;      /* [n_slots]: the turn that last used it */
    unsigned char *verified; /* [n_tensors]: CRC checked */
    uint64_t turn;
    colibri_layer *layers;   /* to clear an evicted expert's matrices */
    colibri_memory_stats st;
};

/* Reads n bytes at off, whatever pread returns short. */
static int read_at(int fd, void *dst, size_t n, uint64_t off) {
    unsigned char *p = dst;
    while (n) {
        ssize_t r = pread(fd, p, n, (off_t)off);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) return r < 0 ? errno : EIO;
        p += r;
        off += (uint64_t)r;
        n -= (size_t)r;
    }
    return 0;
}

void cb_cache_free(cb_cache *c) {
    if (!c) return;
    colibri_pool_free(c->pool);
    free(c->staging);
    free(c->miss);
    free(c->slot_of);
    free(c->owner);
    free(c->last_use);
    free(c->verified);
    pthread_mutex_destroy(&c->lock);
    free(c);
}

cb_cache *cb_cache_create(const cb_model_file *mf, int fd, colibri_layer *layers, size_t budget_for_experts,
                          int check_crc) {
    const cb_mf_header *h = &mf->h;
    const int E = (int)h->n_experts, dt = (int)h->weight_dtype;
    const cbk_kernels *K = layers[0].kernels;
    const size_t I = h->inter, H = h->hidden;
    /* every layer of a file has one shape, so one table and one slot size */
    const size_t slot = 2 * cb_mat_bytes(K, dt, I, H) + cb_mat_bytes(K, dt, H, I);
    if (budget_for_experts < slot) {
        cb_fail(COLIBRI_ERR_INVALID, "memory_budget: %zu bytes are left for the routed experts, "
                "under the %zu one expert needs", budget_for_experts, slot);
        return NULL;
    }
    const size_t total = (size_t)h->n_layers * (size_t)E;
    size_t n = budget_for_experts / slot;
    if (n > total) n = total;
    size_t staging = 0;
    for (uint64_t l = 0; l < h->n_layers; l++)
        for (uint64_t j = 1; j <= 3; j++) {
            cb_mf_tensor e;
            cb_mf_tensor_at(mf, cb_mf_slot(mf, l, j), &e);
            if (e.nbytes > staging) staging = (size_t)e.nbytes;
        }
    cb_cache *c = calloc(1, sizeof *c);
    if (!c) {
        cb_fail(COLIBRI_ERR_NOMEM, "out of memory for the expert cache");
        return NULL;
    }
    pthread_mutex_init(&c->lock, NULL);
    c->fd = fd;
    c->mf = mf;
    c->check_crc = check_crc;
    c->n_layers = (int)h->n_layers;
    c->n_experts = E;
    c->dtype = dt;
    c->slot_bytes = slot;
    c->n_slots = (int)n;
    c->layers = layers;
    c->staging_bytes = staging ? staging : 1;
    c->staging_threads = 1;
    c->staging = malloc(c->staging_bytes);
    c->miss = malloc(n * sizeof *c->miss);
    c->slot_of = malloc(total * sizeof *c->slot_of);
    c->owner = malloc(n * sizeof *c->owner);
    c->last_use = calloc(n, sizeof *c->last_use);
    c->verified = calloc(h->n_tensors ? h->n_tensors : 1, 1);
    c->pool = c->staging && c->miss && c->slot_of && c->owner && c->last_use && c->verified
                  ? colibri_pool_create(n * slot, CB_DEFAULT_HUGEPAGES, -1)
                  : NULL;
    if (c->pool) c->base = colibri_pool_alloc(c->pool, n * slot, 64);
    if (!c->base) {
        cb_fail(COLIBRI_ERR_NOMEM, "out of memory for an expert cache of %zu slots of %zu bytes", n, slot);
        cb_cache_free(c);
        return NULL;
    }
    for (size_t i = 0; i < total; i++) c->slot_of[i] = -1;
    for (size_t i = 0; i < n; i++) c->owner[i] = -1;
    c->st.cache_slots = (int)n;
    return c;
}

void cb_cache_begin(cb_cache *c) { pthread_mutex_lock(&c->lock); }
void cb_cache_end(cb_cache *c) { pthread_mutex_unlock(&c->lock); }

static unsigned char *slot_mem(const cb_cache *c, int s) {
    return c->base + (size_t)s * c->slot_bytes;
}

/* An expert's matrices point nowhere while it is not resident: no kernel may read them. */
static void clear_expert(cb_expert *x) {
    cb_mat *m[3] = {&x->gate, &x->up, &x->down};
    for (int k = 0; k < 3; k++) m[k]->w = m[k]->pk = NULL, m[k]->scales = NULL;
}

/* Reads miss m's expert (of layer L) into its slot through staging, checking the CRC of a
 * tensor on its first read (the flags are set by the caller, after the threads). Called by
 * several threads at once for different misses: it writes only m, the slot and staging. */
static void load_expert(const cb_cache *c, colibri_layer *L, struct cb_miss *m, unsigned char *staging) {
    const cb_model_file *mf = c->mf;
    unsigned char *dst = slot_mem(c, m->s);
    cb_expert *x = &L->experts[m->e];
    cb_mat *mats[3] = {&x->gate, &x->up, &x->down};
    m->st = COLIBRI_OK;
    m->bytes = 0;
    m->verified = 0;
    for (int k = 0; k < 3; k++) {
        const uint32_t t = cb_mf_slot(mf, (uint64_t)L->index, 1 + 3 * (uint64_t)m->e + (uint64_t)k);
        cb_mf_tensor te;
        cb_mf_tensor_at(mf, t, &te);
        int err = read_at(c->fd, staging, (size_t)te.nbytes, te.offset);
        if (err) {
            m->st = COLIBRI_ERR_IO;
            snprintf(m->msg, sizeof m->msg, "reading tensor[%u] (layer %d, expert %d %s, bytes %llu .. %llu): %s", t,
                     L->index, m->e, cb_mf_kind_name(te.kind), (unsigned long long)te.offset,
                     (unsigned long long)(te.offset + te.nbytes - 1), strerror(err));
            return;
        }
        m->bytes += te.nbytes;
        if (c->check_crc && !c->verified[t]) {
            const uint32_t crc = cb_crc32(0, staging, (size_t)te.nbytes);
            if (crc != te.crc32) {
                m->st = COLIBRI_ERR_FORMAT;
                snprintf(m->msg, sizeof m->msg,
                         "tensor[%u].crc32: stored 0x%08X, but the %s payload of layer %d, expert %d "
                         "at bytes %llu .. %llu has CRC-32 0x%08X (the payload is corrupt)",
                         t, te.crc32, cb_mf_kind_name(te.kind), L->index, m->e, (unsigned long long)te.offset,
                         (unsigned long long)(te.offset + te.nbytes - 1), crc);
                return;
            }
            m->verified |= 1u << k;
        }
        /* the stored form: data padded to 4, then the scales (FORMAT.md) */
        const float *scales = NULL;
        if (cb_mat_scale_count(c->dtype, te.rows, te.cols))
            scales = (const float *)(const void *)(staging +
                                                   ((cb_mat_data_bytes(c->dtype, te.rows, te.cols) + 3) & ~(size_t)3));
        cb_place_mat(L->kernels, c->dtype, staging, scales, te.rows, te.cols, dst, mats[k]);
        dst += cb_mat_bytes(L->kernels, c->dtype, te.rows, te.cols);
    }
}

int cb_cache_acquire(cb_cache *c, colibri_layer *L, const cb_job *jobs, int j0, int njobs, int *j1, int nt) {
    const int E = c->n_experts;
    const uint64_t turn = ++c->turn;
    int held = 0, nmiss = 0, j = j0;
    /* the turn's experts, and a slot for each miss: the least recently used one this turn
     * does not hold (a free one first) */
    for (; j < njobs; j++) {
        const cb_expert *x = jobs[j].ex;
        if (x < L->experts || x >= L->experts + E) continue; /* the shared expert */
        if (held == c->n_slots) break;
        const int e = (int)(x - L->experts);
        const size_t key = (size_t)L->index * (size_t)E + (size_t)e;
        int s = c->slot_of[key];
        if (s >= 0) {
            c->st.hits++;
        } else {
            int best = -1;
            for (int i = 0; i < c->n_slots; i++) {
                if (c->last_use[i] == turn) continue;
                if (c->owner[i] < 0) {
                    best = i;
                    break;
                }
                if (best < 0 || c->last_use[i] < c->last_use[best]) best = i;
            }
            s = best; /* there is one: this turn holds fewer than n_slots */
            if (c->owner[s] >= 0) {
                const int ol = c->owner[s] / E, oe = c->owner[s] % E;
                clear_expert(&c->layers[ol].experts[oe]);
                c->slot_of[c->owner[s]] = -1;
                c->owner[s] = -1;
                c->st.evictions++;
            }
            c->miss[nmiss].e = e;
            c->miss[nmiss++].s = s;
        }
        c->last_use[s] = turn;
        held++;
    }
    *j1 = j;
    if (!nmiss) return COLIBRI_OK;
    /* the misses read, checked and packed by the call's threads together, each with its
     * staging buffer */
    if (nt < 1) nt = 1;
    if (nt > nmiss) nt = nmiss;
    if (nt > c->staging_threads) {
        unsigned char *more = realloc(c->staging, (size_t)nt * c->staging_bytes);
        if (more) c->staging = more, c->staging_threads = nt;
        else nt = c->staging_threads;
    }
    const double t0 = cb_now_s();
#pragma omp parallel for num_threads(nt) schedule(dynamic, 1)
    for (int i = 0; i < nmiss; i++)
        load_expert(c, L, &c->miss[i], c->staging + (size_t)omp_get_thread_num() * c->staging_bytes);
    c->st.stall_seconds += cb_now_s() - t0;
    int st = COLIBRI_OK;
    for (int i = 0; i < nmiss; i++) {
        struct cb_miss *m = &c->miss[i];
        c->st.misses++;
        c->st.bytes_read += m->bytes;
        for (int k = 0; k < 3; k++)
            if (m->verified >> k & 1u) c->verified[cb_mf_slot(c->mf, (uint64_t)L->index, 1 + 3 * (uint64_t)m->e + (uint64_t)k)] = 1;
        if (m->st) { /* the slot stays free; the first failure in the experts' order is the call's */
            clear_expert(&L->experts[m->e]);
            c->last_use[m->s] = 0;
            if (!st) st = cb_fail(m->st, "%s", m->msg);
            continue;
        }
        const size_t key = (size_t)L->index * (size_t)E + (size_t)m->e;
        c->owner[m->s] = (int32_t)key;
        c->slot_of[key] = m->s;
    }
    return st;
}

void cb_cache_stats(const cb_cache *c, colibri_memory_stats *out) {
    *out = c->st;
    size_t n = 0;
    for (int i = 0; i < c->n_slots; i++) n += c->owner[i] >= 0;
    out->resident_bytes = n * c->slot_bytes;
}
