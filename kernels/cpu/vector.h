/* 16-float vectors in GCC/Clang vector extensions, which the compiler maps onto the machine's vector
 * registers, and the few operations on them the CPU kernels share. */
#ifndef PAGEDRL_VECTOR_H
#define PAGEDRL_VECTOR_H

#include <stdint.h>
#include <string.h>

typedef float v16 __attribute__((vector_size(64)));
typedef int32_t i16 __attribute__((vector_size(64)));

/* exp(x) of 16 values x <= 0 (or -inf), in vector arithmetic: n = floor(x / ln 2 + 1/2), r = x - n ln 2 in
 * two parts (Cody-Waite), exp(r) by its Taylor series to r^7 (relative error under 1e-8 for |r| <= ln(2) / 2),
 * times 2^n built in the exponent bits. Below -87 it gives 0. */
static inline v16 exp16(v16 x) {
    v16 t = x * 1.44269504088896341f + 0.5f;
    i16 n = __builtin_convertvector(t, i16);
    n += (i16)(__builtin_convertvector(n, v16) > t); /* truncation rounded negatives up: floor is one less */
    n += (-126 - n) & (i16)(n < -126);
    v16 nf = __builtin_convertvector(n, v16);
    v16 r = x - nf * 0.693145751953125f - nf * 1.42860682030941723e-6f;
    v16 p = r * (1.0f / 5040.0f) + 1.0f / 720.0f;
    p = p * r + 1.0f / 120.0f;
    p = p * r + 1.0f / 24.0f;
    p = p * r + 1.0f / 6.0f;
    p = p * r + 0.5f;
    p = p * r + 1.0f;
    p = p * r + 1.0f;
    v16 value = p * (v16)((n + 127) << 23);
    return (v16)((i16)value & (i16)(x >= -87.0f));
}

static inline v16 load16(const float *p) {
    v16 v;
    memcpy(&v, p, sizeof v); /* an unaligned load */
    return v;
}

static inline float sum16(v16 v) {
#if defined(__clang__) || __GNUC__ >= 12
    typedef float v8 __attribute__((vector_size(32)));
    typedef float v4 __attribute__((vector_size(16)));
    v8 h = __builtin_shufflevector(v, v, 0, 1, 2, 3, 4, 5, 6, 7) +
           __builtin_shufflevector(v, v, 8, 9, 10, 11, 12, 13, 14, 15);
    v4 f = __builtin_shufflevector(h, h, 0, 1, 2, 3) + __builtin_shufflevector(h, h, 4, 5, 6, 7);
    return (f[0] + f[2]) + (f[1] + f[3]);
#else
    float total = 0.0f;
    for (int i = 0; i < 16; i++) total += v[i];
    return total;
#endif
}

#endif
