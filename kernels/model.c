/* model.c — load a Colibri model file (FORMAT.md) and run the layer stack.
 *
 * The file is mapped read-only and used in place: each layer's matrices point
 * into the mapping, nothing is copied. Loading validates the whole layout
 * (model_file.c) and then checks the CRC-32 of every tensor a slot names, once
 * per tensor even when several slots share it, in parallel across tensors. */
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "expert_cache.h"
#include "internal.h"
#include "kernels.h"
#include "model_file.h"

struct colibri_model {
    void *map;          /* the file's read-only mapping (NULL for an empty file) */
    size_t map_len;
    int n_layers, hidden;
    colibri_layer *layers; /* [n_layers], borrowed views into the mapping */
    /* with a memory budget: the file, open for the cache's reads, and the view it reads by */
    int fd;
    cb_model_file mf;
    cb_cache *cache;
    size_t resident_bytes; /* the routers and shared experts (with a cache), or every weight */
    size_t budget;
};

/* Maps path read-only; *map is NULL (and *len 0) for an empty file. *keep_fd: NULL closes
 * the file, else receives its descriptor. */
static int map_file(const char *path, void **map, size_t *len, int *keep_fd) {
    *map = NULL;
    *len = 0;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return cb_fail(COLIBRI_ERR_IO, "colibri_load_model: cannot open '%s': %s", path,
                       strerror(errno));
    struct stat st;
    if (fstat(fd, &st) != 0) {
        int e = errno;
        close(fd);
        return cb_fail(COLIBRI_ERR_IO, "colibri_load_model: cannot stat '%s': %s", path, strerror(e));
    }
    if (!S_ISREG(st.st_mode)) {
        close(fd);
        return cb_fail(COLIBRI_ERR_IO, "colibri_load_model: '%s' is not a regular file", path);
    }
    if ((uint64_t)st.st_size > (uint64_t)SIZE_MAX) {
        close(fd);
        return cb_fail(COLIBRI_ERR_IO, "colibri_load_model: '%s' is too large to map", path);
    }
    if (st.st_size > 0) {
        void *p = mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_PRIVATE, fd, 0);
        if (p == MAP_FAILED) {
            int e = errno;
            close(fd);
            return cb_fail(e == ENOMEM ? COLIBRI_ERR_NOMEM : COLIBRI_ERR_IO,
                           "colibri_load_model: cannot map '%s' (%llu bytes): %s", path,
                           (unsigned long long)st.st_size, strerror(e));
        }
        *map = p;
        *len = (size_t)st.st_size;
    }
    if (keep_fd) *keep_fd = fd;
    else close(fd); /* the mapping keeps the file alive */
    return COLIBRI_OK;
}

/* Checks the CRC of every tensor some slot names, each once; without the routed experts'
 * where `experts` is 0 (a budgeted model checks those on first read). */
static int verify_referenced(const cb_model_file *mf, int experts) {
    const uint32_t n = mf->h.n_tensors;
    unsigned char *used = calloc(n, 1);
    uint32_t *list = malloc((size_t)n * sizeof *list);
    if (!used || !list) {
        free(used);
        free(list);
        return cb_fail(COLIBRI_ERR_NOMEM, "colibri_load_model: out of memory for %u tensor flags", n);
    }
    for (uint64_t l = 0; l < mf->h.n_layers; l++)
        for (uint64_t j = 0; j < mf->slots_per_layer; j++) {
            if (!experts && j >= 1 && j <= 3 * (uint64_t)mf->h.n_experts) continue;
            uint32_t t = cb_mf_slot(mf, l, j);
            if (t != CB_MF_ABSENT)
                used[t] = 1;
        }
    long m = 0;
    for (uint32_t t = 0; t < n; t++)
        if (used[t])
            list[m++] = t;
    /* used[] is reused as the per-tensor failure flag. */
    memset(used, 0, n);
#ifdef _OPENMP
#pragma omp parallel for schedule(dynamic, 1)
#endif
    for (long i = 0; i < m; i++) {
        char msg[8];
        if (cb_mf_verify_tensor(mf, list[i], msg, sizeof msg) != 0)
            used[list[i]] = 1;
    }
    int rc = COLIBRI_OK;
    for (long i = 0; i < m; i++)
        if (used[list[i]]) { /* the first bad tensor in table order, whatever the threads did */
            char msg[480];
            cb_mf_verify_tensor(mf, list[i], msg, sizeof msg);
            rc = cb_fail(COLIBRI_ERR_FORMAT, "%s", msg);
            break;
        }
    free(used);
    free(list);
    return rc;
}

