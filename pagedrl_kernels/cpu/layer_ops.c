/* The small per-token ops of a decoder layer on CPU: RMSNorm (with the residual add before it), SiLU and
 * multiply, rotary embedding, and the write of new keys and values into the paged cache. In PyTorch each of them
 * is several passes over its tensor, one per elementary op; here each is one pass. Rows are split over OpenMP
 * threads once a call has enough work to pay for them. Each returns 0.
 *
 * Each op takes fp32 tensors (the _f32 functions) or bf16 ones (_bf16: uint16 bit patterns), computes in fp32
 * and rounds to bf16 where the PyTorch reference's bf16 result is rounded, so the two agree to the rounding of
 * fp32 sums. One body per row serves both, with `bf16` a constant at each call: each exported function has its
 * own parallel loop, since OpenMP moves a loop's body into a function of its own, where a flag passed in from
 * outside would no longer be a constant (and the fp32 loops would not vectorise). */
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "vector.h"

#define PARALLEL_MIN_ELEMENTS 32768 /* below this, one thread is faster than waking the others */

/* Row `row` of out = weight * rms_normalised(x + residual), and of hidden = x + residual when residual is not
 * NULL. Rows of x and residual are strided; out and hidden are contiguous [num_tokens, size]. In bf16, as the
 * reference (and transformers) round: the sum x + residual, the normalised value, and its product with the
 * weight. */
static inline __attribute__((always_inline)) void rms_norm_row(const void *x, int64_t stride_x, const void *residual,
                                                               int64_t stride_residual, const void *weight, void *out,
                                                               void *hidden, int row, int size, float eps, int bf16) {
    const void *values = x;
    int64_t start = row * stride_x, out_start = (int64_t)row * size;
    if (residual != NULL) {
        int64_t r = row * stride_residual;
        for (int i = 0; i < size; i++)
            put_value(hidden, out_start + i, get_value(x, start + i, bf16) + get_value(residual, r + i, bf16), bf16);
        values = hidden;
        start = out_start;
    }
    float squares = 0.0f;
#pragma omp simd reduction(+ : squares)
    for (int i = 0; i < size; i++) {
        float v = get_value(values, start + i, bf16);
        squares += v * v;
    }
    float inv_rms = 1.0f / sqrtf(squares / size + eps);
    for (int i = 0; i < size; i++) {
        float normed = stored_value(get_value(values, start + i, bf16) * inv_rms, bf16);
        put_value(out, out_start + i, get_value(weight, i, bf16) * normed, bf16);
    }
}

int rms_norm_f32(const float *x, int64_t stride_x, const float *residual, int64_t stride_residual,
                 const float *weight, float *out, float *hidden, int num_tokens, int size, float eps) {
#pragma omp parallel for if ((int64_t)num_tokens * size >= PARALLEL_MIN_ELEMENTS)
    for (int row = 0; row < num_tokens; row++)
        rms_norm_row(x, stride_x, residual, stride_residual, weight, out, hidden, row, size, eps, 0);
    return 0;
}

int rms_norm_bf16(const uint16_t *x, int64_t stride_x, const uint16_t *residual, int64_t stride_residual,
                  const uint16_t *weight, uint16_t *out, uint16_t *hidden, int num_tokens, int size, float eps) {
#pragma omp parallel for if ((int64_t)num_tokens * size >= PARALLEL_MIN_ELEMENTS)
    for (int row = 0; row < num_tokens; row++)
        rms_norm_row(x, stride_x, residual, stride_residual, weight, out, hidden, row, size, eps, 1);
    return 0;
}

/* Row `row` of out = silu(gate) * up, with silu(g) = g * sigmoid(g) and sigmoid from exp(-|g|), which never
 * overflows; one rounding at the end in bf16. Rows of gate and up are strided; out is contiguous [num_tokens,
 * size]. */
