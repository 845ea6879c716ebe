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
    size_t abytes = (size_t)atol(argv[1]) * 1024, bbytes = (size_t)atol(argv[2]) * 1024; int mode = atoi(argv[3]);
    uint16_t *A = aligned_alloc(64, abytes), *B = aligned_alloc(64, bbytes);
    memset(A, 0, abytes); memset(B, 0, bbytes);
    float C[256*4]; memset(C,0,sizeof C);
    _tile_zero(0);_tile_zero(1);_tile_zero(2);_tile_zero(3);
    long iters = 2000000; size_t na = abytes/2048, nb = bbytes/2048; /* pairs of tiles */
    double t0 = now(); long dps = 0;
    for (long i = 0; i < iters; ++i) {
        const uint16_t *a = A + (i % na) * 1024, *b = B + (i % nb) * 1024;
        if (mode >= 1) { _tile_loadd(4, a, 64); _tile_loadd(5, a + 512, 64); }
        if (mode >= 2) { _tile_loadd(6, b, 64); _tile_loadd(7, b + 512, 64); }
        _tile_dpbf16ps(0,4,6); _tile_dpbf16ps(1,4,7); _tile_dpbf16ps(2,5,6); _tile_dpbf16ps(3,5,7);
        dps += 4;
        if (mode == 3) { _tile_loadd(4, a + 1024*na/2 % (abytes/2), 64); _tile_loadd(5, a + 512, 64); _tile_dpbf16ps(0,4,6); _tile_dpbf16ps(1,4,7); _tile_dpbf16ps(2,5,6); _tile_dpbf16ps(3,5,7); dps += 4; }
    }
    double t = now() - t0;
    _tile_stored(0, C, 64);
    printf("A %zu KB B %zu KB mode %d: %.2f TFLOP/s (%.1f ns per dp) %g\n", abytes/1024, bbytes/1024, mode, dps*16384.0/t/1e12, t/dps*1e9, C[0]);
    return 0;
}
