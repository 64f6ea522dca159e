/* Vectors of the machine's width in GCC/Clang vector extensions, and the few operations on them the CPU kernels
 * share. A vector holds VLEN floats: 16 where the build targets AVX-512, else 8 (AVX2, and the 8-float vectors
 * that compilers split into the narrower registers of other targets). The width is chosen at build time from
 * the compiler's target macros (the libraries are built with -march=native): a 16-float vector on AVX2 is two
 * registers out of 16, and a kernel that keeps a dozen of them live spills to the stack (the decode attention ran
 * 4x slower built that way than with vectors of the machine's width). */
#ifndef PAGEDRL_VECTOR_H
#define PAGEDRL_VECTOR_H

#include <stdint.h>
#include <string.h>

#if defined(__AVX512F__)
#define VLEN 16
#else
#define VLEN 8
#endif

typedef float vf __attribute__((vector_size(4 * VLEN)));
typedef int32_t vi __attribute__((vector_size(4 * VLEN)));

#if VLEN == 16
#define LANES ((vi){0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15})
#else
#define LANES ((vi){0, 1, 2, 3, 4, 5, 6, 7})
#endif

#if defined(__clang__) || __GNUC__ >= 12
#define SHUFFLE2(a, b, ...) __builtin_shufflevector(a, b, __VA_ARGS__)
#else
#define SHUFFLE2(a, b, ...) __builtin_shuffle(a, b, (vi){__VA_ARGS__})
#endif

/* Lanes of a and b side by side (indices below VLEN are a's, from VLEN on b's), folded `width` lanes at a time:
 * the result holds the sums of a's lanes l and l + width (for l mod 2 width < width) in its first half and b's
 * in its second. Folding pairs of vectors at widths VLEN / 2, VLEN / 4, ..., 1, as a tree over VLEN vectors,
 * gives their VLEN lane totals in one vector with VLEN - 1 adds of two shuffles each. `width` must be a
 * constant at each call, as a fully unrolled loop leaves it. */
static inline vf fold(vf a, vf b, int width) {
    switch (width) {
#if VLEN == 16
    case 8:
        return SHUFFLE2(a, b, 0, 1, 2, 3, 4, 5, 6, 7, 16, 17, 18, 19, 20, 21, 22, 23) +
               SHUFFLE2(a, b, 8, 9, 10, 11, 12, 13, 14, 15, 24, 25, 26, 27, 28, 29, 30, 31);
    case 4:
        return SHUFFLE2(a, b, 0, 1, 2, 3, 8, 9, 10, 11, 16, 17, 18, 19, 24, 25, 26, 27) +
               SHUFFLE2(a, b, 4, 5, 6, 7, 12, 13, 14, 15, 20, 21, 22, 23, 28, 29, 30, 31);
    case 2:
        return SHUFFLE2(a, b, 0, 1, 4, 5, 8, 9, 12, 13, 16, 17, 20, 21, 24, 25, 28, 29) +
               SHUFFLE2(a, b, 2, 3, 6, 7, 10, 11, 14, 15, 18, 19, 22, 23, 26, 27, 30, 31);
    default:
        return SHUFFLE2(a, b, 0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30) +
               SHUFFLE2(a, b, 1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23, 25, 27, 29, 31);
#else
    case 4:
        return SHUFFLE2(a, b, 0, 1, 2, 3, 8, 9, 10, 11) + SHUFFLE2(a, b, 4, 5, 6, 7, 12, 13, 14, 15);
    case 2:
        return SHUFFLE2(a, b, 0, 1, 4, 5, 8, 9, 12, 13) + SHUFFLE2(a, b, 2, 3, 6, 7, 10, 11, 14, 15);
    default:
        return SHUFFLE2(a, b, 0, 2, 4, 6, 8, 10, 12, 14) + SHUFFLE2(a, b, 1, 3, 5, 7, 9, 11, 13, 15);
#endif
    }
}

/* exp(x) of VLEN values x <= 0 (or -inf), in vector arithmetic: n = floor(x / ln 2 + 1/2), r = x - n ln 2 in
 * two parts (Cody-Waite), exp(r) by its Taylor series to r^7 (relative error under 1e-8 for |r| <= ln(2) / 2),
 * times 2^n built in the exponent bits. Below -87 it gives 0. */
static inline vf expv(vf x) {
    vf t = x * 1.44269504088896341f + 0.5f;
    vi n = __builtin_convertvector(t, vi);
    n += (vi)(__builtin_convertvector(n, vf) > t); /* truncation rounded negatives up: floor is one less */
    n += (-126 - n) & (vi)(n < -126);
    vf nf = __builtin_convertvector(n, vf);
    vf r = x - nf * 0.693145751953125f - nf * 1.42860682030941723e-6f;
    vf p = r * (1.0f / 5040.0f) + 1.0f / 720.0f;
    p = p * r + 1.0f / 120.0f;
    p = p * r + 1.0f / 24.0f;
    p = p * r + 1.0f / 6.0f;
    p = p * r + 0.5f;
    p = p * r + 1.0f;
    p = p * r + 1.0f;
    vf value = p * (vf)((n + 127) << 23);
    return (vf)((vi)value & (vi)(x >= -87.0f));
}

static inline vf loadv(const float *p) {
    vf v;
    memcpy(&v, p, sizeof v); /* an unaligned load */
    return v;
}

