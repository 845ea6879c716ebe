/* B double-buffered: C 2 tiles (0,1), A hi/lo (4,5), B sets (6,7) and (2,3), alternating */
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
#define CFG(c) __asm__ volatile("ldtilecfg %0" ::"m"(c))
int main(int argc, char **argv) {
    syscall(SYS_arch_prctl, 0x1023, 18);
    cfg_t c; memset(&c,0,sizeof c); c.palette=1; for(int i=0;i<8;i++){c.colsb[i]=64;c.rows[i]=16;}
    CFG(c);
    int ns = atoi(argv[1]), nu = atoi(argv[2]), npan = atoi(argv[3]), mode = atoi(argv[4]);
    size_t span = argc > 5 ? (size_t)atol(argv[5]) : 0;
    size_t tileset = (size_t)nu * ns * 2 * 512;
    size_t total = (size_t)1 << 30; if (!span) span = total;
    size_t nsets = total / 2 / tileset, nspan = span / 2 / tileset;
    uint16_t *B = aligned_alloc(4096, total); memset(B, 1, total);
    size_t asz = (size_t)npan * ns * 2 * 512;
    uint16_t *A = aligned_alloc(64, asz*2); memset(A, 0, asz*2);
    float *C = aligned_alloc(64, (size_t)nu*npan*2*1024); memset(C, 0, (size_t)nu*npan*2*1024);
    long dps = 0; double t0 = now();
    const size_t lines_set = tileset * 2 / 64, calls = (size_t)npan * nu, per_call = (lines_set + calls - 1) / calls;
    for (size_t set = 0; set < nsets; ++set) {
      const uint16_t *Bs = B + (set % nspan) * tileset;
      size_t call = 0;
      for (int p = 0; p < npan; ++p) for (int v = 0; v < nu; ++v, ++call) {
        float *cc = C + ((size_t)v*npan + p)*512;
        _tile_loadd(0, cc, 64); _tile_loadd(1, cc+256, 64);
        const uint16_t *b = Bs + (size_t)v*ns*1024, *a = A + (size_t)p*ns*1024;
        size_t l0 = call * per_call, l1 = l0 + per_call; if (l1 > lines_set) l1 = lines_set;
        size_t lps = (per_call + ns - 1) / ns;
        _tile_loadd(6, b, 64); _tile_loadd(7, b + 512, 64);
        for (int s = 0; s < ns; s += 2) {
            if (mode == 1 && set + 1 < nsets && (set + 1) % nspan) {
                size_t a0 = l0 + s * lps, a1 = a0 + 2 * lps; if (a1 > l1) a1 = l1;
                const char *src = (const char *)(Bs + tileset);
                for (size_t j = a0; j < a1; ++j) __builtin_prefetch(src + j*64, 0, 2);
            }
            _tile_loadd(4, a + s*1024, 64); _tile_loadd(5, a + s*1024 + 512, 64);
            if (s + 1 < ns) { _tile_loadd(2, b + (s+1)*1024, 64); _tile_loadd(3, b + (s+1)*1024 + 512, 64); }
            _tile_dpbf16ps(0,4,6); _tile_dpbf16ps(1,4,7); _tile_dpbf16ps(0,5,6); _tile_dpbf16ps(1,5,7); dps += 4;
            if (s + 1 < ns) {
                _tile_loadd(4, a + (s+1)*1024, 64); _tile_loadd(5, a + (s+1)*1024 + 512, 64);
                if (s + 2 < ns) { _tile_loadd(6, b + (s+2)*1024, 64); _tile_loadd(7, b + (s+2)*1024 + 512, 64); }
                _tile_dpbf16ps(0,4,2); _tile_dpbf16ps(1,4,3); _tile_dpbf16ps(0,5,2); _tile_dpbf16ps(1,5,3); dps += 4;
            }
        }
        _tile_stored(0, cc, 64); _tile_stored(1, cc+256, 64);
      }
    }
    double t = now() - t0;
    printf("dbuf ns %d units %d panels %d mode %d span %zu: %.2f TFLOP/s, B stream %.1f GB/s\n", ns, nu, npan, mode, span, dps*16384.0/t/1e12, total/t/1e9);
}
