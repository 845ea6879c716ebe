// scratch microbenchmark (not committed): memory-level parallelism of decode-like streams
#include <immintrin.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
static double now(void){struct timespec t;clock_gettime(CLOCK_MONOTONIC,&t);return t.tv_sec+1e-9*t.tv_nsec;}
#define REG (256ul<<20)
static unsigned char *buf;
static volatile int sink;
// one stream: sum
static int s_read1(const unsigned char*p,size_t n){__m512i a=_mm512_setzero_si512(),b=a;for(size_t i=0;i<n;i+=128){a=_mm512_add_epi32(a,_mm512_load_si512(p+i));b=_mm512_add_epi32(b,_mm512_load_si512(p+i+64));}return _mm512_reduce_add_epi32(_mm512_add_epi32(a,b));}
// two streams (halves), alternating
static int s_read2(const unsigned char*p,size_t n){const unsigned char*q=p+n/2;__m512i a=_mm512_setzero_si512(),b=a;for(size_t i=0;i<n/2;i+=64){a=_mm512_add_epi32(a,_mm512_load_si512(p+i));b=_mm512_add_epi32(b,_mm512_load_si512(q+i));}return _mm512_reduce_add_epi32(_mm512_add_epi32(a,b));}
// int4-like compute on one 64B word: lo/hi nibbles, 2 dpbusd, with a scale every 5 lines (group = 4 words + scales)
#define I4(acc0,acc1,w) { __m512i lo=_mm512_and_si512(w,m),hi=_mm512_and_si512(_mm512_srli_epi32(w,4),m); acc0=_mm512_dpbusd_epi32(acc0,lo,x); acc1=_mm512_dpbusd_epi32(acc1,hi,y);} 
static int s_comp(const unsigned char*p,size_t n,int streams){
  const __m512i m=_mm512_set1_epi8(15),x=_mm512_set1_epi32(0x01020304),y=_mm512_set1_epi32(0x05060708);
  __m512 f0=_mm512_setzero_ps(),f1=f0; size_t half=streams==2?n/2:n;
  const unsigned char*q=p+half;
  for(size_t g=0; g+320<=half; g+=320){
    __m512i d0=_mm512_setzero_si512(),d1=d0,e0=d0,e1=d0;
    for(int k=0;k<4;k++){ __m512i w=_mm512_load_si512(p+g+64*k); I4(d0,d1,w);
      if(streams==2){ __m512i v=_mm512_load_si512(q+g+64*k); I4(e0,e1,v);} }
    __m512 s=_mm512_load_ps((const float*)(p+g+256));
    f0=_mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_add_epi32(d0,d1)),s,f0);
    if(streams==2){ __m512 s2=_mm512_load_ps((const float*)(q+g+256)); f1=_mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_add_epi32(e0,e1)),s2,f1);}
  }
  return (int)_mm512_reduce_add_ps(_mm512_add_ps(f0,f1));
}
static int s_comp1(const unsigned char*p,size_t n){return s_comp(p,n,1);} static int s_comp2(const unsigned char*p,size_t n){return s_comp(p,n,2);}
// one stream, software prefetch DIST ahead with hint
static int PFD=1024;
static int s_comp1pf(const unsigned char*p,size_t n){
  const __m512i m=_mm512_set1_epi8(15),x=_mm512_set1_epi32(0x01020304),y=_mm512_set1_epi32(0x05060708);
  __m512 f0=_mm512_setzero_ps();
  for(size_t g=0; g+320<=n; g+=320){
    for(int o=0;o<320;o+=64) _mm_prefetch((const char*)p+g+PFD+o,_MM_HINT_T1);
    __m512i d0=_mm512_setzero_si512(),d1=d0;
    for(int k=0;k<4;k++){ __m512i w=_mm512_load_si512(p+g+64*k); I4(d0,d1,w);}
    __m512 s=_mm512_load_ps((const float*)(p+g+256));
    f0=_mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_add_epi32(d0,d1)),s,f0);
  }
  return (int)_mm512_reduce_add_ps(f0);
}
// experts: segments of SEG bytes (gate, up side by side in two halves of a 2*SEG pair) at scattered places
static size_t SEG=983040; static int PFN=0;
static int s_experts(const unsigned char*p,size_t n){
  const __m512i m=_mm512_set1_epi8(15),x=_mm512_set1_epi32(0x01020304),y=_mm512_set1_epi32(0x05060708);
  __m512 f0=_mm512_setzero_ps(),f1=f0; size_t nseg=n/(2*SEG); unsigned r=12345; int s=0;
  for(size_t e=0;e<nseg;e++){ size_t k=(r=r*1103515245u+12345u)%nseg; const unsigned char*g=p+k*2*SEG,*u=g+SEG;
    size_t kn=((r*1103515245u+12345u))%nseg; const unsigned char*gn=p+kn*2*SEG;
    for(size_t o=0;o+320<=SEG;o+=320){
      if(PFN && o+PFN*64>=SEG && o+PFN*64<SEG+320){ for(int q=0;q<PFN;q++){ _mm_prefetch((const char*)gn+q*64,_MM_HINT_T0); _mm_prefetch((const char*)gn+SEG+q*64,_MM_HINT_T0);} }
      __m512i d0=_mm512_setzero_si512(),d1=d0,e0=d0,e1=d0;
      for(int q=0;q<4;q++){ __m512i w=_mm512_load_si512(g+o+64*q); I4(d0,d1,w); __m512i v=_mm512_load_si512(u+o+64*q); I4(e0,e1,v);}
      f0=_mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_add_epi32(d0,d1)),_mm512_load_ps((const float*)(g+o+256)),f0);
      f1=_mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_add_epi32(e0,e1)),_mm512_load_ps((const float*)(u+o+256)),f1);
    }
    (void)s;
  }
  return (int)_mm512_reduce_add_ps(_mm512_add_ps(f0,f1));
}
static int s_exp_pf(const unsigned char*p,size_t n){PFN=32;int r=s_experts(p,n);PFN=0;return r;}
static int s_exp_small(const unsigned char*p,size_t n){size_t o=SEG;SEG=65536;int r=s_experts(p,n);SEG=o;return r;}
typedef int(*fn)(const unsigned char*,size_t);
int main(int argc,char**argv){
  int rounds=argc>1?atoi(argv[1]):20; PFD=argc>2?atoi(argv[2]):1024;
  int nth=2; buf=mmap(0,REG*nth,PROT_READ|PROT_WRITE,MAP_PRIVATE|MAP_ANONYMOUS,-1,0); madvise(buf,REG*nth,MADV_HUGEPAGE);
  #pragma omp parallel num_threads(nth)
  { int t=omp_get_thread_num(); memset(buf+REG*t,0x11,REG);}
  fn fs[]={s_read1,s_comp2,s_experts,s_exp_pf,s_exp_small}; const char*nm[]={"read1","comp2","experts","exp+pf","exp64K"}; int nf=5;
  printf("round"); for(int f=0;f<nf;f++) printf(" %8s",nm[f]); printf("  (GB/s, 2 threads)\n");
  for(int r=0;r<rounds;r++){ printf("%5d",r);
    for(int f=0;f<nf;f++){ double t0=now(); int s=0;
      #pragma omp parallel num_threads(nth) reduction(+:s)
      { int t=omp_get_thread_num(); s+=fs[f](buf+REG*t,REG);} 
      double dt=now()-t0; sink=s; printf(" %8.1f",REG*nth/dt/1e9);} printf("\n"); fflush(stdout);}
}
