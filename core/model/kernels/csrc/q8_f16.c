/* F16 and Q8_0 weights times float32 activations: y[i,j] = sum_k x[i,k] * W[j,k].
 *
 * Both kernels are batch- and thread-invariant by construction: each y[i,j] is one
 * 16-lane accumulator over k in a fixed order, reduced by one scalar function, whatever
 * m is, whichever rows share the call and however many threads split the output rows
 * (threads split j only). A tile of MI activation rows x NJ weight rows shares every
 * weight load (what makes extra rows nearly free while decode reads memory) without
 * changing any (i,j)'s operations. The AVX-512, AVX2 and plain C paths keep the same
 * lane structure, so where they run the same IEEE operations they give the same bits.
 *
 * F16: W is n x k IEEE halves; each is widened exactly to float32 (F16C), multiplied and
 * summed in float32 (FMA): lane l sums k = 16t + l.
 *
 * Q8_0: W is n rows of k/32 blocks of 34 bytes (a half scale d, then 32 int8 q; the
 * format as the gguf package reads it). x is quantized per 32-input block to int16 with
 * a float scale s (|x| max -> 32767, round to nearest even): relative error <= 1.5e-5 of
 * the block's largest input, 256x finer than int8 activations. Per block, lane l holds
 * the exact integer q[2l]x[2l] + q[2l+1]x[2l+1] (|.| < 2^24: exact in float32), scaled
 * by s then accumulated with d by FMA. A block of x that is not finite makes its row's
 * outputs NaN.
 */
#include <math.h>
#include <stdlib.h>

#include "common.h"

#define LANES 16
/* Tiles: activation rows x weight rows per register block (the registers each ISA has:
 * 8 weight rows keep enough loads in flight for one-row decode to read at memory speed). */
#if defined(LD_AVX512)
#define F16_MI 4
#define F16_NJ 8
#define Q8_MI 4
#define Q8_NJ 8 /* 8 rows x 4 tiles: 32 accumulators, every zmm */
#elif defined(LD_AVX2)
#define F16_MI 2
#define F16_NJ 2
#define Q8_MI 1
#define Q8_NJ 4
#else
#define F16_MI 4
#define F16_NJ 4
#define Q8_MI 4
#define Q8_NJ 4
#endif
#define MI 4 /* the largest of the tiles above */
#define NJ 8
#define JBLOCK 32 /* weight rows handed to a thread at a time */
#define INLINE static inline __attribute__((always_inline))

/* The one reduction of 16 lanes every path uses: halves added pairwise (l + l+8, ...). */
static float hsum16(const float *v)
{
    float a[8], b[4], c[2];
    for (int l = 0; l < 8; l++)
        a[l] = v[l] + v[l + 8];
    for (int l = 0; l < 4; l++)
        b[l] = a[l] + a[l + 4];
    for (int l = 0; l < 2; l++)
        c[l] = b[l] + b[l + 2];
    return c[0] + c[1];
}

/* ---------------------------------------------------------------- F16 */

/* The k % 16 tail of one (i,j): lane l takes input k16 + l. */
static float f16_finish(float *lanes, const float *x, const uint16_t *w, int64_t k16, int64_t k)
{
    for (int64_t t = k16; t < k; t++)
        lanes[t - k16] = fmaf(x[t], ld_half_to_float(w[t]), lanes[t - k16]);
    return hsum16(lanes);
}

