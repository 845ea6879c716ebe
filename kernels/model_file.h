/* model_file.h — parse and validate a Colibri model file (FORMAT.md, v1) held in
 * memory (normally a read-only mapping) into a plain view: the header fields,
 * the slot table and the tensor table, all bounds- and overflow-checked.
 *
 * Self-contained (needs only crc32.c), so the dump-schema tool can use it
 * without the engine. Errors are written into view->err; the engine's loader
 * forwards them to cb_fail(COLIBRI_ERR_FORMAT, ...). */
#ifndef COLIBRI_MODEL_FILE_H
#define COLIBRI_MODEL_FILE_H

#include <stddef.h>
#include <stdint.h>

#define CB_MF_MAGIC 0xCAFE1234u
#define CB_MF_VERSION 2u     /* written; v2 adds weight dtype 4, int4k */
#define CB_MF_MIN_VERSION 1u /* read back to this */
#define CB_MF_HEADER_BYTES 128u
#define CB_MF_HEADER_CRC_BYTES 104u /* the header CRC covers bytes 0 .. 103 */
#define CB_MF_TENSOR_ENTRY_BYTES 48u
#define CB_MF_ABSENT 0xFFFFFFFFu

/* Header field byte offsets (FORMAT.md "Header"). */
enum {
    CB_MF_OFF_MAGIC = 0,
    CB_MF_OFF_VERSION = 4,
    CB_MF_OFF_HEADER_BYTES = 8,
    CB_MF_OFF_N_LAYERS = 12,
    CB_MF_OFF_HIDDEN = 16,
    CB_MF_OFF_INTER = 20,
    CB_MF_OFF_N_EXPERTS = 24,
    CB_MF_OFF_TOP_K = 28,
    CB_MF_OFF_SCORING = 32,
    CB_MF_OFF_NORM_TOPK_PROB = 36,
    CB_MF_OFF_DYN_P = 40,
    CB_MF_OFF_K_MIN = 44,
    CB_MF_OFF_K_MAX = 48,
    CB_MF_OFF_WEIGHT_DTYPE = 52,
    CB_MF_OFF_SHARED_INTER = 56,
    CB_MF_OFF_SHARED_GATED = 60,
    CB_MF_OFF_ALIGNMENT = 64,
    CB_MF_OFF_N_TENSORS = 68,
    CB_MF_OFF_SLOT_TABLE_OFFSET = 72,
    CB_MF_OFF_TENSOR_TABLE_OFFSET = 80,
    CB_MF_OFF_DATA_OFFSET = 88,
    CB_MF_OFF_FILE_SIZE = 96,
    CB_MF_OFF_HEADER_CRC32 = 104,
    CB_MF_OFF_RESERVED = 108
};

/* Tensor-entry field byte offsets, relative to the entry. */
enum {
    CB_MF_TOFF_KIND = 0,
    CB_MF_TOFF_DTYPE = 4,
    CB_MF_TOFF_ROWS = 8,
    CB_MF_TOFF_COLS = 16,
    CB_MF_TOFF_OFFSET = 24,
    CB_MF_TOFF_NBYTES = 32,
    CB_MF_TOFF_CRC32 = 40,
    CB_MF_TOFF_RESERVED = 44
};

/* Tensor kinds (tensor-entry `kind`). */
enum {
    CB_KIND_ROUTER = 0,
    CB_KIND_GATE = 1,
    CB_KIND_UP = 2,
    CB_KIND_DOWN = 3,
    CB_KIND_SHARED_GATE = 4,
    CB_KIND_SHARED_UP = 5,
    CB_KIND_SHARED_DOWN = 6,
    CB_KIND_SHARED_EXPERT_GATE = 7,
    CB_KIND_COUNT = 8
};

typedef struct {
    uint32_t magic, version, header_bytes;
    uint32_t n_layers, hidden, inter, n_experts;
    uint32_t top_k, scoring, norm_topk_prob;
    float dyn_p;
    uint32_t k_min, k_max;
    uint32_t weight_dtype, shared_inter, shared_gated;
    uint32_t alignment, n_tensors;
    uint64_t slot_table_offset, tensor_table_offset, data_offset, file_size;
    uint32_t header_crc32;
} cb_mf_header;

typedef struct {
    uint32_t kind, dtype;
    uint64_t rows, cols, offset, nbytes;
    uint32_t crc32, reserved;
} cb_mf_tensor;

typedef struct {
    const unsigned char *base; /* the file's bytes */
    uint64_t size;             /* the file's actual length */
    cb_mf_header h;
    uint64_t slots_per_layer;  /* 1 + 3E + 4 */
    uint64_t n_slots;          /* n_layers * slots_per_layer */
    char err[480];             /* what is wrong and where, when a call fails */
} cb_model_file;

/* Decodes and validates everything except payload CRCs. Returns 0, or
 * COLIBRI_ERR_FORMAT (3) with mf->err set. Allocates nothing. */
int cb_mf_parse(cb_model_file *mf, const void *base, uint64_t size);

/* Decodes the header alone (no checks) from at least 128 bytes. */
void cb_mf_read_header(cb_mf_header *h, const unsigned char *p);

/* After a successful parse: tensor entry t (< n_tensors), slot (layer, j). */
void cb_mf_tensor_at(const cb_model_file *mf, uint32_t t, cb_mf_tensor *out);
uint32_t cb_mf_slot(const cb_model_file *mf, uint64_t layer, uint64_t j);
uint64_t cb_mf_slot_byte(const cb_model_file *mf, uint64_t layer, uint64_t j);
uint64_t cb_mf_tensor_byte(const cb_model_file *mf, uint32_t t);
const void *cb_mf_payload(const cb_model_file *mf, const cb_mf_tensor *t);

/* Checks tensor t's payload CRC. Returns 0, or COLIBRI_ERR_FORMAT with the
 * message written to err (a caller's buffer, so several threads may verify
 * different tensors at once; pass mf->err when single-threaded). */
int cb_mf_verify_tensor(const cb_model_file *mf, uint32_t t, char *err, size_t err_len);

/* Names for messages and the dump tool. */
const char *cb_mf_kind_name(uint32_t kind);
const char *cb_mf_dtype_name(uint32_t dtype);
/* Kind a slot j of a layer expects, and its name ("expert 3 gate", ...). */
uint32_t cb_mf_slot_kind(uint64_t j, uint64_t n_experts);
void cb_mf_slot_name(uint64_t j, uint64_t n_experts, char *buf, size_t len);

/* Stored payload bytes for dtype/rows/cols (int8: data padded to 4, then rows
 * f32 scales). Returns 0 on success, -1 if the arithmetic overflows 64 bits,
 * -2 for an unknown dtype. */
int cb_mf_payload_bytes(uint32_t dtype, uint64_t rows, uint64_t cols, uint64_t *out);

#endif
