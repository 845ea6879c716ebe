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
    int ns = atoi(argv[1]), nu = atoi(argv[2]), npair = atoi(argv[3]), pfmode = atoi(argv[4]); long D = argc > 5 ? atol(argv[5]) : 0; int hint_ = argc > 6 ? atoi(argv[6]) : 2;
    size_t tileset = (size_t)nu * ns * 2 * 512; /* elements of B per k-tile */
    size_t total = (size_t)1 << 29; /* 1 GB of B */
    size_t nsets = total / 2 / tileset;
    uint16_t *B = aligned_alloc(64, total); memset(B, 1, total);
    size_t asz = (size_t)npair * ns * 4 * 512;
    uint16_t *A = aligned_alloc(64, asz*2); memset(A, 0, asz*2);
    float *C = aligned_alloc(64, (size_t)nu*npair*4*1024); memset(C, 0, (size_t)nu*npair*4*1024);
    long dps = 0; double t0 = now();
    for (size_t set = 0; set < nsets; ++set) {
      const uint16_t *Bs = B + set * tileset;
      for (int p = 0; p < npair; ++p) for (int v = 0; v < nu; ++v) {
        float *cc = C + ((size_t)v*npair + p)*1024;
        _tile_loadd(0, cc, 64); _tile_loadd(1, cc+256, 64); _tile_loadd(2, cc+512, 64); _tile_loadd(3, cc+768, 64);
        const uint16_t *b = Bs + (size_t)v*ns*1024, *a = A + (size_t)p*ns*2048;
        for (int s = 0; s < ns; ++s) {
            if (pfmode == 1 && set + 1 < nsets) { /* next set share */
                const char *nb = (const char *)(b + tileset + s*1024);
                int j0 = 32 * p / npair, j1 = 32 * (p+1) / npair;
                for (int j = j0; j < j1; ++j) __builtin_prefetch(nb + j*64, 0, 2);
            }
            if (pfmode >= 2 && p == 0) { /* stream ahead by D elements on the first pass */
                const char *nb = (const char *)(b + s*1024) + D;
                for (int j = 0; j < 32; ++j) do { if (hint_==3) __builtin_prefetch(nb + j*64, 0, 3); else if (hint_==2) __builtin_prefetch(nb + j*64, 0, 2); else __builtin_prefetch(nb + j*64, 0, 1);} while(0);
            }
            if (pfmode == 3) { /* every pass: its share of the lines D ahead */
                const char *nb = (const char *)(b + s*1024) + D;
                int j0 = 32 * p / npair, j1 = 32 * (p+1) / npair;
                for (int j = j0; j < j1; ++j) do { if (hint_==3) __builtin_prefetch(nb + j*64, 0, 3); else if (hint_==2) __builtin_prefetch(nb + j*64, 0, 2); else __builtin_prefetch(nb + j*64, 0, 1);} while(0);
            }
            _tile_loadd(6, b + s*1024, 64); _tile_loadd(7, b + s*1024 + 512, 64);
            _tile_loadd(4, a + s*2048, 64); _tile_loadd(5, a + s*2048 + 512, 64);
            _tile_dpbf16ps(0,4,6); _tile_dpbf16ps(1,4,7); _tile_dpbf16ps(2,5,6); _tile_dpbf16ps(3,5,7);
            _tile_loadd(4, a + s*2048 + 1024, 64); _tile_loadd(5, a + s*2048 + 1536, 64);
            _tile_dpbf16ps(0,4,6); _tile_dpbf16ps(1,4,7); _tile_dpbf16ps(2,5,6); _tile_dpbf16ps(3,5,7); dps += 8;
        }
        _tile_stored(0, cc, 64); _tile_stored(1, cc+256, 64); _tile_stored(2, cc+512, 64); _tile_stored(3, cc+768, 64);
      }
    }
    double t = now() - t0;
    printf("ns %d units %d pairs %d pf %d: %.2f TFLOP/s, B stream %.1f GB/s\n", ns, nu, npair, pfmode, dps*16384.0/t/1e12, total/t/1e9);
}
