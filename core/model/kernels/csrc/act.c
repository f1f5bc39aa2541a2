/* The decode step's activation, out = silu(a) * b, computed the same way for every element
 * (issue 23: batch invariance).
 *
 * torch's silu runs full vectors through one exp and a buffer's last few elements through
 * the scalar libm one, which round differently: the last row of a decode step whose width
 * is not a multiple of 32 (stories260K's 172) got other numbers than the same row alone.
 * Here every element takes the same float operations (ld_exp_neg: arithmetic only, no FMA
 * contraction), vectorized or not, so a row's result does not depend on the batch. */
#include "common.h"

void ld_silu_mul(const float *restrict a, const float *restrict b, float *restrict out, int64_t n) {
#ifdef _OPENMP
#pragma omp parallel for schedule(static) if (n > 262144)
#endif
    for (int64_t i = 0; i < n; i++)
        out[i] = ld_silu_times(a[i], b[i]);
}
