/* scratch.c — the scratch memory of a forward call (layer, dense matrix, their bf16 forms),
 * held per calling thread and reused by its next calls.
 *
 * Why: a malloc and a free per call let glibc put the next call's buffers of other sizes
 * (the prepared panels follow the routing) on fresh pages, so a process's resident memory
 * grew call after call before it settled (Qwen3 prefill512 int8: about 6 MB a call for six
 * calls), which the tuner's leak check read as a leak, and each call paid its page faults.
 * Now a thread's buffers grow to its largest call and stay; they go when the thread exits
 * or calls colibri_release_scratch(). They are mapped, not malloc'd, so that going gives
 * the memory back to the system at once, whatever glibc's thresholds and arenas. */
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <sys/mman.h>

#include "colibri.h"
#include "internal.h"

typedef struct {
    void *p[CB_SCRATCH_SLOTS];
    size_t n[CB_SCRATCH_SLOTS];
} scratch_set;

static pthread_key_t key;
static pthread_once_t once = PTHREAD_ONCE_INIT;
static int key_ok;

static void set_free(void *v) {
    scratch_set *s = v;
    if (!s) return;
    for (int i = 0; i < CB_SCRATCH_SLOTS; ++i)
        if (s->p[i]) munmap(s->p[i], s->n[i]);
    free(s);
}

static void make_key(void) { key_ok = pthread_key_create(&key, set_free) == 0; }

/* A library unloaded while threads still hold sets must not leave them a destructor in
 * unmapped code (the binding never unloads it; another loader might). */
__attribute__((destructor)) static void drop_key(void) {
    if (!key_ok) return;
    set_free(pthread_getspecific(key));
    pthread_key_delete(key);
    key_ok = 0;
}

void *cb_scratch(int slot, size_t bytes) {
    if (slot < 0 || slot >= CB_SCRATCH_SLOTS || bytes > SIZE_MAX / 2) return NULL;
    pthread_once(&once, make_key);
    if (!key_ok) return NULL;
    scratch_set *s = pthread_getspecific(key);
    if (!s) {
        s = calloc(1, sizeof *s);
        if (!s) return NULL;
        if (pthread_setspecific(key, s)) {
            free(s);
            return NULL;
        }
    }
    if (bytes <= s->n[slot]) return s->p[slot];
    if (s->p[slot]) munmap(s->p[slot], s->n[slot]);
    s->p[slot] = NULL;
    s->n[slot] = 0;
    /* an eighth more than asked: sizes that follow the routing then settle in a few calls */
    const size_t page = 4096, want = (bytes + bytes / 8 + page) / page * page;
    void *p = mmap(NULL, want, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) return NULL;
    s->p[slot] = p;
    s->n[slot] = want;
    return p;
}

void colibri_release_scratch(void) {
    pthread_once(&once, make_key);
    if (!key_ok) return;
    set_free(pthread_getspecific(key));
    pthread_setspecific(key, NULL);
}
