/* crc32.c — CRC-32 (ISO-HDLC, reflected polynomial 0xEDB88320), bit-identical
 * to zlib.crc32. Slice-by-8: eight 256-entry tables let the loop consume eight
 * bytes per step, which keeps checksumming a multi-gigabyte model file at load
 * time well above disk speed. The tables are built once, thread-safely. */
#include <pthread.h>
#include <string.h>

#include "internal.h"

static uint32_t crc_table[8][256];
static pthread_once_t crc_once = PTHREAD_ONCE_INIT;

static void crc_build_tables(void) {
    for (uint32_t i = 0; i < 256; i++) {
        uint32_t c = i;
        for (int k = 0; k < 8; k++)
            c = (c & 1u) ? (c >> 1) ^ 0xEDB88320u : c >> 1;
        crc_table[0][i] = c;
    }
    for (uint32_t i = 0; i < 256; i++) {
        uint32_t c = crc_table[0][i];
        for (int t = 1; t < 8; t++) {
            c = crc_table[0][c & 0xFFu] ^ (c >> 8);
            crc_table[t][i] = c;
        }
    }
}

static inline uint32_t load_le32(const unsigned char *p) {
    return (uint32_t)p[0] | ((uint32_t)p[1] << 8) | ((uint32_t)p[2] << 16) |
           ((uint32_t)p[3] << 24);
}

/* The CRC register c (not inverted) after n more bytes, by the tables. */
static uint32_t crc_by_tables(uint32_t c, const unsigned char *p, size_t n) {
    /* Head: bytes up to 8-byte alignment (the loads below are bytewise-safe
     * anyway; alignment only helps the compiler merge them). */
    while (n > 0 && ((uintptr_t)p & 7u) != 0) {
        c = crc_table[0][(c ^ *p++) & 0xFFu] ^ (c >> 8);
        n--;
    }
    while (n >= 8) {
        uint32_t lo = load_le32(p) ^ c;
        uint32_t hi = load_le32(p + 4);
        c = crc_table[7][lo & 0xFFu] ^ crc_table[6][(lo >> 8) & 0xFFu] ^
            crc_table[5][(lo >> 16) & 0xFFu] ^ crc_table[4][lo >> 24] ^
            crc_table[3][hi & 0xFFu] ^ crc_table[2][(hi >> 8) & 0xFFu] ^
            crc_table[1][(hi >> 16) & 0xFFu] ^ crc_table[0][hi >> 24];
        p += 8;
        n -= 8;
    }
    while (n-- > 0)
        c = crc_table[0][(c ^ *p++) & 0xFFu] ^ (c >> 8);
    return c;
}

#if defined(__x86_64__) && defined(__GNUC__)
/* Folding with carry-less multiplies (x86 PCLMULQDQ), for long buffers: 4-8x the tables.
 *
 * The reflected CRC reads a 16-byte block, loaded little-endian, as a polynomial whose
 * bit j is the coefficient of x^(127 - j): the low quadword L holds the high terms, so the
 * block is L x^64 + H. Moving a block F bits further on multiplies it by x^F; modulo P
 * that is L (x^(F+64) mod P) + H (x^F mod P), of degree < 128, which is added into the
 * block found there. clmul(L, C) with C's bit j the coefficient of x^(32 - j) (a 33-bit
 * constant) reads back, in the block's order, as L C x^32, so C = x^(F + 64 - 32) mod P
 * for L and x^(F - 32) mod P for H. Four blocks move 512 bits at a time, then they fold
 * into one, 128 bits at a time. The last block's own remainder, (block x^32) mod P, is
 * what the tables give for its 16 bytes from a register of 0. The CRC register enters as
 * the first four bytes xor'ed with it. */
#include <wmmintrin.h>

static __m128i fold_k512, fold_k128;

