/* random reads of CHUNK bytes at QD threads from FILE (page cache dropped before), O_DIRECT or not */
#define _GNU_SOURCE
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <sys/stat.h>
static int fd; static size_t chunk, fsize; static int nreq; static int next; static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static double now(void){struct timespec t;clock_gettime(CLOCK_MONOTONIC,&t);return t.tv_sec+t.tv_nsec*1e-9;}
static void *worker(void *a){ (void)a; void *buf; posix_memalign(&buf, 4096, chunk);
  unsigned s = (unsigned)(size_t)a * 7919u + 1;
  for(;;){ pthread_mutex_lock(&mu); int i = next++; pthread_mutex_unlock(&mu); if(i>=nreq)break;
    size_t nch = fsize / chunk; size_t off = ((size_t)(i * 2654435761u) % nch) * chunk;
    size_t done=0; while(done<chunk){ ssize_t r=pread(fd,(char*)buf+done,chunk-done,off+done); if(r<=0){perror("pread");exit(1);} done+=r;} }
  (void)s; free(buf); return NULL; }
int main(int c, char **v){ const char *f=v[1]; int qd=atoi(v[2]); chunk=strtoull(v[3],0,10); nreq=atoi(v[4]); int direct=atoi(v[5]);
  fd=open(f,O_RDONLY|(direct?O_DIRECT:0)); struct stat st; fstat(fd,&st); fsize=st.st_size;
  posix_fadvise(fd,0,0,POSIX_FADV_DONTNEED);
  pthread_t th[64]; double t0=now(); for(int i=0;i<qd;i++) pthread_create(&th[i],0,worker,(void*)(size_t)i);
  for(int i=0;i<qd;i++) pthread_join(th[i],0); double t=now()-t0;
  printf("qd %d chunk %zu direct %d: %.1f MB/s (%.2f ms/req)\n", qd, chunk, direct, nreq*(double)chunk/t/1e6, t/nreq*1e3*qd);
  return 0; }
