/* infer_model MODEL INPUT T OUTPUT [BUDGET [decode|all [IO_THREADS [READ_DEPTH [DIRECT_IO [POLICY]]]]]]:
 * run a Colibri model file on T tokens with nothing but colibri.h (colibri_load_model_with,
 * colibri_infer, colibri_free_model). INPUT holds T x hidden float32 values; OUTPUT receives
 * as many. BUDGET (bytes, 0 = none) loads the model under that memory budget, read by
 * IO_THREADS threads through READ_DEPTH buffers, with O_DIRECT or not (DIRECT_IO 1 or -1),
 * evicting by POLICY (1 LRU, 2 LFU) (colibri_load_options; 0 = the defaults);
 * `decode` runs the tokens one call each, `all` (the default) one call for all. With a
 * BUDGET (0 too), one line of JSON on stdout: the peak resident set, the load's and the
 * calls' wall time (load_seconds, infer_seconds) and the model's memory stats.
 * Built natively and cross-built for each Arm profile: `python -m tuner verify` and
 * tests/colibri_build/test_arm_emulated.py run it under qemu-user against the NumPy
 * reference and against the native library; tests/engine/test_memory_limit.py runs it in a
 * memory cgroup. Exit status: 0 done, 1 a Colibri or file error (on stderr), 2 usage. */
#define _POSIX_C_SOURCE 200809L /* clock_gettime */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>

/* The peak resident set of this program: VmHWM (Linux), which starts at the exec; rusage's
 * ru_maxrss would count a forking parent's pages from before it. */
static long long peak_rss_bytes(void) {
    FILE *f = fopen("/proc/self/status", "r");
    char line[256];
    long long kb = -1;
    while (f && fgets(line, sizeof line, f))
        if (!strncmp(line, "VmHWM:", 6)) kb = atoll(line + 6);
    if (f) fclose(f);
    if (kb < 0) {
        struct rusage ru;
        getrusage(RUSAGE_SELF, &ru);
        kb = ru.ru_maxrss;
    }
    return kb * 1024;
}

#include "colibri.h"

static int fail(const char *what) {
    const char *why = colibri_last_error();
    fprintf(stderr, "infer_model: %s: %s\n", what, why && *why ? why : "(no detail)");
    return 1;
}

int main(int argc, char **argv) {
    if (argc < 5 || argc > 11 || (argc >= 7 && strcmp(argv[6], "decode") != 0 && strcmp(argv[6], "all") != 0)) {
        fprintf(stderr, "usage: infer_model MODEL INPUT T OUTPUT [BUDGET [decode|all [IO_THREADS [READ_DEPTH "
                        "[DIRECT_IO [POLICY]]]]]]\n");
        return 2;
    }
    colibri_load_options opts;
    memset(&opts, 0, sizeof opts);
    if (argc >= 6) {
        char *end;
        opts.memory_budget = (size_t)strtoull(argv[5], &end, 10);
        if (*end || argv[5][0] == '-') {
            fprintf(stderr, "usage: BUDGET must be a byte count, got '%s'\n", argv[5]);
            return 2;
        }
    }
    for (int i = 7; i < argc; i++) {
        char *end;
        const long v = strtol(argv[i], &end, 10);
        if (*end || !*argv[i]) {
            fprintf(stderr, "usage: %s must be an integer, got '%s'\n",
                    i == 7 ? "IO_THREADS" : i == 8 ? "READ_DEPTH" : i == 9 ? "DIRECT_IO" : "POLICY", argv[i]);
            return 2;
        }
        *(i == 7 ? &opts.io_threads : i == 8 ? &opts.read_depth : i == 9 ? &opts.direct_io : &opts.policy) = (int)v;
    }
    const int decode = argc >= 7 && !strcmp(argv[6], "decode");
    const int T = atoi(argv[3]);
    if (T < 1) {
        fprintf(stderr, "usage: T must be a positive token count, got '%s'\n", argv[3]);
        return 2;
    }
    struct timespec l0, l1;
    clock_gettime(CLOCK_MONOTONIC, &l0);
    colibri_model *m = colibri_load_model_with(argv[1], &opts);
    if (!m) return fail("colibri_load_model");
    clock_gettime(CLOCK_MONOTONIC, &l1);
    const size_t n = (size_t)T * (size_t)colibri_model_hidden(m);
    float *x = malloc(n * sizeof *x), *y = malloc(n * sizeof *y);
    int rc = 1;
    FILE *f = NULL;
    if (!x || !y) {
        fprintf(stderr, "infer_model: out of memory\n");
        goto done;
    }
    if (!(f = fopen(argv[2], "rb")) || fread(x, sizeof *x, n, f) != n) {
        fprintf(stderr, "infer_model: cannot read %zu floats from %s\n", n, argv[2]);
        goto done;
    }
    fclose(f);
    f = NULL;
    const size_t H = (size_t)colibri_model_hidden(m);
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    for (int t = 0; t < (decode ? T : 1); t++)
        if (colibri_infer(m, x + (decode ? (size_t)t * H : 0), y + (decode ? (size_t)t * H : 0), decode ? 1 : T) !=
            COLIBRI_OK) {
            rc = fail("colibri_infer");
            goto done;
        }
    clock_gettime(CLOCK_MONOTONIC, &t1);
    if (argc >= 6) {
        colibri_memory_stats st;
        if (colibri_model_stats(m, &st) != COLIBRI_OK) {
            rc = fail("colibri_model_stats");
            goto done;
        }
        printf("{\"peak_rss_bytes\": %lld, \"load_seconds\": %.6f, \"infer_seconds\": %.6f, \"hits\": %llu, "
               "\"misses\": %llu, "
               "\"evictions\": %llu, \"bytes_read\": %llu, \"stall_seconds\": %.6f, \"wait_seconds\": %.6f, "
               "\"resident_bytes\": %zu, \"budget_bytes\": %zu, \"cache_slots\": %d, \"staging_bytes\": %zu, "
               "\"io_threads\": %d, \"direct_io\": %d, \"policy\": %d}\n",
               peak_rss_bytes(), (double)(l1.tv_sec - l0.tv_sec) + 1e-9 * (double)(l1.tv_nsec - l0.tv_nsec),
               (double)(t1.tv_sec - t0.tv_sec) + 1e-9 * (double)(t1.tv_nsec - t0.tv_nsec),
               (unsigned long long)st.hits, (unsigned long long)st.misses, (unsigned long long)st.evictions,
               (unsigned long long)st.bytes_read, st.stall_seconds, st.wait_seconds, st.resident_bytes,
               st.budget_bytes, st.cache_slots, st.staging_bytes, st.io_threads, st.direct_io, st.policy);
    }
    if (!(f = fopen(argv[4], "wb")) || fwrite(y, sizeof *y, n, f) != n) {
        fprintf(stderr, "infer_model: cannot write %s\n", argv[4]);
        goto done;
    }
    rc = 0;
done:
    if (f && fclose(f) != 0 && rc == 0) rc = 1;
    free(x);
    free(y);
    colibri_free_model(m);
    return rc;
}
