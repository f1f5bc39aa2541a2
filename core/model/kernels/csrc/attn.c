/* Decode attention for every row of a batch in one call (issue 23: serve's decode step).
 *
 * Each (row, query head) is computed by one thread with the same operations in the same
 * order whatever the batch holds: the scores over the row's own keys, their softmax, the
 * weighted sum of its values. Nothing of another row, the batch size or the thread count
 * enters a row's numbers, so a row decodes bit for bit alike alone or beside others
 * (docs/SERVING.md, batch invariance) with one call per layer instead of one per row. */
#include <stdint.h>
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

/* The plain form, for shapes past the blocked one's buffers (d > LD_DMAX, rep > LD_REPMAX):
 * key by key, each key and value row read (and widened) once for all rep heads. */
static void ld_attn_group_rows(const float *restrict q, const void *k, const void *v, int dtype, int64_t base,
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

/* ---- The blocked form: scores 16 keys at a time for every head of the group, softmax over
 * lanes, values accumulated along d. Per (row, head) the operations and their order are
 * fixed by d and rep alone:
 *   score_l = (q·k_l as ld_dot sums it) * scale   (8 interleaved partials, fixed tree, tail)
 *   e_l = ld_exp_neg(score_l - max), sum = 16 partials by l mod 16 then a halving tree
 *   out_i = (sum_l e_l v_l[i], P partials by l mod P then a halving tree) * (1 / sum)
 * with P = 4 for d = 8 and 16, 2 for d = 32, else 1 (enough independent sums to hide the
 * adds' latency). The arithmetic is written in GCC's generic vector types (every lane takes the
 * scalar operations) and the AVX-512 transposes and widening move data only, so AVX-512,
 * AVX2 and plain C builds give the same bits. */
#define LD_KB 16      /* keys a score block holds: one 16-lane vector */
#define LD_DMAX 256   /* head dims the blocked form takes (its stack buffers) */
#define LD_REPMAX 64  /* query heads a kv head may serve in the blocked form */
#define LD_VBUF 4096  /* floats of widened values a chunk holds (16 KB: stays in L1) */

typedef float ld_v16 __attribute__((vector_size(64), aligned(64)));
typedef float ld_v8 __attribute__((vector_size(32), aligned(4)));
typedef float ld_v4 __attribute__((vector_size(16)));
typedef float ld_v2 __attribute__((vector_size(8)));

static inline float ld_widen(const void *src, int dtype, int64_t at) {
    if (dtype == LD_F32)
        return ((const float *)src)[at];
    uint16_t h = ((const uint16_t *)src)[at];
    if (dtype == LD_F16)
        return ld_half_to_float(h);
    uint32_t b = (uint32_t)h << 16;
    float f;
    memcpy(&f, &b, 4);
    return f;
}

#if defined(LD_AVX512)
/* Elements at..at+7 of a key row as float32 (zeros for a key past the block's end: a
 * masked load, which reads nothing there). */
static inline __m256 ld_seg8(const void *src, int dtype, int64_t at, int valid) {
    __mmask8 m = (__mmask8)(valid ? 0xff : 0);
    if (dtype == LD_F32)
        return _mm256_maskz_loadu_ps(m, (const float *)src + at);
    __m128i h = _mm_maskz_loadu_epi16(m, (const uint16_t *)src + at);
    if (dtype == LD_F16)
        return _mm256_cvtph_ps(h);
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}

/* Swaps bit b of the vector index with bit b of the lane between a and b (the pair whose
 * vector indices differ in bit b): three such swaps transpose 8 vectors of [key m | key m+8]
 * rows into 8 columns of 16 keys. */
static const int32_t ld_swap_lo[3][16] __attribute__((aligned(64))) = {{0, 16, 2, 18, 4, 20, 6, 22, 8, 24, 10, 26, 12, 28, 14, 30}, {0, 1, 16, 17, 4, 5, 20, 21, 8, 9, 24, 25, 12, 13, 28, 29}, {0, 1, 2, 3, 16, 17, 18, 19, 8, 9, 10, 11, 24, 25, 26, 27}};
static const int32_t ld_swap_hi[3][16] __attribute__((aligned(64))) = {{1, 17, 3, 19, 5, 21, 7, 23, 9, 25, 11, 27, 13, 29, 15, 31}, {2, 3, 18, 19, 6, 7, 22, 23, 10, 11, 26, 27, 14, 15, 30, 31}, {4, 5, 6, 7, 20, 21, 22, 23, 12, 13, 14, 15, 28, 29, 30, 31}};

static inline void ld_swap_bit(__m512 *a, __m512 *b, int bit) {
    __m512i il = _mm512_load_si512(ld_swap_lo[bit]), ih = _mm512_load_si512(ld_swap_hi[bit]);
    __m512 x = _mm512_permutex2var_ps(*a, il, *b), y = _mm512_permutex2var_ps(*a, ih, *b);
    *a = x, *b = y;
}
#endif

#if defined(LD_AVX512)
/* z[i] lane j = element c + i of key j (at src + off + j*sl), widened, for j < nb; 0 past
 * it: 16 row loads and 24 permutes. */
static inline __attribute__((always_inline)) void ld_tile8(const void *src, int dtype, int64_t off, int64_t sl,
                                                           int64_t nb, int64_t c, __m512 *z) {
    if (nb == LD_KB) {
        for (int m = 0; m < 8; m++)
            z[m] = _mm512_insertf32x8(_mm512_castps256_ps512(ld_seg8(src, dtype, off + m * sl + c, 1)),
                                      ld_seg8(src, dtype, off + (m + 8) * sl + c, 1), 1);
    } else {
        for (int m = 0; m < 8; m++) {
            __m256 a = ld_seg8(src, dtype, off + m * sl + c, m < nb);
            __m256 b = ld_seg8(src, dtype, off + (m + 8) * sl + c, m + 8 < nb);
            z[m] = _mm512_insertf32x8(_mm512_castps256_ps512(a), b, 1);
        }
    }
    for (int bit = 0; bit < 3; bit++)
        for (int m = 0; m < 8; m++)
            if (!((m >> bit) & 1))
                ld_swap_bit(&z[m], &z[m | (1 << bit)], bit);
}
#endif

/* kt[i] lane j = element i of key j (at src + off + j*sl), widened, for j < nb; 0 past it. */
static void ld_keys_t(const void *src, int dtype, int64_t off, int64_t sl, int64_t nb, int64_t d,
                      ld_v16 *restrict kt) {
#if defined(LD_AVX512)
    if ((d & 7) == 0) {
        int64_t esz = dtype == LD_F32 ? 4 : 2;
        for (int64_t c = 0; c < d; c += 8) {
            __m512 z[8];
            if ((c * esz) % 64 == 0)  /* the next block's rows, a cache line each column step */
                for (int m = 0; m < LD_KB; m++)
                    __builtin_prefetch((const char *)src + (off + (LD_KB + m) * sl + c) * esz);
            ld_tile8(src, dtype, off, sl, nb, c, z);
            for (int i = 0; i < 8; i++)
                _mm512_store_ps((float *)&kt[c + i], z[i]);
        }
        return;
    }
#endif
    for (int64_t i = 0; i < d; i++)
        for (int64_t j = 0; j < LD_KB; j++)
            kt[i][j] = j < nb ? ld_widen(src, dtype, off + j * sl + i) : 0.0f;
}

typedef int32_t ld_i16 __attribute__((vector_size(64), aligned(64)));

static inline ld_v16 ld_select(ld_i16 m, ld_v16 a, ld_v16 b) {
    return (ld_v16)((m & (ld_i16)a) | (~m & (ld_i16)b));
}

static inline ld_v16 ld_splat(float f) {
    ld_v16 z = {0};
    return z + f;
}

/* ld_exp_neg on 16 lanes: the same operations, lane by lane. */
static inline ld_v16 ld_exp_neg16(ld_v16 x) {
    ld_i16 low = x < -87.0f;
    ld_v16 xc = ld_select(low, ld_splat(-87.0f), x);
    ld_v16 n = (xc * 1.44269504088896341f + 12582912.0f) - 12582912.0f;
    ld_v16 r = xc - n * 0.693359375f;
    r = r - n * -2.12194440e-4f;
    ld_v16 p = r * 1.9875691500e-4f + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    p = p * (r * r) + r + 1.0f;
    ld_i16 bits = (__builtin_convertvector(n, ld_i16) + 127) << 23;
    return ld_select(low, ld_splat(0.0f), p * (ld_v16)bits);
}

/* sh[0..nb-1] in a vector's first lanes, ``pad`` past them (a masked load where there is one). */
static inline ld_v16 ld_lanes(const float *sh, int64_t nb, float pad) {
    ld_v16 x;
    if (nb == LD_KB) {
        memcpy(&x, sh, sizeof x);
        return x;
    }
#if defined(LD_AVX512)
    __m512 m = _mm512_mask_loadu_ps(_mm512_set1_ps(pad), (__mmask16)((1u << nb) - 1u), sh);
    memcpy(&x, &m, sizeof x);
#else
    for (int j = 0; j < LD_KB; j++)
        x[j] = j < nb ? sh[j] : pad;
#endif
    return x;
}

/* The first nb lanes of x to out. */
static inline void ld_store_lanes(float *out, ld_v16 x, int64_t nb) {
    if (nb == LD_KB) {
        memcpy(out, &x, sizeof x);
        return;
    }
#if defined(LD_AVX512)
    _mm512_mask_storeu_ps(out, (__mmask16)((1u << nb) - 1u), (__m512)x);
#else
    memcpy(out, &x, sizeof(float) * (size_t)nb);
#endif
}

/* lanes j < nb set */
static inline ld_i16 ld_first(int64_t nb) {
    const ld_i16 iota = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15};
    return iota < (int32_t)nb;
}

