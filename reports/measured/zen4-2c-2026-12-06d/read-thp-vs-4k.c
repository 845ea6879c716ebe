/* Read bandwidth on transparent huge pages against 4 KiB pages, interleaved: two 512 MiB
 * arrays (one advised MADV_HUGEPAGE, one MADV_NOHUGEPAGE), each first touched by the two
 * threads that read it, then 60 rounds of one read pass over each in turn. Prints GB/s of
 * each and their ratio per round (read-thp-vs-4k.txt).
 * Build and run: gcc -O3 -march=native -fopenmp read-thp-vs-4k.c -o rd && ./rd */
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
typedef double vd __attribute__((vector_size(64)));
static double rd(const double *a, size_t n) {
    const vd *v = (const vd *)a; vd s0={0},s1={0},s2={0},s3={0};
    for (size_t i = 0; i < n/8; i += 4) { s0 += v[i]; s1 += v[i+1]; s2 += v[i+2]; s3 += v[i+3]; }
    vd s = s0+s1+s2+s3; double t=0; for (int k=0;k<8;k++) t+=s[k]; return t;
}
static double *mk(size_t bytes, int thp) {
    char *m = mmap(NULL, bytes + (2<<20), PROT_READ|PROT_WRITE, MAP_PRIVATE|MAP_ANONYMOUS, -1, 0);
    double *a = (double *)(((unsigned long)m + (2<<20) - 1) & ~((2ul<<20) - 1));
    madvise(a, bytes, thp ? MADV_HUGEPAGE : MADV_NOHUGEPAGE);
    size_t n = bytes/8;
#pragma omp parallel num_threads(2)
    { int t=omp_get_thread_num(); for (size_t i=n*t/2;i<n*(t+1)/2;i++) a[i]=1.0; }
    return a;
}
static double pass(const double *a, size_t bytes) {
    size_t n = bytes/8; double t0 = omp_get_wtime(), s = 0;
#pragma omp parallel num_threads(2) reduction(+:s)
    { int t=omp_get_thread_num(); s += rd(a + n*t/2, n/2); }
    return bytes / (omp_get_wtime() - t0) / 1e9;
}
int main(void) {
    size_t bytes = 512ul << 20;
    double *h = mk(bytes, 1), *p = mk(bytes, 0);
    for (int r = 0; r < 60; r++) {
        double a = pass(h, bytes), b = pass(p, bytes);
        printf("%5.1f %5.1f  %.2f\n", a, b, a / b);
    }
}
