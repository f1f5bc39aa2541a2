/* Shared by every csrc/*.c: the ABI version and small inline helpers only. */
#ifndef LD_COMMON_H
#define LD_COMMON_H

#include <stdint.h>
#include <string.h>

/* Raised when a symbol's meaning changes: build.py refuses a library of another version. */
#define LD_ABI_VERSION 1

/* Which SIMD path every kernel compiles to; the same integer sums and one scalar order
 * for the float part make all three give the same numbers (tests). */
#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__) && defined(__AVX512VNNI__)
#define LD_AVX512 1
#define LD_ISA "AVX-512 VNNI"
#elif defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#define LD_AVX2 1
#define LD_ISA "AVX2"
#else
#define LD_ISA "plain C"
#endif
#if defined(LD_AVX512) || defined(LD_AVX2) || defined(__F16C__)
#include <immintrin.h>
#endif

#ifdef _OPENMP
#include <omp.h>
#define LD_THREADS() omp_get_max_threads()
#else
#define LD_THREADS() 1
#endif

/* IEEE half -> float without F16C (exact for every half, NaN and inf included). */
static inline float ld_half_to_float(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t exp = (h >> 10) & 0x1fu, man = h & 0x3ffu, bits;
    if (exp == 0x1f) {
        bits = sign | 0x7f800000u | (man << 13);
    } else if (exp != 0) {
        bits = sign | ((exp + 112u) << 23) | (man << 13);
    } else if (man == 0) {
        bits = sign;
    } else {  /* subnormal half: normalise */
        int e = -1;
        do { man <<= 1; e++; } while (!(man & 0x400u));
        bits = sign | ((uint32_t)(112 - e) << 23) | ((man & 0x3ffu) << 13);
    }
    float f;
    memcpy(&f, &bits, 4);
    return f;
}

/* the same, in one instruction where the CPU has F16C */
static inline float ld_half(const uint8_t *p) {
    uint16_t h = (uint16_t)(p[0] | (p[1] << 8));
#if defined(__F16C__)
    return _cvtsh_ss(h);
#else
    return ld_half_to_float(h);
#endif
}

/* exp(x) for x <= 0 in float32 (0 below -87, where exp leaves the normal range): Cody-Waite
 * reduction by ln 2 and a degree-5 polynomial, ~1 ulp. Plain arithmetic, so the compiler
 * vectorizes the loops that call it (libm's expf would be a call per element); the same
 * operations in a vector lane and in a loop's scalar tail, so an element's result does not
 * depend on where it sits in a buffer (torch's own exp does: vector and tail paths differ). */
static inline float ld_exp_neg(float x) {
    float xc = x < -87.0f ? -87.0f : x;
    /* round to nearest by the 1.5 * 2^23 trick: plain adds, so the loop vectorizes (floorf does not) */
    float n = (xc * 1.44269504088896341f + 12582912.0f) - 12582912.0f;
    float r = xc - n * 0.693359375f;
    r = r - n * -2.12194440e-4f;
    float p = 1.9875691500e-4f;
    p = p * r + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    p = p * (r * r) + r + 1.0f;
    int32_t bits = ((int32_t)n + 127) << 23;
    float scale;
    memcpy(&scale, &bits, 4);
    return x < -87.0f ? 0.0f : p * scale;
}

/* silu(x) * y, every element by the same float operations wherever it sits (csrc/act.c,
 * csrc/layer.c): e^-|x| cannot overflow. */
static inline float ld_silu_times(float x, float y) {
    float t = ld_exp_neg(x < 0.0f ? x : -x);
    float s = x < 0.0f ? t / (1.0f + t) : 1.0f / (1.0f + t);  /* sigmoid(x) */
    return x * s * y;
}

/* a·b over d inputs in one fixed order: 8 interleaved partial sums combined by a fixed
 * tree, then the inputs past the last multiple of 8 in order (attention's q·k, RMSNorm's
 * sum of squares). */
static inline float ld_dot(const float *a, const float *b, int64_t d) {
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

static inline uint16_t ld_read_u16(const uint8_t *p) {
    return (uint16_t)(p[0] | (p[1] << 8));
}

/* Activations quantized per block of `block` inputs to int16: x ~= s * q with
 * s = max|x| / LD_XMAX and q = round-to-nearest-even(x * (LD_XMAX / max|x|)), |q| <= LD_XMAX.
 * A block holding NaN or inf gets s = NaN (its row's outputs become NaN, as a float product
 * would make them); an all-zero block gets s = 0. One scalar order for every SIMD path. */
#define LD_XMAX 32767

static inline void ld_quantize_row(const float *x, int64_t k, int64_t block, int16_t *q, float *s) {
    for (int64_t b = 0; b < k / block; b++) {
        const float *xb = x + b * block;
        float amax = 0.0f;
        int finite = 1;
        for (int64_t i = 0; i < block; i++) {
            float a = xb[i] < 0 ? -xb[i] : xb[i];
            finite &= (a <= 3.4028234663852886e38f);  /* false for NaN and inf */
            amax = a > amax ? a : amax;
        }
        int16_t *qb = q + b * block;
        float inv = (float)LD_XMAX / amax;
        if (!finite || !(inv <= 3.4028234663852886e38f)) {  /* non-finite, zero or subnormal-tiny */
            memset(qb, 0, (size_t)block * sizeof(int16_t));
            s[b] = finite ? 0.0f : __builtin_nanf("");
            continue;
        }
        for (int64_t i = 0; i < block; i++) {
            float v = __builtin_rintf(xb[i] * inv);
            v = v > LD_XMAX ? LD_XMAX : v < -LD_XMAX ? -LD_XMAX : v;
            qb[i] = (int16_t)v;
        }
        s[b] = amax / (float)LD_XMAX;
    }
}

#endif
