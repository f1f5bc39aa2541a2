/* Decode attention's building block, for other kernels that run a whole layer in C
 * (issue 23). Its signature is kept stable: csrc/layer.c calls it per (query row, kv head). */
#ifndef LD_ATTN_H
#define LD_ATTN_H

#include <stdint.h>

/* cache element types ld_attn_decode and ld_attn_group read */
enum { LD_F32 = 0, LD_BF16 = 1, LD_F16 = 2 };

/* The ``rep`` query heads q[rep][d] (float32) that share one kv head, over its first n
 * keys/values (of type ``dtype``, row l at element base + l*sl of k and v):
 * out[h][i] = sum_l softmax_l(scale * q_h·k_l) v_l[i]. Every head's numbers come from its
 * own operations in a fixed order, whatever rep, the other rows or the thread. Scratch:
 * ``s`` holds rep*n floats, ``tmp`` d floats; out[rep][d]. */
void ld_attn_group(const float *restrict q, const void *k, const void *v, int dtype, int64_t base,
                   int64_t sl, int64_t n, int64_t d, int64_t rep, float scale, float *restrict s,
                   float *restrict tmp, float *restrict out);

#endif
