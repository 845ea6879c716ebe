/* The int8 dot with vpsignb, with a broadcast from memory added per step, and with the
 * vpmaddwd constant from memory.
 * gcc -O2 -mavx2 FILE.c && ./a.out (measured by hand on 2026-12-07, README.md) */
#include <stdio.h>
#include <time.h>
#include <stdint.h>
#include <immintrin.h>
static double now(void){struct timespec t;clock_gettime(CLOCK_MONOTONIC,&t);return t.tv_sec+t.tv_nsec*1e-9;}
#define N 200000000L
int32_t buf[64] __attribute__((aligned(64)));
int main(void){
  for(int i=0;i<64;++i) buf[i]=i*0x01020304;
  __m256i a0=_mm256_set1_epi32(1),a1=a0,a2=a0,a3=a0,a4=a0,a5=a0,a6=a0,a7=a0;
  __m256i x=_mm256_set1_epi8(3), y=_mm256_set1_epi8(-2), one=_mm256_set1_epi16(1);
  double t0;
  const int32_t *p=buf;
/* one broadcast per step (x from memory), as the 1-vector kernels take it */
#define SB(a) __asm__("vpbroadcastd (%5), %%ymm13\n\tvpsignb %3, %%ymm13, %%ymm14\n\tvpmaddubsw %%ymm14, %2, %%ymm15\n\tvpmaddwd %4, %%ymm15, %%ymm15\n\tvpaddd %%ymm15, %0, %0" : "+x"(a) : "x"(a), "x"(y), "x"(x), "x"(one), "r"(p) : "xmm15","xmm14","xmm13");
#define S4(a) __asm__("vpsignb %3, %2, %%ymm14\n\tvpmaddubsw %%ymm14, %3, %%ymm15\n\tvpmaddwd %4, %%ymm15, %%ymm15\n\tvpaddd %%ymm15, %0, %0" : "+x"(a) : "x"(a), "x"(y), "x"(x), "x"(one) : "xmm15","xmm14");
#define SM(a) __asm__("vpsignb %3, %2, %%ymm14\n\tvpmaddubsw %%ymm14, %3, %%ymm15\n\tvpmaddwd (%5), %%ymm15, %%ymm15\n\tvpaddd %%ymm15, %0, %0" : "+x"(a) : "x"(a), "x"(y), "x"(x), "x"(one), "r"(buf+32) : "xmm15","xmm14");
#define RUN(M,name) t0=now(); for(long i=0;i<N/8;++i){M(a0)M(a1)M(a2)M(a3)M(a4)M(a5)M(a6)M(a7)} printf("%-28s %.3f ns per step\n",name,(now()-t0)/N*1e9);
  for(int i=32;i<48;++i) buf[i]=0x00010001;
  for(int r=0;r<2;++r){
  RUN(S4,"sign+maddubs+maddwd+add")
  RUN(SB,"bcast+sign+maddubs+maddwd+add")
  RUN(SM,"sign+maddubs+maddwd(mem ones)+add")
  }
  __m256i s=_mm256_add_epi32(_mm256_add_epi32(a0,a1),_mm256_add_epi32(a2,a3)); s=_mm256_add_epi32(s,_mm256_add_epi32(_mm256_add_epi32(a4,a5),_mm256_add_epi32(a6,a7)));
  printf("%d\n",_mm256_extract_epi32(s,0));
}
