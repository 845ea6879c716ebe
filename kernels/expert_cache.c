/* expert_cache.c — a model's routed experts under a memory budget (colibri_load_options).
 *
 * The cache is one pool of equal slots, each one expert (gate, up, down) in the layout its
 * kernel table wants, shared by all of the model's layers. A forward call groups its
 * tokens by expert as always, then runs its experts in turns of at most the slot count.
 * A turn (layer.c):
 *   1. acquire: each expert gets its slot (a miss: a slot the turn does not hold, chosen
 *      by the policy, LRU or LFU) and the misses' tensors are handed to the I/O threads, which pread
 *      them into staging buffers, as many at once as there are buffers;
 *   2. the call computes the gate and up projections of the experts already resident
 *      while the reads are in flight;
 *   3. next, until no miss is left: wait for read tensors, check each one's CRC on its
 *      first read and pack it into its slot (the call's threads), free its buffer for the
 *      next read, and hand back the experts now complete, whose gate and up run next;
 *   4. the down projections of all the turn's experts, in the experts' order.
 * Only step 4 adds into the output, in the same order as an unbudgeted call, so the
 * outputs are bit-identical to an unbudgeted model's whatever order the reads end in.
 *
 * The I/O threads only wait on the disk: the CPU work (the CRC, the packing) stays with
 * the call's threads. With io_threads -1 there are none, and the call's threads read too.
 * The time a call spends in step 3 is colibri_memory_stats' stall_seconds, of which
 * wait_seconds is waiting for reads to finish. */
#include <errno.h>
#include <fcntl.h>
#include <omp.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "expert_cache.h"
#include "kernels.h"

enum { R_WAIT, R_QUEUED, R_READ, R_DONE }; /* a read's state: no buffer yet; queued; bytes in; placed */

struct cb_miss;
typedef struct { /* one stored tensor of a miss, read through a staging buffer */
    struct cb_miss *m;
    int k;           /* 0 gate, 1 up, 2 down */
    uint32_t t;      /* its index in the file's tensor table */
    cb_mf_tensor te;
    unsigned char *buf;
    const unsigned char *data; /* the tensor's bytes in buf (an O_DIRECT read starts before them) */
    int err;         /* pread's errno, 0 */
    uint32_t crc;    /* the payload's CRC-32 where it was checked */
    int checked;     /* 1: checked on this read */
    int state;
} cb_read;

struct cb_miss {
    int e, s, j; /* expert, slot, its job */
    int left;    /* tensors not yet placed */
};

/* O_DIRECT reads: whole blocks of this size, into buffers aligned to it */
#define DIRECT_ALIGN 4096

