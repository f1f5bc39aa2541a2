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

/* The first of `blocks` blocks (`bytes` each) whose fp16 at byte `at` (and `count` - 1 more
 * after it) is NaN or infinite, else -1: a block's integers cannot be, only its scales. One
 * pass over the tensor at load, which also brings its pages in from the disk. */
int64_t ld_first_bad_scale(const uint8_t *w, int64_t blocks, int64_t bytes, int64_t at, int64_t count) {
    int64_t first = blocks;
    #pragma omp parallel for schedule(static) reduction(min:first) if (blocks >= 4096)
    for (int64_t b = 0; b < blocks; b++)
        for (int64_t c = 0; c < count; c++) {
            uint16_t h = ld_read_u16(w + b * bytes + at + 2 * c);
            if ((h & 0x7c00u) == 0x7c00u && b < first) first = b;
        }
    return first == blocks ? -1 : first;
}