static cb_mat mat_at(const cb_model_file *mf, uint32_t t) {
    cb_mf_tensor e;
    cb_mf_tensor_at(mf, t, &e);
    const unsigned char *w = cb_mf_payload(mf, &e);
    cb_mat m = {w, NULL, (int)e.rows, (int)e.cols, NULL, 0};
    if (e.dtype == COLIBRI_INT8 || e.dtype == COLIBRI_INT4) /* data padded to 4, then f32 scales */
        m.scales = (const float *)(const void *)(w + ((cb_mat_data_bytes((int)e.dtype, e.rows, e.cols) + 3) &
                                                      ~(uint64_t)3));
    return m;
}

static size_t tensor_nbytes(const cb_model_file *mf, uint32_t t) {
    cb_mf_tensor e;
    cb_mf_tensor_at(mf, t, &e);
    return (size_t)e.nbytes;
}

/* The whole pages of [p, p + n) in the read-only file mapping out of this process's
 * resident set: clean pages, read again from the file should anything touch them. */
static void drop_pages(const void *p, size_t n) {
    const uintptr_t pg = (uintptr_t)sysconf(_SC_PAGESIZE);
    const uintptr_t a = ((uintptr_t)p + pg - 1) / pg * pg, b = ((uintptr_t)p + n) / pg * pg;
    if (b > a) madvise((void *)a, b - a, MADV_DONTNEED);
}

/* Packs the layer's expert matrices into a pool of its own where its kernel table packs
 * the dtype (cbk_kernels.pack): once, at load; their mapped pages then leave the resident
 * set (w is NULL: no kernel of the table reads the stored layout). */
/* The layer's i-th expert matrix: gate, up, down of expert i / 3, the shared expert last. */
static cb_mat *mat_of(colibri_layer *L, int i) {
    cb_expert *x = i / 3 < L->n_experts ? &L->experts[i / 3] : &L->shared;
    return i % 3 == 0 ? &x->gate : i % 3 == 1 ? &x->up : &x->down;
}

/* routed: 0 packs the shared expert alone (a budgeted model's routed experts go to its cache) */
static int pack_layer(colibri_layer *L, int routed) {
    const cbk_kernels *K = L->kernels;
    const int E = L->n_experts;
    const int i0 = routed ? 0 : 3 * E, n = 3 * (E + L->has_shared);
    size_t total = 0;
    for (int i = i0; i < n; i++) {
        const cb_mat *m = mat_of(L, i);
        const size_t pb = cbk_part_of(K, L->dtype)->pack_bytes(L->dtype, m->rows, m->cols);
        if (!pb) return COLIBRI_OK; /* one dtype per layer: none of its matrices packs */
        total += (pb + 63) / 64 * 64;
    }
    if (!total) return COLIBRI_OK;
    L->pool = colibri_pool_create(total, CB_DEFAULT_HUGEPAGES, -1);
    if (!L->pool)
        return cb_fail(COLIBRI_ERR_NOMEM, "colibri_load_model: out of memory for %zu bytes of packed weights",
                       total);
    L->page_kind = colibri_pool_page_kind(L->pool);
    for (int i = i0; i < n; i++) { /* the pool hands out memory in order: places first */
        cb_mat *m = mat_of(L, i);
        m->pk = colibri_pool_alloc(L->pool, cbk_part_of(K, L->dtype)->pack_bytes(L->dtype, m->rows, m->cols), 64);
        if (!m->pk) return cb_fail(COLIBRI_ERR_NOMEM, "colibri_load_model: packed weights overflow their pool");
    }
#pragma omp parallel for schedule(dynamic)
    for (int i = i0; i < n; i++) {
        cb_mat *m = mat_of(L, i);
        cbk_part_of(K, L->dtype)->pack(L->dtype, m->w, m->scales, m->rows, m->cols, (void *)m->pk);
        drop_pages(m->w, cb_mat_data_bytes(L->dtype, (size_t)m->rows, (size_t)m->cols));
        m->w = NULL;
    }
    return COLIBRI_OK;
}

/* Fills layer l as a borrowed view into the mapping (its packed matrices in a pool). With a
 * cache (cached), the routed experts point nowhere until the cache reads them, and
 * weight_bytes counts the router and shared expert alone. */
