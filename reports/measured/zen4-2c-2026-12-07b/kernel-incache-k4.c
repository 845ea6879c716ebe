/* kernel-incache-k4.c — the packed int4k prefill blocks' in-cache rate on one core (2026-12-07b,
 * README.md, kernel-incache-k4.txt): ../zen3-2c-2026-12-07/kernel-incache.c adapted to int4k. One
 * generated int4 part file included whole, one block function KFN (NV vectors x NT tokens)
 * called over a row of cols (argv[2], default 2048; read at run time: with the length a
 * compile-time constant GCC compiled k4pk_pre_v1_t4 to 237 GOP/s instead of 320) in k-chunks of
 * one super-block, on data that stays in L1/L2. Build against a zen4 build tree's part:
 *   gcc -O3 -std=c11 -ffp-contract=off -march=znver3 -mtune=znver3 -mavx512f -mavx512bw -mavx512cd
 *       -mavx512dq -mavx512vl -mavx512vnni -mavx512bf16 -mavx512vbmi -mgfni -D_GNU_SOURCE -I . -I kernels
 *       -I build/zen4/gen -DPART='"build/zen4/gen/parts/cbp_int4_<hash>.c"' -DKFN=k4pk_pre_v2_t4 -DNV=2
 *       -DNT=4 kernel-incache-k4.c -o k4ic -lm -fopenmp
 * and run ./k4ic 20000 [cols] (calls of the whole row; prints GOP/s three times). */
#include PART
#ifdef ALT_H
#include ALT_H
#endif
#ifndef KNAME
#define KNAME "k"
#endif
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
static double now(void){struct timespec t;clock_gettime(CLOCK_MONOTONIC,&t);return t.tv_sec+t.tv_nsec*1e-9;}
int main(int argc,char**argv){
    const int cols=argc>2?atoi(argv[2]):2048, ng=cols/32, kcg=8;
    const size_t bb=k4pk_block_bytes(cols);
    uint8_t *blk=aligned_alloc(64, 4*bb);
    for(size_t i=0;i<4*bb;++i) blk[i]=(uint8_t)(rand()&255);
    for(int b=0;b<4;++b) for(int g=0;g<ng;g+=8){ uint16_t *h=(uint16_t*)(blk+b*bb+K4_HOFF(g)+12*PK_RV); for(int l=0;l<2*PK_RV;++l) h[l]=0x3c00; }
    int8_t *q=aligned_alloc(64, 8*cols); float *s=aligned_alloc(64,8*ng*4); int32_t *bs=aligned_alloc(64,8*ng*4);
    for(int i=0;i<8*cols;++i) q[i]=(int8_t)(rand()%255-127);
    for(int i=0;i<8*ng;++i){s[i]=1e-3f;bs[i]=rand()%1000;}
    k4_x x[8]; for(int t=0;t<8;++t) x[t]=(k4_x){q+t*cols,s+t*ng,bs+t*ng};
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
