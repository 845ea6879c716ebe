/* model_file.c — parse and validate a Colibri model file (FORMAT.md, v1).
 *
 * Every check of FORMAT.md "Limits" lives here, in file order, so the first
 * defect found is the one nearest the start of the file that matters:
 *   header bytes (magic, version, header_bytes, CRC, reserved) -> header fields
 *   -> table extents against the real file length -> tensor entries -> slots
 *   -> header.file_size.
 * Table/payload extents are checked against the real length before
 * header.file_size, so a truncated file is reported by the structure that is
 * cut, not by a generic size mismatch. All arithmetic on sizes and offsets is
 * 64-bit with explicit overflow checks. Messages name the field and the byte
 * offset of that field in the file. */
#include "model_file.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "internal.h"

#define U(x) ((unsigned long long)(x))

/* Format v1 ranges. */
#define MF_MAX_LAYERS 65536u
#define MF_MAX_DIM 1048576u
#define MF_MAX_EXPERTS 4096u
#define MF_MIN_ALIGN 64u
#define MF_MAX_ALIGN 2097152u

static uint32_t rd32(const unsigned char *p) {
    return (uint32_t)p[0] | ((uint32_t)p[1] << 8) | ((uint32_t)p[2] << 16) |
           ((uint32_t)p[3] << 24);
}

static uint64_t rd64(const unsigned char *p) {
    return (uint64_t)rd32(p) | ((uint64_t)rd32(p + 4) << 32);
}

