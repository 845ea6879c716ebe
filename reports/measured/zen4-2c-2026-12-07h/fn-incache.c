/* scratch: rows_acc_k4pk_pre / gateup_k4pk_pre on weights that stay in L2, GOP/s */
#include PART
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
static double now(void){struct timespec t;clock_gettime(CLOCK_MONOTONIC,&t);return t.tv_sec+t.tv_nsec*1e-9;}
static uint8_t *rnd_pk(int rows, int cols){ size_t n=k4pk_bytes(rows,cols); uint8_t *b=aligned_alloc(64,(n+63)/64*64);
  for(size_t i=0;i<n;++i) b[i]=(uint8_t)(rand()&255);
  size_t bb=k4pk_block_bytes(cols); for(int blk=0;blk<(rows+15)/16;++blk) for(int g=0;g<q_groups(cols);g+=8){uint16_t *h=(uint16_t*)(b+blk*bb+K4_HOFF(g)+12*PK_RV); for(int l=0;l<2*PK_RV;++l) h[l]=0x3c00;}
  return b;}
int main(int argc,char**argv){
  const int which=atoi(argv[1]), ntok=atoi(argv[2]); const long it=atol(argv[3]);
  const int H=2048, I=768;
  const int rows = which ? 192 : 512, cols = which ? H : I;
  uint8_t *pg=rnd_pk(rows,cols), *pu=rnd_pk(rows,cols);
  cb_mat g={0}, u={0}; g.rows=u.rows=rows; g.cols=u.cols=cols; g.pk=pg; u.pk=pu;
  float *X=aligned_alloc(64,(size_t)64*cols*4); for(int i=0;i<64*cols;++i) X[i]=(float)(rand()%1000-500)/500.f;
  int32_t tok[64]; float tw[64]; for(int t=0;t<64;++t){tok[t]=t;tw[t]=0.5f;}
  char *wsp=aligned_alloc(64,1<<22), *pw=aligned_alloc(64,1<<22);
  k4_prep_rows(X,cols,NULL,64,cols,pw);
  const char *prep = pw + ((size_t)64*sizeof(k4_x)+63)/64*64;
  float *Y=aligned_alloc(64,(size_t)64*H*4); for(int i=0;i<64*H;++i) Y[i]=0;
  float *Ho=aligned_alloc(64,(size_t)64*I*4);
  for(int rep=0;rep<3;++rep){ double t0=now();
    for(long i=0;i<it;++i){ __asm__ volatile(""::"r"(Y),"r"(Ho):"memory");
      if(which) gateup_k4pk_pre(&g,&u,X,cols,tok,ntok,0,rows,Ho,I,wsp,prep);
      else rows_acc_k4pk_pre(&g,Ho,I,ntok,tw,tok,0,rows,Y,H,wsp,prep); }
    double dt=now()-t0; double ops=2.0*it*(which?2:1)*rows*(double)cols*ntok;
    printf("%s t%d: %.1f GOP/s\n", which?"gateup":"down", ntok, ops/dt*1e-9); }
  return 0; }
