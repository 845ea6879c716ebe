/* claim.c — work claimed at run time by the threads of a layer call (layer.c's run_turn and
 * run_decode_claimed) and of a dense decode (dense.c): items in a list, each taken by
 * exactly one thread.
 *
 * A static split gives every thread the same work, yet on a shared machine one thread
 * often runs slower (a vCPU that also takes interrupts, a neighbour on its core) and the
 * others wait for it. Here each thread walks forward from where a static split would start
 * it, so it mostly streams the weights a static split would give it, one after another;
 * when it meets an item that is taken (the next thread's start, or a thread that came from
 * the end), it takes what is left from the end of the list backward. */
#include "internal.h"

int cb_walk_next(int *taken, int n, cb_walk *w) {
    if (!w->back) {
        if (w->next < n && !__atomic_exchange_n(&taken[w->next], 1, __ATOMIC_RELAXED)) return w->next++;
        w->back = 1, w->next = n - 1;
    }
    for (; w->next >= 0; --w->next)
        if (!__atomic_load_n(&taken[w->next], __ATOMIC_RELAXED) &&
            !__atomic_exchange_n(&taken[w->next], 1, __ATOMIC_RELAXED))
            return w->next--;
    return -1;
}

int cb_chunk_rows(long per_row) {
    const long r = (CB_ITEM_WEIGHTS + per_row - 1) / (per_row > 0 ? per_row : 1);
    return (int)((r + 15) / 16 * 16);
}

int cb_prefill_chunk_rows(long per_row, int ntok, int rows, int nt) {
    const long work = per_row * (ntok > CB_PREFILL_STREAM_TOKENS ? ntok : CB_PREFILL_STREAM_TOKENS);
    long r = (CB_PREFILL_ITEM_WORK + work - 1) / (work > 0 ? work : 1);
    const long most = (long)CB_PREFILL_ITEMS_PER_THREAD * (nt > 0 ? nt : 1), fewest = (rows + most - 1) / most;
    if (r < fewest) r = fewest;
    if (r < CB_PREFILL_MIN_ROWS) r = CB_PREFILL_MIN_ROWS;
    return (int)((r + 15) / 16 * 16);
}
