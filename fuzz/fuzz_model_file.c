/* fuzz_model_file.c — libFuzzer target for the model-file loader (FORMAT.md).
 *
 * Each input is a whole model file. It goes through:
 *   1. cb_mf_parse on the fuzzer's own buffer, which is exactly `size` bytes long,
 *      so AddressSanitizer catches any read past the end of the file; when the
 *      parse accepts the file, every accessor the engine and the dump tool use
 *      (tensor entries, slots, payload CRCs, names) is walked over it;
 *   2. colibri_load_model on the same bytes through a memfd (the real path:
 *      open, fstat, mmap PROT_READ/MAP_PRIVATE, parse, routing check, CRCs,
 *      layer views), and when it loads, colibri_infer over 1 and 8 tokens if the model
 *      is small, so hostile weights (NaN, Inf, huge int8 scales) run the layer.
 * Invariants checked beyond "no crash": the two paths agree that a malformed
 * file is malformed, and every refusal leaves a message.
 *
 * Most mutations of a valid file break the header CRC (or a payload CRC) and
 * would stop at that check, so the custom mutator below re-seals the CRCs of
 * most mutants; one in eight is left as mutated, to keep fuzzing the CRC checks
 * themselves. */
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "colibri.h"
#include "internal.h"
#include "model_file.h"

size_t LLVMFuzzerMutate(uint8_t *data, size_t size, size_t max_size);

/* Stops the run as a crash, with a line saying which invariant broke. */
#define FUZZ_ASSERT(cond, ...)                                                                     \
    do {                                                                                           \
        if (!(cond)) {                                                                             \
            fprintf(stderr, "fuzz_model_file: invariant failed: " __VA_ARGS__);                   \
            fputc('\n', stderr);                                                                   \
            abort();                                                                               \
        }                                                                                          \
    } while (0)

/* The infer step only runs models whose weights, all layers together, stay
 * below this many elements: a slow execution would hide the fast ones. */
#define FUZZ_MAX_INFER_ELEMS (1u << 18)
/* One token (the decode kernels) and eight (experts get more tokens than the decode
 * class takes, so the prefill kernels run too). */
static const int fuzz_tokens[] = {1, 8};
#define FUZZ_MAX_TOKENS 8

static uint64_t get64(const uint8_t *p) {
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--) v = v << 8 | p[i];
    return v;
}

static void put32(uint8_t *p, uint32_t v) {
    for (int i = 0; i < 4; i++) p[i] = (uint8_t)(v >> (8 * i));
}

/* Rewrites the header CRC, then the CRC of every tensor whose entry and payload
 * lie inside the buffer. Trusts nothing it reads: every extent is checked here. */
static void reseal(uint8_t *d, size_t size) {
    if (size < CB_MF_HEADER_BYTES) return;
    uint32_t n = (uint32_t)d[CB_MF_OFF_N_TENSORS] | (uint32_t)d[CB_MF_OFF_N_TENSORS + 1] << 8 |
                 (uint32_t)d[CB_MF_OFF_N_TENSORS + 2] << 16 |
                 (uint32_t)d[CB_MF_OFF_N_TENSORS + 3] << 24;
    uint64_t table = get64(d + CB_MF_OFF_TENSOR_TABLE_OFFSET);
    uint64_t fit = table > size ? 0 : (size - table) / CB_MF_TENSOR_ENTRY_BYTES;
    if (n > fit) n = (uint32_t)fit;
    if (n > 256) n = 256; /* a mutation stays cheap: the seeds have at most 39 tensors */
    for (uint32_t i = 0; i < n; i++) {
        uint8_t *e = d + table + (uint64_t)i * CB_MF_TENSOR_ENTRY_BYTES;
        uint64_t off = get64(e + CB_MF_TOFF_OFFSET), nb = get64(e + CB_MF_TOFF_NBYTES);
        if (off <= size && nb <= size - off)
            put32(e + CB_MF_TOFF_CRC32, cb_crc32(0, d + off, (size_t)nb));
    }
    /* Inserting or erasing bytes always breaks header.file_size too: set it to the real
     * size when its stored low bit is clear, so mutants reach past that check while the
     * check itself (low bit set) stays reachable. */
    if ((d[CB_MF_OFF_FILE_SIZE] & 1) == 0)
        for (int i = 0; i < 8; i++) d[CB_MF_OFF_FILE_SIZE + i] = (uint8_t)((uint64_t)size >> (8 * i));
    put32(d + CB_MF_OFF_HEADER_CRC32, cb_crc32(0, d, CB_MF_HEADER_CRC_BYTES));
}

size_t LLVMFuzzerCustomMutator(uint8_t *data, size_t size, size_t max_size, unsigned int seed) {
    size = LLVMFuzzerMutate(data, size, max_size);
    if (seed % 8 != 0) reseal(data, size);
    return size;
}

