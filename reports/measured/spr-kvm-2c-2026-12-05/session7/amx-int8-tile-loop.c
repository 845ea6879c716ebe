/* The int8 tile loop of amx_int.j2 (row layout) in isolation, for the 2026-12-05 session-7
 * measurements (README.md here). Build: gcc -O2 -march=sapphirerapids amx-int8-tile-loop.c
 * Run: ./a.out V with V = 1 (amx_int.j2's shape: 32 rows x 32 tokens a group, C stored and
 * scaled per group), 3 (V1 with the scaling one group behind) or 2 (16 rows, two groups on
 * separate tiles). Environment: PACKED=1 reads tile-packed weights (each group's 16 rows
 * contiguous) instead of rows 2 KiB apart; PF=bytes a software prefetch distance (HINT=3:
 * prefetcht0, else prefetcht1); NOEPI=1 leaves out the float scaling; WFIX=1 cycles one
 * block (weights in L1/L2); HUGE=1 advises huge pages; FILE=path maps a model file instead
 * of 1 GiB of anonymous memory. Prints ns per 16x16x32 product and the weights' GB/s. */
#define _GNU_SOURCE
#include <immintrin.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <sys/syscall.h>
#include <unistd.h>
#include <sys/mman.h>
typedef struct { uint8_t palette, start; uint8_t r[14]; uint16_t colsb[16]; uint8_t rows[16]; } cfg_t;
static double now(void){struct timespec t;clock_gettime(CLOCK_MONOTONIC,&t);return t.tv_sec+t.tv_nsec*1e-9;}
static int noepi_g; static inline void epi16(const int32_t *c, const float *sv, float *acc, int ld) { if (noepi_g) return; /* 16 rows x 16 tokens */
  const __m512 s = _mm512_loadu_ps(sv);
  for (int i=0;i<16;i++){ float *o=acc+i*ld; _mm512_storeu_ps(o,_mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_load_si512(c+i*16)),s,_mm512_loadu_ps(o))); }
}
int main(int argc,char**argv){
  syscall(SYS_arch_prctl, 0x1023, 18);
  int V = atoi(argv[1]); int wfix = getenv("WFIX") != 0; int noepi = getenv("NOEPI") != 0; int pf = getenv("PF") ? atoi(getenv("PF")) : 0; int packed = getenv("PACKED") != 0; int hint = getenv("HINT") ? atoi(getenv("HINT")) : 3; size_t N = (size_t)1<<30; const int cols=2048;
  int8_t *w;
  if (getenv("FILE")) { FILE *f = fopen(getenv("FILE"),"rb"); int fd = fileno(f); w = mmap(0,N,PROT_READ,MAP_SHARED,fd,0); volatile long s=0; for(size_t i=0;i<N;i+=4096) s+=w[i]; }
  else { w = mmap(0,N,PROT_READ|PROT_WRITE,MAP_PRIVATE|MAP_ANONYMOUS,-1,0); if (getenv("HUGE")) madvise(w,N,MADV_HUGEPAGE); memset(w,1,N);}
  int8_t *act=aligned_alloc(64,64*1024*2); memset(act,1,64*1024*2); /* per group g: 2 halves of 8 rows x 64 B (16 tokens each) */
  int32_t *c=aligned_alloc(64,8*1024*4); float *acc=aligned_alloc(64,32*32*4); memset(acc,0,4096);
  float sc[64*32]; for(int i=0;i<64*32;i++)sc[i]=1e-3f;
  cfg_t cf; memset(&cf,0,sizeof cf); cf.palette=1;
  for(int i=0;i<8;i++){cf.colsb[i]=64; cf.rows[i]=16;}
  /* V1: 0-3 C, 4,5 A (16x32B), 6,7 B (8x64B) */
  if (V==1||V==3) { for(int i=4;i<6;i++) cf.colsb[i]=32; for(int i=6;i<8;i++) cf.rows[i]=8; }
  /* V2: pairs: A in 0,1 (16x32B); B in 2,3 (8 x 64B); C in 4..7 : stage s uses A_s, B_s, C_{4+2s}, C_{5+2s}? keep simple: 16 rows x 32 tokens per stage */
  if (V==2) { cf.colsb[0]=cf.colsb[1]=32; cf.rows[2]=cf.rows[3]=8; }
  _tile_loadconfig(&cf); noepi_g = noepi;
  double t0=now(); size_t units=0;
  for (size_t r0=0; r0+32 <= N/cols; r0+=32) {
    for (int k0=0;k0<cols;k0+=512) {
      const int8_t *w0 = w + (wfix ? 0 : r0)*cols + k0, *w1 = w0 + 16*cols;
      if (V==1) for (int g=0; g<16; g++) { /* current: 32 rows x 32 tokens, store+epilogue per group */
        const int8_t *qg = act + (size_t)(k0/32+g)*1024;
        if (pf && !packed && !(g&1)) for (int i=0;i<16;i++) { if (hint==3) { _mm_prefetch((const char*)w0+i*cols+g*32+pf, _MM_HINT_T0); _mm_prefetch((const char*)w1+i*cols+g*32+pf, _MM_HINT_T0);} else { _mm_prefetch((const char*)w0+i*cols+g*32+pf, _MM_HINT_T1); _mm_prefetch((const char*)w1+i*cols+g*32+pf, _MM_HINT_T1);} }
        _tile_zero(0); _tile_zero(1); _tile_zero(2); _tile_zero(3);
        if (packed) { const int8_t *pw = w + ((wfix ? 0 : r0/32)*(size_t)(cols/32) + (k0/32+g))*1024; if (pf) for (int l=0;l<16;l++) { if (hint==3) _mm_prefetch((const char*)pw+pf+l*64, _MM_HINT_T0); else _mm_prefetch((const char*)pw+pf+l*64, _MM_HINT_T1); }; _tile_loadd(4,pw,32); _tile_loadd(5,pw+512,32); }
        else { _tile_loadd(4,w0+g*32,cols); _tile_loadd(5,w1+g*32,cols); }
        _tile_loadd(6,qg,64); _tile_loadd(7,qg+512,64);
        _tile_dpbssd(0,4,6); _tile_dpbssd(1,4,7); _tile_dpbssd(2,5,6); _tile_dpbssd(3,5,7);
        _tile_stored(0,c,64); _tile_stored(1,c+256,64); _tile_stored(2,c+512,64); _tile_stored(3,c+768,64);
        for (int a=0;a<2;a++) for(int h=0;h<2;h++) epi16(c+(a*2+h)*256, sc+(k0/32+g)*32+16*h, acc+16*a*32+16*h, 32);
        units += 8;
      }
      if (V==3) for (int g=0; g<16; g++) { /* as V1, epilogue of the previous group (double-buffered c) */
        const int8_t *qg = act + (size_t)(k0/32+g)*1024; int32_t *cb = c + (g&1)*1024, *pb = c + ((g-1)&1)*1024;
        _tile_zero(0); _tile_zero(1); _tile_zero(2); _tile_zero(3);
        _tile_loadd(4,w0+g*32,cols); _tile_loadd(5,w1+g*32,cols); _tile_loadd(6,qg,64); _tile_loadd(7,qg+512,64);
        _tile_dpbssd(0,4,6); _tile_dpbssd(1,4,7); _tile_dpbssd(2,5,6); _tile_dpbssd(3,5,7);
        if (g) for (int a=0;a<2;a++) for(int h=0;h<2;h++) epi16(pb+(a*2+h)*256, sc+(k0/32+g-1)*32+16*h, acc+16*a*32+16*h, 32);
        _tile_stored(0,cb,64); _tile_stored(1,cb+256,64); _tile_stored(2,cb+512,64); _tile_stored(3,cb+768,64);
        units += 8;
        if (g==15) for (int a=0;a<2;a++) for(int h=0;h<2;h++) epi16(cb+(a*2+h)*256, sc+(k0/32+g)*32+16*h, acc+16*a*32+16*h, 32);
      }
      if (V==2) for (int g=0; g<16; g+=2) { /* 16 rows x 32 tokens, two groups in flight on separate tiles */
        for (int rb=0; rb<2; rb++) { const int8_t *wr = rb? w1 : w0;
        const int8_t *q0 = act + (size_t)(k0/32+g)*1024, *q1 = q0 + 1024;
        _tile_zero(4); _tile_zero(5); _tile_loadd(0,wr+g*32,cols); _tile_loadd(2,q0,64);
        _tile_dpbssd(4,0,2); _tile_loadd(3,q0+512,64); _tile_dpbssd(5,0,3);
        _tile_zero(6); _tile_zero(7); _tile_loadd(1,wr+g*32+32,cols); _tile_loadd(2,q1,64);
        _tile_dpbssd(6,1,2); _tile_loadd(3,q1+512,64); _tile_dpbssd(7,1,3);
        _tile_stored(4,c,64); _tile_stored(5,c+256,64); _tile_stored(6,c+512,64); _tile_stored(7,c+768,64);
        for (int s=0;s<2;s++) for(int h=0;h<2;h++) epi16(c+(s*2+h)*256, sc+(k0/32+g+s)*32+16*h, acc+16*rb*32+16*h, 32);
        units += 8; }
      }
    }
  }
  double t=now()-t0;
  printf("V%d: %.1f ns per 16x16x32 unit, %.0f GMAC/s, %.2f GB/s weights\n", V, t/units*1e9, units*8192/t/1e9, (double)N/t/1e9);
  return acc[3]==12345;
}
