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
 * Reads are synchronous for now: a call waits while its misses are read, checked and packed,
 * and that wait is counted (colibri_model_stats' stall_seconds). */
#include <errno.h>
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
    unsigned char *staging; /* one stored tensor, read before it is packed into its slot */
    size_t staging_bytes;
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
    c->staging_bytes = staging;
    c->staging = malloc(staging ? staging : 1);
    c->slot_of = malloc(total * sizeof *c->slot_of);
    c->owner = malloc(n * sizeof *c->owner);
    c->last_use = calloc(n, sizeof *c->last_use);
    c->verified = calloc(h->n_tensors ? h->n_tensors : 1, 1);
    c->pool = c->staging && c->slot_of && c->owner && c->last_use && c->verified
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

/* Reads expert e of layer l into slot s, its CRCs checked on first read. */
static int load_expert(cb_cache *c, colibri_layer *L, int e, int s) {
    const cb_model_file *mf = c->mf;
    unsigned char *dst = slot_mem(c, s);
    cb_expert *x = &L->experts[e];
    cb_mat *mats[3] = {&x->gate, &x->up, &x->down};
    for (int k = 0; k < 3; k++) {
        const uint32_t t = cb_mf_slot(mf, (uint64_t)L->index, 1 + 3 * (uint64_t)e + (uint64_t)k);
        cb_mf_tensor te;
        cb_mf_tensor_at(mf, t, &te);
        int err = read_at(c->fd, c->staging, (size_t)te.nbytes, te.offset);
        if (err)
            return cb_fail(COLIBRI_ERR_IO, "reading tensor[%u] (layer %d, expert %d %s, bytes %llu .. %llu): %s", t,
                           L->index, e, cb_mf_kind_name(te.kind), (unsigned long long)te.offset,
                           (unsigned long long)(te.offset + te.nbytes - 1), strerror(err));
        c->st.bytes_read += te.nbytes;
        if (c->check_crc && !c->verified[t]) {
            const uint32_t crc = cb_crc32(0, c->staging, (size_t)te.nbytes);
            if (crc != te.crc32)
                return cb_fail(COLIBRI_ERR_FORMAT,
                               "tensor[%u].crc32: stored 0x%08X, but the %s payload of layer %d, expert %d "
                               "at bytes %llu .. %llu has CRC-32 0x%08X (the payload is corrupt)",
                               t, te.crc32, cb_mf_kind_name(te.kind), L->index, e, (unsigned long long)te.offset,
                               (unsigned long long)(te.offset + te.nbytes - 1), crc);
            c->verified[t] = 1;
        }
        /* the stored form: data padded to 4, then the scales (FORMAT.md) */
        const float *scales = NULL;
        if (cb_mat_scale_count(c->dtype, te.rows, te.cols))
            scales = (const float *)(const void *)(c->staging +
                                                   ((cb_mat_data_bytes(c->dtype, te.rows, te.cols) + 3) & ~(size_t)3));
        cb_place_mat(L->kernels, c->dtype, c->staging, scales, te.rows, te.cols, dst, mats[k]);
        dst += cb_mat_bytes(L->kernels, c->dtype, te.rows, te.cols);
    }
    return COLIBRI_OK;
}

int cb_cache_acquire(cb_cache *c, colibri_layer *L, const cb_job *jobs, int j0, int njobs, int *j1) {
    const int E = c->n_experts;
    const uint64_t turn = ++c->turn;
    int held = 0, j = j0;
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
            c->st.misses++;
            /* the least recently used slot this turn does not hold (a free one first) */
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
            const double t0 = cb_now_s();
            if (c->owner[s] >= 0) {
                const int ol = c->owner[s] / E, oe = c->owner[s] % E;
                clear_expert(&c->layers[ol].experts[oe]);
                c->slot_of[c->owner[s]] = -1;
                c->st.evictions++;
            }
            c->owner[s] = -1;
            int st = load_expert(c, L, e, s);
            c->st.stall_seconds += cb_now_s() - t0;
            if (st) {
                clear_expert(&L->experts[e]);
                c->last_use[s] = 0;
                return st;
            }
            c->owner[s] = (int32_t)key;
            c->slot_of[key] = s;
        }
        c->last_use[s] = turn;
        held++;
    }
    *j1 = j;
    return COLIBRI_OK;
}

void cb_cache_stats(const cb_cache *c, colibri_memory_stats *out) {
    *out = c->st;
    size_t n = 0;
    for (int i = 0; i < c->n_slots; i++) n += c->owner[i] >= 0;
    out->resident_bytes = n * c->slot_bytes;
}
