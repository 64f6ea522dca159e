/* The small per-token ops of a decoder layer on CPU, fp32: RMSNorm (with the residual add before it), SiLU
 * and multiply, rotary embedding, and the write of new keys and values into the paged cache. In PyTorch each
 * of them is several passes over its tensor, one per elementary op; here each is one pass. Rows are split
 * over OpenMP threads once a call has enough work to pay for them. Each returns 0. */
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "vector.h"

#define PARALLEL_MIN_ELEMENTS 32768 /* below this, one thread is faster than waking the others */

/* out = weight * rms_normalised(x + residual), and hidden = x + residual when residual is not NULL. Rows of
 * x and residual are strided; out and hidden are contiguous [num_tokens, size]. */
int rms_norm_f32(const float *x, int64_t stride_x, const float *residual, int64_t stride_residual,
                  const float *weight, float *out, float *hidden, int num_tokens, int size, float eps) {
#pragma omp parallel for if ((int64_t)num_tokens * size >= PARALLEL_MIN_ELEMENTS)
    for (int row = 0; row < num_tokens; row++) {
        const float *x_row = x + row * stride_x;
        float *out_row = out + (int64_t)row * size;
        if (residual != NULL) {
            float *h = hidden + (int64_t)row * size;
            const float *r = residual + row * stride_residual;
            for (int i = 0; i < size; i++) h[i] = x_row[i] + r[i];
            x_row = h;
        }
        float squares = 0.0f;
#pragma omp simd reduction(+ : squares)
        for (int i = 0; i < size; i++) squares += x_row[i] * x_row[i];
        float inv_rms = 1.0f / sqrtf(squares / size + eps);
        for (int i = 0; i < size; i++) out_row[i] = weight[i] * (x_row[i] * inv_rms);
    }
    return 0;
}

/* out = silu(gate) * up, with silu(g) = g * sigmoid(g) and sigmoid from exp(-|g|), which never overflows.
 * Rows of gate and up are strided; out is contiguous [num_tokens, size]. */
int silu_and_mul_f32(const float *gate, int64_t stride_gate, const float *up, int64_t stride_up, float *out,
                      int num_tokens, int size) {
#pragma omp parallel for if ((int64_t)num_tokens * size >= PARALLEL_MIN_ELEMENTS)
    for (int row = 0; row < num_tokens; row++) {
        const float *g_row = gate + row * stride_gate, *u_row = up + row * stride_up;
        float *o_row = out + (int64_t)row * size;
        for (int i = 0; i < size; i += VLEN) {
            int count = size - i < VLEN ? size - i : VLEN;
            vf g = {0}, u = {0};
            if (count == VLEN) {
                g = loadv(g_row + i);
                u = loadv(u_row + i);
            } else {
                memcpy(&g, g_row + i, sizeof(float) * count);
                memcpy(&u, u_row + i, sizeof(float) * count);
            }
            vf negative = (vf)((vi)g & (vi)(g < 0.0f));
            vf magnitude = g - negative - negative;               /* |g| */
            vf e = expv(-magnitude);                              /* exp(-|g|) in (0, 1] */
            vf sigmoid_of_magnitude = 1.0f / (1.0f + e);          /* sigmoid(|g|) */
            vf sigmoid = blend((vi)(g >= 0.0f), sigmoid_of_magnitude, e * sigmoid_of_magnitude);
            vf value = g * sigmoid * u;
            if (count == VLEN)
                memcpy(o_row + i, &value, sizeof value);
            else
                memcpy(o_row + i, &value, sizeof(float) * count);
        }
    }
    return 0;
}

static inline void rotate_heads(float *x, int64_t stride_head, int num_heads, const float *cos, const float *sin,
                                int half) {
    for (int head = 0; head < num_heads; head++) {
        float *x1 = x + head * stride_head, *x2 = x1 + half;
#pragma omp simd
        for (int i = 0; i < half; i++) {
            float a = x1[i], b = x2[i];
            x1[i] = a * cos[i] - b * sin[i];
            x2[i] = b * cos[i] + a * sin[i];
        }
    }
}

/* Rotates q [num_tokens, num_heads, head_dim] and k [num_tokens, num_kv_heads, head_dim] in place (head_dim
 * contiguous) by the rows positions[t] of cos_sin [max_positions, head_dim] = cat(cos, sin) halves, as the
 * rotate_half form of Llama and Qwen does. Returns -1, rotating nothing, when a position has no row. */
int rotary_embedding_f32(const int64_t *positions, float *q, int64_t stride_q_token, int64_t stride_q_head,
                         int num_heads, float *k, int64_t stride_k_token, int64_t stride_k_head, int num_kv_heads,
                         const float *cos_sin, int64_t stride_cache, int max_positions, int num_tokens,
                         int head_dim) {
    for (int t = 0; t < num_tokens; t++)
        if (positions[t] < 0 || positions[t] >= max_positions) return -1;
    int half = head_dim / 2;
#pragma omp parallel for if ((int64_t)num_tokens * (num_heads + num_kv_heads) * head_dim >= PARALLEL_MIN_ELEMENTS)
    for (int t = 0; t < num_tokens; t++) {
        const float *cos = cos_sin + positions[t] * stride_cache, *sin = cos + half;
        rotate_heads(q + t * stride_q_token, stride_q_head, num_heads, cos, sin, half);
        rotate_heads(k + t * stride_k_token, stride_k_head, num_kv_heads, cos, sin, half);
    }
    return 0;
}

/* Copies key[t] and value[t] ([num_kv_heads, head_dim], head_dim contiguous) into the contiguous caches'
 * slot slots[t], a row of num_kv_heads * head_dim; tokens with a negative slot are skipped. Returns -1,
 * writing nothing, when a slot lies past the caches' num_slots rows. */
int reshape_and_cache_f32(const float *key, int64_t stride_key_token, int64_t stride_key_head, const float *value,
                          int64_t stride_value_token, int64_t stride_value_head, float *k_cache, float *v_cache,
                          const int64_t *slots, int64_t num_slots, int num_tokens, int num_kv_heads, int head_dim) {
    for (int t = 0; t < num_tokens; t++)
        if (slots[t] >= num_slots) return -1;
    int64_t row = (int64_t)num_kv_heads * head_dim;
#pragma omp parallel for if ((int64_t)num_tokens * row >= PARALLEL_MIN_ELEMENTS)
    for (int t = 0; t < num_tokens; t++) {
        if (slots[t] < 0) continue;
        for (int head = 0; head < num_kv_heads; head++) {
            memcpy(k_cache + slots[t] * row + head * head_dim, key + t * stride_key_token + head * stride_key_head,
                   sizeof(float) * head_dim);
            memcpy(v_cache + slots[t] * row + head * head_dim,
                   value + t * stride_value_token + head * stride_value_head, sizeof(float) * head_dim);
        }
    }
    return 0;
}
