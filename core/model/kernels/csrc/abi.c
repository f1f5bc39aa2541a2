/* What the loader checks before it trusts the library. */
#include "common.h"

int ld_abi_version(void) { return LD_ABI_VERSION; }

/* OpenMP threads the kernels would use from the calling thread (0: built without OpenMP). */
int ld_max_threads(void) {
#ifdef _OPENMP
    return omp_get_max_threads();
#else
    return 0;
#endif
}

/* The SIMD path the kernels were compiled to (for Model Info). */
const char *ld_isa(void) { return LD_ISA; }
