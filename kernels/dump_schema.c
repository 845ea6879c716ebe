/* dump_schema.c — `colibri_dump_schema FILE`: print a Colibri model file's
 * header, slot table summary and tensor table (FORMAT.md).
 *
 * Uses model_file.c directly (no engine), so it also checks every tensor's
 * CRC-32 and prints the table even when some fail, naming each bad tensor.
 * Exit status: 0 valid file, 1 broken file (what is wrong and where goes to
 * stderr: the loader's own message), 2 usage error. */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "internal.h"
#include "model_file.h"

#define U(x) ((unsigned long long)(x))
#define MAX_USERS_SHOWN 6

static const char *prog = "colibri_dump_schema";

static void usage(FILE *f) {
    fprintf(f,
            "usage: %s FILE\n"
            "Print the header, slot table and tensor table of a Colibri model file\n"
            "(format v1 or v2, see FORMAT.md) and check every tensor's CRC-32.\n"
            "Exit status: 0 valid, 1 broken file (the defect and its byte offset on\n"
            "stderr), 2 usage error.\n",
            prog);
}

static void print_header(const cb_model_file *mf) {
    const cb_mf_header *h = &mf->h;
    printf("header (bytes 0 .. 127)\n");
    printf("  %-20s 0x%08X\n", "magic", h->magic);
    printf("  %-20s %u\n", "version", h->version);
    printf("  %-20s %u\n", "header_bytes", h->header_bytes);
    printf("  %-20s %u\n", "n_layers", h->n_layers);
    printf("  %-20s %u\n", "hidden", h->hidden);
    printf("  %-20s %u\n", "inter", h->inter);
    printf("  %-20s %u\n", "n_experts", h->n_experts);
    printf("  %-20s %u%s\n", "top_k", h->top_k, h->dyn_p > 0 ? " (unused: dynamic mode)" : "");
    printf("  %-20s %u (%s)\n", "scoring", h->scoring,
           h->scoring == 0 ? "softmax over all, top-k" : "top-k logits, softmax over k");
    printf("  %-20s %u\n", "norm_topk_prob", h->norm_topk_prob);
    if (h->dyn_p > 0)
        printf("  %-20s %g (dynamic: smallest set with mass >= p)\n", "dyn_p", (double)h->dyn_p);
    else
        printf("  %-20s 0 (fixed top-k)\n", "dyn_p");
    printf("  %-20s %u\n", "k_min", h->k_min);
    printf("  %-20s %u\n", "k_max", h->k_max);
    printf("  %-20s %u (%s)\n", "weight_dtype", h->weight_dtype, cb_mf_dtype_name(h->weight_dtype));
    printf("  %-20s %u%s\n", "shared_inter", h->shared_inter,
           h->shared_inter ? "" : " (no shared expert)");
    printf("  %-20s %u\n", "shared_gated", h->shared_gated);
    printf("  %-20s %u\n", "alignment", h->alignment);
    printf("  %-20s %u\n", "n_tensors", h->n_tensors);
    printf("  %-20s %llu\n", "slot_table_offset", U(h->slot_table_offset));
    printf("  %-20s %llu\n", "tensor_table_offset", U(h->tensor_table_offset));
    printf("  %-20s %llu\n", "data_offset", U(h->data_offset));
    printf("  %-20s %llu\n", "file_size", U(h->file_size));
    printf("  %-20s 0x%08X (ok)\n", "header_crc32", h->header_crc32);
}

/* "L0.e3.gate" style short slot names for the tensor table. */
static void short_slot(uint64_t l, uint64_t j, uint64_t E, char *buf, size_t len) {
    uint32_t kind = cb_mf_slot_kind(j, E);
    static const char *const part[] = {"router", "gate", "up", "down",
                                       "shared.gate", "shared.up", "shared.down", "shared.expert_gate"};
    if (kind >= CB_KIND_GATE && kind <= CB_KIND_DOWN)
        snprintf(buf, len, "L%llu.e%llu.%s", U(l), U((j - 1) / 3), part[kind]);
    else
        snprintf(buf, len, "L%llu.%s", U(l), part[kind]);
}

static void print_slots(const cb_model_file *mf) {
    const uint64_t E = mf->h.n_experts, spl = mf->slots_per_layer;
    printf("\nslot table (byte %llu): %u layers x %llu slots (1 router + 3 x %llu experts + 4 "
           "shared)\n", U(mf->h.slot_table_offset), mf->h.n_layers, U(spl), U(E));
    for (uint64_t l = 0; l < mf->h.n_layers; l++) {
        printf("  layer %llu: router t%u; experts (gate/up/down)", U(l), cb_mf_slot(mf, l, 0));
        uint64_t shown = E < 8 ? E : 8;
        for (uint64_t e = 0; e < shown; e++)
            printf(" t%u/t%u/t%u", cb_mf_slot(mf, l, 1 + 3 * e), cb_mf_slot(mf, l, 2 + 3 * e),
                   cb_mf_slot(mf, l, 3 + 3 * e));
        if (shown < E)
            printf(" ... (%llu more)", U(E - shown));
        printf("; shared");
        static const char *const sname[] = {"gate", "up", "down", "expert_gate"};
        for (int k = 0; k < 4; k++) {
            uint32_t t = cb_mf_slot(mf, l, 1 + 3 * E + (uint64_t)k);
            if (t == CB_MF_ABSENT)
                printf(" %s -", sname[k]);
            else
                printf(" %s t%u", sname[k], t);
        }
        printf("\n");
    }
}

