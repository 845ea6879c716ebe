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
    int mode = atoi(argv[1]); long D = argc > 2 ? atol(argv[2]) : 4096;
    size_t total = (size_t)1 << 30; char *B = aligned_alloc(4096, total + (1<<22)); memset(B, 1, total + (1<<22));
    __m512i acc = _mm512_setzero_si512();
    double t0 = now();
    for (size_t o = 0; o < total; o += 1024) {
        if (mode == 0) for (int j = 0; j < 16; ++j) acc = _mm512_add_epi32(acc, _mm512_load_si512(B + o + j*64));
        if (mode == 1) _tile_loadd(6, B + o, 64);
        if (mode == 2) { for (int j = 0; j < 16; ++j) _mm_prefetch(B + o + D + j*64, _MM_HINT_T1); _tile_loadd(6, B + o, 64); }
        if (mode == 3) { for (int j = 0; j < 16; ++j) _mm_prefetch(B + o + D + j*64, _MM_HINT_T0); _tile_loadd(6, B + o, 64); }
        if (mode == 4) { for (int j = 0; j < 16; ++j) _mm_prefetch(B + o + D + j*64, _MM_HINT_T1); }
        if (mode == 5) { for (int j = 0; j < 16; ++j) acc = _mm512_add_epi32(acc, _mm512_load_si512(B + o + D + j*64)); _tile_loadd(6, B + o, 64); }
    }
    double t = now() - t0;
    printf("mode %d D %ld: %.1f GB/s %d\n", mode, D, total / t / 1e9, _mm512_reduce_add_epi32(acc) & 0);
}