typedef int32_t ld_i8 __attribute__((vector_size(32)));
typedef int32_t ld_i4 __attribute__((vector_size(16)));
typedef int32_t ld_i2 __attribute__((vector_size(8)));

/* The largest of the 16 lanes, halves against halves in registers (any order gives the
 * same: no NaN among scores of finite inputs). */
static inline float ld_lanes_max(ld_v16 x) {
    ld_v8 a, b;
    ld_v4 c, d;
    ld_v2 e, f;
    memcpy(&a, &x, 32), memcpy(&b, (const char *)&x + 32, 32);
    ld_i8 ab = b > a;
    a = (ld_v8)((ab & (ld_i8)b) | (~ab & (ld_i8)a));
    memcpy(&c, &a, 16), memcpy(&d, (const char *)&a + 16, 16);
    ld_i4 cd = d > c;
    c = (ld_v4)((cd & (ld_i4)d) | (~cd & (ld_i4)c));
    memcpy(&e, &c, 8), memcpy(&f, (const char *)&c + 8, 8);
    ld_i2 ef = f > e;
    e = (ld_v2)((ef & (ld_i2)f) | (~ef & (ld_i2)e));
    return e[1] > e[0] ? e[1] : e[0];
}

/* out[j] = scale * q·k_j for the nb keys of kt, each summed as ld_dot sums one key; mx:
 * the lanes' running maxima. */