static int build_layer(const cb_model_file *mf, uint64_t l, colibri_layer *L, int cached) {
    const cb_mf_header *h = &mf->h;
    const uint64_t E = h->n_experts;
    memset(L, 0, sizeof *L);
    L->hidden = (int)h->hidden;
    L->inter = (int)h->inter;
    L->n_experts = (int)E;
    L->dtype = (int)h->weight_dtype;
    L->kernels = cbk_kernels_for(L->hidden, L->inter);
    L->route.scoring = (int)h->scoring;
    L->route.top_k = (int)h->top_k;
    L->route.norm_topk_prob = (int)h->norm_topk_prob;
    L->route.dyn_p = h->dyn_p;
    L->route.k_min = (int)h->k_min;
    L->route.k_max = (int)h->k_max;
    L->pool = NULL;
    L->page_kind = COLIBRI_PAGES_FILE;
    L->borrowed = 1;
    L->index = (int)l;

    L->experts = calloc(E, sizeof *L->experts);
    if (!L->experts)
        return cb_fail(COLIBRI_ERR_NOMEM, "colibri_load_model: out of memory for %llu experts",
                       (unsigned long long)E);
    size_t bytes = 0;
    uint32_t t = cb_mf_slot(mf, l, 0);
    L->router = (const float *)mat_at(mf, t).w;
    bytes += tensor_nbytes(mf, t);
    for (uint64_t e = 0; e < E; e++) {
        cb_expert *x = &L->experts[e];
        cb_mat *mats[3] = {&x->gate, &x->up, &x->down};
        for (int k = 0; k < 3; k++) {
            t = cb_mf_slot(mf, l, 1 + 3 * e + (uint64_t)k);
            *mats[k] = mat_at(mf, t);
            if (cached) mats[k]->w = NULL, mats[k]->scales = NULL;
            else bytes += tensor_nbytes(mf, t);
        }
        x->inter = (int)h->inter;
    }
    if (h->shared_inter > 0) {
        cb_mat *mats[3] = {&L->shared.gate, &L->shared.up, &L->shared.down};
        for (int k = 0; k < 3; k++) {
            t = cb_mf_slot(mf, l, 1 + 3 * E + (uint64_t)k);
            *mats[k] = mat_at(mf, t);
            bytes += tensor_nbytes(mf, t);
        }
        L->shared.inter = (int)h->shared_inter;
        L->has_shared = 1;
        if (h->shared_gated) {
            t = cb_mf_slot(mf, l, 4 + 3 * E);
            L->shared_expert_gate = (const float *)mat_at(mf, t).w;
            bytes += tensor_nbytes(mf, t);
        }
    }
    L->weight_bytes = bytes;
    return pack_layer(L, !cached);
}

void colibri_free_model(colibri_model *m) {
    if (!m)
        return;
    if (m->layers) {
        for (int i = 0; i < m->n_layers; i++)
            cb_layer_destroy(&m->layers[i]); /* frees experts[] and a packed layer's pool */
        free(m->layers);
    }
    cb_cache_free(m->cache);
    if (m->fd >= 0)
        close(m->fd);
    if (m->map)
        munmap(m->map, m->map_len);
    free(m);
}

colibri_model *colibri_load_model(const char *path) { return colibri_load_model_with(path, NULL); }

colibri_model *colibri_load_model_with(const char *path, const colibri_load_options *opts) {
    cb_clear_error();
    if (!path) {
        cb_fail(COLIBRI_ERR_INVALID, "colibri_load_model: path is NULL");
        return NULL;
    }
    if (opts && (opts->io_threads < -1 || opts->io_threads > 256 || opts->read_depth < 0 || opts->read_depth > 4096 ||
                 opts->direct_io < -1 || opts->direct_io > 1 || opts->policy < 0 || opts->policy > COLIBRI_CACHE_LFU)) {
        cb_fail(COLIBRI_ERR_INVALID, "colibri_load_model: io_threads must be in [-1, 256], read_depth in [0, 4096], "
                "direct_io in [-1, 1] and policy 0, COLIBRI_CACHE_LRU (1) or COLIBRI_CACHE_LFU (2), got %d, %d, %d "
                "and %d", opts->io_threads, opts->read_depth, opts->direct_io, opts->policy);
        return NULL;
    }
    colibri_model *m = calloc(1, sizeof *m);
    if (!m) {
        cb_fail(COLIBRI_ERR_NOMEM, "colibri_load_model: out of memory");
        return NULL;
    }
    m->fd = -1;
    const size_t budget = opts ? opts->memory_budget : 0;
    m->budget = budget;
    if (map_file(path, &m->map, &m->map_len, budget ? &m->fd : NULL) != COLIBRI_OK) {
        free(m);
        return NULL;
    }
    cb_model_file *mf = &m->mf; /* the model's own: its cache reads by it */
    if (cb_mf_parse(mf, m->map, m->map_len) != 0) {
        cb_fail(COLIBRI_ERR_FORMAT, "%s", mf->err);
        colibri_free_model(m);
        return NULL;
    }
    /* Routing config: model_file.c checked each field; the engine's own check
     * is the final word on what the router accepts. */
    colibri_route_config rc = {(int)mf->h.scoring, (int)mf->h.top_k, (int)mf->h.norm_topk_prob,
                               mf->h.dyn_p, (int)mf->h.k_min, (int)mf->h.k_max};
    if (cb_route_config_check(&rc, (int)mf->h.n_experts) != COLIBRI_OK) {
        char why[400];
        strncpy(why, colibri_last_error(), sizeof why - 1);
        why[sizeof why - 1] = '\0';
        cb_fail(COLIBRI_ERR_FORMAT, "header routing fields (bytes 28 .. 51): %s", why);
        colibri_free_model(m);
        return NULL;
    }
    const int check_crc = !(opts && opts->skip_crc);
    if (check_crc && verify_referenced(mf, !budget) != COLIBRI_OK) {
        colibri_free_model(m);
        return NULL;
    }
    m->n_layers = (int)mf->h.n_layers;
    m->hidden = (int)mf->h.hidden;
    m->layers = calloc((size_t)m->n_layers, sizeof *m->layers);
    if (!m->layers) {
        cb_fail(COLIBRI_ERR_NOMEM, "colibri_load_model: out of memory for %d layers", m->n_layers);
        colibri_free_model(m);
        return NULL;
    }
    for (int l = 0; l < m->n_layers; l++) {
        if (build_layer(mf, (uint64_t)l, &m->layers[l], budget > 0) != COLIBRI_OK) {
            colibri_free_model(m);
            return NULL;
        }
        m->resident_bytes += m->layers[l].weight_bytes;
    }
    if (budget && m->n_layers > 0) {
        if (budget < m->resident_bytes) {
            cb_fail(COLIBRI_ERR_INVALID, "colibri_load_model: memory_budget %zu bytes is under the %zu bytes of "
                    "routers and shared experts, which stay resident", budget, m->resident_bytes);
            colibri_free_model(m);
            return NULL;
        }
        m->cache = cb_cache_create(mf, m->fd, m->layers, budget - m->resident_bytes, opts);
        if (!m->cache) {
            colibri_free_model(m);
            return NULL;
        }
        for (int l = 0; l < m->n_layers; l++) m->layers[l].cache = m->cache;
    }
    return m;
}

