/* Run by hand on 2026-12-07 (README.md): 12 independent vpdpbusd a loop, plus 4 of another
 * instruction (-DFMA vfmadd231ps, -DMUL vpmulld, -DCVT vcvtdq2ps, -DMADD vpmaddwd, -DNONE), on one core:
 *   gcc -O2 -mavx512f -DFMA dot-pipes-mix.c -o x && taskset -c 1 ./x
 * output (cycles at 3.66 GHz, the vpdpbusd-only loop 12.1): NONE 12.1, FMA 16.0, MUL 16.0, CVT 12.0,
 * MADD 16.0: an FMA, vpmulld or vpmaddwd takes a dot product slot; vcvtdq2ps does not. */
#include <stdio.h>
#include <time.h>
static double now(void){struct timespec t;clock_gettime(CLOCK_MONOTONIC,&t);return t.tv_sec+t.tv_nsec*1e-9;}
#define DP(r) "vpdpbusd %%zmm20, %%zmm21, %%zmm" #r "\n"
#ifdef FMA
#define X(r) "vfmadd231ps %%zmm22, %%zmm23, %%zmm" #r "\n"
#elif defined(MUL)
#define X(r) "vpmulld %%zmm20, %%zmm21, %%zmm" #r "\n"
#elif defined(CVT)
#define X(r) "vcvtdq2ps %%zmm20, %%zmm" #r "\n"
#elif defined(MADD)
#define X(r) "vpmaddwd %%zmm20, %%zmm21, %%zmm" #r "\n"
#else
#define X(r) ""
#endif
int main(void){
  long it=200000000; double t0=now();
  __asm__ volatile(
    "vpxord %%zmm20,%%zmm20,%%zmm20\n vpxord %%zmm21,%%zmm21,%%zmm21\n vxorps %%zmm22,%%zmm22,%%zmm22\n vxorps %%zmm23,%%zmm23,%%zmm23\n"
    "1:\n"
    DP(0) DP(1) DP(2) DP(3) DP(4) DP(5) DP(6) DP(7) DP(8) DP(9) DP(10) DP(11)
    X(12) X(13) X(14) X(15)
    "dec %0\n jnz 1b\n" : "+r"(it) : : "xmm0","xmm1","xmm2","xmm3","xmm4","xmm5","xmm6","xmm7","xmm8","xmm9","xmm10","xmm11","xmm12","xmm13","xmm14","xmm15","xmm20","xmm21","xmm22","xmm23","cc");
  double dt=now()-t0;
  printf("%.2f ns/iter = %.1f cycles at 3.66 GHz\n", dt/200000000*1e9, dt/200000000*3.66e9); return 0; }