static int mf_fail(cb_model_file *mf, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static int mf_fail(cb_model_file *mf, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(mf->err, sizeof mf->err, fmt, ap);
    va_end(ap);
    return COLIBRI_ERR_FORMAT;
}

/* Appended to "past the end of the file" messages when the header promised more. */
static const char *trunc_note(const cb_model_file *mf, char *buf, size_t len) {
    if (mf->size < mf->h.file_size)
        snprintf(buf, len, "; the file is truncated (header.file_size says %llu bytes)",
                 U(mf->h.file_size));
    else
        buf[0] = '\0';
    return buf;
}

void cb_mf_read_header(cb_mf_header *h, const unsigned char *p) {
    h->magic = rd32(p + CB_MF_OFF_MAGIC);
    h->version = rd32(p + CB_MF_OFF_VERSION);
    h->header_bytes = rd32(p + CB_MF_OFF_HEADER_BYTES);
    h->n_layers = rd32(p + CB_MF_OFF_N_LAYERS);
    h->hidden = rd32(p + CB_MF_OFF_HIDDEN);
    h->inter = rd32(p + CB_MF_OFF_INTER);
    h->n_experts = rd32(p + CB_MF_OFF_N_EXPERTS);
    h->top_k = rd32(p + CB_MF_OFF_TOP_K);
    h->scoring = rd32(p + CB_MF_OFF_SCORING);
    h->norm_topk_prob = rd32(p + CB_MF_OFF_NORM_TOPK_PROB);
    uint32_t bits = rd32(p + CB_MF_OFF_DYN_P);
    memcpy(&h->dyn_p, &bits, sizeof bits);
    h->k_min = rd32(p + CB_MF_OFF_K_MIN);
    h->k_max = rd32(p + CB_MF_OFF_K_MAX);
    h->weight_dtype = rd32(p + CB_MF_OFF_WEIGHT_DTYPE);
    h->shared_inter = rd32(p + CB_MF_OFF_SHARED_INTER);
    h->shared_gated = rd32(p + CB_MF_OFF_SHARED_GATED);
    h->alignment = rd32(p + CB_MF_OFF_ALIGNMENT);
    h->n_tensors = rd32(p + CB_MF_OFF_N_TENSORS);
    h->slot_table_offset = rd64(p + CB_MF_OFF_SLOT_TABLE_OFFSET);
    h->tensor_table_offset = rd64(p + CB_MF_OFF_TENSOR_TABLE_OFFSET);
    h->data_offset = rd64(p + CB_MF_OFF_DATA_OFFSET);
    h->file_size = rd64(p + CB_MF_OFF_FILE_SIZE);
    h->header_crc32 = rd32(p + CB_MF_OFF_HEADER_CRC32);
}

const char *cb_mf_kind_name(uint32_t kind) {
    static const char *const names[CB_KIND_COUNT] = {
        "router", "gate", "up", "down", "shared gate", "shared up", "shared down",
        "shared expert gate"};
    return kind < CB_KIND_COUNT ? names[kind] : "unknown";
}

const char *cb_mf_dtype_name(uint32_t dtype) {
    switch (dtype) {
    case COLIBRI_F32: return "f32";
    case COLIBRI_BF16: return "bf16";
    case COLIBRI_INT8: return "int8";
    case COLIBRI_INT4: return "int4g32"; /* the older int4 format; Python names it so */
    case COLIBRI_INT4K: return "int4";
    default: return "unknown";
    }
}

uint32_t cb_mf_slot_kind(uint64_t j, uint64_t n_experts) {
    if (j == 0)
        return CB_KIND_ROUTER;
    if (j <= 3 * n_experts)
        return (uint32_t)(CB_KIND_GATE + (j - 1) % 3);
    return (uint32_t)(CB_KIND_SHARED_GATE + (j - 1 - 3 * n_experts));
}

void cb_mf_slot_name(uint64_t j, uint64_t n_experts, char *buf, size_t len) {
    uint32_t kind = cb_mf_slot_kind(j, n_experts);
    if (kind >= CB_KIND_GATE && kind <= CB_KIND_DOWN)
        snprintf(buf, len, "expert %llu %s", U((j - 1) / 3), cb_mf_kind_name(kind));
    else
        snprintf(buf, len, "%s", cb_mf_kind_name(kind));
}

int cb_mf_payload_bytes(uint32_t dtype, uint64_t rows, uint64_t cols, uint64_t *out) {
    uint64_t n, bytes;
    if (__builtin_mul_overflow(rows, cols, &n))
        return -1;
    switch (dtype) {
    case COLIBRI_F32:
        if (__builtin_mul_overflow(n, (uint64_t)4, &bytes))
            return -1;
        break;
    case COLIBRI_BF16:
        if (__builtin_mul_overflow(n, (uint64_t)2, &bytes))
            return -1;
        break;
    case COLIBRI_INT8: {
        uint64_t padded, scales;
        if (__builtin_add_overflow(n, (uint64_t)3, &padded))
            return -1;
        padded &= ~(uint64_t)3;
        if (__builtin_mul_overflow(rows, (uint64_t)4, &scales) ||
            __builtin_add_overflow(padded, scales, &bytes))
            return -1;
        break;
    }
    case COLIBRI_INT4: { /* ceil(cols/32) groups of 16 bytes per row, then f32 scale per group */
        uint64_t groups = cols / CB_INT4_GROUP + (cols % CB_INT4_GROUP != 0), ng, data, scales;
        if (__builtin_mul_overflow(rows, groups, &ng) || __builtin_mul_overflow(ng, (uint64_t)16, &data) ||
            __builtin_mul_overflow(ng, (uint64_t)4, &scales) || __builtin_add_overflow(data, scales, &bytes))
            return -1;
        break;
    }
    case COLIBRI_INT4K: /* super-blocks of a 16-byte header and up to 8 groups of 16 bytes per row */
        if (cols > (1u << 20) || __builtin_mul_overflow(rows, (uint64_t)cb_k4_row_bytes((size_t)cols), &bytes))
            return -1;
        break;
    default:
        return -2;
    }
    *out = bytes;
    return 0;
}

uint64_t cb_mf_tensor_byte(const cb_model_file *mf, uint32_t t) {
    return mf->h.tensor_table_offset + (uint64_t)t * CB_MF_TENSOR_ENTRY_BYTES;
}

uint64_t cb_mf_slot_byte(const cb_model_file *mf, uint64_t layer, uint64_t j) {
    return mf->h.slot_table_offset + (layer * mf->slots_per_layer + j) * 4u;
}

void cb_mf_tensor_at(const cb_model_file *mf, uint32_t t, cb_mf_tensor *out) {
    const unsigned char *e = mf->base + cb_mf_tensor_byte(mf, t);
    out->kind = rd32(e + CB_MF_TOFF_KIND);
    out->dtype = rd32(e + CB_MF_TOFF_DTYPE);
    out->rows = rd64(e + CB_MF_TOFF_ROWS);
    out->cols = rd64(e + CB_MF_TOFF_COLS);
    out->offset = rd64(e + CB_MF_TOFF_OFFSET);
    out->nbytes = rd64(e + CB_MF_TOFF_NBYTES);
    out->crc32 = rd32(e + CB_MF_TOFF_CRC32);
    out->reserved = rd32(e + CB_MF_TOFF_RESERVED);
}

uint32_t cb_mf_slot(const cb_model_file *mf, uint64_t layer, uint64_t j) {
    return rd32(mf->base + cb_mf_slot_byte(mf, layer, j));
}

const void *cb_mf_payload(const cb_model_file *mf, const cb_mf_tensor *t) {
    return mf->base + t->offset;
}

/* ---- header ---- */

static int check_range(cb_model_file *mf, const char *field, unsigned off, uint32_t v,
                       uint32_t lo, uint32_t hi) {
    if (v < lo || v > hi)
        return mf_fail(mf, "header.%s (byte %u): %u, expected %u .. %u", field, off, v, lo, hi);
    return 0;
}

static int check_header(cb_model_file *mf) {
    const cb_mf_header *h = &mf->h;
    int rc;
    if (h->magic != CB_MF_MAGIC)
        return mf_fail(mf, "header.magic (byte 0): 0x%08X, expected 0x%08X (not a Colibri model file)",
                       h->magic, CB_MF_MAGIC);
    if (h->version < CB_MF_MIN_VERSION || h->version > CB_MF_VERSION)
        return mf_fail(mf, "header.version (byte 4): %u, expected %u to %u (this loader reads formats v1 and v2)",
                       h->version, CB_MF_MIN_VERSION, CB_MF_VERSION);
    if (h->header_bytes != CB_MF_HEADER_BYTES)
        return mf_fail(mf, "header.header_bytes (byte 8): %u, expected %u", h->header_bytes,
                       CB_MF_HEADER_BYTES);
    uint32_t crc = cb_crc32(0, mf->base, CB_MF_HEADER_CRC_BYTES);
    if (crc != h->header_crc32)
        return mf_fail(mf, "header.header_crc32 (byte 104): stored 0x%08X, but the CRC-32 of "
                       "bytes 0 .. 103 is 0x%08X (the header is corrupt)", h->header_crc32, crc);
    for (unsigned i = CB_MF_OFF_RESERVED; i < CB_MF_HEADER_BYTES; i++)
        if (mf->base[i] != 0)
            return mf_fail(mf, "header.reserved (byte %u): 0x%02X, expected zero (bytes 108 .. 127 "
                           "are reserved)", i, mf->base[i]);

    if ((rc = check_range(mf, "n_layers", CB_MF_OFF_N_LAYERS, h->n_layers, 1, MF_MAX_LAYERS)) ||
        (rc = check_range(mf, "hidden", CB_MF_OFF_HIDDEN, h->hidden, 1, MF_MAX_DIM)) ||
        (rc = check_range(mf, "inter", CB_MF_OFF_INTER, h->inter, 1, MF_MAX_DIM)) ||
        (rc = check_range(mf, "n_experts", CB_MF_OFF_N_EXPERTS, h->n_experts, 1, MF_MAX_EXPERTS)))
        return rc;

    /* Routing. dyn_p first: it decides which rules top_k/k_min/k_max follow. */
    float p = h->dyn_p;
    int dynamic = p > 0.0f;
    if (!(p == 0.0f || (p > 0.0f && p <= 1.0f)))
        return mf_fail(mf, "header.dyn_p (byte 40): %g, expected 0 (fixed top-k) or a value in (0, 1]",
                       (double)p);
    if (dynamic) {
        /* top_k is unused in dynamic mode; any value up to E (0 included) is accepted. */
        if ((rc = check_range(mf, "top_k", CB_MF_OFF_TOP_K, h->top_k, 0, h->n_experts)))
            return rc;
        if (h->k_min < 1 || h->k_min > h->k_max)
            return mf_fail(mf, "header.k_min (byte 44): %u, expected 1 .. k_max (%u) in dynamic mode",
                           h->k_min, h->k_max);
        if (h->k_max > h->n_experts)
            return mf_fail(mf, "header.k_max (byte 48): %u, expected k_min (%u) .. n_experts (%u) in "
                           "dynamic mode", h->k_max, h->k_min, h->n_experts);
    } else {
        if ((rc = check_range(mf, "top_k", CB_MF_OFF_TOP_K, h->top_k, 1, h->n_experts)))
            return rc;
        if (h->k_min != 0)
            return mf_fail(mf, "header.k_min (byte 44): %u, expected 0 in fixed top-k mode (dyn_p 0)",
                           h->k_min);
        if (h->k_max != 0)
            return mf_fail(mf, "header.k_max (byte 48): %u, expected 0 in fixed top-k mode (dyn_p 0)",
                           h->k_max);
    }
    if ((rc = check_range(mf, "scoring", CB_MF_OFF_SCORING, h->scoring, 0, 1)) ||
        (rc = check_range(mf, "norm_topk_prob", CB_MF_OFF_NORM_TOPK_PROB, h->norm_topk_prob, 0, 1)) ||
        /* int4k (4) came with v2 */
        (rc = check_range(mf, "weight_dtype", CB_MF_OFF_WEIGHT_DTYPE, h->weight_dtype, 0, h->version >= 2 ? 4 : 3)))
        return rc;
    if (h->shared_inter > MF_MAX_DIM)
        return mf_fail(mf, "header.shared_inter (byte 56): %u, expected 0 (no shared expert) or "
                       "1 .. %u", h->shared_inter, MF_MAX_DIM);
    if ((rc = check_range(mf, "shared_gated", CB_MF_OFF_SHARED_GATED, h->shared_gated, 0, 1)))
        return rc;
    if (h->shared_gated && h->shared_inter == 0)
        return mf_fail(mf, "header.shared_gated (byte 60): 1, but there is no shared expert "
                       "(shared_inter 0); must be 0");
    uint32_t a = h->alignment;
    if (a < MF_MIN_ALIGN || a > MF_MAX_ALIGN || (a & (a - 1)) != 0)
        return mf_fail(mf, "header.alignment (byte 64): %u, expected a power of two in %u .. %u", a,
                       MF_MIN_ALIGN, MF_MAX_ALIGN);

    /* Tables. The ranges above bound these products far below 2^64, but they are
     * checked anyway: the check is cheap and the bound is not obvious to a reader. */
    uint64_t spl = 1 + 3 * (uint64_t)h->n_experts + 4, n_slots, slot_bytes, slot_end;
    if (__builtin_mul_overflow((uint64_t)h->n_layers, spl, &n_slots) ||
        __builtin_mul_overflow(n_slots, (uint64_t)4, &slot_bytes))
        return mf_fail(mf, "header.n_layers (byte 12): n_layers %u x slots_per_layer %llu x 4 bytes "
                       "overflows 64 bits", h->n_layers, U(spl));
    mf->slots_per_layer = spl;
    mf->n_slots = n_slots;
    if (h->n_tensors < 1 || h->n_tensors > n_slots)
        return mf_fail(mf, "header.n_tensors (byte 68): %u, expected 1 .. n_layers x slots_per_layer "
                       "(%u x %llu = %llu)", h->n_tensors, h->n_layers, U(spl), U(n_slots));

    if (h->slot_table_offset < CB_MF_HEADER_BYTES || h->slot_table_offset % 4 != 0)
        return mf_fail(mf, "header.slot_table_offset (byte 72): %llu, expected >= 128 and a multiple "
                       "of 4", U(h->slot_table_offset));
    if (__builtin_add_overflow(h->slot_table_offset, slot_bytes, &slot_end))
        return mf_fail(mf, "header.slot_table_offset (byte 72): offset %llu + slot table %llu bytes "
                       "overflows 64 bits", U(h->slot_table_offset), U(slot_bytes));

    uint64_t tensor_bytes = (uint64_t)h->n_tensors * CB_MF_TENSOR_ENTRY_BYTES, tensor_end;
    if (h->tensor_table_offset < slot_end || h->tensor_table_offset % 8 != 0)
        return mf_fail(mf, "header.tensor_table_offset (byte 80): %llu, expected >= %llu (the end of "
                       "the slot table) and a multiple of 8", U(h->tensor_table_offset), U(slot_end));
    if (__builtin_add_overflow(h->tensor_table_offset, tensor_bytes, &tensor_end))
        return mf_fail(mf, "header.tensor_table_offset (byte 80): offset %llu + tensor table %llu bytes "
                       "overflows 64 bits", U(h->tensor_table_offset), U(tensor_bytes));
    if (h->data_offset < tensor_end || h->data_offset % a != 0)
        return mf_fail(mf, "header.data_offset (byte 88): %llu, expected >= %llu (the end of the "
                       "tensor table) and a multiple of header.alignment (%u)", U(h->data_offset),
                       U(tensor_end), a);

    /* Extents against the real length: a truncated file names what is cut. */
    char note[96];
    if (slot_end > mf->size)
        return mf_fail(mf, "slot table (byte %llu): %u layers x %llu slots x 4 = %llu bytes end at "
                       "byte %llu, past the end of the file (%llu bytes)%s",
                       U(h->slot_table_offset), h->n_layers, U(spl), U(slot_bytes), U(slot_end),
                       U(mf->size), trunc_note(mf, note, sizeof note));
    if (tensor_end > mf->size)
        return mf_fail(mf, "tensor table (byte %llu): %u entries x 48 = %llu bytes end at byte %llu, "
                       "past the end of the file (%llu bytes)%s",
                       U(h->tensor_table_offset), h->n_tensors, U(tensor_bytes), U(tensor_end),
                       U(mf->size), trunc_note(mf, note, sizeof note));
    if (h->data_offset > mf->size)
        return mf_fail(mf, "header.data_offset (byte 88): %llu is past the end of the file "
                       "(%llu bytes)%s", U(h->data_offset), U(mf->size),
                       trunc_note(mf, note, sizeof note));
    return 0;
}

/* ---- tensor entries ---- */

/* Expected rows/cols of a kind, with the header field each comes from. */
static void kind_shape(const cb_mf_header *h, uint32_t kind, uint64_t *rows, const char **rname,
                       uint64_t *cols, const char **cname) {
    uint64_t H = h->hidden, I = h->inter, E = h->n_experts, S = h->shared_inter;
    switch (kind) {
    case CB_KIND_ROUTER: *rows = E, *rname = "n_experts", *cols = H, *cname = "hidden"; break;
    case CB_KIND_GATE:
    case CB_KIND_UP: *rows = I, *rname = "inter", *cols = H, *cname = "hidden"; break;
    case CB_KIND_DOWN: *rows = H, *rname = "hidden", *cols = I, *cname = "inter"; break;
    case CB_KIND_SHARED_GATE:
    case CB_KIND_SHARED_UP: *rows = S, *rname = "shared_inter", *cols = H, *cname = "hidden"; break;
    case CB_KIND_SHARED_DOWN: *rows = H, *rname = "hidden", *cols = S, *cname = "shared_inter"; break;
    default: *rows = 1, *rname = "one row", *cols = H, *cname = "hidden"; break;
    }
}

static int check_tensor(cb_model_file *mf, uint32_t i) {
    const cb_mf_header *h = &mf->h;
    cb_mf_tensor t;
    cb_mf_tensor_at(mf, i, &t);
    uint64_t eb = cb_mf_tensor_byte(mf, i);
    char note[96];

    if (t.kind >= CB_KIND_COUNT)
        return mf_fail(mf, "tensor[%u].kind (byte %llu): %u, expected 0 .. 7", i,
                       U(eb + CB_MF_TOFF_KIND), t.kind);
    if (t.kind >= CB_KIND_SHARED_GATE && t.kind <= CB_KIND_SHARED_DOWN && h->shared_inter == 0)
        return mf_fail(mf, "tensor[%u].kind (byte %llu): %u (%s), but the header has no shared "
                       "expert (header.shared_inter 0)", i, U(eb + CB_MF_TOFF_KIND), t.kind,
                       cb_mf_kind_name(t.kind));
    if (t.kind == CB_KIND_SHARED_EXPERT_GATE && !h->shared_gated)
        return mf_fail(mf, "tensor[%u].kind (byte %llu): %u (%s), but the shared expert is ungated "
                       "(header.shared_gated 0)", i, U(eb + CB_MF_TOFF_KIND), t.kind,
                       cb_mf_kind_name(t.kind));

    uint32_t want_dtype = (t.kind == CB_KIND_ROUTER || t.kind == CB_KIND_SHARED_EXPERT_GATE)
                              ? (uint32_t)COLIBRI_F32 : h->weight_dtype;
    if (t.dtype != want_dtype)
        return mf_fail(mf, "tensor[%u].dtype (byte %llu): %u (%s), expected %u (%s) for kind %u (%s)",
                       i, U(eb + CB_MF_TOFF_DTYPE), t.dtype, cb_mf_dtype_name(t.dtype), want_dtype,
                       cb_mf_dtype_name(want_dtype), t.kind, cb_mf_kind_name(t.kind));

    uint64_t bytes;
    if (cb_mf_payload_bytes(t.dtype, t.rows, t.cols, &bytes) != 0)
        return mf_fail(mf, "tensor[%u].rows (byte %llu): rows %llu x cols %llu of %s: the payload "
                       "size overflows 64 bits", i, U(eb + CB_MF_TOFF_ROWS), U(t.rows), U(t.cols),
                       cb_mf_dtype_name(t.dtype));

    uint64_t want_rows, want_cols;
    const char *rname, *cname;
    kind_shape(h, t.kind, &want_rows, &rname, &want_cols, &cname);
    if (t.rows != want_rows)
        return mf_fail(mf, "tensor[%u].rows (byte %llu): %llu, expected %llu (%s) for kind %u (%s)",
                       i, U(eb + CB_MF_TOFF_ROWS), U(t.rows), U(want_rows), rname, t.kind,
                       cb_mf_kind_name(t.kind));
    if (t.cols != want_cols)
        return mf_fail(mf, "tensor[%u].cols (byte %llu): %llu, expected %llu (%s) for kind %u (%s)",
                       i, U(eb + CB_MF_TOFF_COLS), U(t.cols), U(want_cols), cname, t.kind,
                       cb_mf_kind_name(t.kind));
    if (t.nbytes != bytes)
        return mf_fail(mf, "tensor[%u].nbytes (byte %llu): %llu, expected %llu for %llu x %llu %s",
                       i, U(eb + CB_MF_TOFF_NBYTES), U(t.nbytes), U(bytes), U(t.rows), U(t.cols),
                       cb_mf_dtype_name(t.dtype));

    if (t.offset % h->alignment != 0)
        return mf_fail(mf, "tensor[%u].offset (byte %llu): %llu is not a multiple of "
                       "header.alignment (%u)", i, U(eb + CB_MF_TOFF_OFFSET), U(t.offset),
                       h->alignment);
    if (t.offset < h->data_offset)
        return mf_fail(mf, "tensor[%u].offset (byte %llu): %llu is before header.data_offset (%llu)",
                       i, U(eb + CB_MF_TOFF_OFFSET), U(t.offset), U(h->data_offset));
    uint64_t end;
    if (__builtin_add_overflow(t.offset, t.nbytes, &end))
        return mf_fail(mf, "tensor[%u].offset (byte %llu): offset %llu + nbytes %llu overflows 64 bits",
                       i, U(eb + CB_MF_TOFF_OFFSET), U(t.offset), U(t.nbytes));
    if (end > mf->size)
        return mf_fail(mf, "tensor[%u].offset (byte %llu): offset %llu + nbytes %llu = %llu is past "
                       "the end of the file (%llu bytes)%s", i, U(eb + CB_MF_TOFF_OFFSET),
                       U(t.offset), U(t.nbytes), U(end), U(mf->size),
                       trunc_note(mf, note, sizeof note));
    if (t.reserved != 0)
        return mf_fail(mf, "tensor[%u].reserved (byte %llu): 0x%08X, expected zero", i,
                       U(eb + CB_MF_TOFF_RESERVED), t.reserved);
    return 0;
}

/* ---- slots ---- */

/* "slot[layer 1, expert 3 gate] (byte 1234)" */
static const char *slot_where(const cb_model_file *mf, uint64_t l, uint64_t j, char *buf, size_t len) {
    char name[40];
    cb_mf_slot_name(j, mf->h.n_experts, name, sizeof name);
    snprintf(buf, len, "slot[layer %llu, %s] (byte %llu)", U(l), name, U(cb_mf_slot_byte(mf, l, j)));
    return buf;
}

static int check_slots(cb_model_file *mf) {
    const cb_mf_header *h = &mf->h;
    char where[96];
    for (uint64_t l = 0; l < h->n_layers; l++) {
        for (uint64_t j = 0; j < mf->slots_per_layer; j++) {
            uint32_t idx = cb_mf_slot(mf, l, j);
            uint32_t kind = cb_mf_slot_kind(j, h->n_experts);
            int shared = kind >= CB_KIND_SHARED_GATE && kind <= CB_KIND_SHARED_DOWN;
            int wanted = kind <= CB_KIND_DOWN || (shared && h->shared_inter > 0) ||
                         (kind == CB_KIND_SHARED_EXPERT_GATE && h->shared_gated);
            if (idx == CB_MF_ABSENT) {
                if (wanted)
                    return mf_fail(mf, "%s: absent (0xFFFFFFFF), but %s",
                                   slot_where(mf, l, j, where, sizeof where),
                                   kind <= CB_KIND_DOWN ? "this slot is always required"
                                   : shared ? "it is required when header.shared_inter > 0"
                                            : "it is required when header.shared_gated is 1");
                continue;
            }
            if (!wanted)
                return mf_fail(mf, "%s: names tensor %u, but must be absent (0xFFFFFFFF) because %s",
                               slot_where(mf, l, j, where, sizeof where), idx,
                               shared ? "there is no shared expert (header.shared_inter 0)"
                                      : "the shared expert is ungated (header.shared_gated 0)");
            if (idx >= h->n_tensors)
                return mf_fail(mf, "%s: tensor index %u is past the tensor table (n_tensors %u)",
                               slot_where(mf, l, j, where, sizeof where), idx, h->n_tensors);
            cb_mf_tensor t;
            cb_mf_tensor_at(mf, idx, &t);
            if (t.kind != kind)
                return mf_fail(mf, "%s: tensor %u has kind %u (%s), expected kind %u (%s)",
                               slot_where(mf, l, j, where, sizeof where), idx, t.kind,
                               cb_mf_kind_name(t.kind), kind, cb_mf_kind_name(kind));
        }
    }
    return 0;
}

int cb_mf_parse(cb_model_file *mf, const void *base, uint64_t size) {
    memset(mf, 0, sizeof *mf);
    mf->base = (const unsigned char *)base;
    mf->size = size;
    if (size < CB_MF_HEADER_BYTES || base == NULL)
        return mf_fail(mf, "header (byte 0): the file is %llu bytes, shorter than the %u-byte header "
                       "(truncated, or not a Colibri model file)", U(size), CB_MF_HEADER_BYTES);
    cb_mf_read_header(&mf->h, mf->base);
    int rc = check_header(mf);
    if (rc)
        return rc;
    for (uint32_t i = 0; i < mf->h.n_tensors; i++)
        if ((rc = check_tensor(mf, i)))
            return rc;
    if ((rc = check_slots(mf)))
        return rc;
    if (mf->h.file_size != size)
        return mf_fail(mf, "header.file_size (byte 96): %llu, but the file is %llu bytes",
                       U(mf->h.file_size), U(size));
    return 0;
}

int cb_mf_verify_tensor(const cb_model_file *mf, uint32_t i, char *err, size_t err_len) {
    cb_mf_tensor t;
    cb_mf_tensor_at(mf, i, &t);
    uint32_t crc = cb_crc32(0, mf->base + t.offset, t.nbytes);
    if (crc == t.crc32)
        return 0;
    snprintf(err, err_len, "tensor[%u].crc32 (byte %llu): stored 0x%08X, but the %s payload at bytes "
             "%llu .. %llu has CRC-32 0x%08X (the payload is corrupt)", i,
             U(cb_mf_tensor_byte(mf, i) + CB_MF_TOFF_CRC32), t.crc32, cb_mf_kind_name(t.kind),
             U(t.offset), U(t.offset + t.nbytes - 1), crc);
    return COLIBRI_ERR_FORMAT;
}
