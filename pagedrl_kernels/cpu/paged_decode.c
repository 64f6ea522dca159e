/* Paged decode attention on CPU, in fp32 over an fp32 or a bf16 cache (each bf16 value widened to the float it
 * stands for as it is loaded): each sequence's one query token attends to its cached tokens, read in place
 * through its block table. The PyTorch reference copies every sequence's K/V out of the cache
 * before attending; this reads each cached row once, where it lies.
 *
 * A work item is (sequence, KV head): the query heads of that KV head (its GQA group) share every K/V row
 * it loads. Tokens are taken a tile (one vector's worth, VLEN) at a time into an online softmax, and the next
 * tile's rows are prefetched while one is computed: the rows of a sequence's blocks lie apart in the pool, so
 * the hardware prefetcher cannot see them coming, and the kernel spends most of its time waiting on memory.
 */
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "vector.h"

#define MAX_GROUP 64 /* query heads per KV head */
#define MAX_HEAD_DIM 256 /* a multiple of 16, up to this */
#define MAX_CHUNKS (MAX_HEAD_DIM / VLEN)
#define TILE VLEN /* cached tokens per online-softmax step: one vector of scores */
#define LOG2_TILE (TILE == 16 ? 4 : 3)

/* Chunk c (VLEN values) of a cached row of floats, or of bf16 values when `bf16` (a constant at each call, so
 * each kernel keeps one kind of load). */
static inline vf load_kv(const char *row, int c, int bf16) {
    return bf16 ? load_bf16((const uint16_t *)row + VLEN * c) : loadv((const float *)row + VLEN * c);
}

/* The tile's rows of one KV head (token_bytes apart), asked of the memory system ahead of their use. */
static inline void prefetch_rows(const char *k, const char *v, int count, int64_t token_bytes, int row_bytes) {
    for (int t = 0; t < count; t++)
        for (int line = 0; line < row_bytes; line += 64) { /* one 64-byte cache line */
            __builtin_prefetch(k + t * token_bytes + line);
            __builtin_prefetch(v + t * token_bytes + line);
        }
}

/* The tile at `position` of a sequence: how many tokens it has (up to TILE, within one block and before
 * context_len), and in *offset where its first row lies from cache token 0. */
static inline int tile_at(const int32_t *table, int position, int context_len, int block_size, int64_t block_stride,
                          int64_t token_stride, int64_t *offset) {
    int count = block_size - position % block_size;
    count = count < context_len - position ? count : context_len - position;
    *offset = (int64_t)table[position / block_size] * block_stride + (position % block_size) * token_stride;
    return count < TILE ? count : TILE;
}

/* The `group` query heads of one KV head (rows of q, q_head_stride apart) over the first context_len cached
 * tokens of one sequence; k_cache and v_cache point at that KV head's row of cache token 0, of bf16 values where
 * `bf16`, else of floats (strides count values). head_dim is a multiple of 16 and at most MAX_HEAD_DIM; callers
 * pass it, and bf16, as constants where they can, so the loops over its chunks unroll. */