/* Returns the number of tensors whose CRC fails; prints each failure to stderr. */
static int print_tensors(cb_model_file *mf, const char *path) {
    const uint32_t n = mf->h.n_tensors;
    const uint64_t E = mf->h.n_experts, spl = mf->slots_per_layer, ns = mf->n_slots;
    /* Users of each tensor as a CSR list of slot numbers. */
    uint64_t *start = calloc((size_t)n + 1, sizeof *start);
    uint64_t *fill = calloc((size_t)n + 1, sizeof *fill);
    uint64_t *users = malloc((size_t)(ns ? ns : 1) * sizeof *users);
    if (!start || !fill || !users) {
        fprintf(stderr, "%s: out of memory\n", prog);
        exit(1);
    }
    for (uint64_t s = 0; s < ns; s++) {
        uint32_t t = cb_mf_slot(mf, s / spl, s % spl);
        if (t != CB_MF_ABSENT)
            start[t + 1]++;
    }
    for (uint32_t t = 0; t < n; t++)
        start[t + 1] += start[t];
    memcpy(fill, start, ((size_t)n + 1) * sizeof *fill);
    for (uint64_t s = 0; s < ns; s++) {
        uint32_t t = cb_mf_slot(mf, s / spl, s % spl);
        if (t != CB_MF_ABSENT)
            users[fill[t]++] = s;
    }

    printf("\ntensor table (byte %llu): %u entries x 48 bytes\n", U(mf->h.tensor_table_offset), n);
    printf("  %5s  %-18s %-7s %17s %12s %12s  %-10s %-4s %s\n", "index", "kind", "dtype",
           "rows x cols", "offset", "nbytes", "crc32", "", "used by");
    int bad = 0;
    uint64_t stored = 0, referenced = 0;
    char *errs = NULL;
    size_t errs_len = 0;
    for (uint32_t t = 0; t < n; t++) {
        cb_mf_tensor e;
        cb_mf_tensor_at(mf, t, &e);
        char msg[480];
        int ok = cb_mf_verify_tensor(mf, t, msg, sizeof msg) == 0;
        if (!ok) {
            bad++;
            size_t ml = strlen(msg);
            char *grown = realloc(errs, errs_len + ml + 2);
            if (grown) {
                errs = grown;
                memcpy(errs + errs_len, msg, ml);
                errs[errs_len + ml] = '\n';
                errs_len += ml + 1;
                errs[errs_len] = '\0';
            }
        }
        char shape[40], kind[24];
        snprintf(shape, sizeof shape, "%llu x %llu", U(e.rows), U(e.cols));
        snprintf(kind, sizeof kind, "%u %s", e.kind, cb_mf_kind_name(e.kind));
        printf("  %5u  %-18s %-7s %17s %12llu %12llu  0x%08X %-4s", t, kind, cb_mf_dtype_name(e.dtype),
               shape, U(e.offset), U(e.nbytes), e.crc32, ok ? "ok" : "BAD");
        uint64_t nu = start[t + 1] - start[t];
        stored += e.nbytes;
        referenced += e.nbytes * nu;
        if (nu == 0)
            printf(" (unused)");
        for (uint64_t u = 0; u < nu && u < MAX_USERS_SHOWN; u++) {
            char name[48];
            uint64_t s = users[start[t] + u];
            short_slot(s / spl, s % spl, E, name, sizeof name);
            printf(" %s", name);
        }
        if (nu > MAX_USERS_SHOWN)
            printf(" ... (%llu slots in all)", U(nu));
        printf("\n");
    }
    printf("\npayload bytes: %llu stored, %llu referenced by slots", U(stored), U(referenced));
    if (referenced > stored)
        printf(" (sharing saves %llu bytes)", U(referenced - stored));
    printf("\n");
    if (bad) {
        printf("checksums: %d of %u tensors FAILED\n", bad, n);
        fflush(stdout);
        fprintf(stderr, "%s: %s: %d tensor(s) failed their CRC-32 check:\n%s", prog, path, bad,
                errs ? errs : "");
    } else {
        printf("checksums: all %u tensors ok\n", n);
    }
    free(errs);
    free(start);
    free(fill);
    free(users);
    return bad;
}

int main(int argc, char **argv) {
    if (argc == 2 && (strcmp(argv[1], "-h") == 0 || strcmp(argv[1], "--help") == 0)) {
        usage(stdout);
        return 0;
    }
    if (argc != 2 || argv[1][0] == '\0') {
        usage(stderr);
        return 2;
    }
    const char *path = argv[1];
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        fprintf(stderr, "%s: cannot open '%s': %s\n", prog, path, strerror(errno));
        return 1;
    }
    struct stat st;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        fprintf(stderr, "%s: '%s' is not a regular file\n", prog, path);
        close(fd);
        return 1;
    }
    void *map = NULL;
    if (st.st_size > 0) {
        map = mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_PRIVATE, fd, 0);
        if (map == MAP_FAILED) {
            fprintf(stderr, "%s: cannot map '%s': %s\n", prog, path, strerror(errno));
            close(fd);
            return 1;
        }
    }
    close(fd);

    cb_model_file mf;
    if (cb_mf_parse(&mf, map, (uint64_t)st.st_size) != 0) {
        fprintf(stderr, "%s: %s: %s\n", prog, path, mf.err);
        return 1;
    }
    printf("colibri model file %s: format v%u, %llu bytes\n", path, mf.h.version, U(mf.size));
    print_header(&mf);
    print_slots(&mf);
    int bad = print_tensors(&mf, path);
    if (map)
        munmap(map, (size_t)st.st_size);
    return bad ? 1 : 0;
}