typedef uint16_t vh __attribute__((vector_size(2 * VLEN)));
typedef uint32_t vu __attribute__((vector_size(4 * VLEN)));

/* VLEN bf16 values as floats: a bf16 is the upper half of the float it stands for, so widening is exact. */
static inline vf load_bf16(const uint16_t *p) {
    vh h;
    memcpy(&h, p, sizeof h);
    return (vf)(__builtin_convertvector(h, vu) << 16);
}

static inline float bf16_to_float(uint16_t h) {
    uint32_t bits = (uint32_t)h << 16;
    float f;
    memcpy(&f, &bits, sizeof f);
    return f;
}

/* The bf16 nearest to f, ties to even, as torch rounds (a NaN becomes torch's 0x7FC0). */
static inline uint16_t float_to_bf16(float f) {
    uint32_t bits;
    memcpy(&bits, &f, sizeof bits);
    uint32_t rounded = (bits + 0x7FFFu + ((bits >> 16) & 1u)) >> 16;
    return (uint16_t)((bits & 0x7FFFFFFFu) > 0x7F800000u ? 0x7FC0u : rounded);
}

/* float_to_bf16 of VLEN floats. */
static inline vh floats_to_bf16(vf v) {
    vu bits = (vu)v;
    vu rounded = (bits + 0x7FFFu + ((bits >> 16) & 1u)) >> 16;
    vu nan = (vu)((vi)(bits & 0x7FFFFFFFu) > 0x7F800000); /* a signed compare: AVX2 has no unsigned one */
    return __builtin_convertvector((rounded & ~nan) | (0x7FC0u & nan), vh);
}

/* Element i of an array of floats, or of bf16 values where `bf16` (a constant at each call), as a float. */
static inline float get_value(const void *p, int64_t i, int bf16) {
    return bf16 ? bf16_to_float(((const uint16_t *)p)[i]) : ((const float *)p)[i];
}

/* Stores v as element i of an array of floats, or of bf16 values (rounded) where `bf16`. */
static inline void put_value(void *p, int64_t i, float v, int bf16) {
    if (bf16) ((uint16_t *)p)[i] = float_to_bf16(v);
    else ((float *)p)[i] = v;
}

/* v as the array's element type stores it: rounded to bf16 and back where `bf16`, else v. */
static inline float stored_value(float v, int bf16) { return bf16 ? bf16_to_float(float_to_bf16(v)) : v; }

/* `count` (at most VLEN) elements from element i of an array of floats, or of bf16 values, as floats; the
 * lanes past count are 0. */
static inline vf load_values(const void *p, int64_t i, int count, int bf16) {
    if (count == VLEN) return bf16 ? load_bf16((const uint16_t *)p + i) : loadv((const float *)p + i);
    if (bf16) {
        vh h = {0};
        memcpy(&h, (const uint16_t *)p + i, sizeof(uint16_t) * count);
        return (vf)(__builtin_convertvector(h, vu) << 16);
    }
    vf v = {0};
    memcpy(&v, (const float *)p + i, sizeof(float) * count);
    return v;
}

/* Stores the first `count` (at most VLEN) lanes of v from element i, rounded to bf16 where `bf16`. */
static inline void store_values(void *p, int64_t i, vf v, int count, int bf16) {
    if (bf16) {
        vh h = floats_to_bf16(v);
        memcpy((uint16_t *)p + i, &h, count == VLEN ? sizeof h : sizeof(uint16_t) * count);
    } else {
        memcpy((float *)p + i, &v, count == VLEN ? sizeof v : sizeof(float) * count);
    }
}

/* v where `mask` lanes are set (all bits), else `other`. */
static inline vf blend(vi mask, vf v, vf other) { return (vf)(((vi)v & mask) | ((vi)other & ~mask)); }

/* v with lanes l and l ^ width exchanged (width a power of two below VLEN, constant at each call). */
static inline vf swap(vf v, int width) {
    switch (width) {
#if VLEN == 16
    case 8:
        return SHUFFLE2(v, v, 8, 9, 10, 11, 12, 13, 14, 15, 0, 1, 2, 3, 4, 5, 6, 7);
    case 4:
        return SHUFFLE2(v, v, 4, 5, 6, 7, 0, 1, 2, 3, 12, 13, 14, 15, 8, 9, 10, 11);
    case 2:
        return SHUFFLE2(v, v, 2, 3, 0, 1, 6, 7, 4, 5, 10, 11, 8, 9, 14, 15, 12, 13);
    default:
        return SHUFFLE2(v, v, 1, 0, 3, 2, 5, 4, 7, 6, 9, 8, 11, 10, 13, 12, 15, 14);
#else
    case 4:
        return SHUFFLE2(v, v, 4, 5, 6, 7, 0, 1, 2, 3);
    case 2:
        return SHUFFLE2(v, v, 2, 3, 0, 1, 6, 7, 4, 5);
    default:
        return SHUFFLE2(v, v, 1, 0, 3, 2, 5, 4, 7, 6);
#endif
    }
}

static inline float sumv(vf v) {
#pragma GCC unroll 4
    for (int width = VLEN / 2; width >= 1; width /= 2) v += swap(v, width);
    return v[0];
}

static inline float maxv(vf v) {
#pragma GCC unroll 4
    for (int width = VLEN / 2; width >= 1; width /= 2) {
        vf other = swap(v, width);
        v = blend((vi)(other > v), other, v);
    }
    return v[0];
}

#endif
