/* The library's threads, and what the build has. */
#include "internal.h"

int llmp_has_avx2(void) {
#if defined(__AVX2__)
    return 1;
#else
    return 0;
#endif
}

void llmp_set_threads(int n) {
#ifdef _OPENMP
    omp_set_num_threads(n);
#endif
    (void)n;
}

int llmp_get_threads(void) {
#ifdef _OPENMP
    return omp_get_max_threads();
#else
    return 1;
#endif
}

/* The calling thread's idle OpenMP workers exit. libgomp counts every team's threads in
 * the process; once they outnumber the CPUs, its workers sleep at every barrier instead of
 * spinning, and a decode step has hundreds of barriers: a server whose main thread loaded
 * the weights (a team of its own) and whose engine thread decodes (another) ran batch-1
 * steps 25-30% slower than `bench`, which loads and decodes on one thread. */
void llmp_release_threads(void) {
#if defined(_OPENMP) && (_OPENMP >= 201811 || (!defined(__clang__) && __GNUC__ >= 9))
    omp_pause_resource_all(omp_pause_soft);
#endif
}