int colibri_model_stats(const colibri_model *m, colibri_memory_stats *out) {
    cb_clear_error();
    if (!m || !out) return cb_fail(COLIBRI_ERR_INVALID, "colibri_model_stats: model and out must not be NULL");
    memset(out, 0, sizeof *out);
    if (m->cache) cb_cache_stats(m->cache, out);
    out->resident_bytes += m->resident_bytes;
    out->budget_bytes = m->budget;
    return COLIBRI_OK;
}

int colibri_infer(colibri_model *m, const float *input, float *output, int seq_len) {
    cb_clear_error();
    if (!m)
        return cb_fail(COLIBRI_ERR_INVALID, "colibri_infer: model is NULL");
    if (!input || !output)
        return cb_fail(COLIBRI_ERR_INVALID, "colibri_infer: input and output must not be NULL");
    if (seq_len <= 0)
        return cb_fail(COLIBRI_ERR_INVALID, "colibri_infer: seq_len %d must be > 0", seq_len);
    const size_t H = (size_t)m->hidden;
    if ((size_t)seq_len > SIZE_MAX / sizeof(float) / H)
        return cb_fail(COLIBRI_ERR_INVALID, "colibri_infer: seq_len %d x hidden %zu is too large",
                       seq_len, H);
    const size_t n = (size_t)seq_len * H;
    float *tmp = NULL;
    if (posix_memalign((void **)&tmp, 64, n * sizeof(float)) != 0)
        return cb_fail(COLIBRI_ERR_NOMEM, "colibri_infer: out of memory for %zu floats", n);
    if (output != input)
        memmove(output, input, n * sizeof(float)); /* memmove: they may overlap */
    /* h = h + moe(h), with h living in output; tmp never overlaps it. */
    for (int l = 0; l < m->n_layers; l++) {
        int st = colibri_layer_forward(&m->layers[l], output, tmp, seq_len, 0);
        if (st != COLIBRI_OK) {
            free(tmp);
            return st;
        }
        for (size_t i = 0; i < n; i++)
            output[i] += tmp[i];
    }
    free(tmp);
    return COLIBRI_OK;
}

int colibri_model_n_layers(const colibri_model *m) {
    if (!m)
        return cb_fail(COLIBRI_ERR_INVALID, "colibri_model_n_layers: model is NULL"), -1;
    return m->n_layers;
}

int colibri_model_hidden(const colibri_model *m) {
    if (!m)
        return cb_fail(COLIBRI_ERR_INVALID, "colibri_model_hidden: model is NULL"), -1;
    return m->hidden;
}

colibri_layer *colibri_model_layer(colibri_model *m, int index) {
    if (!m) {
        cb_fail(COLIBRI_ERR_INVALID, "colibri_model_layer: model is NULL");
        return NULL;
    }
    if (index < 0 || index >= m->n_layers) {
        cb_fail(COLIBRI_ERR_INVALID, "colibri_model_layer: index %d out of range [0, %d)", index,
                m->n_layers);
        return NULL;
    }
    return &m->layers[index];
}
