#include <immintrin.h>
#include <stdio.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <sys/syscall.h>
typedef struct { uint8_t palette, start_row, reserved[14]; uint16_t colsb[16]; uint8_t rows[16]; } cfg_t;
static double now(void){struct timespec t; clock_gettime(CLOCK_MONOTONIC,&t); return t.tv_sec+t.tv_nsec*1e-9;}
int main(int argc, char **argv) {
    syscall(SYS_arch_prctl, 0x1023, 18);
    cfg_t c; memset(&c,0,sizeof c); c.palette=1; for(int i=0;i<8;i++){c.colsb[i]=64;c.rows[i]=16;}
    _tile_loadconfig(&c);
    int ns = atoi(argv[1]), nu = atoi(argv[2]), npair = atoi(argv[3]), mode = atoi(argv[4]);
    int lo = argc > 5 ? atoi(argv[5]) : 1;
    size_t tileset = (size_t)nu * ns * 2 * 512; /* elements of B per k-tile set */
    size_t total = (size_t)1 << 30; size_t span = argc > 6 ? (size_t)atol(argv[6]) : total; size_t reps = total / span;
    size_t nsets = total / 2 / tileset, nspan = span / 2 / tileset; (void)reps;
    uint16_t *B = aligned_alloc(4096, total); memset(B, 1, total);
    uint16_t *buf = aligned_alloc(4096, tileset * 2 * 2); memset(buf, 0, tileset*4);
    size_t asz = (size_t)npair * ns * 4 * 512;
    uint16_t *A = aligned_alloc(64, asz*2); memset(A, 0, asz*2);
    float *C = aligned_alloc(64, (size_t)nu*npair*4*1024); memset(C, 0, (size_t)nu*npair*4*1024);
    long dps = 0; double t0 = now(); __m512i acc = _mm512_setzero_si512();
    const size_t lines_set = tileset * 2 / 64, calls = (size_t)npair * nu, per_call = (lines_set + calls - 1) / calls;
    if (mode == 4) memcpy(buf, B, tileset * 2);
    for (size_t set = 0; set < nsets; ++set) {
      const uint16_t *Bs = B + (set % nspan) * tileset;
      const uint16_t *Bt = mode == 4 ? buf + (set & 1) * tileset : Bs;
      uint16_t *nxt = buf + ((set + 1) & 1) * tileset;
      size_t call = 0;
      for (int p = 0; p < npair; ++p) for (int v = 0; v < nu; ++v, ++call) {
        float *cc = C + ((size_t)v*npair + p)*1024;
        _tile_loadd(0, cc, 64); _tile_loadd(1, cc+256, 64); _tile_loadd(2, cc+512, 64); _tile_loadd(3, cc+768, 64);
        const uint16_t *b = Bt + (size_t)v*ns*1024, *a = A + (size_t)p*ns*2048;
        size_t l0 = call * per_call, l1 = l0 + per_call; if (l1 > lines_set) l1 = lines_set;
        size_t lps = (per_call + ns - 1) / ns;
        for (int s = 0; s < ns; ++s) {
            if (set + 1 < nsets && (set + 1) % nspan) {
                size_t a0 = l0 + s * lps, a1 = a0 + lps; if (a1 > l1) a1 = l1;
                const char *src = (const char *)(Bs + tileset);
                if (mode == 1) for (size_t j = a0; j < a1; ++j) __builtin_prefetch(src + j*64, 0, 2);
                if (mode == 4) for (size_t j = a0; j < a1; ++j) _mm512_store_si512((char *)nxt + j*64, _mm512_load_si512(src + j*64));
                if (mode == 5) for (size_t j = a0; j < a1; ++j) acc = _mm512_xor_si512(acc, _mm512_load_si512(src + j*64));
                if (mode == 6) for (size_t j = a0; j < a1; ++j) _mm_prefetch(src + j*64, _MM_HINT_T0);
            }
            _tile_loadd(6, b + s*1024, 64); _tile_loadd(7, b + s*1024 + 512, 64);
            _tile_loadd(4, a + s*2048, 64); _tile_loadd(5, a + s*2048 + 512, 64);
            _tile_dpbf16ps(0,4,6); _tile_dpbf16ps(1,4,7); _tile_dpbf16ps(2,5,6); _tile_dpbf16ps(3,5,7);
            if (lo) { _tile_loadd(4, a + s*2048 + 1024, 64); _tile_loadd(5, a + s*2048 + 1536, 64);
            _tile_dpbf16ps(0,4,6); _tile_dpbf16ps(1,4,7); _tile_dpbf16ps(2,5,6); _tile_dpbf16ps(3,5,7); dps += 4; }
            dps += 4;
        }
        _tile_stored(0, cc, 64); _tile_stored(1, cc+256, 64); _tile_stored(2, cc+512, 64); _tile_stored(3, cc+768, 64);
      }
    }
    double t = now() - t0;
    int sink = _mm512_reduce_add_epi32(acc);
    printf("ns %d units %d pairs %d mode %d lo %d: %.2f TFLOP/s, B stream %.1f GB/s %d\n", ns, nu, npair, mode, lo, dps*16384.0/t/1e12, total/t/1e9, sink & 0);
}