struct cb_cache {
    pthread_mutex_t lock; /* one call at a time */
    int fd;
    int dfd; /* the same file opened O_DIRECT (past the page cache), or -1 */
    const cb_model_file *mf;
    int check_crc;
    int n_layers, n_experts, dtype;
    size_t slot_bytes, mat_bytes; /* an expert's slot; gate's (or up's) part of it */
    int n_slots;
    colibri_pool *pool;
    unsigned char *base; /* n_slots x slot_bytes in the pool */
    /* staging: n_stage buffers of stage_bytes (the largest stored tensor) */
    unsigned char *staging;
    size_t stage_bytes;
    int n_stage;
    unsigned char **free_buf;
    int n_free;
    /* the turn: its misses and their reads in the experts' order */
    struct cb_miss *miss;
    int nmiss, misses_left;
    cb_read *rd;
    int nrd, rd_next; /* reads, and the next one to get a buffer */
    cb_read **batch;
    colibri_layer *turn_layer;
    /* I/O threads and their queue (qlock guards queue, qhead, qtail, quit and rd[].state
     * and .err while threads run) */
    pthread_t *io;
    int n_io, io_want;
    pid_t io_pid; /* the process that started them (a forked child has none of them) */
    pthread_mutex_t qlock;
    pthread_cond_t qcv, dcv; /* work queued; a read done */
    cb_read **queue;
    int qhead, qtail, quit;
    /* residency */
    int32_t *slot_of;        /* [n_layers * E]: the expert's slot, or -1 */
    int32_t *owner;          /* [n_slots]: layer * E + expert, or -1 */
    uint64_t *last_use;      /* [n_slots]: the turn that last used it */
    uint32_t *uses;          /* [n_layers * E]: turns that used the expert (LFU), halved every
                              * COLIBRI_LFU_HALF_LIFE turns per layer */
    int policy;              /* COLIBRI_CACHE_LRU or COLIBRI_CACHE_LFU */
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

/* Reads tensor r into its buffer: with O_DIRECT the blocks around it (a read that fails
 * there, or comes short, goes through the page cache instead), else its bytes. */
static int read_tensor(const cb_cache *c, cb_read *r) {
    const uint64_t off = r->te.offset, n = r->te.nbytes;
    if (c->dfd >= 0) {
        const uint64_t a0 = off & ~(uint64_t)(DIRECT_ALIGN - 1);
        const uint64_t len = (off + n - a0 + DIRECT_ALIGN - 1) & ~(uint64_t)(DIRECT_ALIGN - 1);
        uint64_t got = 0;
        while (got < off + n - a0) {
            const ssize_t k = pread(c->dfd, r->buf + got, (size_t)(len - got), (off_t)(a0 + got));
            if (k < 0 && errno == EINTR) continue;
            if (k <= 0 || (got + (uint64_t)k < off + n - a0 && (uint64_t)k % DIRECT_ALIGN)) break;
            got += (uint64_t)k;
        }
        if (got >= off + n - a0) {
            r->data = r->buf + (off - a0);
            return 0;
        }
    }
    r->data = r->buf;
    return read_at(c->fd, r->buf, (size_t)n, off);
}

static void *io_main(void *arg) {
    cb_cache *c = arg;
    pthread_mutex_lock(&c->qlock);
    for (;;) {
        while (!c->quit && c->qhead == c->qtail) pthread_cond_wait(&c->qcv, &c->qlock);
        if (c->quit) break;
        cb_read *r = c->queue[c->qhead++];
        pthread_mutex_unlock(&c->qlock);
        const int err = read_tensor(c, r);
        pthread_mutex_lock(&c->qlock);
        r->err = err;
        r->state = R_READ;
        pthread_cond_signal(&c->dcv); /* only the call waits */
    }
    pthread_mutex_unlock(&c->qlock);
    return NULL;
}

void cb_cache_free(cb_cache *c) {
    if (!c) return;
    if (c->n_io && c->io_pid == getpid()) {
        pthread_mutex_lock(&c->qlock);
        c->quit = 1;
        pthread_cond_broadcast(&c->qcv);
        pthread_mutex_unlock(&c->qlock);
        for (int i = 0; i < c->n_io; i++) pthread_join(c->io[i], NULL);
    }
    colibri_pool_free(c->pool);
    if (c->dfd >= 0) close(c->dfd);
    free(c->io);
    free(c->queue);
    free(c->batch);
    free(c->rd);
    free(c->free_buf);
    free(c->staging);
    free(c->miss);
    free(c->slot_of);
    free(c->owner);
    free(c->last_use);
    free(c->uses);
    free(c->verified);
    pthread_cond_destroy(&c->qcv);
    pthread_cond_destroy(&c->dcv);
    pthread_mutex_destroy(&c->qlock);
    pthread_mutex_destroy(&c->lock);
    free(c);
}

cb_cache *cb_cache_create(const cb_model_file *mf, int fd, colibri_layer *layers, size_t budget_for_experts,
                          const colibri_load_options *o) {
    const int check_crc = !o->skip_crc, io_threads = o->io_threads, read_depth = o->read_depth,
              direct_io = o->direct_io;
    const cb_mf_header *h = &mf->h;
    const int E = (int)h->n_experts, dt = (int)h->weight_dtype;
    const cbk_kernels *K = layers[0].kernels;
    const size_t I = h->inter, H = h->hidden;
    /* every layer of a file has one shape, so one table and one slot size */
    const size_t mat = cb_mat_bytes(K, dt, I, H), slot = 2 * mat + cb_mat_bytes(K, dt, H, I);
    size_t stage = 0;
    for (uint64_t l = 0; l < h->n_layers; l++)
        for (uint64_t j = 1; j <= 3; j++) {
            cb_mf_tensor e;
            cb_mf_tensor_at(mf, cb_mf_slot(mf, l, j), &e);
            if (e.nbytes > stage) stage = (size_t)e.nbytes;
        }
    /* room for the blocks an O_DIRECT read takes around the tensor */
    stage = (stage + 2 * DIRECT_ALIGN - 1) / DIRECT_ALIGN * DIRECT_ALIGN;
    /* The staging buffers are paid from the budget: as many as read_depth asks for while
     * one slot is left beside them, and at least one (outside the budget when even that
     * leaves no slot, so that a budget of one expert still runs). */
    int n_stage = read_depth > 0 ? read_depth : CB_DEFAULT_READ_DEPTH;
    while (n_stage > 1 && budget_for_experts < slot + (size_t)n_stage * stage) n_stage--;
    const size_t paid = budget_for_experts >= slot + (size_t)n_stage * stage ? (size_t)n_stage * stage : 0;
    if (budget_for_experts < slot) {
        cb_fail(COLIBRI_ERR_INVALID, "memory_budget: %zu bytes are left for the routed experts, "
                "under the %zu one expert needs", budget_for_experts, slot);
        return NULL;
    }
    const size_t total = (size_t)h->n_layers * (size_t)E;
    size_t n = (budget_for_experts - paid) / slot;
    if (n > total) n = total;
    cb_cache *c = calloc(1, sizeof *c);
    if (!c) {
        cb_fail(COLIBRI_ERR_NOMEM, "out of memory for the expert cache");
        return NULL;
    }
    pthread_mutex_init(&c->lock, NULL);
    pthread_mutex_init(&c->qlock, NULL);
    pthread_cond_init(&c->qcv, NULL);
    pthread_cond_init(&c->dcv, NULL);
    c->fd = fd;
    c->dfd = -1;
    if (direct_io > 0 || (direct_io == 0 && CB_DEFAULT_DIRECT_IO)) {
        char self[64]; /* the same open file, not the path again: it may have been replaced */
        snprintf(self, sizeof self, "/proc/self/fd/%d", fd);
        c->dfd = open(self, O_RDONLY | O_DIRECT | O_CLOEXEC);
    }
    c->mf = mf;
    c->check_crc = check_crc;
    c->n_layers = (int)h->n_layers;
    c->n_experts = E;
    c->dtype = dt;
    c->slot_bytes = slot;
    c->mat_bytes = mat;
    c->n_slots = (int)n;
    c->layers = layers;
    c->stage_bytes = stage;
    c->n_stage = n_stage;
    c->io_want = io_threads < 0 ? 0 : io_threads > 0 ? io_threads : CB_DEFAULT_IO_THREADS;
    c->staging = aligned_alloc(DIRECT_ALIGN, (size_t)n_stage * stage);
    c->free_buf = malloc((size_t)n_stage * sizeof *c->free_buf);
    c->miss = malloc(n * sizeof *c->miss);
    c->rd = malloc(3 * n * sizeof *c->rd);
    c->batch = malloc(3 * n * sizeof *c->batch);
    c->queue = malloc(3 * n * sizeof *c->queue);
    c->io = malloc((size_t)(c->io_want ? c->io_want : 1) * sizeof *c->io);
    c->slot_of = malloc(total * sizeof *c->slot_of);
    c->owner = malloc(n * sizeof *c->owner);
    c->last_use = calloc(n, sizeof *c->last_use);
    c->uses = calloc(total, sizeof *c->uses);
    c->policy = o->policy ? o->policy : CB_DEFAULT_CACHE_POLICY;
    c->verified = calloc(h->n_tensors ? h->n_tensors : 1, 1);
    c->pool = c->staging && c->free_buf && c->miss && c->rd && c->batch && c->queue && c->io && c->slot_of &&
                      c->owner && c->last_use && c->uses && c->verified
                  ? colibri_pool_create(n * slot, CB_DEFAULT_HUGEPAGES, -1)
                  : NULL;
    if (c->pool) c->base = colibri_pool_alloc(c->pool, n * slot, 64);
    if (!c->base) {
        cb_fail(COLIBRI_ERR_NOMEM, "out of memory for an expert cache of %zu slots of %zu bytes", n, slot);
        cb_cache_free(c);
        return NULL;
    }
    for (int i = 0; i < n_stage; i++) c->free_buf[i] = c->staging + (size_t)i * stage;
    c->n_free = n_stage;
    for (size_t i = 0; i < total; i++) c->slot_of[i] = -1;
    for (size_t i = 0; i < n; i++) c->owner[i] = -1;
    c->st.cache_slots = (int)n;
    c->st.staging_bytes = (size_t)n_stage * stage;
    return c;
}

void cb_cache_begin(cb_cache *c) { pthread_mutex_lock(&c->lock); }
void cb_cache_end(cb_cache *c) { pthread_mutex_unlock(&c->lock); }

/* An expert's matrices point nowhere while it is not resident: no kernel may read them. */
static void clear_expert(cb_expert *x) {
    cb_mat *m[3] = {&x->gate, &x->up, &x->down};
    for (int k = 0; k < 3; k++) m[k]->w = m[k]->pk = NULL, m[k]->scales = NULL;
}

/* Gives the waiting reads, in order, the free staging buffers, and queues them for the I/O
 * threads (without any, they stay for the call's threads). */
static void start_reads(cb_cache *c) {
    if (c->n_io) pthread_mutex_lock(&c->qlock);
    if (!c->rd_next) c->qhead = c->qtail = 0; /* a turn's first: the last turn's reads are all done */
    int queued = 0;
    while (c->rd_next < c->nrd && c->n_free) {
        cb_read *r = &c->rd[c->rd_next++];
        r->buf = c->free_buf[--c->n_free];
        r->state = R_QUEUED;
        if (c->n_io) c->queue[c->qtail++] = r, queued++;
    }
    if (queued) pthread_cond_broadcast(&c->qcv);
    if (c->n_io) pthread_mutex_unlock(&c->qlock);
}

/* Whether slot a (held) is a better victim than slot b under the cache's policy. */
static int evicts_before(const cb_cache *c, int a, int b) {
    if (c->policy == COLIBRI_CACHE_LFU) {
        const uint32_t ua = c->uses[c->owner[a]], ub = c->uses[c->owner[b]];
        if (ua != ub) return ua < ub;
    }
    return c->last_use[a] < c->last_use[b];
}

/* Starts the I/O threads on first use; with none started, the call's threads read. */
static void start_io(cb_cache *c) {
    c->io_pid = getpid();
    while (c->n_io < c->io_want && pthread_create(&c->io[c->n_io], NULL, io_main, c) == 0) c->n_io++;
    c->io_want = c->n_io;
}

int cb_cache_acquire(cb_cache *c, colibri_layer *L, const cb_job *jobs, int j0, int njobs, int *j1, int *ready,
                     int *nready) {
    const int E = c->n_experts;
    const uint64_t turn = ++c->turn;
    int held = 0, nmiss = 0, j = j0;
    *nready = 0;
    if (c->policy == COLIBRI_CACHE_LFU && turn % ((uint64_t)COLIBRI_LFU_HALF_LIFE * (uint64_t)c->n_layers) == 0)
        for (size_t i = 0; i < (size_t)c->n_layers * (size_t)E; i++) c->uses[i] >>= 1;
    /* the turn's experts, and a slot for each miss among those this turn does not hold: a
     * free one, else the policy's victim (LRU: the least recently used; LFU: the least often
     * used, ties to the least recent) */
    for (; j < njobs; j++) {
        const cb_expert *x = jobs[j].ex;
        if (x < L->experts || x >= L->experts + E) { /* the shared expert */
            ready[(*nready)++] = j;
            continue;
        }
        if (held == c->n_slots) break;
        const int e = (int)(x - L->experts);
        const size_t key = (size_t)L->index * (size_t)E + (size_t)e;
        int s = c->slot_of[key];
        c->uses[key]++;
        if (s >= 0) {
            c->st.hits++;
            ready[(*nready)++] = j;
        } else {
            int best = -1;
            for (int i = 0; i < c->n_slots; i++) {
                if (c->last_use[i] == turn) continue;
                if (c->owner[i] < 0) {
                    best = i;
                    break;
                }
                if (best < 0 || evicts_before(c, i, best)) best = i;
            }
            s = best; /* there is one: this turn holds fewer than n_slots */
            if (c->owner[s] >= 0) {
                const int ol = c->owner[s] / E, oe = c->owner[s] % E;
                clear_expert(&c->layers[ol].experts[oe]);
                c->slot_of[c->owner[s]] = -1;
                c->owner[s] = -1;
                c->st.evictions++;
            }
            c->miss[nmiss] = (struct cb_miss){e, s, j, 3};
            for (int k = 0; k < 3; k++) {
                cb_read *r = &c->rd[3 * nmiss + k];
                memset(r, 0, sizeof *r);
                r->m = &c->miss[nmiss];
                r->k = k;
                r->t = cb_mf_slot(c->mf, (uint64_t)L->index, 1 + 3 * (uint64_t)e + (uint64_t)k);
                cb_mf_tensor_at(c->mf, r->t, &r->te);
                r->state = R_WAIT;
            }
            nmiss++;
        }
        c->last_use[s] = turn;
        held++;
    }
    *j1 = j;
    c->nmiss = c->misses_left = nmiss;
    c->nrd = 3 * nmiss;
    c->rd_next = 0;
    c->turn_layer = L;
    if (c->n_io && c->io_pid != getpid()) { /* a forked child: start its own */
        pthread_mutex_init(&c->qlock, NULL);
        pthread_cond_init(&c->qcv, NULL);
        pthread_cond_init(&c->dcv, NULL);
        c->io_want = c->n_io;
        c->n_io = 0;
    }
    if (nmiss) {
        if (c->io_want > c->n_io) start_io(c);
        start_reads(c);
    }
    return COLIBRI_OK;
}

/* Read tensor r (when the call's threads read), check its CRC on its first read, and pack
 * it into its slot. Several threads at once, on different reads: it writes r, the slot's
 * part and the expert's matrix. */
static void place(const cb_cache *c, colibri_layer *L, cb_read *r, int do_read) {
    if (do_read) r->err = read_tensor(c, r);
    if (r->err) return;
    if (c->check_crc && !c->verified[r->t]) {
        r->crc = cb_crc32(0, r->data, (size_t)r->te.nbytes);
        r->checked = 1;
        if (r->crc != r->te.crc32) return;
    }
    cb_expert *x = &L->experts[r->m->e];
    cb_mat *mats[3] = {&x->gate, &x->up, &x->down};
    /* the stored form: data padded to 4, then the scales (FORMAT.md) */
    const float *scales = NULL;
    if (cb_mat_scale_count(c->dtype, r->te.rows, r->te.cols))
        scales = (const float *)(const void *)(r->data + ((cb_mat_data_bytes(c->dtype, r->te.rows, r->te.cols) + 3) &
                                                          ~(size_t)3));
    unsigned char *dst = c->base + (size_t)r->m->s * c->slot_bytes + (size_t)r->k * c->mat_bytes;
    cb_place_mat(L->kernels, c->dtype, r->data, scales, r->te.rows, r->te.cols, dst, mats[r->k]);
}

/* What is wrong with read r, or 0. */
static int read_status(const cb_read *r) {
    if (r->err) return COLIBRI_ERR_IO;
    return r->checked && r->crc != r->te.crc32 ? COLIBRI_ERR_FORMAT : COLIBRI_OK;
}

static int read_fail(const cb_cache *c, const cb_read *r) {
    const int L = c->turn_layer->index, e = r->m->e;
    const unsigned long long a = (unsigned long long)r->te.offset, b = a + r->te.nbytes - 1;
    if (r->err)
        return cb_fail(COLIBRI_ERR_IO, "reading tensor[%u] (layer %d, expert %d %s, bytes %llu .. %llu): %s", r->t,
                       L, e, cb_mf_kind_name(r->te.kind), a, b, strerror(r->err));
    return cb_fail(COLIBRI_ERR_FORMAT,
                   "tensor[%u].crc32: stored 0x%08X, but the %s payload of layer %d, expert %d at bytes %llu .. %llu "
                   "has CRC-32 0x%08X (the payload is corrupt)",
                   r->t, r->te.crc32, cb_mf_kind_name(r->te.kind), L, e, a, b, r->crc);
}

int cb_cache_next(cb_cache *c, int *ready, int *nready, int nt) {
    colibri_layer *L = c->turn_layer;
    const int E = c->n_experts;
    *nready = 0;
    if (!c->misses_left) return COLIBRI_OK;
    const double t0 = cb_now_s();
    while (c->misses_left && !*nready) {
        /* a batch: the tensors read by now (waiting for one), or without I/O threads the
         * ones with buffers, which the call's threads read */
        int nb = 0;
        if (c->n_io) {
            pthread_mutex_lock(&c->qlock);
            const double w0 = cb_now_s();
            for (;;) {
                for (int i = 0; i < c->rd_next; i++)
                    if (c->rd[i].state == R_READ) c->batch[nb++] = &c->rd[i];
                if (nb) break;
                pthread_cond_wait(&c->dcv, &c->qlock);
            }
            c->st.wait_seconds += cb_now_s() - w0;
            pthread_mutex_unlock(&c->qlock);
        } else {
            for (int i = 0; i < c->rd_next; i++)
                if (c->rd[i].state == R_QUEUED) c->batch[nb++] = &c->rd[i];
        }
        const int do_read = !c->n_io, n = nt < nb ? nt : nb;
#pragma omp parallel for num_threads(n) schedule(dynamic, 1)
        for (int i = 0; i < nb; i++) place(c, L, c->batch[i], do_read);
        for (int i = 0; i < nb; i++) {
            cb_read *r = c->batch[i];
            struct cb_miss *m = r->m;
            r->state = R_DONE;
            c->free_buf[c->n_free++] = r->buf;
            r->buf = NULL;
            if (!r->err) c->st.bytes_read += r->te.nbytes;
            if (r->checked && r->crc == r->te.crc32) c->verified[r->t] = 1;
            if (--m->left) continue;
            c->misses_left--;
            c->st.misses++;
            const cb_read *mr = &c->rd[3 * (m - c->miss)];
            if (read_status(&mr[0]) || read_status(&mr[1]) || read_status(&mr[2])) {
                clear_expert(&L->experts[m->e]); /* the slot stays free */
                c->last_use[m->s] = 0;
                continue;
            }
            const size_t key = (size_t)L->index * (size_t)E + (size_t)m->e;
            c->owner[m->s] = (int32_t)key;
            c->slot_of[key] = m->s;
            ready[(*nready)++] = m->j;
        }
        start_reads(c);
    }
    c->st.stall_seconds += cb_now_s() - t0;
    if (c->misses_left) return COLIBRI_OK;
    /* all read: the first failure in the experts' order is the call's */
    for (int i = 0; i < c->nrd; i++)
        if (read_status(&c->rd[i])) return read_fail(c, &c->rd[i]);
    return COLIBRI_OK;
}

void cb_cache_stats(const cb_cache *c, colibri_memory_stats *out) {
    *out = c->st;
    size_t n = 0;
    for (int i = 0; i < c->n_slots; i++) n += c->owner[i] >= 0;
    out->resident_bytes = n * c->slot_bytes;
    out->io_threads = c->n_io;
    out->direct_io = c->dfd >= 0;
    out->policy = c->policy;
}