#if defined(LD_AVX512)
INLINE void f16_tile(const uint16_t *w, int64_t k, const float *x, int mi, int nj, float *y, int64_t ldy)
{
    __m512 acc[MI][NJ];
#pragma GCC unroll 8
    for (int i = 0; i < mi; i++)
#pragma GCC unroll 8
        for (int j = 0; j < nj; j++)
            acc[i][j] = _mm512_setzero_ps();
    int64_t k16 = k & ~(int64_t)15;
    for (int64_t t = 0; t < k16; t += LANES) {
        __m512 xv[MI];
#pragma GCC unroll 8
        for (int i = 0; i < mi; i++)
            xv[i] = _mm512_loadu_ps(x + i * k + t);
#pragma GCC unroll 8
        for (int j = 0; j < nj; j++) {
            /* the next tile's rows into L2: a row of 2048 halves is one 4 KB page, where
             * the hardware prefetcher stops (the 128k x 2048 output: ~20% faster) */
            _mm_prefetch((const char *)(w + (j + nj) * k + t), _MM_HINT_T1);
            __m512 wv = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(w + j * k + t)));
#pragma GCC unroll 8
            for (int i = 0; i < mi; i++)
                acc[i][j] = _mm512_fmadd_ps(xv[i], wv, acc[i][j]);
        }
    }
    float lanes[LANES];
    for (int i = 0; i < mi; i++)
        for (int j = 0; j < nj; j++) {
            _mm512_storeu_ps(lanes, acc[i][j]);
            y[i * ldy + j] = f16_finish(lanes, x + i * k, w + j * k, k16, k);
        }
}
#elif defined(LD_AVX2)
INLINE void f16_tile(const uint16_t *w, int64_t k, const float *x, int mi, int nj, float *y, int64_t ldy)
{
    __m256 lo[MI][NJ], hi[MI][NJ]; /* lanes 0-7 and 8-15 */
#pragma GCC unroll 8
    for (int i = 0; i < mi; i++)
#pragma GCC unroll 8
        for (int j = 0; j < nj; j++)
            lo[i][j] = hi[i][j] = _mm256_setzero_ps();
    int64_t k16 = k & ~(int64_t)15;
    for (int64_t t = 0; t < k16; t += LANES) {
        __m256 wl[NJ], wh[NJ];
#pragma GCC unroll 8
        for (int j = 0; j < nj; j++) {
            _mm_prefetch((const char *)(w + (j + nj) * k + t), _MM_HINT_T1);
            wl[j] = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(w + j * k + t)));
            wh[j] = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(w + j * k + t + 8)));
        }
#pragma GCC unroll 8
        for (int i = 0; i < mi; i++) {
            __m256 xl = _mm256_loadu_ps(x + i * k + t), xh = _mm256_loadu_ps(x + i * k + t + 8);
#pragma GCC unroll 8
            for (int j = 0; j < nj; j++) {
                lo[i][j] = _mm256_fmadd_ps(xl, wl[j], lo[i][j]);
                hi[i][j] = _mm256_fmadd_ps(xh, wh[j], hi[i][j]);
            }
        }
    }
    float lanes[LANES];
    for (int i = 0; i < mi; i++)
        for (int j = 0; j < nj; j++) {
            _mm256_storeu_ps(lanes, lo[i][j]);
            _mm256_storeu_ps(lanes + 8, hi[i][j]);
            y[i * ldy + j] = f16_finish(lanes, x + i * k, w + j * k, k16, k);
        }
}
#else
INLINE void f16_tile(const uint16_t *w, int64_t k, const float *x, int mi, int nj, float *y, int64_t ldy)
{
    int64_t k16 = k & ~(int64_t)15;
    for (int i = 0; i < mi; i++)
        for (int j = 0; j < nj; j++) {
            float lanes[LANES] = {0};
            const float *xi = x + i * k;
            const uint16_t *wj = w + j * k;
            for (int64_t t = 0; t < k16; t += LANES)
                for (int l = 0; l < LANES; l++)
                    lanes[l] = fmaf(xi[t + l], ld_half_to_float(wj[t + l]), lanes[l]);
            y[i * ldy + j] = f16_finish(lanes, xi, wj, k16, k);
        }
}
#endif

/* Tiles of constant shape, so the accumulators live in registers. */
#define F16_CASE(A, B) case (A) * 8 + (B): if ((A) <= F16_MI && (B) <= F16_NJ) f16_tile(w, k, x, A, B, y, n); break;
static void f16_tile_any(const uint16_t *w, int64_t k, const float *x, int mi, int nj, float *y, int64_t n)
{
    switch (mi * 8 + nj) {
    F16_CASE(1, 1) F16_CASE(1, 2) F16_CASE(1, 3) F16_CASE(1, 4) F16_CASE(1, 5) F16_CASE(1, 6) F16_CASE(1, 7) F16_CASE(1, 8)
    F16_CASE(2, 1) F16_CASE(2, 2) F16_CASE(2, 3) F16_CASE(2, 4) F16_CASE(2, 5) F16_CASE(2, 6) F16_CASE(2, 7) F16_CASE(2, 8)
    F16_CASE(3, 1) F16_CASE(3, 2) F16_CASE(3, 3) F16_CASE(3, 4) F16_CASE(3, 5) F16_CASE(3, 6) F16_CASE(3, 7) F16_CASE(3, 8)
    F16_CASE(4, 1) F16_CASE(4, 2) F16_CASE(4, 3) F16_CASE(4, 4) F16_CASE(4, 5) F16_CASE(4, 6) F16_CASE(4, 7) F16_CASE(4, 8)
    default: break;
    }
}