static inline __attribute__((always_inline)) void attend_kv_head(
    const float *q, int64_t q_head_stride, const char *k_cache, const char *v_cache, const int32_t *table,
    int context_len, int64_t cache_block_stride, int64_t cache_token_stride, int group, int head_dim,
    int block_size, float scale, float *out, int bf16) {
    const int chunks = head_dim / VLEN, size = bf16 ? 2 : 4;
    const int64_t token_bytes = cache_token_stride * size;
    vf qs[MAX_GROUP][MAX_CHUNKS], acc[MAX_GROUP][MAX_CHUNKS];
    float row_max[MAX_GROUP], row_sum[MAX_GROUP];
    for (int g = 0; g < group; g++) {
        for (int c = 0; c < chunks; c++) {
            qs[g][c] = loadv(q + g * q_head_stride + VLEN * c) * scale;
            acc[g][c] = (vf){0};
        }
        row_max[g] = -INFINITY;
        row_sum[g] = 0.0f;
    }
    for (int position = 0; position < context_len;) {
        int64_t offset, next_offset;
        int count = tile_at(table, position, context_len, block_size, cache_block_stride, cache_token_stride,
                            &offset);
        const char *k_tile = k_cache + offset * size, *v_tile = v_cache + offset * size;
        if (position + count < context_len) {
            int next_count = tile_at(table, position + count, context_len, block_size, cache_block_stride,
                                     cache_token_stride, &next_offset);
            prefetch_rows(k_cache + next_offset * size, v_cache + next_offset * size, next_count, token_bytes,
                          head_dim * size);
        }
        for (int g = 0; g < group; g++) {
            /* Each token's products with q, folded into one vector of scores as they come (see fold), so that
             * few vectors stay live: folded[l] holds the last 2^l tokens' partial sums until its partner. */
            vf folded[LOG2_TILE], tile = {0};
#pragma GCC unroll 16
            for (int t = 0; t < TILE; t++) {
                vf partial = {0}, odd = {0}; /* two chains of FMAs, not one */
                if (t < count) {
                    const char *k = k_tile + t * token_bytes;
                    for (int c = 0; c < chunks; c++) {
                        if (c % 2) odd += qs[g][c] * load_kv(k, c, bf16);
                        else partial += qs[g][c] * load_kv(k, c, bf16);
                    }
                    partial += odd;
                }
#pragma GCC unroll 4
                for (int level = 0, width = TILE / 2; level < LOG2_TILE; level++, width /= 2) {
                    if (!((t >> level) & 1)) {
                        folded[level] = partial;
                        break;
                    }
                    partial = fold(folded[level], partial, width);
                    if (width == 1) tile = partial;
                }
            }
            tile = blend((vi)(LANES < count), tile, (vf){0} - INFINITY); /* tokens past count weigh 0 */
            float tile_max = maxv(tile);
            vf a[MAX_CHUNKS];
            for (int c = 0; c < chunks; c++) a[c] = acc[g][c];
            if (tile_max > row_max[g]) { /* a new max rescales what came before (to 0 on the first tile) */
                float alpha = expv((vf){0} + (row_max[g] - tile_max))[0];
                row_sum[g] *= alpha;
                for (int c = 0; c < chunks; c++) a[c] *= alpha;
                row_max[g] = tile_max;
            }
            tile = expv(tile - row_max[g]);
            float weights[TILE];
            memcpy(weights, &tile, sizeof tile);
            row_sum[g] += sumv(tile);
            for (int t = 0; t < count; t++) {
                const char *v = v_tile + t * token_bytes;
                for (int c = 0; c < chunks; c++) a[c] += weights[t] * load_kv(v, c, bf16);
            }
            for (int c = 0; c < chunks; c++) acc[g][c] = a[c];
        }
        position += count;
    }
    for (int g = 0; g < group; g++) {
        float *o = out + g * head_dim;
        if (row_sum[g] == 0.0f) { /* no context: the output is zeros */
            memset(o, 0, sizeof(float) * head_dim);
            continue;
        }
        float inv = 1.0f / row_sum[g];
        for (int c = 0; c < chunks; c++) {
            vf value = acc[g][c] * inv;
            memcpy(o + VLEN * c, &value, sizeof value);
        }
    }
}

/* 0 when the kernel takes these shapes and every block table entry a context needs is a block of the cache; -1
 * when head_dim is not a multiple of 16 within the compiled limit or a KV head has more than MAX_GROUP query
 * heads; -2 for a table entry outside the cache. */
static int check_args(const int32_t *block_tables, int64_t table_stride, const int32_t *context_lens, int num_seqs,
                      int num_heads, int num_kv_heads, int head_dim, int block_size, int num_blocks) {
    if (head_dim % 16 || head_dim > MAX_HEAD_DIM || num_heads / num_kv_heads > MAX_GROUP) return -1;
    for (int s = 0; s < num_seqs; s++)
        for (int b = 0; b < (context_lens[s] + block_size - 1) / block_size; b++)
            if (block_tables[s * table_stride + b] < 0 || block_tables[s * table_stride + b] >= num_blocks) return -2;
    return 0;
}

