/* pool.c — one page-aligned arena for all expert weights, bump-allocated.
 *
 * Huge pages when asked, for pools of at least one huge page: an explicit MAP_HUGETLB
 * mapping first (needs a reserved hugetlb pool), else madvise(MADV_HUGEPAGE) for
 * transparent huge pages, else normal pages. The pool records which one it got.
 * Why it matters: decode streams each expert's weights once per token, and on 4 KiB
 * pages its reads stall on page walks the hardware prefetcher cannot hide
 * (docs/huge-pages.md has the figures). */
#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "internal.h"

#ifndef MAP_HUGETLB
#define MAP_HUGETLB 0x40000
#endif
#ifndef MADV_HUGEPAGE
#define MADV_HUGEPAGE 14
#endif
#define CB_HUGE_PAGE (2u << 20)
#define CB_MPOL_BIND 2

struct colibri_pool {
    unsigned char *base;
    size_t capacity; /* usable bytes */
    size_t mapped;   /* bytes mapped (rounded to the page size used) */
    size_t used;
    int page_kind;
    int numa_node;
};

static size_t round_up(size_t v, size_t a) { return (v + a - 1) / a * a; }

/* mbind through the raw syscall: libnuma is not a dependency. */
static int bind_to_node(void *addr, size_t len, int node) {
#ifdef SYS_mbind
    unsigned long mask[16];
    if (node < 0 || node >= (int)(sizeof mask * 8)) {
        errno = EINVAL; /* a node the mask cannot name */
        return -1;
    }
    memset(mask, 0, sizeof mask);
    mask[node / (8 * sizeof(unsigned long))] |= 1ul << (node % (8 * sizeof(unsigned long)));
    return (int)syscall(SYS_mbind, addr, len, CB_MPOL_BIND, mask, sizeof mask * 8, 0);
#else
    (void)addr; (void)len; (void)node;
    errno = ENOSYS;
    return -1;
#endif
}

/* len bytes starting on a huge-page boundary, with THP advice: only the aligned 2 MiB
 * ranges of a mapping can be huge pages, and the kernel aligns a mapping only where its
 * length is a multiple of 2 MiB. The tail past the last boundary stays on normal pages,
 * so no memory is rounded up. *kind says whether the advice was taken. */
static void *map_thp(size_t len, int *kind) {
    unsigned char *m = mmap(NULL, len + CB_HUGE_PAGE, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (m == MAP_FAILED) return MAP_FAILED;
    unsigned char *a = (unsigned char *)round_up((size_t)(uintptr_t)m, CB_HUGE_PAGE);
    if (a > m) munmap(m, (size_t)(a - m));
    munmap(a + len, (size_t)(m + len + CB_HUGE_PAGE - (a + len)));
    if (madvise(a, len, MADV_HUGEPAGE) == 0) *kind = COLIBRI_PAGES_THP;
    return a;
}

colibri_pool *colibri_pool_create(size_t capacity, int hugepages, int numa_node) {
    cb_clear_error();
    if (capacity == 0) {
        cb_fail(COLIBRI_ERR_INVALID, "pool capacity must be > 0");
        return NULL;
    }
    if (hugepages != COLIBRI_HUGEPAGES_OFF && hugepages != COLIBRI_HUGEPAGES_AUTO) {
        cb_fail(COLIBRI_ERR_INVALID, "hugepages must be 0 (off) or 1 (auto), got %d", hugepages);
        return NULL;
    }
    if (capacity > SIZE_MAX - CB_HUGE_PAGE) {
        cb_fail(COLIBRI_ERR_INVALID, "pool capacity %zu is too large", capacity);
        return NULL;
    }
    colibri_pool *p = calloc(1, sizeof *p);
    if (!p) {
        cb_fail(COLIBRI_ERR_NOMEM, "out of memory for the pool descriptor");
        return NULL;
    }
    void *mem = MAP_FAILED;
    int kind = COLIBRI_PAGES_NORMAL;
    size_t len = round_up(capacity, (size_t)sysconf(_SC_PAGESIZE));
    /* under one huge page there is nothing to gain, and hugetlb would round it up */
    if (hugepages == COLIBRI_HUGEPAGES_AUTO && capacity >= CB_HUGE_PAGE) {
        size_t hlen = round_up(capacity, CB_HUGE_PAGE);
        mem = mmap(NULL, hlen, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_HUGETLB, -1, 0);
        if (mem != MAP_FAILED) {
            kind = COLIBRI_PAGES_HUGETLB;
            len = hlen;
        } else {
            mem = map_thp(len, &kind);
        }
    } else {
        mem = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    }
    if (mem == MAP_FAILED) {
        free(p);
        cb_fail(COLIBRI_ERR_NOMEM, "mmap of a %zu-byte pool failed: %s", len, strerror(errno));
        return NULL;
    }
    if (numa_node >= 0 && bind_to_node(mem, len, numa_node) != 0) {
        int e = errno;
        munmap(mem, len);
        free(p);
        cb_fail(COLIBRI_ERR_INVALID, "cannot bind the pool to NUMA node %d: %s", numa_node, strerror(e));
        return NULL;
    }
    p->base = mem;
    p->capacity = capacity;
    p->mapped = len;
    p->page_kind = kind;
    p->numa_node = numa_node;
    return p;
}

void *colibri_pool_alloc(colibri_pool *pool, size_t bytes, size_t align) {
    cb_clear_error();
    if (!pool) {
        cb_fail(COLIBRI_ERR_INVALID, "pool is NULL");
        return NULL;
    }
    if (align == 0) align = 64;
    if (align & (align - 1)) {
        cb_fail(COLIBRI_ERR_INVALID, "alignment %zu is not a power of two", align);
        return NULL;
    }
    size_t start = round_up(pool->used, align);
    if (start < pool->used || start > pool->capacity || bytes > pool->capacity - start) {
        cb_fail(COLIBRI_ERR_NOMEM, "pool exhausted: %zu bytes asked, %zu of %zu used", bytes,
                pool->used, pool->capacity);
        return NULL;
    }
    pool->used = start + bytes;
    return pool->base + start;
}

/* The getters return 0 or -1 for a NULL pool, with a message. */
size_t colibri_pool_used(const colibri_pool *pool) {
    if (!pool) return cb_fail(COLIBRI_ERR_INVALID, "colibri_pool_used: pool is NULL"), 0;
    return pool->used;
}

size_t colibri_pool_capacity(const colibri_pool *pool) {
    if (!pool) return cb_fail(COLIBRI_ERR_INVALID, "colibri_pool_capacity: pool is NULL"), 0;
    return pool->capacity;
}

int colibri_pool_page_kind(const colibri_pool *pool) {
    if (!pool) return cb_fail(COLIBRI_ERR_INVALID, "colibri_pool_page_kind: pool is NULL"), -1;
    return pool->page_kind;
}

int colibri_pool_numa_node(const colibri_pool *pool) {
    if (!pool) return cb_fail(COLIBRI_ERR_INVALID, "colibri_pool_numa_node: pool is NULL"), -1;
    return pool->numa_node;
}

void colibri_pool_free(colibri_pool *pool) {
    if (!pool) return;
    munmap(pool->base, pool->mapped);
    free(pool);
}
