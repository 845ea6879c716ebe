/* omp.h stand-in for the fuzz build (profiles/fuzz.yaml): clang without an OpenMP
 * runtime compiles the engine with -fno-openmp, so `#pragma omp` is ignored and
 * these answer as the one thread that runs every parallel region in turn. */
#ifndef COLIBRI_FUZZ_OMP_H
#define COLIBRI_FUZZ_OMP_H
static inline int omp_get_num_procs(void) { return 1; }
static inline int omp_get_max_threads(void) { return 1; }
static inline int omp_get_num_threads(void) { return 1; }
static inline int omp_get_thread_num(void) { return 0; }
#endif
