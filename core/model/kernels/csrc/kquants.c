/* Matrix products on GGUF K-quant blocks (Q4_K, Q5_K, Q6_K) read in place.
 *
 * y[i,j] = sum over the 256-weight blocks b of row j of
 *     sx[i,b] * (d * sum_t sc_t * sum q*xq  -  dmin * sum_t mn_t * sum xq)
 * with x quantized per block to int16 (common.h). The weights are expanded once per block
 * into 256 int16 values q*sc (the sub-block scale folded in: |q*sc| <= 4096), then dotted
 * with every row of x that shares them. The integer part of one block is summed into 16
 * int32 "lanes" (lane l holds the products of inputs 32t+2l and 32t+2l+1, t = 0..7:
 * exactly what one AVX-512 vpdpwssd per 32 inputs gives; AVX2 keeps the same 16 lanes in
 * two registers, plain C loops over them). A lane holds at most 16 products of
 * |w| <= 4096 by |xq| <= 32767: < 2^31, no overflow, so every path has the same integers.
 * The float part is one fixed order on every path: lane_acc[l] = fma(float(lane), d*sx,
 * lane_acc[l]) block after block, the mins' term likewise in 8 lanes (one per sub-block),
 * then the lanes summed in a fixed tree. Threads split the output rows j only: each y[i,j]
 * is the same bits whatever m, the other rows of x, or the thread count. */
#include <math.h>
#include <stdlib.h>

#include "common.h"

#define QK 256
#define I_TILE 8  /* rows of x dotted with a block while it is expanded */

typedef struct {
#if defined(LD_AVX512)
    __m512i v[8];  /* q * sub-block scale, 32 weights each: kept in registers once inlined */
#else
    int16_t w[QK] __attribute__((aligned(64)));  /* q * sub-block scale */
#endif
    float d, dmin;
    int32_t mn[8];  /* Q4_K/Q5_K mins per 32-weight sub-block (0 for Q6_K) */
} kblock;

#define INLINE static inline __attribute__((always_inline))

/* -------------------------------------------------------------------- block decoding */

/* Q4_K/Q5_K: 12 bytes -> 8 six-bit scales and 8 six-bit mins, one byte each, four at a
 * time: sc[j] = s[j] & 63, sc[j+4] = (s[j+8] & 15) | (s[j] >> 6) << 4, and the mins
 * likewise from s[j+4] and the high nibbles of s[j+8]. */
INLINE void k_scales(const uint8_t *s, uint64_t *sc, uint64_t *mn) {
    uint32_t u0, u1, u2;
    memcpy(&u0, s, 4);
    memcpy(&u1, s + 4, 4);
    memcpy(&u2, s + 8, 4);
    *sc = (u0 & 0x3f3f3f3fu) | (uint64_t)((u2 & 0x0f0f0f0fu) | ((u0 >> 2) & 0x30303030u)) << 32;
    *mn = (u1 & 0x3f3f3f3fu) | (uint64_t)(((u2 >> 4) & 0x0f0f0f0fu) | ((u1 >> 2) & 0x30303030u)) << 32;
}

INLINE void k_mins(uint64_t mn, int32_t *out) {
#if defined(LD_AVX512) || defined(LD_AVX2)
    _mm256_storeu_si256((__m256i *)out, _mm256_cvtepu8_epi32(_mm_cvtsi64_si128((long long)mn)));
#else
    for (int t = 0; t < 8; t++) out[t] = (int32_t)((mn >> (8 * t)) & 0xff);
#endif
}

/* Q4_K (144 bytes): fp16 d, fp16 dmin, 12 bytes scales/mins, 128 bytes of nibbles; bytes
 * 32c..32c+31 hold weights 64c..64c+31 (low nibbles) and 64c+32..64c+63 (high). */