/* Work item `item` = (sequence, KV head) of paged_decode_f32 / _bf16, whose arguments it takes. */
static inline __attribute__((always_inline)) void decode_item(
    int64_t item, const float *q, int64_t q_seq_stride, int64_t q_head_stride, const void *k_cache,
    const void *v_cache, const int32_t *block_tables, int64_t table_stride, const int32_t *context_lens, float *out,
    int num_heads, int num_kv_heads, int head_dim, int block_size, float scale, int bf16) {
    int group = num_heads / num_kv_heads;
    int64_t token_stride = (int64_t)num_kv_heads * head_dim;
    int64_t block_stride = token_stride * block_size;
    int s = (int)(item / num_kv_heads), kv_head = (int)(item % num_kv_heads), head = kv_head * group;
    const float *qs = q + s * q_seq_stride + head * q_head_stride;
    const int32_t *table = block_tables + s * table_stride;
    float *os = out + ((int64_t)s * num_heads + head) * head_dim;
    int64_t head_bytes = (int64_t)kv_head * head_dim * (bf16 ? 2 : 4);
    const char *ks = (const char *)k_cache + head_bytes, *vs = (const char *)v_cache + head_bytes;
    switch (head_dim) { /* the common head sizes as constants */
#define ATTEND(dim)                                                                                            \
    case dim:                                                                                                  \
        attend_kv_head(qs, q_head_stride, ks, vs, table, context_lens[s], block_stride, token_stride, group, dim, \
                       block_size, scale, os, bf16);                                                           \
        break;
        ATTEND(64) ATTEND(128) ATTEND(96) ATTEND(80) ATTEND(256) ATTEND(32)
#undef ATTEND
    default:
        attend_kv_head(qs, q_head_stride, ks, vs, table, context_lens[s], block_stride, token_stride, group,
                       head_dim, block_size, scale, os, bf16);
    }
}

/* q [num_seqs, num_heads, head_dim] (head_dim contiguous); k_cache, v_cache [num_blocks, block_size,
 * num_kv_heads, head_dim] contiguous, of floats (paged_decode_f32) or of bf16 values (paged_decode_bf16, uint16
 * bit patterns); block_tables [num_seqs, table_stride] int32; context_lens [num_seqs] int32. Writes out
 * [num_seqs, num_heads, head_dim] fp32, contiguous. Returns check_args's status, 0 when it ran. Each has its own
 * parallel loop, so that `bf16` stays a constant in the function OpenMP moves the loop's body into. */
int paged_decode_f32(const float *q, int64_t q_seq_stride, int64_t q_head_stride, const float *k_cache,
                     const float *v_cache, const int32_t *block_tables, int64_t table_stride,
                     const int32_t *context_lens, float *out, int num_seqs, int num_heads, int num_kv_heads,
                     int head_dim, int block_size, int num_blocks, float scale) {
    int status = check_args(block_tables, table_stride, context_lens, num_seqs, num_heads, num_kv_heads, head_dim,
                            block_size, num_blocks);
    if (status) return status;
#pragma omp parallel for schedule(dynamic, 4)
    for (int64_t item = 0; item < (int64_t)num_seqs * num_kv_heads; item++)
        decode_item(item, q, q_seq_stride, q_head_stride, k_cache, v_cache, block_tables, table_stride, context_lens,
                    out, num_heads, num_kv_heads, head_dim, block_size, scale, 0);
    return 0;
}

int paged_decode_bf16(const float *q, int64_t q_seq_stride, int64_t q_head_stride, const uint16_t *k_cache,
                      const uint16_t *v_cache, const int32_t *block_tables, int64_t table_stride,
                      const int32_t *context_lens, float *out, int num_seqs, int num_heads, int num_kv_heads,
                      int head_dim, int block_size, int num_blocks, float scale) {
    int status = check_args(block_tables, table_stride, context_lens, num_seqs, num_heads, num_kv_heads, head_dim,
                            block_size, num_blocks);
    if (status) return status;
#pragma omp parallel for schedule(dynamic, 4)
    for (int64_t item = 0; item < (int64_t)num_seqs * num_kv_heads; item++)
        decode_item(item, q, q_seq_stride, q_head_stride, k_cache, v_cache, block_tables, table_stride, context_lens,
                    out, num_heads, num_kv_heads, head_dim, block_size, scale, 1);
    return 0;
}
