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

uint32_t cb_crc32(uint32_t crc, const void *data, size_t n) {
    pthread_once(&crc_once, crc_build_tables);
    const unsigned char *p = (const unsigned char *)data;
    if (p == NULL || n == 0)
        return crc;
    uint32_t c = ~crc;
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
    return ~c;
}