INLINE void unpack_q4_k(const uint8_t *blk, kblock *o) {
    uint64_t scb, mnb;
    o->d = ld_half(blk);
    o->dmin = ld_half(blk + 2);
    k_scales(blk + 4, &scb, &mnb);
    k_mins(mnb, o->mn);
    const uint8_t *qs = blk + 16;
#if defined(LD_AVX512)
    const __m256i low = _mm256_set1_epi8(15);
    const __m512i scv = _mm512_castsi128_si512(_mm_cvtepu8_epi16(_mm_cvtsi64_si128((long long)scb)));
    for (int c = 0; c < 4; c++) {
        __m256i b = _mm256_loadu_si256((const __m256i *)(qs + 32 * c));
        __m512i lo = _mm512_cvtepu8_epi16(_mm256_and_si256(b, low));
        __m512i hi = _mm512_cvtepu8_epi16(_mm256_and_si256(_mm256_srli_epi16(b, 4), low));
        o->v[2 * c] = _mm512_mullo_epi16(lo, _mm512_permutexvar_epi16(_mm512_set1_epi16((short)(2 * c)), scv));
        o->v[2 * c + 1] = _mm512_mullo_epi16(hi, _mm512_permutexvar_epi16(_mm512_set1_epi16((short)(2 * c + 1)), scv));
    }
#else
    int32_t sc[8];
    k_mins(scb, sc);
    for (int c = 0; c < 4; c++)
        for (int l = 0; l < 32; l++) {
            o->w[64 * c + l] = (int16_t)((qs[32 * c + l] & 15) * sc[2 * c]);
            o->w[64 * c + 32 + l] = (int16_t)((qs[32 * c + l] >> 4) * sc[2 * c + 1]);
        }
#endif
}

/* Q5_K (176 bytes): as Q4_K with 32 bytes of fifth bits before the nibbles: bit j of byte
 * l belongs to weight 32j + l. */
INLINE void unpack_q5_k(const uint8_t *blk, kblock *o) {
    uint64_t scb, mnb;
    int32_t sc[8];
    o->d = ld_half(blk);
    o->dmin = ld_half(blk + 2);
    k_scales(blk + 4, &scb, &mnb);
    k_mins(mnb, o->mn);
    k_mins(scb, sc);
    const uint8_t *qh = blk + 16, *qs = blk + 48;
#if defined(LD_AVX512)
    int16_t w[QK] __attribute__((aligned(64)));
#else
    int16_t *w = o->w;
#endif
    for (int c = 0; c < 4; c++)
        for (int l = 0; l < 32; l++) {
            int lo = (qs[32 * c + l] & 15) | (((qh[l] >> (2 * c)) & 1) << 4);
            int hi = (qs[32 * c + l] >> 4) | (((qh[l] >> (2 * c + 1)) & 1) << 4);
            w[64 * c + l] = (int16_t)(lo * sc[2 * c]);
            w[64 * c + 32 + l] = (int16_t)(hi * sc[2 * c + 1]);
        }
#if defined(LD_AVX512)
    for (int t = 0; t < 8; t++) o->v[t] = _mm512_load_si512((const void *)(w + 32 * t));
#endif
}

/* Q6_K (210 bytes): 128 bytes low nibbles, 64 bytes of 2-bit highs, 16 int8 scales (one per
 * 16 weights), fp16 d. Weight 128h + 32g + l (h < 2, g < 4, l < 32): low nibble of byte
 * 64h + 32(g&1) + l (high nibble when g >= 2), high bits (byte 32h + l) >> 2g; value q - 32. */
INLINE void unpack_q6_k(const uint8_t *blk, kblock *o) {
    const uint8_t *ql = blk, *qh = blk + 128;
    const int8_t *sc = (const int8_t *)(blk + 192);
    o->d = ld_half(blk + 208);
    o->dmin = 0.0f;
    memset(o->mn, 0, sizeof o->mn);
#if defined(LD_AVX512)
    const __m256i low = _mm256_set1_epi8(15), three = _mm256_set1_epi8(3);
    const __m512i scs = _mm512_castsi256_si512(_mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)sc)));
    for (int h = 0; h < 2; h++) {
        __m256i hb = _mm256_loadu_si256((const __m256i *)(qh + 32 * h));
        for (int g = 0; g < 4; g++) {
            __m256i lb = _mm256_loadu_si256((const __m256i *)(ql + 64 * h + 32 * (g & 1)));
            __m256i lo = g < 2 ? _mm256_and_si256(lb, low) : _mm256_and_si256(_mm256_srli_epi16(lb, 4), low);
            __m256i hi = _mm256_and_si256(_mm256_srli_epi16(hb, 2 * g), three);
            __m256i q = _mm256_or_si256(lo, _mm256_slli_epi16(hi, 4));
            __m512i v = _mm512_sub_epi16(_mm512_cvtepu8_epi16(q), _mm512_set1_epi16(32));
            short s = (short)(8 * h + 2 * g);  /* scales of weights 16s.. and 16(s+1).. */
            __m512i idx = _mm512_inserti64x4(_mm512_set1_epi16(s), _mm256_set1_epi16((short)(s + 1)), 1);
            o->v[4 * h + g] = _mm512_mullo_epi16(v, _mm512_permutexvar_epi16(idx, scs));
        }
    }
