/* Decode attention for every row of a batch in one call (issue 23: serve's decode step).
 *
 * Each (row, query head) is computed by one thread with the same operations in the same
 * order whatever the batch holds: the scores over the row's own keys, their softmax, the
 * weighted sum of its values. Nothing of another row, the batch size or the thread count
 * enters a row's numbers, so a row decodes bit for bit alike alone or beside others
 * (docs/SERVING.md, batch invariance) with one call per layer instead of one per row. */
#include <stdlib.h>
#include "common.h"
#include "attn.h"

/* Row ``src`` (d values of type ``dtype``) as float32 in ``dst``; the row itself when it is
 * float32 already. */
static inline const float *ld_row(const void *src, int dtype, int64_t off, int64_t d, float *restrict dst) {
    if (dtype == LD_F32)
        return (const float *)src + off;
    const uint16_t *s = (const uint16_t *)src + off;
    if (dtype == LD_BF16) {
        for (int64_t i = 0; i < d; i++) {
            uint32_t b = (uint32_t)s[i] << 16;
            memcpy(dst + i, &b, 4);
        }
    } else {
        for (int64_t i = 0; i < d; i++)
            dst[i] = ld_half_to_float(s[i]);
    }
    return dst;
}

/* q·k over d inputs in one fixed order: 8 interleaved partial sums combined by a fixed
 * tree, then the inputs past the last multiple of 8 in order. */
static inline float ld_dot(const float *restrict a, const float *restrict b, int64_t d) {
    float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    int64_t d8 = d & ~(int64_t)7;
    for (int64_t i = 0; i < d8; i += 8)
        for (int j = 0; j < 8; j++)
            acc[j] += a[i + j] * b[i + j];
    float sum = ((acc[0] + acc[4]) + (acc[2] + acc[6])) + ((acc[1] + acc[5]) + (acc[3] + acc[7]));
    for (int64_t i = d8; i < d; i++)
        sum += a[i] * b[i];
    return sum;
}

/* (attn.h) Each key and value row is read (and widened) once for all rep heads. */
void ld_attn_group(const float *restrict q, const void *k, const void *v, int dtype, int64_t base,
                   int64_t sl, int64_t n, int64_t d, int64_t rep, float scale, float *restrict s,
                   float *restrict tmp, float *restrict out) {
    for (int64_t l = 0; l < n; l++) {
        const float *kr = ld_row(k, dtype, base + l * sl, d, tmp);
        for (int64_t h = 0; h < rep; h++)
            s[h * n + l] = ld_dot(q + h * d, kr, d) * scale;
    }
    for (int64_t h = 0; h < rep; h++) {
        float *restrict sh = s + h * n, mx = -__builtin_inff(), sum = 0.0f;
        for (int64_t l = 0; l < n; l++)
            mx = sh[l] > mx ? sh[l] : mx;
        for (int64_t l = 0; l < n; l++)
            sh[l] = ld_exp_neg(sh[l] - mx);
        for (int64_t l = 0; l < n; l++)
            sum += sh[l];
        float inv = 1.0f / sum;  /* the weights normalised before the sum: each p_l in [0, 1] */
        for (int64_t l = 0; l < n; l++)
            sh[l] = sh[l] * inv;
        for (int64_t i = 0; i < d; i++)
            out[h * d + i] = 0.0f;
    }
    for (int64_t l = 0; l < n; l++) {
        const float *restrict vr = ld_row(v, dtype, base + l * sl, d, tmp);
        for (int64_t h = 0; h < rep; h++) {
            float p = s[h * n + l], *restrict o = out + h * d;
            for (int64_t i = 0; i < d; i++)
                o[i] += p * vr[i];
        }
    }
}

/* out [b, h, d] = attention of q [b, h, d] (float32) over keys/values of type ``dtype`` at
 * k/v + row*sb + kv_head*sh + pos*sl (elements; each row of d contiguous), row r reading
 * its first lengths[r] positions; query head i reads kv head i / (h / hkv) (grouped-query
 * attention as repeat_interleave lays it out). Threads split the (row, kv head) pairs, never
 * one pair's sums. Returns 0, or -1 when out of memory. */
int ld_attn_decode(const float *q, const void *k, const void *v, int dtype, int64_t b, int64_t h,
                   int64_t hkv, int64_t d, int64_t sb, int64_t sh, int64_t sl, const int64_t *lengths,
                   float scale, float *out) {
    int64_t most = 1, work = 0;
    for (int64_t r = 0; r < b; r++) {
        most = lengths[r] > most ? lengths[r] : most;
        work += lengths[r];
    }
    int64_t rep = h / hkv, jobs = b * hkv, each = rep * most + d;
    float *scratch = malloc(sizeof(float) * (size_t)(each * LD_THREADS()));
    if (scratch == NULL)
        return -1;
#ifdef _OPENMP
    /* threads only where the work pays for waking them (a small model's step is ~µs here) */
#pragma omp parallel for schedule(static) if (work * h * d > 65536)
#endif
    for (int64_t j = 0; j < jobs; j++) {
#ifdef _OPENMP
        float *s = scratch + each * omp_get_thread_num();
#else
        float *s = scratch;
#endif
        int64_t r = j / hkv, g = j % hkv;
        ld_attn_group(q + j * rep * d, k, v, dtype, r * sb + g * sh, sl, lengths[r], d, rep, scale, s,
                      s + rep * most, out + j * rep * d);
    }
    free(scratch);
    return 0;
}
