/* The in-cache rate of the packed int8 prefill blocks on one core (measured by hand on
 * 2026-12-07, README.md): one generated part file included whole, one block function KFN
 * (NV vectors x NT tokens; the part's pk8_pre_* or an ALT below) called over a 2048-wide row
 * in k-chunks of 256, on data that stays in L1/L2. Build against a zen4 build tree's part:
 *   gcc -O3 -std=c11 -ffp-contract=off -march=znver3 -mtune=znver3 -mavx512f -mavx512bw \
 *       -mavx512cd -mavx512dq -mavx512vl -mavx512vnni -mavx512bf16 -D_GNU_SOURCE -I kernels \
 *       -I build/zen4/gen -DPART='"build/zen4/gen/parts/cbp_int8_<hash>.c"' \
 *       -DKFN=pk8_pre_v2_t4 -DKNAME='"pk8_pre_v2_t4"' -DNV=2 -DNT=4 kernel-incache.c -o ic -lm -fopenmp
 * and run ./ic 20000 (calls of the whole row; prints GOP/s three times). */
#include PART
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
static double now(void){struct timespec t;clock_gettime(CLOCK_MONOTONIC,&t);return t.tv_sec+t.tv_nsec*1e-9;}
/* alternative: NVA vectors x NTA tokens, float sums in registers, GS groups share one epilogue (GS>1: timing only) */
#define ALT(NAME, NVA, NTA, GS)                                                                          \
static inline void NAME(const uint8_t *const *p, const pk_x *x, int g0, int g1, float *acc, int first, size_t bb, size_t skip) { \
    (void)bb; (void)skip; vf f[NVA][NTA];                                                                  \
    for (int v = 0; v < NVA; ++v) for (int t = 0; t < NTA; ++t) f[v][t] = first ? V_ZERO() : V_LOADX(acc + (v * NTA + t) * PK_RV); \
    for (int g = g0; g < g1; g += GS) {                                                                    \
        vi d[NVA][NTA];                                                                                    \
        for (int t = 0; t < NTA; ++t) { const vi n = VI_BCAST((const uint8_t *)(x[t].nb + g)); for (int v = 0; v < NVA; ++v) d[v][t] = n; } \
        for (int k4 = 0; k4 < 8 * GS; ++k4) {                                                              \
            vi w[NVA];                                                                                     \
            for (int v = 0; v < NVA; ++v) w[v] = VI_LOAD(p[v] + (size_t)g * PK_GS + (size_t)k4 * PK_RV * 4); \
            for (int t = 0; t < NTA; ++t) { const vi xb = VI_BCAST((const uint8_t *)(x[t].q + (size_t)g * 32 + k4 * 4)); \
                for (int v = 0; v < NVA; ++v) d[v][t] = VI_DP(d[v][t], w[v], xb); }                        \
        }                                                                                                  \
        for (int t = 0; t < NTA; ++t) { const vf s = V_SET1(x[t].s[g]); for (int v = 0; v < NVA; ++v) f[v][t] = V_FMA(VI_CVT(d[v][t]), s, f[v][t]); } \
    }                                                                                                      \
    for (int v = 0; v < NVA; ++v) for (int t = 0; t < NTA; ++t) V_STOREX(acc + (v * NTA + t) * PK_RV, f[v][t]); \
}
ALT(alt_v2_t4, 2, 4, 1)
ALT(alt_v2_t4_g2, 2, 4, 2)
ALT(alt_v2_t6, 2, 6, 1)
ALT(alt_v2_t8, 2, 8, 1)
ALT(alt_v4_t4, 4, 4, 1)
ALT(alt_v4_t3, 4, 3, 1)
ALT(alt_v1_t4, 1, 4, 1)
ALT(alt_v1_t8, 1, 8, 1)
int main(int argc,char**argv){
    const int cols=2048, ng=cols/32, kcg=8;
    const size_t bb=(size_t)ng*PK_GS;
    uint8_t *blk=aligned_alloc(64, 4*bb);
    for(size_t i=0;i<4*bb;++i) blk[i]=(uint8_t)(rand()%255-127);
    int8_t *q=aligned_alloc(64, 8*cols); float *s=aligned_alloc(64,8*ng*4); int32_t *nb=aligned_alloc(64,8*ng*4);
    for(int i=0;i<8*cols;++i) q[i]=(int8_t)(rand()%255-127);
    for(int i=0;i<8*ng;++i){s[i]=1e-3f;nb[i]=0;}
    pk_x x[8]; for(int t=0;t<8;++t) x[t]=(pk_x){q+t*cols,s+t*ng,nb+t*ng};
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