#else
    for (int h = 0; h < 2; h++)
        for (int g = 0; g < 4; g++)
            for (int l = 0; l < 32; l++) {
                int b = ql[64 * h + 32 * (g & 1) + l];
                int q = (g < 2 ? b & 15 : b >> 4) | (((qh[32 * h + l] >> (2 * g)) & 3) << 4);
                int e = 128 * h + 32 * g + l;
                o->w[e] = (int16_t)((q - 32) * sc[e / 16]);
            }
#endif
}

/* the expanded block's 256 values q*sc, in memory */
INLINE void store_block(const kblock *blk, int16_t *q) {
#if defined(LD_AVX512)
    for (int t = 0; t < 8; t++) _mm512_store_si512((void *)(q + 32 * t), blk->v[t]);
#else
    memcpy(q, blk->w, sizeof blk->w);
#endif
}

/* ------------------------------------------------------------- one block against one row */

/* lanes[l] = fma(float(integer lane l), ds, lanes[l]) for the block w against xq */
INLINE void block_lanes(const kblock *blk, const int16_t *xq, float ds, float *lanes) {
#if defined(LD_AVX512)
    __m512i a[4];  /* four chains: integer sums are exact, so the order is free */
    for (int t = 0; t < 4; t++)
        a[t] = _mm512_dpwssd_epi32(_mm512_setzero_si512(), blk->v[t], _mm512_loadu_si512((const void *)(xq + 32 * t)));
    for (int t = 4; t < 8; t++)
        a[t - 4] = _mm512_dpwssd_epi32(a[t - 4], blk->v[t], _mm512_loadu_si512((const void *)(xq + 32 * t)));
    __m512i acc = _mm512_add_epi32(_mm512_add_epi32(a[0], a[1]), _mm512_add_epi32(a[2], a[3]));
    _mm512_storeu_ps(lanes, _mm512_fmadd_ps(_mm512_cvtepi32_ps(acc), _mm512_set1_ps(ds), _mm512_loadu_ps(lanes)));
#else
    const int16_t *w = blk->w;
#endif
#if defined(LD_AVX2)
    __m256i a0 = _mm256_setzero_si256(), a1 = _mm256_setzero_si256();
    for (int t = 0; t < 8; t++) {
        a0 = _mm256_add_epi32(a0, _mm256_madd_epi16(_mm256_load_si256((const __m256i *)(w + 32 * t)),
                                                    _mm256_loadu_si256((const __m256i *)(xq + 32 * t))));
        a1 = _mm256_add_epi32(a1, _mm256_madd_epi16(_mm256_load_si256((const __m256i *)(w + 32 * t + 16)),
                                                    _mm256_loadu_si256((const __m256i *)(xq + 32 * t + 16))));
    }
    __m256 s = _mm256_set1_ps(ds);
    _mm256_storeu_ps(lanes, _mm256_fmadd_ps(_mm256_cvtepi32_ps(a0), s, _mm256_loadu_ps(lanes)));
    _mm256_storeu_ps(lanes + 8, _mm256_fmadd_ps(_mm256_cvtepi32_ps(a1), s, _mm256_loadu_ps(lanes + 8)));
#elif !defined(LD_AVX512)
    for (int l = 0; l < 16; l++) {
        int32_t acc = 0;
        for (int t = 0; t < 8; t++)
            acc += w[32 * t + 2 * l] * xq[32 * t + 2 * l] + w[32 * t + 2 * l + 1] * xq[32 * t + 2 * l + 1];
        lanes[l] = fmaf((float)acc, ds, lanes[l]);
    }
#endif
}

/* the mins' term sum_t mn[t] * xs[t] is kept per sub-block t: 8 float lanes, lane t
 * = fma(float(mn[t] * xs[t]), dmin * sx, lane t) block after block (the integer product is
 * exact: 63 * 32 * 32767 < 2^31), summed at the end in one fixed tree: (t, t+4), (t, t+2),
 * (0, 1). No horizontal sum per block and row. */
static inline float mins_sum(const float *a) {
    float t[4];
    for (int l = 0; l < 4; l++) t[l] = a[l] + a[l + 4];
    for (int l = 0; l < 2; l++) t[l] = t[l] + t[l + 2];
    return t[0] + t[1];
}

