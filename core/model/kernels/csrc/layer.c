/* A small dense float32 model's forward over a KV cache in one call (issue 23).
 *
 * On a model like stories260K (dim 64, 5 layers) a decode step is bound by the count of
 * torch calls (~54 a layer, ~5-10 µs each), not by arithmetic: llama-server runs the same
 * step in C, so do we. ``ld_forward_f32`` runs the embedding, every transformer block and
 * the final norm + output product for M query rows; ``ld_layer_f32`` one block.
 *
 * Batch invariance by construction: every number is computed by the same operations in the
 * same order whatever M is, which rows share the call and how many threads run. Threads
 * split output columns / row tiles and (row, kv head) pairs, never one sum; a product's
 * y[i][j] is one FMA chain over the inputs in order (vectorized across j, so no horizontal
 * sum whose tree could depend on tiling), whether its row sits in a tile of 1 or 4. So a
 * row's prefill, decode and speculative verification agree with themselves bit for bit,
 * with no padding of a step to 4 rows. Per-ISA differences (AVX-512, AVX2, plain C) are
 * allowed; per-batch ones are not. */
#include <stdlib.h>
#include "common.h"
#include "attn.h"

/* ---- a float vector of LD_VL lanes, with a lane mask for a block's last columns ---- */
#if defined(LD_AVX512)
#define LD_VL 16
typedef __m512 ld_vf;
typedef __mmask16 ld_mask;
static inline ld_mask ld_mask_n(int n) { return (ld_mask)((1u << n) - 1u); }
static inline ld_vf ld_vzero(void) { return _mm512_setzero_ps(); }
static inline ld_vf ld_vset1(float x) { return _mm512_set1_ps(x); }
static inline ld_vf ld_vload(const float *p, ld_mask m) { return _mm512_maskz_loadu_ps(m, p); }
static inline ld_vf ld_vloadu(const float *p) { return _mm512_loadu_ps(p); }
static inline void ld_vstoreu(float *p, ld_vf v) { _mm512_storeu_ps(p, v); }
static inline void ld_vstore(float *p, ld_vf v, ld_mask m) { _mm512_mask_storeu_ps(p, m, v); }
static inline ld_vf ld_vfma(ld_vf a, ld_vf b, ld_vf c) { return _mm512_fmadd_ps(a, b, c); }
static inline ld_vf ld_vadd(ld_vf a, ld_vf b) { return _mm512_add_ps(a, b); }
#elif defined(LD_AVX2)
#define LD_VL 8
typedef __m256 ld_vf;
typedef __m256i ld_mask;
static inline ld_mask ld_mask_n(int n) {
    return _mm256_cmpgt_epi32(_mm256_set1_epi32(n), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}
static inline ld_vf ld_vzero(void) { return _mm256_setzero_ps(); }
static inline ld_vf ld_vset1(float x) { return _mm256_set1_ps(x); }
static inline ld_vf ld_vload(const float *p, ld_mask m) { return _mm256_maskload_ps(p, m); }
static inline ld_vf ld_vloadu(const float *p) { return _mm256_loadu_ps(p); }
static inline void ld_vstoreu(float *p, ld_vf v) { _mm256_storeu_ps(p, v); }
static inline void ld_vstore(float *p, ld_vf v, ld_mask m) { _mm256_maskstore_ps(p, m, v); }
static inline ld_vf ld_vfma(ld_vf a, ld_vf b, ld_vf c) { return _mm256_fmadd_ps(a, b, c); }
static inline ld_vf ld_vadd(ld_vf a, ld_vf b) { return _mm256_add_ps(a, b); }
#else
/* plain C: one lane, a product and a sum rounded apart (no FMA without the instruction) */
#define LD_VL 1
typedef float ld_vf;
typedef int ld_mask;
static inline ld_mask ld_mask_n(int n) { return n; }
static inline ld_vf ld_vzero(void) { return 0.0f; }
static inline ld_vf ld_vset1(float x) { return x; }
static inline ld_vf ld_vload(const float *p, ld_mask m) { (void)m; return *p; }
static inline ld_vf ld_vloadu(const float *p) { return *p; }
static inline void ld_vstoreu(float *p, ld_vf v) { *p = v; }
static inline void ld_vstore(float *p, ld_vf v, ld_mask m) { (void)m; *p = v; }
static inline ld_vf ld_vfma(ld_vf a, ld_vf b, ld_vf c) { return a * b + c; }
static inline ld_vf ld_vadd(ld_vf a, ld_vf b) { return a + b; }
#endif

#define LD_MR 4              /* rows of a product's tile */
#define LD_NV 4              /* vectors of columns of a tile */
#define LD_NB (LD_NV * LD_VL)
/* multiply-adds of one product (or scores of one attention) from which threads are woken:
 * below it, waking them costs more than they save (a small model's step is µs) */
#define LD_PAR_WORK (1 << 20)

/* Rows [R] of y[.][0, NV*VL) (the last vector holding the lanes of ``last``) =
 * (add +) sum over kk in order of x[r][kk] * wt[kk][j]: one FMA chain per element. Inlined
 * with constant R, NV, so the accumulators (named, not an array: GCC would keep an array in
 * memory) stay in registers. */
#define LD_ACC(r, v) ld_vf a##r##v = ld_vzero();
#define LD_STEP(r, v) if (R > r && NV > v) a##r##v = ld_vfma(x##r, w##v, a##r##v);
#define LD_OUT(r, v) if (R > r && NV > v) ld_out(a##r##v, y + r * ldy + v * LD_VL, add ? add + r * ldy + v * LD_VL : NULL, v == NV - 1, last);
#define LD_ROW(M, r) M(r, 0) M(r, 1) M(r, 2) M(r, 3)
#define LD_ALL(M) LD_ROW(M, 0) LD_ROW(M, 1) LD_ROW(M, 2) LD_ROW(M, 3)

static inline __attribute__((always_inline)) void ld_out(ld_vf acc, float *y, const float *add, int partial,
                                                         ld_mask last) {
    if (partial) {
        if (add)  /* the residual: h + y, as torch adds them */
            acc = ld_vadd(ld_vload(add, last), acc);
        ld_vstore(y, acc, last);
    } else {
        if (add)
            acc = ld_vadd(ld_vloadu(add), acc);
        ld_vstoreu(y, acc);
    }
}

static inline __attribute__((always_inline)) void ld_tile(
        int R, int NV, const float *restrict x, int64_t ldx, int64_t k, const float *restrict wt,
        int64_t ldw, ld_mask last, float *y, int64_t ldy, const float *add) {
    LD_ALL(LD_ACC)
    ld_vf w0 = ld_vzero(), w1 = w0, w2 = w0, w3 = w0;
    for (int64_t kk = 0; kk < k; kk++) {
        const float *wr = wt + kk * ldw;
        w0 = NV == 1 ? ld_vload(wr, last) : ld_vloadu(wr);
        if (NV > 1) w1 = NV == 2 ? ld_vload(wr + LD_VL, last) : ld_vloadu(wr + LD_VL);
        if (NV > 2) w2 = NV == 3 ? ld_vload(wr + 2 * LD_VL, last) : ld_vloadu(wr + 2 * LD_VL);
        if (NV > 3) w3 = ld_vload(wr + 3 * LD_VL, last);
        ld_vf x0 = ld_vset1(x[kk]), x1 = x0, x2 = x0, x3 = x0;
        if (R > 1) x1 = ld_vset1(x[ldx + kk]);
        if (R > 2) x2 = ld_vset1(x[2 * ldx + kk]);
        if (R > 3) x3 = ld_vset1(x[3 * ldx + kk]);
        LD_ALL(LD_STEP)
    }
    LD_ALL(LD_OUT)
}

#define LD_TILE_CASE(R, NV) \
    case (R - 1) * LD_NV + NV - 1: ld_tile(R, NV, x, ldx, k, wt, ldw, last, y, ldy, add); break;

static void ld_tile_any(int R, int NV, const float *x, int64_t ldx, int64_t k, const float *wt,
                        int64_t ldw, ld_mask last, float *y, int64_t ldy, const float *add) {
    switch ((R - 1) * LD_NV + NV - 1) {
        LD_TILE_CASE(1, 1) LD_TILE_CASE(1, 2) LD_TILE_CASE(1, 3) LD_TILE_CASE(1, 4)
        LD_TILE_CASE(2, 1) LD_TILE_CASE(2, 2) LD_TILE_CASE(2, 3) LD_TILE_CASE(2, 4)
        LD_TILE_CASE(3, 1) LD_TILE_CASE(3, 2) LD_TILE_CASE(3, 3) LD_TILE_CASE(3, 4)
        LD_TILE_CASE(4, 1) LD_TILE_CASE(4, 2) LD_TILE_CASE(4, 3) LD_TILE_CASE(4, 4)
        default: break;
    }
}

/* y [m, n] = (add +) x [m, k] @ wt [k, n] (wt: the weight transposed, [in, out] row-major).
 * ``add`` is y itself or NULL. Threads take (column block, row tile) pairs. */
static inline void ld_matmul_tile(const float *x, int64_t m, int64_t k, const float *wt, int64_t n, float *y,
                                  const float *add, int64_t mb, int64_t t) {
    int64_t jb = t / mb, ib = t % mb;  /* a block's columns stay in cache over its row tiles */
    int64_t j0 = jb * LD_NB, i0 = ib * LD_MR;
    int64_t cols = n - j0 < LD_NB ? n - j0 : LD_NB;
    int R = (int)(m - i0 < LD_MR ? m - i0 : LD_MR);
    int NV = (int)((cols + LD_VL - 1) / LD_VL);
    ld_tile_any(R, NV, x + i0 * k, k, k, wt + j0, n, ld_mask_n((int)(cols - (NV - 1) * LD_VL)),
                y + i0 * n + j0, n, add ? add + i0 * n + j0 : NULL);
}

static void ld_matmul(const float *x, int64_t m, int64_t k, const float *wt, int64_t n, float *y,
                      const float *add) {
    int64_t nb = (n + LD_NB - 1) / LD_NB, mb = (m + LD_MR - 1) / LD_MR;
    if (m * n * k < LD_PAR_WORK || LD_THREADS() == 1) {  /* (an OpenMP region costs ~µs even alone) */
        for (int64_t t = 0; t < nb * mb; t++)
            ld_matmul_tile(x, m, k, wt, n, y, add, mb, t);
        return;
    }
#ifdef _OPENMP
#pragma omp parallel for schedule(static)
#endif
    for (int64_t t = 0; t < nb * mb; t++)
        ld_matmul_tile(x, m, k, wt, n, y, add, mb, t);
}

/* y [m, n] = x [m, k] @ wt [k, n]: the products' kernel alone (tests, and the output layer
 * of a caller that wants it). */
void ld_mm_f32(const float *x, int64_t m, int64_t k, const float *wt, int64_t n, float *y) {
    ld_matmul(x, m, k, wt, n, y, NULL);
}

/* out[i] = x[i] / sqrt(mean(x[i]^2) + eps) * w: the sum of squares as ld_dot sums. */
static void ld_rmsnorm(const float *x, int64_t m, int64_t dim, const float *w, float eps, float *out) {
    for (int64_t i = 0; i < m; i++) {
        const float *xr = x + i * dim;
        float ss = ld_dot(xr, xr, dim);
        float r = 1.0f / __builtin_sqrtf(ss / (float)dim + eps);
        for (int64_t d = 0; d < dim; d++)
            out[i * dim + d] = xr[d] * r * w[d];
    }
}

/* Rotate interleaved pairs of ``heads`` heads of x [heads * d] in place by the rotation
 * table's row (cos, cos, ... | -sin, sin, ...): x·C + swap(x)·S, as apply_rope computes it
 * (a product each, then one sum: the same bits as the torch path). */
static void ld_rope(float *x, int64_t heads, int64_t d, const float *c) {
    const float *s = c + d;
    for (int64_t h = 0; h < heads; h++) {
        float *xh = x + h * d;
        for (int64_t i = 0; i < d; i += 2) {
            float x0 = xh[i], x1 = xh[i + 1];
            xh[i] = x0 * c[i] + x1 * s[i];
            xh[i + 1] = x1 * c[i + 1] + x0 * s[i + 1];
        }
    }
}

/* What one call is given (core/model/fused.py fills it: a ctypes Structure of this layout). */
typedef struct {
    int64_t n_layers, dim, n_heads, n_kv, head_dim, hidden, vocab;
    /* tok_embeddings [vocab, dim]; per layer attention_norm, wq, wk, wv, wo, ffn_norm, w1,
     * w3, w2 (the products transposed: [in, out]); norm; output transposed [dim, vocab] */
    const float *const *w;
    const float *rope;            /* rotation table [rope_len, 2, 1, head_dim] */
    int64_t rope_len;
    float *const *k, *const *v;   /* per layer: the cache's [cache_rows, n_kv, capacity, head_dim] */
    int64_t cache_rows, capacity;
    const int64_t *tokens;        /* [b, t] */
    int64_t b, t;
    const int64_t *start;         /* row i's first position at start[i * start_stride] */
    int64_t start_stride, row0;   /* row i of the call is cache row row0 + i */
    int64_t last_only;            /* logits of each row's last position only */
    float *work;                  /* ld_forward_work_floats(a, b * t) floats */
    int64_t work_floats;
    float *logits;                /* [b, t or 1, vocab] */
    float eps, scale;
} ld_forward_args;

enum { LD_W_LAYER = 9 };

/* Scratch floats a call of m query rows needs in ``work``. */
int64_t ld_forward_work_floats(const ld_forward_args *a, int64_t m) {
    int64_t qd = a->n_heads * a->head_dim, kd = a->n_kv * a->head_dim;
    return m * (2 * a->dim + 2 * qd + 2 * kd + 2 * a->hidden + 4);
}

/* Query row j / G's heads of kv head j % G over its cache row's keys [0, pos]: q, att [m, H*D]. */
static inline void ld_attend(const ld_forward_args *a, const float *q, float *att, const int64_t *rows,
                             const int64_t *pos, int64_t j, int64_t most, float *s, const float *kc,
                             const float *vc) {
    int64_t D = a->head_dim, G = a->n_kv, rep = a->n_heads / G, qd = a->n_heads * D;
    int64_t i = j / G, g = j % G, sh = a->capacity * D, sb = G * sh;
    ld_attn_group(q + i * qd + g * rep * D, kc, vc, LD_F32, rows[i] * sb + g * sh, D, pos[i] + 1, D, rep,
                  a->scale, s, s + rep * most, att + i * qd + g * rep * D);
}

/* One block on h [m, dim] in place: rows[i]'s cache at positions pos[i]. ``att`` holds
 * threads * (rep * most + head_dim) floats, most = the largest pos + 1. */
static void ld_block(const ld_forward_args *a, int64_t layer, float *h, int64_t m, const int64_t *rows,
                     const int64_t *pos, int64_t most, float *att_scratch) {
    const float *const *w = a->w + 1 + layer * LD_W_LAYER;
    int64_t dim = a->dim, D = a->head_dim, H = a->n_heads, G = a->n_kv, rep = H / G;
    int64_t qd = H * D, kd = G * D, hid = a->hidden;
    float *xn = a->work + m * dim, *q = xn + m * dim, *kp = q + m * qd, *vp = kp + m * kd;
    float *att = vp + m * kd, *fa = att + m * qd, *fb = fa + m * hid;
    float *kc = a->k[layer], *vc = a->v[layer];
    int64_t sl = D, sh = a->capacity * D, sb = G * sh;

    ld_rmsnorm(h, m, dim, w[0], a->eps, xn);
    ld_matmul(xn, m, dim, w[1], qd, q, NULL);
    ld_matmul(xn, m, dim, w[2], kd, kp, NULL);
    ld_matmul(xn, m, dim, w[3], kd, vp, NULL);
    /* every row's keys and values are in the cache before any row attends: rows of one
     * prompt (prefill, verification) read each other's */
    for (int64_t i = 0; i < m; i++) {
        const float *c = a->rope + pos[i] * 2 * D;
        ld_rope(q + i * qd, H, D, c);
        ld_rope(kp + i * kd, G, D, c);
        for (int64_t g = 0; g < G; g++) {
            int64_t at = rows[i] * sb + g * sh + pos[i] * sl;
            memcpy(kc + at, kp + i * kd + g * D, (size_t)D * sizeof(float));
            memcpy(vc + at, vp + i * kd + g * D, (size_t)D * sizeof(float));
        }
    }
    int64_t each = rep * most + D, work = 0;
    for (int64_t i = 0; i < m; i++)
        work += (pos[i] + 1) * qd;
    if (work < LD_PAR_WORK || LD_THREADS() == 1) {  /* (an OpenMP region costs ~µs even alone) */
        for (int64_t j = 0; j < m * G; j++)
            ld_attend(a, q, att, rows, pos, j, most, att_scratch, kc, vc);
    } else {
#ifdef _OPENMP
#pragma omp parallel for schedule(dynamic, 4)
#endif
        for (int64_t j = 0; j < m * G; j++) {
#ifdef _OPENMP
            float *s = att_scratch + each * omp_get_thread_num();
#else
            float *s = att_scratch;
#endif
            ld_attend(a, q, att, rows, pos, j, most, s, kc, vc);
        }
    }
    ld_matmul(att, m, qd, w[4], dim, h, h);
    ld_rmsnorm(h, m, dim, w[5], a->eps, xn);
    ld_matmul(xn, m, dim, w[6], hid, fa, NULL);
    ld_matmul(xn, m, dim, w[7], hid, fb, NULL);
    for (int64_t e = 0; e < m * hid; e++)
        fa[e] = ld_silu_times(fa[e], fb[e]);
    ld_matmul(fa, m, hid, w[8], dim, h, h);
}

/* Positions and rows of the call's m = b * t query rows, checked against the cache and the
 * rotation table: 0, or -3 (a position outside them) / -4 (a row outside the cache). */
static int ld_place(const ld_forward_args *a, int64_t *rows, int64_t *pos, int64_t *most) {
    if (a->row0 < 0 || a->row0 + a->b > a->cache_rows)
        return -4;
    *most = 1;
    for (int64_t r = 0; r < a->b; r++) {
        int64_t p0 = a->start[r * a->start_stride];
        if (p0 < 0 || p0 + a->t > a->capacity || p0 + a->t > a->rope_len)
            return -3;
        for (int64_t c = 0; c < a->t; c++) {
            rows[r * a->t + c] = a->row0 + r;
            pos[r * a->t + c] = p0 + c;
        }
        *most = p0 + a->t > *most ? p0 + a->t : *most;
    }
    return 0;
}

/* The forward of tokens [b, t] over the KV cache: embedding, every block, the final norm and
 * output product into ``logits``. Keys and values of the t positions of each row are written
 * into its cache row. Returns 0; -1 out of memory, -2 a token outside the vocabulary, -3 a
 * position outside the cache or the rotation table, -4 a row outside the cache, -5 ``work``
 * too small. */
int ld_forward_f32(const ld_forward_args *a) {
    int64_t m = a->b * a->t, dim = a->dim, most;
    if (m == 0)
        return 0;
    if (a->work_floats < ld_forward_work_floats(a, m))
        return -5;
    float *h = a->work;
    /* rows and positions live in the work's last 4 floats per row (2 int64 each) */
    int64_t *rows = (int64_t *)(a->work + ld_forward_work_floats(a, m) - 4 * m), *pos = rows + m;
    int err = ld_place(a, rows, pos, &most);
    if (err)
        return err;
    for (int64_t i = 0; i < m; i++) {
        int64_t tok = a->tokens[i];
        if (tok < 0 || tok >= a->vocab)
            return -2;
        memcpy(h + i * dim, a->w[0] + tok * dim, (size_t)dim * sizeof(float));
    }
    int64_t rep = a->n_heads / a->n_kv;
    float *att = malloc(sizeof(float) * (size_t)((rep * most + a->head_dim) * LD_THREADS()));
    if (att == NULL)
        return -1;
    for (int64_t l = 0; l < a->n_layers; l++)
        ld_block(a, l, h, m, rows, pos, most, att);
    free(att);
    const float *const *fin = a->w + 1 + a->n_layers * LD_W_LAYER;
    float *xn = a->work + m * dim;
    int64_t out = a->last_only ? a->b : m;
    for (int64_t r = 0; r < out; r++) {  /* the rows whose logits are asked for, packed */
        int64_t src = a->last_only ? r * a->t + a->t - 1 : r;
        memmove(h + r * dim, h + src * dim, (size_t)dim * sizeof(float));
    }
    ld_rmsnorm(h, out, dim, fin[0], a->eps, xn);
    ld_matmul(xn, out, dim, fin[1], a->vocab, a->logits, NULL);
    return 0;
}

/* One block (``layer``) on h [m, dim] in place, rows[i] of the cache at pos[i] (each below
 * the capacity and the rotation table, unchecked: the caller's), with a's weights, cache and
 * work (ld_forward_work_floats(a, m) floats; h is not in it). Returns 0 or -1 (memory). */
int ld_layer_f32(const ld_forward_args *a, int64_t layer, float *h, int64_t m, const int64_t *rows,
                 const int64_t *pos) {
    int64_t most = 1;
    for (int64_t i = 0; i < m; i++)
        most = pos[i] + 1 > most ? pos[i] + 1 : most;
    int64_t rep = a->n_heads / a->n_kv;
    float *att = malloc(sizeof(float) * (size_t)((rep * most + a->head_dim) * LD_THREADS()));
    if (att == NULL)
        return -1;
    ld_block(a, layer, h, m, rows, pos, most, att);
    free(att);
    return 0;
}
