/* Token sampling on CPU, fp32, for rows that sample from their whole temperature-scaled distribution (no
 * top-k or top-p): the token by inverting the CDF at a given uniform, and its logprob. The PyTorch reference
 * (rollout_engine/sampler.py) writes a softmax of the whole [rows, vocab] logits and then scans it; this reads
 * each row twice, once for its max and once for its exps summed per block of tokens, and writes nothing of
 * the vocabulary's size. Rows are split over OpenMP threads. */
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "vector.h"

#define CDF_BLOCK 1024   /* tokens per block sum, as the reference's _CDF_BLOCK */
#define MAX_BLOCKS 1024  /* a vocabulary of up to CDF_BLOCK * MAX_BLOCKS tokens: pagedrl_kernels/sampling.py's MAX_VOCAB */
#define PARALLEL_MIN_ELEMENTS 32768 /* below this, one thread is faster than waking the others */

/* Up to VLEN logits from p, the lanes past count -inf, which weighs 0 and never wins the max. */
static inline vf load_logits(const float *p, int count) {
    if (count == VLEN) return loadv(p);
    vf v = (vf){0} - INFINITY;
    memcpy(&v, p, sizeof(float) * count);
    return v;
}

/* logits / temperature, dividing as the reference does so both see the same scaled values. */
static inline vf scaled(vf v, float temperature) { return temperature == 1.0f ? v : v / temperature; }

/* exp(scaled - max) of tokens [start, start + count) of a row, count <= VLEN. */
static inline vf scaled_exps(const float *row, int start, int count, float temperature, float max) {
    return expv(scaled(load_logits(row + start, count), temperature) - max);
}

/* The largest logit of a row and the first index holding it (torch.argmax's choice): each lane keeps the
 * first index of its own maximum, then the lowest index among the lanes holding the row's maximum wins. */
static float row_max(const float *row, int vocab, int *argmax) {
    vf best = (vf){0} - INFINITY;
    vi best_index = {0}, index = LANES;
    for (int i = 0; i < vocab; i += VLEN, index += VLEN) {
        vf v = load_logits(row + i, vocab - i < VLEN ? vocab - i : VLEN);
        vi greater = v > best;
        best = blend(greater, v, best);
        best_index = (index & greater) | (best_index & ~greater);
    }
    float max = maxv(best);
    int first = vocab;
    for (int lane = 0; lane < VLEN; lane++)
        if (best[lane] == max && best_index[lane] < first) first = best_index[lane];
    *argmax = first;
    return max;
}

/* Of masses [count], the first whose cumulative sum, counted from *before, passes target, or the last one
 * with mass when rounding leaves target at or past their sum; *before becomes the cumulative mass before it.
 * A massless entry is never chosen while another has mass. */
static int first_past(const float *masses, int count, double target, double *before) {
    double cumulative = *before;
    int chosen = 0;
    for (int i = 0; i < count; i++) {
        if (masses[i] == 0.0f) continue;
        chosen = i;
        *before = cumulative;
        cumulative += masses[i];
        if (cumulative > target) break;
    }
    return chosen;
}

/* The token of one row whose CDF interval holds u x (the row's mass), and its logprob. A temperature of 0 is
 * greedy: the argmax, with the logprob at temperature 1. */
static void sample_row(const float *row, int vocab, float temperature, float u, int64_t *token, float *logprob) {
    int greedy = temperature == 0.0f, argmax;
    float t = greedy ? 1.0f : temperature;
    /* Division by a positive number is monotone, so max / t is exactly the largest scaled logit. */
    float max = row_max(row, vocab, &argmax) / t;
    int num_blocks = (vocab + CDF_BLOCK - 1) / CDF_BLOCK;
    float block_sums[MAX_BLOCKS];
    double total = 0.0;
    for (int b = 0; b < num_blocks; b++) {
        int end = (b + 1) * CDF_BLOCK < vocab ? (b + 1) * CDF_BLOCK : vocab;
        vf sums = {0};
        for (int i = b * CDF_BLOCK; i < end; i += VLEN) sums += scaled_exps(row, i, end - i < VLEN ? end - i : VLEN, t, max);
        block_sums[b] = sumv(sums);
        total += block_sums[b];
    }
    int chosen = argmax;
    if (!greedy) {
        /* The target's block, then the chunk of VLEN tokens inside it by the sums of the same exps recomputed,
         * then the token inside the chunk: three short scans instead of one over the block token by token. */
        double target = (double)u * total, before = 0.0;
        int start = first_past(block_sums, num_blocks, target, &before) * CDF_BLOCK;
        int end = start + CDF_BLOCK < vocab ? start + CDF_BLOCK : vocab, num_chunks = (end - start + VLEN - 1) / VLEN;
        float chunk_sums[CDF_BLOCK / VLEN];
        for (int c = 0; c < num_chunks; c++) {
            int i = start + VLEN * c;
            chunk_sums[c] = sumv(scaled_exps(row, i, end - i < VLEN ? end - i : VLEN, t, max));
        }
        start += VLEN * first_past(chunk_sums, num_chunks, target, &before);
        int count = end - start < VLEN ? end - start : VLEN;
        float exps[VLEN];
        vf e = scaled_exps(row, start, count, t, max);
        memcpy(exps, &e, sizeof e);
        chosen = start + first_past(exps, count, target, &before);
    }
    *token = chosen;
    *logprob = (float)(((double)(row[chosen] / t) - max) - log(total));
}

/* logits [rows, vocab], rows row_stride apart; temperatures and uniforms (in [0, 1], ignored for greedy rows)
 * [rows]. Writes tokens and logprobs [rows]. Every row needs a finite logit. Returns 0; -1 when vocab is not in
 * [1, CDF_BLOCK * MAX_BLOCKS] or a temperature is negative. */
int sample_rows_f32(const float *logits, int64_t row_stride, int rows, int vocab, const float *temperatures,
                    const float *uniforms, int64_t *tokens, float *logprobs) {
    if (vocab < 1 || vocab > CDF_BLOCK * MAX_BLOCKS) return -1;
    for (int r = 0; r < rows; r++)
        if (!(temperatures[r] >= 0.0f)) return -1;
#pragma omp parallel for if ((int64_t)rows * vocab >= PARALLEL_MIN_ELEMENTS)
    for (int r = 0; r < rows; r++)
        sample_row(logits + r * row_stride, vocab, temperatures[r], uniforms[r], tokens + r, logprobs + r);
    return 0;
}