/* the 16 lanes in one fixed tree: (l, l+8), then (l, l+4), (l, l+2), (0, 1) */
static inline float lanes_sum(const float *a) {
    float t[8];
    for (int l = 0; l < 8; l++) t[l] = a[l] + a[l + 8];
    for (int l = 0; l < 4; l++) t[l] = t[l] + t[l + 4];
    for (int l = 0; l < 2; l++) t[l] = t[l] + t[l + 2];
    return t[0] + t[1];
}

/* ------------------------------------------------------------------------------ driver */

typedef struct {
    int16_t *q;    /* m x k */
    float *s;      /* m x nb */
    int32_t *sum;  /* m x nb x 8: sums of q per 32-input sub-block (for the mins) */
} xquant;

static int quantize_x(const float *x, int64_t m, int64_t k, int sums, xquant *a) {
    int64_t nb = k / QK;
    a->q = aligned_alloc(64, (size_t)(m * k * 2 + 63) / 64 * 64);
    a->s = malloc((size_t)(m * nb) * sizeof(float));
    a->sum = sums ? malloc((size_t)(m * nb * 8) * sizeof(int32_t)) : NULL;
    if (!a->q || !a->s || (sums && !a->sum)) return 0;
    #pragma omp parallel for schedule(static) if (m * k >= (1 << 16))
    for (int64_t i = 0; i < m; i++) {
        ld_quantize_row(x + i * k, k, QK, a->q + i * k, a->s + i * nb);
        if (sums)
            for (int64_t g = 0; g < nb * 8; g++) {
                int32_t t = 0;
                for (int l = 0; l < 32; l++) t += a->q[i * k + 32 * g + l];
                a->sum[i * nb * 8 + g] = t;
            }
    }
    return 1;
}

/* bytes ahead of the block being expanded that are asked for: the weights stream from
 * memory once, and the hardware prefetcher alone left the loop waiting on them */
#ifndef PREFETCH_AHEAD
#define PREFETCH_AHEAD 2048
#endif
#define PREFETCH(p) __builtin_prefetch((const void *)(p), 0, 0)

#if defined(LD_AVX512)
/* block_lanes with the 16 float lanes in a register: the same operations in the same order */
INLINE __m512 block_lanes_reg(const kblock *blk, const int16_t *xq, float ds, __m512 lanes) {
    __m512i a[4];
    for (int t = 0; t < 4; t++)
        a[t] = _mm512_dpwssd_epi32(_mm512_setzero_si512(), blk->v[t], _mm512_loadu_si512((const void *)(xq + 32 * t)));
    for (int t = 4; t < 8; t++)
        a[t - 4] = _mm512_dpwssd_epi32(a[t - 4], blk->v[t], _mm512_loadu_si512((const void *)(xq + 32 * t)));
    __m512i acc = _mm512_add_epi32(_mm512_add_epi32(a[0], a[1]), _mm512_add_epi32(a[2], a[3]));
    return _mm512_fmadd_ps(_mm512_cvtepi32_ps(acc), _mm512_set1_ps(ds), lanes);
}

/* rows j0..j1 of y's columns for the R rows of x from i0: R is a constant where this is
 * inlined, so every row's lanes and mins stay in registers across the block loop (a store
 * and reload per row and block before) */