static inline __attribute__((always_inline)) void silu_and_mul_row(const void *gate, int64_t stride_gate,
                                                                   const void *up, int64_t stride_up, void *out,
                                                                   int row, int size, int bf16) {
    int64_t g_row = row * stride_gate, u_row = row * stride_up, o_row = (int64_t)row * size;
    for (int i = 0; i < size; i += VLEN) {
        int count = size - i < VLEN ? size - i : VLEN;
        vf g = load_values(gate, g_row + i, count, bf16), u = load_values(up, u_row + i, count, bf16);
        vf negative = (vf)((vi)g & (vi)(g < 0.0f));
        vf magnitude = g - negative - negative;               /* |g| */
        vf e = expv(-magnitude);                              /* exp(-|g|) in (0, 1] */
        vf sigmoid_of_magnitude = 1.0f / (1.0f + e);          /* sigmoid(|g|) */
        vf sigmoid = blend((vi)(g >= 0.0f), sigmoid_of_magnitude, e * sigmoid_of_magnitude);
        store_values(out, o_row + i, g * sigmoid * u, count, bf16);
    }
}

int silu_and_mul_f32(const float *gate, int64_t stride_gate, const float *up, int64_t stride_up, float *out,
                     int num_tokens, int size) {
#pragma omp parallel for if ((int64_t)num_tokens * size >= PARALLEL_MIN_ELEMENTS)
    for (int row = 0; row < num_tokens; row++) silu_and_mul_row(gate, stride_gate, up, stride_up, out, row, size, 0);
    return 0;
}

int silu_and_mul_bf16(const uint16_t *gate, int64_t stride_gate, const uint16_t *up, int64_t stride_up,
                      uint16_t *out, int num_tokens, int size) {
#pragma omp parallel for if ((int64_t)num_tokens * size >= PARALLEL_MIN_ELEMENTS)
    for (int row = 0; row < num_tokens; row++) silu_and_mul_row(gate, stride_gate, up, stride_up, out, row, size, 1);
    return 0;
}

static inline __attribute__((always_inline)) void rotate_heads(void *x, int64_t start, int64_t stride_head,
                                                               int num_heads, const float *cos, const float *sin,
                                                               int half, int bf16) {
    for (int head = 0; head < num_heads; head++) {
        int64_t first = start + head * stride_head, second = first + half;
#pragma omp simd
        for (int i = 0; i < half; i++) {
            float a = get_value(x, first + i, bf16), b = get_value(x, second + i, bf16);
            put_value(x, first + i, a * cos[i] - b * sin[i], bf16);
            put_value(x, second + i, b * cos[i] + a * sin[i], bf16);
        }
    }
}

/* Whether every token's position has a row of the cos/sin cache. */
static int positions_fit(const int64_t *positions, int num_tokens, int max_positions) {
    for (int t = 0; t < num_tokens; t++)
        if (positions[t] < 0 || positions[t] >= max_positions) return 0;
    return 1;
}

/* rotary_embedding_f32 and _bf16 rotate q [num_tokens, num_heads, head_dim] and k [num_tokens, num_kv_heads,
 * head_dim] in place (head_dim contiguous) by the rows positions[t] of the fp32 cos_sin [max_positions,
 * head_dim] = cat(cos, sin) halves, as the rotate_half form of Llama and Qwen does (each result rounded once in
 * bf16). They return -1, rotating nothing, when a position has no row. */
int rotary_embedding_f32(const int64_t *positions, float *q, int64_t stride_q_token, int64_t stride_q_head,
                         int num_heads, float *k, int64_t stride_k_token, int64_t stride_k_head, int num_kv_heads,
                         const float *cos_sin, int64_t stride_cache, int max_positions, int num_tokens,
                         int head_dim) {
    if (!positions_fit(positions, num_tokens, max_positions)) return -1;
    int half = head_dim / 2;
#pragma omp parallel for if ((int64_t)num_tokens * (num_heads + num_kv_heads) * head_dim >= PARALLEL_MIN_ELEMENTS)
    for (int t = 0; t < num_tokens; t++) {
        const float *cos = cos_sin + positions[t] * stride_cache, *sin = cos + half;
        rotate_heads(q, t * stride_q_token, stride_q_head, num_heads, cos, sin, half, 0);
        rotate_heads(k, t * stride_k_token, stride_k_head, num_kv_heads, cos, sin, half, 0);
    }
    return 0;
}