/* x^k mod P (P = x^32 + 0x04C11DB7, the normal form), reflected into bit j = x^(32 - j) */
static uint64_t fold_constant(unsigned k) {
    uint64_t r = 1;
    while (k--) {
        r <<= 1;
        if (r >> 32) r ^= 0x104C11DB7ull;
    }
    uint64_t out = 0;
    for (int d = 0; d < 32; d++)
        if (r >> d & 1) out |= 1ull << (32 - d);
    return out;
}

static void fold_build(void) {
    fold_k512 = _mm_set_epi64x((long long)fold_constant(512 - 32), (long long)fold_constant(512 + 64 - 32));
    fold_k128 = _mm_set_epi64x((long long)fold_constant(128 - 32), (long long)fold_constant(128 + 64 - 32));
}

__attribute__((target("pclmul,sse2"))) static inline __m128i fold(__m128i x, __m128i k) {
    return _mm_xor_si128(_mm_clmulepi64_si128(x, k, 0x00), _mm_clmulepi64_si128(x, k, 0x11));
}

/* The register after n bytes, n a multiple of 16 and >= 64. */
__attribute__((target("pclmul,sse2"))) static uint32_t crc_by_folding(uint32_t c, const unsigned char *p,
                                                                    size_t n) {
    __m128i x0 = _mm_xor_si128(_mm_loadu_si128((const __m128i *)(const void *)p), _mm_cvtsi32_si128((int)c));
    __m128i x1 = _mm_loadu_si128((const __m128i *)(const void *)(p + 16));
    __m128i x2 = _mm_loadu_si128((const __m128i *)(const void *)(p + 32));
    __m128i x3 = _mm_loadu_si128((const __m128i *)(const void *)(p + 48));
    for (p += 64, n -= 64; n >= 64; p += 64, n -= 64) {
        x0 = _mm_xor_si128(fold(x0, fold_k512), _mm_loadu_si128((const __m128i *)(const void *)p));
        x1 = _mm_xor_si128(fold(x1, fold_k512), _mm_loadu_si128((const __m128i *)(const void *)(p + 16)));
        x2 = _mm_xor_si128(fold(x2, fold_k512), _mm_loadu_si128((const __m128i *)(const void *)(p + 32)));
        x3 = _mm_xor_si128(fold(x3, fold_k512), _mm_loadu_si128((const __m128i *)(const void *)(p + 48)));
    }
    __m128i x = _mm_xor_si128(fold(x0, fold_k128), x1);
    x = _mm_xor_si128(fold(x, fold_k128), x2);
    x = _mm_xor_si128(fold(x, fold_k128), x3);
    for (; n >= 16; p += 16, n -= 16)
        x = _mm_xor_si128(fold(x, fold_k128), _mm_loadu_si128((const __m128i *)(const void *)p));
    unsigned char last[16];
    _mm_storeu_si128((__m128i *)(void *)last, x);
    return crc_by_tables(0, last, 16);
}

static int have_pclmul;
static void crc_build_all(void) {
    crc_build_tables();
    __builtin_cpu_init();
    have_pclmul = __builtin_cpu_supports("pclmul");
    if (have_pclmul) fold_build();
}
#define CRC_FOLD_MIN 256 /* shorter: the tables (the folding's set-up and last block cost more) */
#else
static const int have_pclmul = 0;
static uint32_t crc_by_folding(uint32_t c, const unsigned char *p, size_t n) { return crc_by_tables(c, p, n); }
static void crc_build_all(void) { crc_build_tables(); }
#define CRC_FOLD_MIN 256
#endif

uint32_t cb_crc32(uint32_t crc, const void *data, size_t n) {
    pthread_once(&crc_once, crc_build_all);
    const unsigned char *p = (const unsigned char *)data;
    if (p == NULL || n == 0)
        return crc;
    uint32_t c = ~crc;
    if (have_pclmul && n >= CRC_FOLD_MIN) {
        const size_t m = n & ~(size_t)15;
        c = crc_by_folding(c, p, m);
        p += m;
        n -= m;
    }
    return ~crc_by_tables(c, p, n);
}