#define ROWS_TILE(name, bytes, unpack)                                                          \
INLINE void name##_r(const uint8_t *w, int64_t nb, const xquant *a, int64_t j0, int64_t j1,    \
                     int64_t i0, const int R, int64_t n, float *y) {                            \
    kblock blk;                                                                                 \
    for (int64_t j = j0; j < j1; j++) {                                                         \
        __m512 lanes[I_TILE];                                                                   \
        __m256 mins[I_TILE];                                                                    \
        for (int r = 0; r < R; r++) {                                                           \
            lanes[r] = _mm512_setzero_ps();                                                     \
            mins[r] = _mm256_setzero_ps();                                                      \
        }                                                                                       \
        for (int64_t b = 0; b < nb; b++) {                                                      \
            const uint8_t *at = w + (j * nb + b) * (bytes);                                     \
            for (int l = 0; l < (bytes); l += 64) PREFETCH(at + PREFETCH_AHEAD + l);            \
            unpack(at, &blk);                                                                   \
            for (int r = 0; r < R; r++) {                                                       \
                int64_t i = i0 + r;                                                             \
                float sx = a->s[i * nb + b];                                                    \
                lanes[r] = block_lanes_reg(&blk, a->q + (i * nb + b) * QK, blk.d * sx, lanes[r]); \
                if (a->sum) {                                                                   \
                    __m256i p = _mm256_mullo_epi32(_mm256_loadu_si256((const __m256i *)blk.mn), \
                        _mm256_loadu_si256((const __m256i *)(a->sum + (i * nb + b) * 8)));      \
                    mins[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p), _mm256_set1_ps(blk.dmin * sx), mins[r]); \
                }                                                                               \
            }                                                                                   \
        }                                                                                       \
        for (int r = 0; r < R; r++) {                                                           \
            float t[16] __attribute__((aligned(64))), u[8] __attribute__((aligned(32)));        \
            _mm512_store_ps(t, lanes[r]);                                                       \
            _mm256_store_ps(u, mins[r]);                                                        \
            y[(i0 + r) * n + j] = lanes_sum(t) - mins_sum(u);                                   \
        }                                                                                       \
    }                                                                                           \
}                                                                                               \
static void name(const uint8_t *w, int64_t nb, const xquant *a, int64_t j0, int64_t j1,        \
                 int64_t i0, int64_t i1, int64_t n, float *y) {                                 \
    switch (i1 - i0) {                                                                          \
    case 1: name##_r(w, nb, a, j0, j1, i0, 1, n, y); break;                                     \
    case 2: name##_r(w, nb, a, j0, j1, i0, 2, n, y); break;                                     \
    case 3: name##_r(w, nb, a, j0, j1, i0, 3, n, y); break;                                     \
    case 4: name##_r(w, nb, a, j0, j1, i0, 4, n, y); break;                                     \
    case 5: name##_r(w, nb, a, j0, j1, i0, 5, n, y); break;                                     \
    case 6: name##_r(w, nb, a, j0, j1, i0, 6, n, y); break;                                     \
    case 7: name##_r(w, nb, a, j0, j1, i0, 7, n, y); break;                                     \
    default: name##_r(w, nb, a, j0, j1, i0, I_TILE, n, y); break;                               \
    }                                                                                           \
}
#else
/* rows j0..j1 of y's columns for rows i0..i1 of x; one copy per type, so that its block
 * decoding is inlined */
#define ROWS_TILE(name, bytes, unpack)                                                          \
static void name(const uint8_t *w, int64_t nb, const xquant *a, int64_t j0, int64_t j1,        \
                 int64_t i0, int64_t i1, int64_t n, float *y) {                                 \
    kblock blk;                                                                                 \
    float lanes[I_TILE][16] __attribute__((aligned(64))), mins[I_TILE][8];                      \
    for (int64_t j = j0; j < j1; j++) {                                                         \
        memset(lanes, 0, sizeof lanes);                                                         \
        memset(mins, 0, sizeof mins);                                                           \
        for (int64_t b = 0; b < nb; b++) {                                                      \
            const uint8_t *at = w + (j * nb + b) * (bytes);                                     \
            for (int l = 0; l < (bytes); l += 64) PREFETCH(at + PREFETCH_AHEAD + l);            \
            unpack(at, &blk);                                                                   \
            for (int64_t i = i0; i < i1; i++) {                                                 \
                float sx = a->s[i * nb + b];                                                    \
                block_lanes(&blk, a->q + (i * nb + b) * QK, blk.d * sx, lanes[i - i0]);        \
                if (a->sum) {                                                                   \
                    const int32_t *xs = a->sum + (i * nb + b) * 8;                              \
                    float dm = blk.dmin * sx;                                                   \
                    for (int t = 0; t < 8; t++)                                                 \
                        mins[i - i0][t] = fmaf((float)(blk.mn[t] * xs[t]), dm, mins[i - i0][t]); \
                }                                                                               \
            }                                                                                   \
        }                                                                                       \
        for (int64_t i = i0; i < i1; i++) y[i * n + j] = lanes_sum(lanes[i - i0]) - mins_sum(mins[i - i0]); \
    }                                                                                           \
}
#endif

ROWS_TILE(rows_q4_k, 144, unpack_q4_k)
ROWS_TILE(rows_q5_k, 176, unpack_q5_k)
ROWS_TILE(rows_q6_k, 210, unpack_q6_k)