void ld_mm_f16(const uint8_t *wbytes, int64_t n, int64_t k, const float *x, int64_t m, float *y)
{
    const uint16_t *w = (const uint16_t *)wbytes;
    int64_t blocks = (n + JBLOCK - 1) / JBLOCK;
#pragma omp parallel for schedule(static)
    for (int64_t b = 0; b < blocks; b++) {
        int64_t j1 = b * JBLOCK + JBLOCK < n ? b * JBLOCK + JBLOCK : n;
        for (int64_t j0 = b * JBLOCK; j0 < j1; j0 += F16_NJ) {
            int nj = j1 - j0 < F16_NJ ? (int)(j1 - j0) : F16_NJ;
            for (int64_t i0 = 0; i0 < m; i0 += F16_MI) {
                int mi = m - i0 < F16_MI ? (int)(m - i0) : F16_MI;
                f16_tile_any(w + j0 * k, k, x + i0 * k, mi, nj, y + i0 * n + j0, n);
            }
        }
    }
}

/* ---------------------------------------------------------------- Q8_0 */

#define Q8_BLOCK 32
#define Q8_BYTES 34

/* x [m, k] -> int16 xq [m, k] and a float scale per 32 inputs: s = max|x| / 32767,
 * q = rint(x * (32767 / max|x|)) in float32 (the K-quants' rule, kquants.c); a block
 * holding NaN or inf gets s = NaN, an all-zero (or subnormal-tiny) one s = 0. */
static void quantize_rows(const float *x, int64_t m, int64_t k, int16_t *xq, float *xs)
{
    int64_t nb = k / Q8_BLOCK;
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < m; i++) {
        for (int64_t b = 0; b < nb; b++) {
            const float *v = x + i * k + b * Q8_BLOCK;
            int16_t *q = xq + i * k + b * Q8_BLOCK;
            float amax = 0.0f;
            int finite = 1;
            for (int t = 0; t < Q8_BLOCK; t++) {
                float a = fabsf(v[t]);
                finite &= a <= 3.4028234663852886e38f; /* false for NaN and inf */
                amax = a > amax ? a : amax;
            }
            float inv = 32767.0f / amax;
            if (!finite || !(inv <= 3.4028234663852886e38f)) {
                memset(q, 0, sizeof(int16_t) * Q8_BLOCK);
                xs[i * nb + b] = finite ? 0.0f : NAN;
                continue;
            }
            for (int t = 0; t < Q8_BLOCK; t++) {
                float r = rintf(v[t] * inv);
                q[t] = (int16_t)(r > 32767.0f ? 32767.0f : r < -32767.0f ? -32767.0f : r);
            }
            xs[i * nb + b] = amax / 32767.0f;
        }
    }
}

/* Per block: lane l = the exact integer q[2l]x[2l] + q[2l+1]x[2l+1], then
 * acc[l] = fma(float(lane) * s, d, acc[l]). */
__attribute__((unused)) static void q8_lane_step(float *lanes, const int8_t *q, const int16_t *xq, float s, float d)
{
    for (int l = 0; l < LANES; l++) {
        int32_t p = (int32_t)q[2 * l] * xq[2 * l] + (int32_t)q[2 * l + 1] * xq[2 * l + 1];
        float f = (float)p * s;
        lanes[l] = fmaf(f, d, lanes[l]);
    }
}