static inline __attribute__((always_inline)) void ld_scores(const float *restrict q, const ld_v16 *restrict kt,
                                                            int64_t d, float scale, float *restrict out,
                                                            int64_t nb, ld_v16 *restrict mx) {
    ld_v16 sum = ld_splat(0.0f);
    int64_t d8 = d & ~(int64_t)7;
    if (d8) {  /* 8 partials, the first product each starts (no add to zero) */
        ld_v16 acc[8];
        for (int j = 0; j < 8; j++)
            acc[j] = q[j] * kt[j];
        for (int64_t i = 8; i < d8; i += 8)
            for (int j = 0; j < 8; j++)
                acc[j] += q[i + j] * kt[i + j];
        sum = ((acc[0] + acc[4]) + (acc[2] + acc[6])) + ((acc[1] + acc[5]) + (acc[3] + acc[7]));
    }
    for (int64_t i = d8; i < d; i++)
        sum += q[i] * kt[i];
    sum = sum * scale;
    ld_store_lanes(out, sum, nb);
    *mx = ld_select(ld_first(nb) & (sum > *mx), sum, *mx);
}

/* The scores of every head for keys l0.. of the group (s: rep rows of n), mh: each head's
 * running lane maxima. */
static void ld_block_scores(const float *restrict q, const void *k, int dtype, int64_t off, int64_t sl,
                            int64_t nb, int64_t d, int64_t rep, float scale, float *restrict s, int64_t n,
                            int64_t l0, ld_v16 *restrict mh) {
    ld_v16 kt[LD_DMAX];
#if defined(LD_AVX512)
    if (d == 8) {  /* the block stays in registers: no transposed copy */
        __m512 z[8];
        ld_tile8(k, dtype, off, sl, nb, 0, z);
        for (int64_t h = 0; h < rep; h++)
            ld_scores(q + h * d, (const ld_v16 *)z, 8, scale, s + h * n + l0, nb, mh + h);
        return;
    }
#endif
    ld_keys_t(k, dtype, off, sl, nb, d, kt);
    for (int64_t h = 0; h < rep; h++)
        ld_scores(q + h * d, kt, d, scale, s + h * n + l0, nb, mh + h);
}


