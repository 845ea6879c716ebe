/* The int4 tile loop's orders in isolation, for the 2026-12-05 session-8 measurements
 * (README.md here). Build: gcc -O2 -march=sapphirerapids amx-int4-tile-order.c; run ./a.out V:
 * V = 1: 2 panels x 2 blocks a group, K = 32 (int8 bytes), the four C tiles stored after each
 * group (amx_int_packed.j2's order, the first int4 tile kernel's); 4: the same, no stores;
 * 2: K = 64, no stores; 3: bf16 K = 32, no stores; 5: one panel x one block, C/A/B on
 * alternate tiles; 6: one panel x two blocks, the groups of a pair on alternate A tiles, each
 * C tile stored as soon as its product is done (amx_int4_packed.j2's order). B and A stay in
 * L1/L2. Prints ns per 16 x 16 x 32 product. */
#define _GNU_SOURCE
#include <immintrin.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <sys/syscall.h>
#include <unistd.h>
typedef struct { uint8_t palette, start; uint8_t r[14]; uint16_t colsb[16]; uint8_t rows[16]; } cfg_t;
static double now(void){struct timespec t;clock_gettime(CLOCK_MONOTONIC,&t);return t.tv_sec+t.tv_nsec*1e-9;}
int main(int argc,char**argv){
  syscall(SYS_arch_prctl, 0x1023, 18);
  int V = atoi(argv[1]); int NG = 64; long iters = 20000;
  uint8_t *B = aligned_alloc(64, 2*NG*1024); memset(B, 1, 2*NG*1024);
  uint8_t *A = aligned_alloc(64, 32*NG*64); memset(A, 1, 32*NG*64);
  int32_t *ci = aligned_alloc(64, 8*4*1024); memset(ci,0,8*4*1024);
  cfg_t cf; memset(&cf,0,sizeof cf); cf.palette=1;
  for(int i=0;i<8;i++){cf.colsb[i]=64; cf.rows[i]=16;}
  if (V==5 || V==6) { for (int i=0;i<8;i++){cf.colsb[i]=64; cf.rows[i]=16;} cf.colsb[2]=cf.colsb[3]=32; cf.rows[4]=cf.rows[5]=8; } /* 0,1 C; 2,3 A; 4,5 B */
  if (V==1 || V==4) { cf.colsb[4]=cf.colsb[5]=32; cf.rows[6]=cf.rows[7]=8; } /* K=32 int8 */
  /* V2: int8 K=64 ; V3: bf16 K=32 (A 16x64B, B 16 rows x 64B) */
  _tile_loadconfig(&cf);
  double t0=now(); double prods=0;
  for (long it=0; it<iters; ++it) {
    if (V==1) { for (int g=0; g<NG; ++g) { /* 4 tdp K=32 + 4 stores per group */
      _tile_loadd(6, B + g*512, 64); _tile_loadd(7, B + NG*512 + g*512, 64);
      _tile_loadd(4, A + g*32, NG*32); _tile_loadd(5, A + 16*NG*32 + g*32, NG*32);
      _tile_zero(0); _tile_dpbssd(0,4,6); _tile_zero(1); _tile_dpbssd(1,4,7); _tile_zero(2); _tile_dpbssd(2,5,6); _tile_zero(3); _tile_dpbssd(3,5,7);
      int32_t *c = ci + (g & 7)*1024;
      _tile_stored(0,c,64); _tile_stored(1,c+256,64); _tile_stored(2,c+512,64); _tile_stored(3,c+768,64);
      } prods += NG*4; }
    if (V==5) { for (int g=0; g<NG; g+=2) { /* 1 panel x 1 block, C/A/B double-buffered; 4 products per 2 groups as 2 streams */
      for (int st=0; st<2; ++st) {
      const uint8_t *Bs = B + st*NG*512; const uint8_t *As = A + st*16*NG*32;
      _tile_loadd(4, Bs + g*512, 64); _tile_loadd(2, As + g*32, NG*32);
      _tile_zero(0); _tile_dpbssd(0,2,4);
      _tile_loadd(5, Bs + (g+1)*512, 64); _tile_loadd(3, As + (g+1)*32, NG*32);
      _tile_stored(0, ci + (st*2)*256, 64);
      _tile_zero(1); _tile_dpbssd(1,3,5);
      _tile_stored(1, ci + (st*2+1)*256, 64);
      }
      } prods += NG*2; }
    if (V==6) { for (int g=0; g<NG; g+=2) { /* 1 panel x 1 block interleaved differently */
      const uint8_t *B0 = B, *B1 = B + NG*512;
      _tile_loadd(4, B0 + g*512, 64); _tile_loadd(2, A + g*32, NG*32); _tile_zero(0); _tile_dpbssd(0,2,4);
      _tile_loadd(5, B1 + g*512, 64); _tile_zero(1); _tile_dpbssd(1,2,5);
      _tile_stored(0, ci, 64);
      _tile_loadd(4, B0 + (g+1)*512, 64); _tile_loadd(3, A + (g+1)*32, NG*32); _tile_zero(0); _tile_dpbssd(0,3,4);
      _tile_stored(1, ci + 256, 64);
      _tile_loadd(5, B1 + (g+1)*512, 64); _tile_zero(1); _tile_dpbssd(1,3,5);
      _tile_stored(0, ci+512, 64); _tile_stored(1, ci + 768, 64);
      } prods += NG*2; }
    if (V==4) { for (int g=0; g<NG; ++g) { /* as 1, no stores */
      _tile_loadd(6, B + g*512, 64); _tile_loadd(7, B + NG*512 + g*512, 64);
      _tile_loadd(4, A + g*32, NG*32); _tile_loadd(5, A + 16*NG*32 + g*32, NG*32);
      _tile_dpbssd(0,4,6); _tile_dpbssd(1,4,7); _tile_dpbssd(2,5,6); _tile_dpbssd(3,5,7);
      } prods += NG*4; }
    if (V==2) { for (int g=0; g<NG; g+=2) { /* int8 K=64: 2 groups per tdp */
      _tile_loadd(6, B + g*512, 64); _tile_loadd(7, B + NG*512 + g*512, 64);
      _tile_loadd(4, A + g*32, NG*32); _tile_loadd(5, A + 16*NG*32 + g*32, NG*32);
      _tile_dpbssd(0,4,6); _tile_dpbssd(1,4,7); _tile_dpbssd(2,5,6); _tile_dpbssd(3,5,7);
      } prods += NG*4; }
    if (V==3) { for (int g=0; g<NG; ++g) { /* bf16 K=32 per tdp: B 1KB per group */
      _tile_loadd(6, B + (g&31)*1024, 64); _tile_loadd(7, B + NG*512 + (g&31)*1024, 64);
      _tile_loadd(4, A + g*64 % (NG*32), NG*64); _tile_loadd(5, A + 16*NG*32 + g*64 % (NG*32), NG*64);
      _tile_dpbf16ps(0,4,6); _tile_dpbf16ps(1,4,7); _tile_dpbf16ps(2,5,6); _tile_dpbf16ps(3,5,7);
      } prods += NG*4; }
  }
  double t=now()-t0;
  _tile_stored(0, ci, 64); _tile_release();
  printf("V%d: %.2f ns per 16x16x32 product (%.0f GMAC/s)\n", V, t/prods*1e9, prods*8192/t/1e9);
  return ci[0] == 12345;
}
