/* One pass over a chunk of attention logits on the CPU: the batch/head sum of the visible logits,
 * the softmax in place, and the per-head batch sums of the weights.
 *
 * The capture's torch path reads a chunk of logits [n, H, c, nc] from memory several times: once for
 * the logit sum, once each way for the softmax, once for the per-head weight sums. Here every row of
 * nc logits is read once and written once; its passes run on a row that stays in the L1 cache.
 *
 * Built at first use by poslens.capture.native (C99, -O3 -march=native -fopenmp-simd; no OpenMP
 * runtime, no fast-math: the exponential below is ours and the reductions are vectorised by
 * `omp simd` clauses). Loaded with ctypes, which releases the GIL during the call, so the caller may
 * run disjoint row ranges of one chunk on several threads.
 */
#include <stdint.h>
#include <string.h>

/* exp(x) for finite x <= 0, to about 1 ulp: x = n ln2 + r (Cody-Waite), exp(r) by the Cephes
 * polynomial on |r| <= ln2 / 2, times 2^n built from its exponent bits. Results below the smallest
 * normal float (x < -87.3) are 0 (the softmax weight of a logit 87 below the row's maximum). */
static inline float exp_nonpositive(float x) {
    x = x < -88.0f ? -88.0f : x;
    float t = x * 1.44269504088896341f;
    float n = (t + 12582912.0f) - 12582912.0f; /* round to nearest: 1.5 * 2^23 */
    float r = x - n * 0.693359375f;
    r = r + n * 2.12194440e-4f;
    float p = 1.9875691500e-4f;
    p = p * r + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    p = p * (r * r) + r + 1.0f;
    int32_t e = (int32_t)n + 127;
    int32_t bits = e > 0 ? e << 23 : 0; /* 2^n, or 0 below the normal range */
    float scale;
    memcpy(&scale, &bits, sizeof scale);
    return p * scale;
}

/* Rows r0 .. r1 - 1 of one chunk. logits: [n, H, c, nc] float32, contiguous; row r of the chunk is
 * query position start + r; with `causal` it sees keys j <= start + r (the rest of its nc keys are
 * masked), else all nc.
 *
 * - logit_sum (or NULL): [c, nc], rows r0 .. r1 - 1 written: the sum over the n x H rows of the
 *   visible logits, 0 where masked.
 * - the logits become the softmax weights in place, 0 where masked.
 * - head_sum (or NULL): head h's row r at head_sum + h * hs_h + r * hs_r (nc floats): the sum over
 *   the n sequences of the weights; written, or added to when `accumulate`.
 *
 * Returns the number of visible logits that are not finite (NaN, +-inf); when it is not 0 the
 * outputs are not meaningful and the caller takes its checked path instead.
 */
int64_t poslens_softmax_sums(float *restrict logits, int64_t n, int64_t H, int64_t c, int64_t nc, int64_t start,
                             int32_t causal, int64_t r0, int64_t r1, float *restrict logit_sum, float *restrict head_sum,
                             int64_t hs_h, int64_t hs_r, int32_t accumulate) {
    int64_t bad = 0;
    for (int64_t r = r0; r < r1; r++) {
        int64_t vis = causal ? start + r + 1 : nc;
        if (vis > nc) vis = nc;
        float *restrict sum = logit_sum ? logit_sum + r * nc : NULL;
        if (sum) memset(sum, 0, sizeof(float) * (size_t)nc);
        for (int64_t h = 0; h < H; h++) {
            float *restrict hrow = head_sum ? head_sum + h * hs_h + r * hs_r : NULL;
            for (int64_t b = 0; b < n; b++) {
                float *restrict x = logits + ((b * H + h) * c + r) * nc;
                float m = x[0];
                int32_t nonfinite = 0;
                if (sum) {
                    #pragma omp simd reduction(max:m) reduction(+:nonfinite)
                    for (int64_t j = 0; j < vis; j++) {
                        float v = x[j];
                        int32_t u;
                        memcpy(&u, &v, sizeof u);
                        nonfinite += ((u & 0x7f800000) == 0x7f800000);
                        sum[j] += v;
                        m = v > m ? v : m;
                    }
                } else {
                    #pragma omp simd reduction(max:m) reduction(+:nonfinite)
                    for (int64_t j = 0; j < vis; j++) {
                        float v = x[j];
                        int32_t u;
                        memcpy(&u, &v, sizeof u);
                        nonfinite += ((u & 0x7f800000) == 0x7f800000);
                        m = v > m ? v : m;
                    }
                }
                if (nonfinite) {
                    bad += nonfinite;
                    continue;
                }
                float s = 0.0f;
                #pragma omp simd reduction(+:s)
                for (int64_t j = 0; j < vis; j++) {
                    float e = exp_nonpositive(x[j] - m);
                    x[j] = e;
                    s += e;
                }
                float inv = 1.0f / s;
                if (hrow && (b > 0 || accumulate)) {
                    #pragma omp simd
                    for (int64_t j = 0; j < vis; j++) {
                        float p = x[j] * inv;
                        x[j] = p;
                        hrow[j] += p;
                    }
                } else if (hrow) {
                    #pragma omp simd
                    for (int64_t j = 0; j < vis; j++) {
                        float p = x[j] * inv;
                        x[j] = p;
                        hrow[j] = p;
                    }
                    if (vis < nc) memset(hrow + vis, 0, sizeof(float) * (size_t)(nc - vis));
                } else {
                    #pragma omp simd
                    for (int64_t j = 0; j < vis; j++) x[j] *= inv;
                }
                if (vis < nc) memset(x + vis, 0, sizeof(float) * (size_t)(nc - vis));
            }
        }
    }
    return bad;
}