/* lane j + lane j + w for w = 8, 4, 2, 1: the halves of a vector added, in registers */
static inline float ld_halving_sum(ld_v16 x) {
    ld_v8 a, b;
    ld_v4 c, d;
    ld_v2 e, f;
    memcpy(&a, &x, 32), memcpy(&b, (const char *)&x + 32, 32);
    a = a + b;
    memcpy(&c, &a, 16), memcpy(&d, (const char *)&a + 16, 16);
    c = c + d;
    memcpy(&e, &c, 8), memcpy(&f, (const char *)&c + 8, 8);
    e = e + f;
    return e[0] + e[1];
}

/* sh[l] = e^(sh[l] - max) over the n scores (m: their lane maxima); returns 1 / their sum
 * (16 partial sums by l mod 16, then a halving tree). */
static float ld_softmax(float *restrict sh, int64_t n, ld_v16 m) {
    float mx = ld_lanes_max(m);
    ld_v16 p = ld_splat(0.0f);
    int64_t l = 0;
    for (; l + LD_KB <= n; l += LD_KB) {
        ld_v16 e = ld_exp_neg16(ld_lanes(sh + l, LD_KB, mx) - mx);
        ld_store_lanes(sh + l, e, LD_KB);
        p += e;
    }
    if (l < n) {
        ld_v16 e = ld_exp_neg16(ld_lanes(sh + l, n - l, mx) - mx);
        ld_store_lanes(sh + l, e, n - l);
        p += ld_select(ld_first(n - l), e, ld_splat(0.0f));
    }
    return 1.0f / ld_halving_sum(p);
}

typedef uint16_t ld_h8 __attribute__((vector_size(16)));
typedef uint32_t ld_u8 __attribute__((vector_size(32)));

