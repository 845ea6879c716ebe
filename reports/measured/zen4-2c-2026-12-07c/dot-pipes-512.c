/* Which AVX-512 instructions share the VNNI dot's issue slots on Zen 4 (the int4k kernels'
 * per-group and per-super-block arithmetic, k4pk_* in templates/expert_ffn/packed.j2): 32
 * vpdpbusd on 8 independent accumulators per step, then the same with 8 vpmulld, 8 vpdpwssd,
 * 8 vcvtdq2ps or 32 vpbroadcastd from memory added; and (second table) 16 vpdpbusd with 16
 * register moves, 16 or 24 vpandd. Measured by hand on 2026-12-07 (README.md):
 *   gcc -O2 -mavx512f -mavx512vnni dot-pipes-512.c && ./a.out */
#include <stdio.h>
#include <time.h>
static double now(void){struct timespec t;clock_gettime(CLOCK_MONOTONIC,&t);return t.tv_sec+t.tv_nsec*1e-9;}
#define DP8 "vpdpbusd %%zmm16,%%zmm17,%%zmm0\n vpdpbusd %%zmm16,%%zmm17,%%zmm1\n vpdpbusd %%zmm16,%%zmm17,%%zmm2\n vpdpbusd %%zmm16,%%zmm17,%%zmm3\n vpdpbusd %%zmm16,%%zmm17,%%zmm4\n vpdpbusd %%zmm16,%%zmm17,%%zmm5\n vpdpbusd %%zmm16,%%zmm17,%%zmm6\n vpdpbusd %%zmm16,%%zmm17,%%zmm7\n"
#define MUL8 "vpmulld %%zmm20,%%zmm18,%%zmm21\n vpmulld %%zmm22,%%zmm18,%%zmm23\n vpmulld %%zmm24,%%zmm18,%%zmm25\n vpmulld %%zmm26,%%zmm18,%%zmm27\n vpmulld %%zmm20,%%zmm19,%%zmm28\n vpmulld %%zmm22,%%zmm19,%%zmm29\n vpmulld %%zmm24,%%zmm19,%%zmm30\n vpmulld %%zmm26,%%zmm19,%%zmm31\n"
#define WSD8 "vpdpwssd %%zmm20,%%zmm18,%%zmm21\n vpdpwssd %%zmm22,%%zmm18,%%zmm23\n vpdpwssd %%zmm24,%%zmm18,%%zmm25\n vpdpwssd %%zmm26,%%zmm18,%%zmm27\n vpdpwssd %%zmm20,%%zmm19,%%zmm28\n vpdpwssd %%zmm22,%%zmm19,%%zmm29\n vpdpwssd %%zmm24,%%zmm19,%%zmm30\n vpdpwssd %%zmm26,%%zmm19,%%zmm31\n"
#define CVT8 "vcvtdq2ps %%zmm20,%%zmm21\n vcvtdq2ps %%zmm22,%%zmm23\n vcvtdq2ps %%zmm24,%%zmm25\n vcvtdq2ps %%zmm26,%%zmm27\n vcvtdq2ps %%zmm20,%%zmm28\n vcvtdq2ps %%zmm22,%%zmm29\n vcvtdq2ps %%zmm24,%%zmm30\n vcvtdq2ps %%zmm26,%%zmm31\n"
#define BC8 "vpbroadcastd (%0),%%zmm21\n vpbroadcastd 4(%0),%%zmm23\n vpbroadcastd 8(%0),%%zmm25\n vpbroadcastd 12(%0),%%zmm27\n vpbroadcastd 16(%0),%%zmm28\n vpbroadcastd 20(%0),%%zmm29\n vpbroadcastd 24(%0),%%zmm30\n vpbroadcastd 28(%0),%%zmm31\n"
#define CL "xmm0","xmm1","xmm2","xmm3","xmm4","xmm5","xmm6","xmm7","xmm21","xmm23","xmm25","xmm27","xmm28","xmm29","xmm30","xmm31"
#define MV8 "vmovdqa64 %%zmm20,%%zmm21\n vmovdqa64 %%zmm22,%%zmm23\n vmovdqa64 %%zmm24,%%zmm25\n vmovdqa64 %%zmm26,%%zmm27\n vmovdqa64 %%zmm21,%%zmm28\n vmovdqa64 %%zmm23,%%zmm29\n vmovdqa64 %%zmm25,%%zmm30\n vmovdqa64 %%zmm27,%%zmm31\n"
#define AND8 "vpandd %%zmm20,%%zmm18,%%zmm21\n vpandd %%zmm22,%%zmm18,%%zmm23\n vpandd %%zmm24,%%zmm18,%%zmm25\n vpandd %%zmm26,%%zmm18,%%zmm27\n vpandd %%zmm20,%%zmm19,%%zmm28\n vpandd %%zmm22,%%zmm19,%%zmm29\n vpandd %%zmm24,%%zmm19,%%zmm30\n vpandd %%zmm26,%%zmm19,%%zmm31\n"
static void slots(void){
  long N=50000000; static int buf[64];
  for(int rep=0;rep<2;++rep){
  double t[8]; t[0]=now();
  for(long i=0;i<N;i+=1) __asm__ volatile(DP8 DP8 DP8 DP8 ::"r"(buf): CL);
  t[1]=now();
  for(long i=0;i<N;i+=1) __asm__ volatile(DP8 DP8 DP8 DP8 MUL8 ::"r"(buf): CL);
  t[2]=now();
  for(long i=0;i<N;i+=1) __asm__ volatile(DP8 DP8 DP8 DP8 WSD8 ::"r"(buf): CL);
  t[3]=now();
  for(long i=0;i<N;i+=1) __asm__ volatile(DP8 DP8 DP8 DP8 CVT8 ::"r"(buf): CL);
  t[4]=now();
  for(long i=0;i<N;i+=1) __asm__ volatile(DP8 DP8 DP8 DP8 BC8 BC8 BC8 BC8 ::"r"(buf): CL);
  t[5]=now();
  printf("ns/iter: 32 DP %.3f | +8 mulld %.3f | +8 dpwssd %.3f | +8 cvt %.3f | +32 bcast %.3f\n",(t[1]-t[0])/N*1e9,(t[2]-t[1])/N*1e9,(t[3]-t[2])/N*1e9,(t[4]-t[3])/N*1e9,(t[5]-t[4])/N*1e9);}
}
static void alu(void){
  long N=100000000;
  for(int rep=0;rep<2;++rep){
  double t0=now();
  for(long i=0;i<N;i+=1) __asm__ volatile(DP8 DP8 ::: "xmm0","xmm1","xmm2","xmm3","xmm4","xmm5","xmm6","xmm7");
  double t1=now();
  for(long i=0;i<N;i+=1) __asm__ volatile(DP8 DP8 MV8 MV8 ::: "xmm0","xmm1","xmm2","xmm3","xmm4","xmm5","xmm6","xmm7","xmm21","xmm23","xmm25","xmm27","xmm28","xmm29","xmm30","xmm31");
  double t2=now();
  for(long i=0;i<N;i+=1) __asm__ volatile(DP8 DP8 AND8 AND8 ::: "xmm0","xmm1","xmm2","xmm3","xmm4","xmm5","xmm6","xmm7","xmm21","xmm23","xmm25","xmm27","xmm28","xmm29","xmm30","xmm31");
  double t3=now();
  for(long i=0;i<N;i+=1) __asm__ volatile(DP8 DP8 AND8 AND8 AND8 ::: "xmm0","xmm1","xmm2","xmm3","xmm4","xmm5","xmm6","xmm7","xmm21","xmm23","xmm25","xmm27","xmm28","xmm29","xmm30","xmm31");
  double t4=now();
  printf("ns/iter: 16 DP %.3f | +16 mov %.3f | +16 and %.3f | +24 and %.3f\n",(t1-t0)/N*1e9,(t2-t1)/N*1e9,(t3-t2)/N*1e9,(t4-t3)/N*1e9);}
}
int main(void){ slots(); alu(); return 0; }