typedef void (*rows_fn)(const uint8_t *, int64_t, const xquant *, int64_t, int64_t, int64_t, int64_t,
                        int64_t, float *);

#define J_TILE 16

static void kq_mm(const uint8_t *w, int64_t n, int64_t k, const float *x, int64_t m, float *y,
                  rows_fn rows, int mins) {
    xquant a;
    if (k % QK || !quantize_x(x, m, k, mins, &a)) {  /* refused by ops.py; out of memory */
        for (int64_t i = 0; i < m * n; i++) y[i] = __builtin_nanf("");
        return;
    }
    int64_t nb = k / QK, tiles = (n + J_TILE - 1) / J_TILE;
    #pragma omp parallel for schedule(static) if (n * k >= (1 << 16))
    for (int64_t jt = 0; jt < tiles; jt++) {
        int64_t j0 = jt * J_TILE, j1 = j0 + J_TILE < n ? j0 + J_TILE : n;
        for (int64_t i0 = 0; i0 < m; i0 += I_TILE)
            rows(w, nb, &a, j0, j1, i0, i0 + I_TILE < m ? i0 + I_TILE : m, n, y);
    }
    free(a.q);
    free(a.s);
    free(a.sum);
}

void ld_mm_q4_k(const uint8_t *w, int64_t n, int64_t k, const float *x, int64_t m, float *y) {
    kq_mm(w, n, k, x, m, y, rows_q4_k, 1);
}

void ld_mm_q5_k(const uint8_t *w, int64_t n, int64_t k, const float *x, int64_t m, float *y) {
    kq_mm(w, n, k, x, m, y, rows_q5_k, 1);
}

void ld_mm_q6_k(const uint8_t *w, int64_t n, int64_t k, const float *x, int64_t m, float *y) {
    kq_mm(w, n, k, x, m, y, rows_q6_k, 0);
}

/* ------------------------------------------------------------------------ dequantize */

/* float -> bfloat16, rounding to nearest even (NaN stays a quiet NaN), as torch rounds */
static inline uint16_t to_bf16(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    uint32_t r = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
    return (uint16_t)((u & 0x7fffffffu) > 0x7f800000u ? (u >> 16) | 0x40u : r);
}

INLINE void dequant_f32(const kblock *blk, const int16_t *q, float *out) {
    for (int t = 0; t < 8; t++) {
        float dm = blk->dmin * (float)blk->mn[t];
        for (int e = 0; e < 32; e++) out[32 * t + e] = blk->d * (float)q[32 * t + e] - dm;
    }
}

INLINE void dequant_bf16(const kblock *blk, const int16_t *q, uint16_t *out) {
    float v[32];
    for (int t = 0; t < 8; t++) {
        float dm = blk->dmin * (float)blk->mn[t];
        for (int e = 0; e < 32; e++) v[e] = blk->d * (float)q[32 * t + e] - dm;
        for (int e = 0; e < 32; e++) out[32 * t + e] = to_bf16(v[e]);
    }
}

/* W as float32 (bf16 == 0) or bfloat16 (bf16 != 0), n x k row-major: d * (q*sc) - dmin * mn,
 * the same value gguf's dequantization gives ((d*sc)*q - dmin*mn: every product is exact
 * in float32, so only the subtraction rounds, the same way). */
#define DEQUANT(name, bytes, unpack)                                                            \
void name(const uint8_t *w, int64_t n, int64_t k, void *out, int32_t bf16) {                    \
    int64_t nb = k / QK;                                                                        \
    _Pragma("omp parallel for schedule(static) if (n * k >= (1 << 18))")                        \
    for (int64_t j = 0; j < n; j++) {                                                           \
        kblock blk;                                                                             \
        int16_t q[QK] __attribute__((aligned(64)));                                             \
        for (int64_t b = 0; b < nb; b++) {                                                      \
            unpack(w + (j * nb + b) * (bytes), &blk);                                           \
            store_block(&blk, q);                                                               \
            int64_t at = j * k + b * QK;                                                        \
            if (bf16) dequant_bf16(&blk, q, (uint16_t *)out + at);                              \
            else dequant_f32(&blk, q, (float *)out + at);                                       \
        }                                                                                       \
    }                                                                                           \
}

DEQUANT(ld_dequant_q4_k, 144, unpack_q4_k)
DEQUANT(ld_dequant_q5_k, 176, unpack_q5_k)
DEQUANT(ld_dequant_q6_k, 210, unpack_q6_k)