/* Elements at..at+7 of src (of type dtype) as float32. */
static inline __attribute__((always_inline)) ld_v8 ld_load8(const void *src, const int dtype, int64_t at) {
    ld_v8 x;
    if (dtype == LD_F32) {
        memcpy(&x, (const float *)src + at, sizeof x);
        return x;
    }
    ld_h8 h;
    memcpy(&h, (const uint16_t *)src + at, sizeof h);
    if (dtype == LD_BF16) {
        ld_u8 w = __builtin_convertvector(h, ld_u8) << 16;
        memcpy(&x, &w, sizeof x);
        return x;
    }
#if defined(__F16C__)
    __m256 f = _mm256_cvtph_ps((__m128i)h);
    memcpy(&x, &f, sizeof x);
#else
    for (int i = 0; i < 8; i++)
        x[i] = ld_half_to_float(h[i]);
#endif
    return x;
}

typedef uint16_t ld_h16 __attribute__((vector_size(32)));

/* Elements at..at+15 of src (of type dtype) as float32. */
static inline __attribute__((always_inline)) ld_v16 ld_load16(const void *src, const int dtype, int64_t at) {
    ld_v16 x;
    if (dtype == LD_F32) {
        memcpy(&x, (const float *)src + at, sizeof x);
        return x;
    }
    ld_h16 h;
    memcpy(&h, (const uint16_t *)src + at, sizeof h);
    if (dtype == LD_BF16) {
        ld_i16 w = (ld_i16)(__builtin_convertvector(h, ld_i16) << 16);
        memcpy(&x, &w, sizeof x);
        return x;
    }
#if defined(LD_AVX512)
    __m512 f = _mm512_cvtph_ps((__m256i)h);
    memcpy(&x, &f, sizeof x);
#else
    ld_v8 lo = ld_load8(src, dtype, at), hi = ld_load8(src, dtype, at + 8);
    memcpy(&x, &lo, sizeof lo), memcpy((char *)&x + sizeof lo, &hi, sizeof hi);
#endif
    return x;
}

/* ld_vacc's body for a vector type V of W lanes and its loader. */
#define LD_VACC_BODY(V, W, LOAD)                                                       \
    V a[4][LD_DMAX / W];                                                               \
    for (int p = 0; p < P; p++)                                                        \
        for (int c = 0; c < D / W; c++)                                                \
            memcpy(&a[p][c], acc + p * D + c * W, sizeof(V));                          \
    int64_t l = 0;                                                                     \
    for (; l + P <= nc; l += P)                                                        \
        for (int p = 0; p < P; p++)                                                    \
            for (int c = 0; c < D / W; c++)                                            \
                a[p][c] += e[l + p] * LOAD(src, T, off + (l + p) * sl + c * W);        \
    for (int p = 0; p < P && l + p < nc; p++)                                          \
        for (int c = 0; c < D / W; c++)                                                \
            a[p][c] += e[l + p] * LOAD(src, T, off + (l + p) * sl + c * W);            \
    for (int p = 0; p < P; p++)                                                        \
        for (int c = 0; c < D / W; c++)                                                \
            memcpy(acc + p * D + c * W, &a[p][c], sizeof(V));

/* acc[P][D] += e_l v_l over the nc value rows of type T at src + off + l*sl, key l into
 * partial l mod P; D, P and T constants where it is inlined: the sums stay in registers and
 * each row is widened as it is read. */
static inline __attribute__((always_inline)) void ld_vacc(const float *restrict e, const void *src, const int T,
                                                          int64_t off, int64_t sl, int64_t nc, const int D,
                                                          const int P, float *restrict acc) {
    if (D % 16 == 0) {
        LD_VACC_BODY(ld_v16, 16, ld_load16)
    } else {
        LD_VACC_BODY(ld_v8, 8, ld_load8)
    }
}

/* The same for any d over float32 rows (row l at vr + l*vs), one partial (P = 1). */
static void ld_vacc_any(const float *restrict e, const float *restrict vr, int64_t vs, int64_t nc, int64_t d,
                        float *restrict acc) {
    for (int64_t l = 0; l < nc; l++) {
        float w = e[l];
        const float *restrict r = vr + l * vs;
        for (int64_t i = 0; i < d; i++)
            acc[i] += w * r[i];
    }
}

