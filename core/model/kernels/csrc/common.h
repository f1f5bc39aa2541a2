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
#if defined(LD_AVX512) || defined(LD_AVX2)
#include <immintrin.h>
#endif

#ifdef _OPENMP
#include <omp.h>
#define LD_THREADS() omp_get_max_threads()
#else
#define LD_THREADS() 1
#endif

/* IEEE half -> float without F16C (the plain-C path; exact for every half, NaN and inf
 * included). */
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

static inline uint16_t ld_read_u16(const uint8_t *p) {
    return (uint16_t)(p[0] | (p[1] << 8));
}

#endif
