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
/* kernel-like: units x pairs x ns steps; B per unit [ns][2][1KB], A per pair [ns][2 tiles][hi,lo] */
int main(int argc, char **argv) {
    syscall(SYS_arch_prctl, 0x1023, 18);
    cfg_t c; memset(&c,0,sizeof c); c.palette=1; for(int i=0;i<8;i++){c.colsb[i]=64;c.rows[i]=16;}
    _tile_loadconfig(&c);
    int ns = atoi(argv[1]), nu = atoi(argv[2]), npair = atoi(argv[3]), lo = atoi(argv[4]), storeC = atoi(argv[5]);
    size_t bsz = (size_t)nu * ns * 2 * 512, asz = (size_t)npair * ns * 4 * 512;
    uint16_t *B = aligned_alloc(64, bsz*2), *A = aligned_alloc(64, asz*2);
    memset(B, 0, bsz*2); memset(A, 0, asz*2);
    float *C = aligned_alloc(64, (size_t)nu*npair*4*1024); memset(C, 0, (size_t)nu*npair*4*1024);
    long dps = 0; double t0 = now();
    for (int it = 0; it < 20000000 / (ns*nu*npair*(lo?8:4)) + 1; ++it)
    for (int p = 0; p < npair; ++p) for (int v = 0; v < nu; ++v) {
        float *cc = C + ((size_t)v*npair + p)*1024;
        if (storeC) { _tile_loadd(0, cc, 64); _tile_loadd(1, cc+256, 64); _tile_loadd(2, cc+512, 64); _tile_loadd(3, cc+768, 64); }
        const uint16_t *b = B + (size_t)v*ns*1024, *a = A + (size_t)p*ns*2048;
        for (int s = 0; s < ns; ++s) {
            _tile_loadd(6, b + s*1024, 64); _tile_loadd(7, b + s*1024 + 512, 64);
            _tile_loadd(4, a + s*2048, 64); _tile_loadd(5, a + s*2048 + 512, 64);
            _tile_dpbf16ps(0,4,6); _tile_dpbf16ps(1,4,7); _tile_dpbf16ps(2,5,6); _tile_dpbf16ps(3,5,7); dps += 4;
            if (lo) { _tile_loadd(4, a + s*2048 + 1024, 64); _tile_loadd(5, a + s*2048 + 1536, 64);
            _tile_dpbf16ps(0,4,6); _tile_dpbf16ps(1,4,7); _tile_dpbf16ps(2,5,6); _tile_dpbf16ps(3,5,7); dps += 4; }
        }
        if (storeC) { _tile_stored(0, cc, 64); _tile_stored(1, cc+256, 64); _tile_stored(2, cc+512, 64); _tile_stored(3, cc+768, 64); }
    }
    double t = now() - t0;
    printf("ns %d units %d pairs %d lo %d storeC %d (B %zu KB, A %zu KB): %.2f TFLOP/s\n", ns, nu, npair, lo, storeC, bsz*2/1024, asz*2/1024, dps*16384.0/t/1e12);
}