static int ld_partials(int64_t d) { return d == 8 || d == 16 ? 4 : d == 32 ? 2 : 1; }

static int ld_vspecial(int64_t d) { return d == 8 || d == 16 || d == 32 || d == 64 || d == 128; }

#define LD_VACC_D(T)                                                         \
    switch (d) {                                                              \
        case 8: ld_vacc(e, v, T, off, sl, nc, 8, 4, acc); break;              \
        case 16: ld_vacc(e, v, T, off, sl, nc, 16, 4, acc); break;            \
        case 32: ld_vacc(e, v, T, off, sl, nc, 32, 2, acc); break;            \
        case 64: ld_vacc(e, v, T, off, sl, nc, 64, 1, acc); break;            \
        default: ld_vacc(e, v, T, off, sl, nc, 128, 1, acc); break;           \
    }

/* ld_vacc for a d that ld_vspecial takes, with its P. */
static void ld_vacc_d(const float *e, const void *v, int dtype, int64_t off, int64_t sl, int64_t nc, int64_t d,
                      float *acc) {
    if (dtype == LD_F32) {
        LD_VACC_D(LD_F32)
    } else if (dtype == LD_BF16) {
        LD_VACC_D(LD_BF16)
    } else {
        LD_VACC_D(LD_F16)
    }
}

/* nc value rows (at src + off + l*sl) as float32 rows of d in buf. */
static void ld_widen_rows(const void *src, int dtype, int64_t off, int64_t sl, int64_t nc, int64_t d,
                          float *restrict buf) {
    for (int64_t l = 0; l < nc; l++)
        for (int64_t i = 0; i < d; i++)
            buf[l * d + i] = ld_widen(src, dtype, off + l * sl + i);
}

/* out[h] = (sum_l e[h][l] v_l) * inv[h] for the group's rep heads; e = s (rep rows of n).
 * Keys go in chunks of ~16 KB of values (they stay in L1 for the rep heads). */
static void ld_values(const void *v, int dtype, int64_t base, int64_t sl, int64_t n, int64_t d, int64_t rep,
                      const float *s, const float *inv, float *restrict out) {
    int P = ld_partials(d), special = ld_vspecial(d);
    float st[LD_REPMAX * 64] __attribute__((aligned(64)));  /* P > 1 only where P * d <= 64 */
    float vbuf[LD_VBUF] __attribute__((aligned(64)));
    float *acc = P > 1 ? st : out;
    memset(acc, 0, sizeof(float) * (size_t)(rep * P * d));
    int64_t ck = (LD_VBUF / d) & ~(int64_t)(LD_KB - 1);  /* a multiple of P: l mod P is global */
    for (int64_t c0 = 0; c0 < n; c0 += ck) {
        int64_t nc = n - c0 < ck ? n - c0 : ck, off = base + c0 * sl;
        if (special) {
            for (int64_t h = 0; h < rep; h++)
                ld_vacc_d(s + h * n + c0, v, dtype, off, sl, nc, d, acc + h * P * d);
            continue;
        }
        const float *vr = (const float *)v + off;
        int64_t vs = sl;
        if (dtype != LD_F32) {
            ld_widen_rows(v, dtype, off, sl, nc, d, vbuf);
            vr = vbuf, vs = d;
        }
        for (int64_t h = 0; h < rep; h++)
            ld_vacc_any(s + h * n + c0, vr, vs, nc, d, acc + h * d);
    }
    for (int64_t h = 0; h < rep; h++) {  /* one loop per P: each vectorizes */
        const float *a = acc + h * P * d;
        float *restrict o = out + h * d, w = inv[h];
        if (P == 4 && d == 8) {
            ld_v8 x[4];
            memcpy(x, a, sizeof x);
            ld_v8 y = ((x[0] + x[2]) + (x[1] + x[3])) * w;
            memcpy(o, &y, sizeof y);
        } else if (P == 4)
            for (int64_t i = 0; i < d; i++)
                o[i] = ((a[i] + a[2 * d + i]) + (a[d + i] + a[3 * d + i])) * w;
        else if (P == 2)
            for (int64_t i = 0; i < d; i++)
                o[i] = (a[i] + a[d + i]) * w;
        else
            for (int64_t i = 0; i < d; i++)
                o[i] = a[i] * w;
    }
}