#if defined(LD_AVX512)
INLINE void q8_tile(const uint8_t *w, int64_t rowb, int64_t nb, const int16_t *xq, const float *xs, int64_t k,
                    int mi, int nj, float *y, int64_t ldy)
{
    __m512 acc[MI][NJ];
#pragma GCC unroll 8
    for (int i = 0; i < mi; i++)
#pragma GCC unroll 8
        for (int j = 0; j < nj; j++)
            acc[i][j] = _mm512_setzero_ps();
    for (int64_t b = 0; b < nb; b++) {
        __m512i xv[MI];
        __m512 sv[MI];
#pragma GCC unroll 8
        for (int i = 0; i < mi; i++) {
            xv[i] = _mm512_loadu_si512((const void *)(xq + i * k + b * Q8_BLOCK));
            sv[i] = _mm512_set1_ps(xs[i * nb + b]);
        }
#pragma GCC unroll 8
        for (int j = 0; j < nj; j++) {
            const uint8_t *blk = w + j * rowb + b * Q8_BYTES;
            /* the next tile's rows into L2, as for F16: without it the hardware
             * prefetcher leaves one row at ~10 GB/s (8192x2048: 1.5-2.1 -> 0.8 ms) */
            _mm_prefetch((const char *)(blk + nj * rowb), _MM_HINT_T1);
            uint16_t h;
            memcpy(&h, blk, 2);
            __m512 dv = _mm512_set1_ps(_cvtsh_ss(h));
            __m512i wq = _mm512_cvtepi8_epi16(_mm256_loadu_si256((const __m256i *)(blk + 2)));
#pragma GCC unroll 8
            for (int i = 0; i < mi; i++) {
                __m512 f = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_madd_epi16(xv[i], wq)), sv[i]);
                acc[i][j] = _mm512_fmadd_ps(f, dv, acc[i][j]);
            }
        }
    }
    float lanes[LANES];
    for (int i = 0; i < mi; i++)
        for (int j = 0; j < nj; j++) {
            _mm512_storeu_ps(lanes, acc[i][j]);
            y[i * ldy + j] = hsum16(lanes);
        }
}
#elif defined(LD_AVX2)
INLINE void q8_tile(const uint8_t *w, int64_t rowb, int64_t nb, const int16_t *xq, const float *xs, int64_t k,
                    int mi, int nj, float *y, int64_t ldy)
{
    __m256 lo[MI][NJ], hi[MI][NJ];
#pragma GCC unroll 8
    for (int i = 0; i < mi; i++)
#pragma GCC unroll 8
        for (int j = 0; j < nj; j++)
            lo[i][j] = hi[i][j] = _mm256_setzero_ps();
    for (int64_t b = 0; b < nb; b++) {
        __m256i wl[NJ], wh[NJ];
        __m256 dv[NJ];
#pragma GCC unroll 8
        for (int j = 0; j < nj; j++) {
            const uint8_t *blk = w + j * rowb + b * Q8_BYTES;
            _mm_prefetch((const char *)(blk + nj * rowb), _MM_HINT_T1);
            uint16_t h;
            memcpy(&h, blk, 2);
            dv[j] = _mm256_set1_ps(_cvtsh_ss(h));
            wl[j] = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(blk + 2)));
            wh[j] = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(blk + 18)));
        }
#pragma GCC unroll 8
        for (int i = 0; i < mi; i++) {
            const int16_t *xb = xq + i * k + b * Q8_BLOCK;
            __m256i xl = _mm256_loadu_si256((const __m256i *)xb), xh = _mm256_loadu_si256((const __m256i *)(xb + 16));
            __m256 sv = _mm256_set1_ps(xs[i * nb + b]);
#pragma GCC unroll 8
            for (int j = 0; j < nj; j++) {
                __m256 fl = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_madd_epi16(xl, wl[j])), sv);
                __m256 fh = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_madd_epi16(xh, wh[j])), sv);
                lo[i][j] = _mm256_fmadd_ps(fl, dv[j], lo[i][j]);
                hi[i][j] = _mm256_fmadd_ps(fh, dv[j], hi[i][j]);
            }
        }
    }
    float lanes[LANES];
    for (int i = 0; i < mi; i++)
        for (int j = 0; j < nj; j++) {
            _mm256_storeu_ps(lanes, lo[i][j]);
            _mm256_storeu_ps(lanes + 8, hi[i][j]);
            y[i * ldy + j] = hsum16(lanes);
        }
}
#else
INLINE void q8_tile(const uint8_t *w, int64_t rowb, int64_t nb, const int16_t *xq, const float *xs, int64_t k,
                    int mi, int nj, float *y, int64_t ldy)
{
    for (int i = 0; i < mi; i++)
        for (int j = 0; j < nj; j++) {
            float lanes[LANES] = {0};
            for (int64_t b = 0; b < nb; b++) {
                const uint8_t *blk = w + j * rowb + b * Q8_BYTES;
                uint16_t h;
                memcpy(&h, blk, 2);
                q8_lane_step(lanes, (const int8_t *)(blk + 2), xq + i * k + b * Q8_BLOCK, xs[i * nb + b],
                             ld_half_to_float(h));
            }
            y[i * ldy + j] = hsum16(lanes);
        }
}
#endif

