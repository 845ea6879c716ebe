/* The in-cache rate of the packed int8 prefill blocks on one core (measured by hand on
 * 2026-12-07, README.md): one generated part file included whole, one block function KFN
 * (NV vectors x NT tokens) called over a 2048-wide row in k-chunks of 256, on data that stays
 * in L1/L2. Build against a zen3 build tree's rendered part:
 *   gcc -O3 -std=c11 -ffp-contract=off -march=znver3 -mtune=znver3 -D_GNU_SOURCE -I . \
 *       -I kernels -I build/zen3/gen -DPART='"build/zen3/gen/parts/cbp_int8_<hash>.c"' \
 *       -DKFN=pk8_pre_v2_t4 -DNV=2 -DNT=4 kernel-incache.c -o incache -lm -fopenmp
 * and run ./incache 100000 (calls of the whole row; prints GOP/s three times).
 * Other alternatives: -DALT_H='"<header>"' (../zen4-2c-2026-12-07/kernel-incache-alt512.h for
 * AVX-512; '"/dev/null"' for none); -DKNAME='"<name>"' labels the output. -DK4 times an int4k
 * block (an int4 part, -DKFN=k4pk_pre_v2_t4; ./incache 100000 [cols]): its k-chunks are one
 * super-block (../zen4-2c-2026-12-07b/kernel-incache-k4.txt). */
#include PART
#ifndef ALT_H
#define ALT_H "kernel-incache-alt.h"
#endif
#include ALT_H
#ifndef KNAME
#define KNAME "k"
#endif
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
static double now(void){struct timespec t;clock_gettime(CLOCK_MONOTONIC,&t);return t.tv_sec+t.tv_nsec*1e-9;}
int main(int argc,char**argv){
#ifdef K4 /* int4k (k4pk_*): the row length read at run time (argv[2], default 2048), as a
           * constant it made GCC compile k4pk_pre_v1_t4 to 237 GOP/s instead of 320 */
    const int cols=argc>2?atoi(argv[2]):2048, ng=cols/32, kcg=8; /* a super-block */
    const size_t bb=k4pk_block_bytes(cols);
#else
    const int cols=2048, ng=cols/32, kcg=8; /* a k-chunk of 256 */
    const size_t bb=(size_t)ng*PK_GS;
#endif
    uint8_t *blk=aligned_alloc(64, 4*bb);
#ifdef K4 /* random codes and nibbles; every super-block's f16 d and dmin 1.0 */
    for(size_t i=0;i<4*bb;++i) blk[i]=(uint8_t)(rand()&255);
    for(int b=0;b<4;++b) for(int g=0;g<ng;g+=8){ uint16_t *h=(uint16_t*)(blk+b*bb+K4_HOFF(g)+12*PK_RV); for(int l=0;l<2*PK_RV;++l) h[l]=0x3c00; }
#else
    for(size_t i=0;i<4*bb;++i) blk[i]=(uint8_t)(rand()%255-127);
#endif
    /* up to 8 tokens */
    int8_t *q=aligned_alloc(64, 8*cols); float *s=aligned_alloc(64,8*ng*4); int32_t *nb=aligned_alloc(64,8*ng*4);
    for(int i=0;i<8*cols;++i) q[i]=(int8_t)(rand()%255-127);
#ifdef K4 /* the group sums as int16 (k4_x), whole super-blocks */
    int16_t *nb16=aligned_alloc(64,8*(ng+8)*2);
    for(int i=0;i<8*ng;++i) s[i]=1e-3f;
    for(int i=0;i<8*(ng+8);++i) nb16[i]=(int16_t)(rand()%1000);
    k4_x x[8]; for(int t=0;t<8;++t) x[t]=(k4_x){q+t*cols,s+t*ng,nb16+t*(ng+8)};
#else
    for(int i=0;i<8*ng;++i){s[i]=1e-3f;nb[i]=0;}
    pk_x x[8]; for(int t=0;t<8;++t) x[t]=(pk_x){q+t*cols,s+t*ng,nb+t*ng};
#endif
    float acc[64*16] __attribute__((aligned(64)));
    const uint8_t *p[4]={blk,blk+bb,blk+2*bb,blk+3*bb};
    const long it=atol(argv[1]);
    for(int rep=0;rep<3;++rep){
    double t0=now();
    for(long i=0;i<it;++i) for(int g0=0; g0<ng; g0+=kcg) { __asm__ volatile("" : : "r"(acc), "r"(p), "r"(x), "r"(blk), "r"(q) : "memory"); KFN(p,x,g0,g0+kcg,acc,g0==0,bb,0); }
    double dt=now()-t0;
    double ops=2.0*it*NV*PK_RV*NT*cols;
    printf("%s: %.1f GOP/s (acc %g)\n", KNAME, ops/dt*1e-9, acc[0]);}
    return 0;
}