/* Asks for the first ~8 KB of n rows (contiguous when sl == d) to be brought in: a group's
 * keys and values start cold in a decode step (the rest of the layer ran in between), and
 * the hardware prefetcher only follows once a stream is under way. */
static inline void ld_prefetch_rows(const void *src, int dtype, int64_t off, int64_t sl, int64_t n, int64_t d) {
    int64_t esz = dtype == LD_F32 ? 4 : 2, bytes = (sl == d ? n * d : d) * esz;
    const char *p = (const char *)src + off * esz;
    for (int64_t b = 0; b < bytes && b < 8192; b += 64)
        __builtin_prefetch(p + b);
}

/* (attn.h) Key blocks are read (and widened) once for all rep heads, values once a chunk. */
void ld_attn_group(const float *restrict q, const void *k, const void *v, int dtype, int64_t base,
                   int64_t sl, int64_t n, int64_t d, int64_t rep, float scale, float *restrict s,
                   float *restrict tmp, float *restrict out) {
    if (d > LD_DMAX || rep > LD_REPMAX) {
        ld_attn_group_rows(q, k, v, dtype, base, sl, n, d, rep, scale, s, tmp, out);
        return;
    }
    ld_prefetch_rows(k, dtype, base, sl, n, d);
    ld_prefetch_rows(v, dtype, base, sl, n, d);
    ld_v16 mh[LD_REPMAX];
    for (int64_t h = 0; h < rep; h++)
        mh[h] = ld_splat(-__builtin_inff());
    for (int64_t l0 = 0; l0 < n; l0 += LD_KB)
        ld_block_scores(q, k, dtype, base + l0 * sl, sl, n - l0 < LD_KB ? n - l0 : LD_KB, d, rep, scale, s, n, l0,
                        mh);
    float inv[LD_REPMAX];
    for (int64_t h = 0; h < rep; h++)
        inv[h] = ld_softmax(s + h * n, n, mh[h]);
    ld_values(v, dtype, base, sl, n, d, rep, s, inv, out);
}

/* (rows' keys x query heads x (d + 24)) past which ld_attn_decode splits the work */
#define LD_ATTN_THREADS_FROM ((int64_t)1 << 22)

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
    /* Threads only for a call of ~250 µs and more on one thread: a second thread saves at
     * most half of it, and waking one costs 1-5 µs when its core is idle, 26 µs on average
     * and up to a scheduler slice (~8 ms) when the cores are busy (docs/PERFORMANCE.md,
     * "Decode attention for small heads"). (d + 24): a key's softmax and bookkeeping cost
     * about 24 products' worth. */
#pragma omp parallel for schedule(static) if (work * h * (d + 24) > LD_ATTN_THREADS_FROM)
#endif
    for (int64_t j = 0; j < jobs; j++) {
#ifdef _OPENMP
        float *s = scratch + each * omp_get_thread_num();
#else
        float *s = scratch;
#endif
        int64_t r = j / hkv, g = j % hkv;
        if (j + 1 < jobs) {  /* the next group's rows start arriving while this one runs */
            int64_t rn = (j + 1) / hkv, gn = (j + 1) % hkv;
            ld_prefetch_rows(k, dtype, rn * sb + gn * sh, sl, lengths[rn], d);
            ld_prefetch_rows(v, dtype, rn * sb + gn * sh, sl, lengths[rn], d);
        }
        ld_attn_group(q + j * rep * d, k, v, dtype, r * sb + g * sh, sl, lengths[r], d, rep, scale, s,
                      s + rep * most, out + j * rep * d);
    }
    free(scratch);
    return 0;
}