#define Q8_CASE(A, B) case (A) * 8 + (B): if ((A) <= Q8_MI && (B) <= Q8_NJ) q8_tile(w, rowb, nb, xq, xs, k, A, B, y, n); break;
static void q8_tile_any(const uint8_t *w, int64_t rowb, int64_t nb, const int16_t *xq, const float *xs,
                        int64_t k, int mi, int nj, float *y, int64_t n)
{
    switch (mi * 8 + nj) {
    Q8_CASE(1, 1) Q8_CASE(1, 2) Q8_CASE(1, 3) Q8_CASE(1, 4) Q8_CASE(1, 5) Q8_CASE(1, 6) Q8_CASE(1, 7) Q8_CASE(1, 8)
    Q8_CASE(2, 1) Q8_CASE(2, 2) Q8_CASE(2, 3) Q8_CASE(2, 4) Q8_CASE(2, 5) Q8_CASE(2, 6) Q8_CASE(2, 7) Q8_CASE(2, 8)
    Q8_CASE(3, 1) Q8_CASE(3, 2) Q8_CASE(3, 3) Q8_CASE(3, 4) Q8_CASE(3, 5) Q8_CASE(3, 6) Q8_CASE(3, 7) Q8_CASE(3, 8)
    Q8_CASE(4, 1) Q8_CASE(4, 2) Q8_CASE(4, 3) Q8_CASE(4, 4) Q8_CASE(4, 5) Q8_CASE(4, 6) Q8_CASE(4, 7) Q8_CASE(4, 8)
    default: break;
    }
}

/* k must be a multiple of 32 (the caller checks); y is left untouched if scratch
 * memory cannot be had, which the caller detects by returning -1. */
int ld_mm_q8_0_checked(const uint8_t *w, int64_t n, int64_t k, const float *x, int64_t m, float *y)
{
    int64_t nb = k / Q8_BLOCK, rowb = nb * Q8_BYTES;
    int16_t *xq = malloc(sizeof(int16_t) * (size_t)(m * k) + 64);
    float *xs = malloc(sizeof(float) * (size_t)(m * nb) + 64);
    if (!xq || !xs) {
        free(xq);
        free(xs);
        return -1;
    }
    quantize_rows(x, m, k, xq, xs);
    int64_t blocks = (n + JBLOCK - 1) / JBLOCK;
#pragma omp parallel for schedule(static)
    for (int64_t bj = 0; bj < blocks; bj++) {
        int64_t j1 = bj * JBLOCK + JBLOCK < n ? bj * JBLOCK + JBLOCK : n;
        for (int64_t j0 = bj * JBLOCK; j0 < j1; j0 += Q8_NJ) {
            int nj = j1 - j0 < Q8_NJ ? (int)(j1 - j0) : Q8_NJ;
            for (int64_t i0 = 0; i0 < m; i0 += Q8_MI) {
                int mi = m - i0 < Q8_MI ? (int)(m - i0) : Q8_MI;
                q8_tile_any(w + j0 * rowb, rowb, nb, xq + i0 * k, xs + i0 * nb, k, mi, nj, y + i0 * n + j0, n);
            }
        }
    }
    free(xq);
    free(xs);
    return 0;
}

void ld_mm_q8_0(const uint8_t *w, int64_t n, int64_t k, const float *x, int64_t m, float *y)
{
    if (ld_mm_q8_0_checked(w, n, k, x, m, y) != 0)
        for (int64_t t = 0; t < m * n; t++)
            y[t] = NAN;
}

/* float -> bfloat16, rounding to nearest even (NaN stays a quiet NaN), as torch rounds */
static inline uint16_t q8_to_bf16(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    uint32_t r = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
    return (uint16_t)((u & 0x7fffffffu) > 0x7f800000u ? (u >> 16) | 0x40u : r);
}

/* W as float32 (bf16 == 0) or bfloat16 (bf16 != 0), n x k row-major: d * q, exact in
 * float32 (gguf's value bit for bit), then rounded once for bfloat16. */
void ld_dequant_q8_0(const uint8_t *w, int64_t n, int64_t k, void *out, int32_t bf16)
{
    int64_t nb = k / Q8_BLOCK;
#pragma omp parallel for schedule(static) if (n * k >= (1 << 18))
    for (int64_t j = 0; j < n; j++)
        for (int64_t b = 0; b < nb; b++) {
            const uint8_t *blk = w + (j * nb + b) * Q8_BYTES;
            float d = ld_half_to_float(ld_read_u16(blk));
            const int8_t *q = (const int8_t *)(blk + 2);
            int64_t at = j * k + b * Q8_BLOCK;
            for (int t = 0; t < Q8_BLOCK; t++) {
                float v = d * (float)q[t];
                if (bf16)
                    ((uint16_t *)out)[at + t] = q8_to_bf16(v);
                else
                    ((float *)out)[at + t] = v;
            }
        }
}