int rotary_embedding_bf16(const int64_t *positions, uint16_t *q, int64_t stride_q_token, int64_t stride_q_head,
                          int num_heads, uint16_t *k, int64_t stride_k_token, int64_t stride_k_head,
                          int num_kv_heads, const float *cos_sin, int64_t stride_cache, int max_positions,
                          int num_tokens, int head_dim) {
    if (!positions_fit(positions, num_tokens, max_positions)) return -1;
    int half = head_dim / 2;
#pragma omp parallel for if ((int64_t)num_tokens * (num_heads + num_kv_heads) * head_dim >= PARALLEL_MIN_ELEMENTS)
    for (int t = 0; t < num_tokens; t++) {
        const float *cos = cos_sin + positions[t] * stride_cache, *sin = cos + half;
        rotate_heads(q, t * stride_q_token, stride_q_head, num_heads, cos, sin, half, 1);
        rotate_heads(k, t * stride_k_token, stride_k_head, num_kv_heads, cos, sin, half, 1);
    }
    return 0;
}

/* Copies key[t] and value[t] ([num_kv_heads, head_dim], head_dim contiguous) into the contiguous caches'
 * slot slots[t], a row of num_kv_heads * head_dim values of `size` bytes each; tokens with a negative slot are
 * skipped. Returns -1, writing nothing, when a slot lies past the caches' num_slots rows. */
static inline int reshape_and_cache(const char *key, int64_t stride_key_token, int64_t stride_key_head,
                                    const char *value, int64_t stride_value_token, int64_t stride_value_head,
                                    char *k_cache, char *v_cache, const int64_t *slots, int64_t num_slots,
                                    int num_tokens, int num_kv_heads, int head_dim, int size) {
    for (int t = 0; t < num_tokens; t++)
        if (slots[t] >= num_slots) return -1;
    int64_t row = (int64_t)num_kv_heads * head_dim;
#pragma omp parallel for if ((int64_t)num_tokens * row >= PARALLEL_MIN_ELEMENTS)
    for (int t = 0; t < num_tokens; t++) {
        if (slots[t] < 0) continue;
        for (int head = 0; head < num_kv_heads; head++) {
            int64_t cached = (slots[t] * row + head * head_dim) * size;
            memcpy(k_cache + cached, key + (t * stride_key_token + head * stride_key_head) * size,
                   (size_t)size * head_dim);
            memcpy(v_cache + cached, value + (t * stride_value_token + head * stride_value_head) * size,
                   (size_t)size * head_dim);
        }
    }
    return 0;
}

int reshape_and_cache_f32(const float *key, int64_t stride_key_token, int64_t stride_key_head, const float *value,
                          int64_t stride_value_token, int64_t stride_value_head, float *k_cache, float *v_cache,
                          const int64_t *slots, int64_t num_slots, int num_tokens, int num_kv_heads, int head_dim) {
    return reshape_and_cache((const char *)key, stride_key_token, stride_key_head, (const char *)value,
                             stride_value_token, stride_value_head, (char *)k_cache, (char *)v_cache, slots,
                             num_slots, num_tokens, num_kv_heads, head_dim, sizeof(float));
}

int reshape_and_cache_bf16(const uint16_t *key, int64_t stride_key_token, int64_t stride_key_head,
                           const uint16_t *value, int64_t stride_value_token, int64_t stride_value_head,
                           uint16_t *k_cache, uint16_t *v_cache, const int64_t *slots, int64_t num_slots,
                           int num_tokens, int num_kv_heads, int head_dim) {
    return reshape_and_cache((const char *)key, stride_key_token, stride_key_head, (const char *)value,
                             stride_value_token, stride_value_head, (char *)k_cache, (char *)v_cache, slots,
                             num_slots, num_tokens, num_kv_heads, head_dim, sizeof(uint16_t));
}