/* Walks a parsed file the way model.c and dump_schema.c do. */
static void walk_parsed(const cb_model_file *mf) {
    char buf[96], err[480];
    for (uint32_t t = 0; t < mf->h.n_tensors; t++) {
        cb_mf_tensor e;
        cb_mf_tensor_at(mf, t, &e);
        FUZZ_ASSERT(e.offset + e.nbytes <= mf->size, "tensor %u extends past the file", t);
        (void)cb_mf_kind_name(e.kind);
        (void)cb_mf_dtype_name(e.dtype);
        if (cb_mf_verify_tensor(mf, t, err, sizeof err) != 0)
            FUZZ_ASSERT(err[0] != '\0', "a CRC mismatch of tensor %u left no message", t);
    }
    for (uint64_t l = 0; l < mf->h.n_layers; l++)
        for (uint64_t j = 0; j < mf->slots_per_layer; j++) {
            uint32_t t = cb_mf_slot(mf, l, j);
            FUZZ_ASSERT(t == CB_MF_ABSENT || t < mf->h.n_tensors, "slot names tensor %u", t);
            cb_mf_slot_name(j, mf->h.n_experts, buf, sizeof buf);
        }
}

/* The bytes as a file: one memfd, reused (creating one per input costs more than the run). */
static int file_of(const uint8_t *data, size_t size, char *path, size_t len) {
    static int fd = -1;
    if (fd < 0) {
        fd = memfd_create("colibri-fuzz", MFD_CLOEXEC);
        FUZZ_ASSERT(fd >= 0, "memfd_create failed");
    }
    if (ftruncate(fd, 0) != 0 || ftruncate(fd, (off_t)size) != 0) return -1;
    for (size_t done = 0; done < size;) {
        ssize_t w = pwrite(fd, data + done, size - done, (off_t)done);
        if (w <= 0) return -1;
        done += (size_t)w;
    }
    snprintf(path, len, "/proc/self/fd/%d", fd);
    return 0;
}

static void run_model(colibri_model *m) {
    int n_layers = colibri_model_n_layers(m), hidden = colibri_model_hidden(m);
    FUZZ_ASSERT(n_layers >= 1 && hidden >= 1, "loaded model has %d layers, hidden %d", n_layers,
                hidden);
    uint64_t elems = 0;
    for (int l = 0; l < n_layers; l++) {
        colibri_layer *L = colibri_model_layer(m, l);
        FUZZ_ASSERT(L != NULL, "layer %d of %d is NULL", l, n_layers);
        elems += (uint64_t)L->n_experts * L->inter * L->hidden * 3 +
                 (uint64_t)(L->has_shared ? L->shared.inter : 0) * L->hidden * 3;
        if (elems > FUZZ_MAX_INFER_ELEMS) return;
    }
    float *x = malloc(sizeof(float) * FUZZ_MAX_TOKENS * (size_t)hidden);
    FUZZ_ASSERT(x != NULL, "out of memory for %d floats", FUZZ_MAX_TOKENS * hidden);
    for (size_t r = 0; r < sizeof fuzz_tokens / sizeof fuzz_tokens[0]; r++) {
        const int T = fuzz_tokens[r];
        for (int i = 0; i < T * hidden; i++) x[i] = (float)((i * 5 % 11) - 5) * 0.25f;
        /* In place (output == input) is allowed and is the path that needs the memmove. */
        int st = colibri_infer(m, x, x, T);
        FUZZ_ASSERT(st == COLIBRI_OK || colibri_last_error()[0] != '\0',
                    "colibri_infer over %d tokens failed (%d) without a message", T, st);
    }
    free(x);
}

/* tests/engine/test_fuzz.py checks that a crash is caught and its input kept: this env
 * variable makes every input one. */
static int selftest_crash;

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc, (void)argv;
    selftest_crash = getenv("COLIBRI_FUZZ_SELFTEST_CRASH") != NULL;
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    FUZZ_ASSERT(!selftest_crash, "self-test crash (COLIBRI_FUZZ_SELFTEST_CRASH is set)");
    cb_model_file mf;
    int parsed = cb_mf_parse(&mf, data, size);
    if (parsed == 0)
        walk_parsed(&mf);
    else
        FUZZ_ASSERT(parsed == COLIBRI_ERR_FORMAT && mf.err[0] != '\0',
                    "cb_mf_parse returned %d with message '%s'", parsed, mf.err);

    char path[64];
    if (file_of(data, size, path, sizeof path) != 0) return 0;
    colibri_model *m = colibri_load_model(path);
    if (!m) {
        FUZZ_ASSERT(colibri_last_error()[0] != '\0', "colibri_load_model refused without a message");
        return 0;
    }
    FUZZ_ASSERT(parsed == 0, "colibri_load_model accepted a file cb_mf_parse refuses: %s", mf.err);
    run_model(m);
    colibri_free_model(m);
    return 0;
}
