/* poslens's fused CPU kernels: loops that torch would run as several passes over memory, each done
 * here in one.
 *
 * - poslens_softmax_sums: a chunk of attention logits [n, H, c, nc]: the batch/head sum of the visible
 *   logits, the softmax in place and the per-head batch sums of the weights. The torch path reads
 *   the chunk once for the logit sum, once each way for the softmax and once for the head sums; here
 *   every row of nc logits is read once and written once, its passes running on a row in L1.
 * - poslens_causal_pair_dim_sum: per head dimension, the sum over causal pairs j <= i of q_i k_j.
 * - poslens_rising_pairs: the APS count of a self-similarity map (rising pairs below the diagonal).
 * - poslens_pair_counts: rising and tied pairs of rows (locality, diagonal trends of score maps).
 * - poslens_merge_pair_counts: the same counts of long rows by a merge sort, O(T log T) per row.
 * - poslens_diagonal_rows: the lower diagonals of a map as rows (diagonal normalisation, trends).
 * - poslens_diagonal_stats: each diagonal's count, sum, centred sum of squares and extremes, packed.
 * - poslens_unrotate_half: queries or keys rotated back by their RoPE angles (rotate-half layout).
 * - poslens_add_widened: a float32 map added into a float64 sum (its lower triangle alone, if asked).
 * - poslens_unit_rows: vectors' norms and the unit vectors, written sequence-major (cosine maps).
 *
 * Built at first use by poslens.native (GNU C99, -O3 -march=native -fopenmp-simd; no OpenMP
 * runtime, no fast-math: the exponential below is ours, in GCC/Clang vector types, and the other
 * reductions are vectorised by `omp simd` clauses). Loaded with ctypes, which releases the GIL during the call, so the caller may
 * run disjoint row ranges of one chunk on several threads.
 */
#include <stdint.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

/* exp(x) for x <= 0 (or -inf), VW lanes at a time, to about 1 ulp: x = n ln2 + r (Cody-Waite),
 * exp(r) by the Cephes polynomial on |r| <= ln2 / 2, times 2^n built from its exponent bits. Results
 * below the smallest normal float (x < -87.3) are 0 (the softmax weight of a logit 87 below the
 * row's maximum). Written with GCC/Clang vector types: the same loop in scalar C with an `omp simd`
 * reduction is left scalar by GCC 12 (its selects and the float64 sum defeat the vectoriser), which
 * made the exponential 2-3x slower than the rest of the pass. */
#define VW 8
typedef float vf __attribute__((vector_size(VW * 4)));
typedef int32_t vi __attribute__((vector_size(VW * 4)));
typedef float vf4 __attribute__((vector_size(16)));
typedef double vd4 __attribute__((vector_size(32)));
typedef int64_t vl4 __attribute__((vector_size(32)));

static inline vf splat(float a) {
    vf v;
    for (int i = 0; i < VW; i++) v[i] = a;
    return v;
}

static inline vi splat_int(int32_t a) {
    vi v;
    for (int i = 0; i < VW; i++) v[i] = a;
    return v;
}

static inline vf exp_nonpositive(vf x) {
    vi low = x < splat(-88.0f);
    x = (vf)(((vi)x & ~low) | ((vi)splat(-88.0f) & low));
    vf n = (x * splat(1.44269504088896341f) + splat(12582912.0f)) - splat(12582912.0f); /* round: 1.5 * 2^23 */
    vf r = x - n * splat(0.693359375f);
    r = r + n * splat(2.12194440e-4f);
    vf p = splat(1.9875691500e-4f);
    p = p * r + splat(1.3981999507e-3f);
    p = p * r + splat(8.3334519073e-3f);
    p = p * r + splat(4.1665795894e-2f);
    p = p * r + splat(1.6666665459e-1f);
    p = p * r + splat(5.0000001201e-1f);
    p = p * (r * r) + r + splat(1.0f);
    vi e = __builtin_convertvector(n, vi) + splat_int(127);
    vi bits = (e << 23) & (e > splat_int(0)); /* 2^n, or 0 below the normal range */
    return p * (vf)bits;
}

/* x[0 .. vis - 1] <- exp(x - m) (m: the row's maximum); returns their sum, added in float64 lanes (a
 * float32 sum of a few thousand terms over 8 lanes carried relative errors of 5e-6, 6x torch's
 * softmax). The last partial vector is padded with -inf, whose weight is 0. The float64 lanes are two
 * vectors of 4 (one AVX2 register each): GCC keeps a single vector of 8 doubles on the stack, which
 * makes the loop about twice as slow. */
static inline void add_widened4(vd4 *lo, vd4 *hi, vf e) {
    vf4 a, b;
    memcpy(&a, &e, sizeof a);
    memcpy(&b, (const char *)&e + sizeof a, sizeof b);
    *lo += __builtin_convertvector(a, vd4);
    *hi += __builtin_convertvector(b, vd4);
}

static inline double exp_row(float *restrict x, int64_t vis, float m) {
    vd4 lo = {0}, hi = {0};
    vf mv = splat(m);
    int64_t j = 0;
    for (; j + VW <= vis; j += VW) {
        vf v;
        memcpy(&v, x + j, sizeof v);
        vf e = exp_nonpositive(v - mv);
        memcpy(x + j, &e, sizeof e);
        add_widened4(&lo, &hi, e);
    }
    if (j < vis) {
        vf v = splat(-INFINITY);
        memcpy(&v, x + j, sizeof(float) * (size_t)(vis - j));
        vf e = exp_nonpositive(v - mv);
        memcpy(x + j, &e, sizeof(float) * (size_t)(vis - j));
        add_widened4(&lo, &hi, e);
    }
    vd4 t = lo + hi;
    return (t[0] + t[1]) + (t[2] + t[3]);
}

/* The maximum of x[0 .. vis - 1], the count of its non-finite entries (into *nonfinite), and, with
 * `with_sum` (a constant: each use is compiled without the branch), the entries added into sum. */
static inline float row_max(const float *restrict x, int64_t vis, float *restrict sum, int32_t *nonfinite,
                            const int with_sum) {
    float m = x[0];
    int32_t bad = 0;
    #pragma omp simd reduction(max:m) reduction(+:bad)
    for (int64_t j = 0; j < vis; j++) {
        float v = x[j];
        int32_t u;
        memcpy(&u, &v, sizeof u);
        bad += ((u & 0x7f800000) == 0x7f800000);
        if (with_sum) sum[j] += v;
        m = v > m ? v : m;
    }
    *nonfinite = bad;
    return m;
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
                int32_t nonfinite = 0;
                float m = sum ? row_max(x, vis, sum, &nonfinite, 1) : row_max(x, vis, NULL, &nonfinite, 0);
                if (nonfinite) {
                    bad += nonfinite;
                    continue;
                }
                float inv = (float)(1.0 / exp_row(x, vis, m));
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

/* Per dimension d, sum over i and j <= i of q[i, d] k[j, d] (= sum_i q[i, d] * cumsum(k)[i, d]), for
 * grouped queries q [B, Hk, g, S, D] and keys k [B, Hk, S, D], both float32 and contiguous, into
 * out [B, Hk, g, D] (float32). The running key sum and the products are accumulated in float64.
 * D <= 1024. Only the (sequence, key head) pairs bh0 .. bh1 - 1 (flattened), so that threads can
 * share a call. */
void poslens_causal_pair_dim_sum(const float *restrict q, const float *restrict k, int64_t B, int64_t Hk,
                                 int64_t g, int64_t S, int64_t D, float *restrict out, int64_t bh0, int64_t bh1) {
    double ck[1024], acc[1024];
    (void)B;
    for (int64_t bh = bh0; bh < bh1; bh++) {
        const float *kb = k + bh * S * D;
        const float *qb = q + bh * g * S * D;
        for (int64_t r = 0; r < g; r++) {
            memset(ck, 0, sizeof(double) * (size_t)D);
            memset(acc, 0, sizeof(double) * (size_t)D);
            const float *qr = qb + r * S * D;
            for (int64_t i = 0; i < S; i++) {
                #pragma omp simd
                for (int64_t d = 0; d < D; d++) {
                    ck[d] += (double)kb[i * D + d];
                    acc[d] += (double)qr[i * D + d] * ck[d];
                }
            }
            float *o = out + (bh * g + r) * D;
            for (int64_t d = 0; d < D; d++) o[d] = (float)acc[d];
        }
    }
}

/* For each of the N maps m [N, T, T] (float32, contiguous, finite below the diagonal): the number of
 * triples j < k < i with m[i, k] > m[i, j] (row i's keys before the diagonal; ties do not rise), into
 * counts [N]. Every pair compared directly, T^3 / 6 comparisons per map: 16 keys k at a time against
 * each earlier j, a key past the row's last one (k >= i) padded with -inf, which rises above nothing.
 * Maps n0 .. n1 - 1 only. */
void poslens_rising_pairs(const float *restrict m, int64_t N, int64_t T, int64_t *restrict counts, int64_t n0,
                          int64_t n1) {
    (void)N;
    for (int64_t n = n0; n < n1; n++) {
        const float *mn = m + n * T * T;
        int64_t total = 0;
        for (int64_t i = 2; i < T; i++) {
            const float *row = mn + i * T;
            for (int64_t k0 = 1; k0 < i; k0 += 16) {
                float vk[16];
                int32_t kidx[16], cnt[16];
                for (int l = 0; l < 16; l++) {
                    int64_t k = k0 + l;
                    vk[l] = k < i ? row[k] : -__builtin_inff();
                    kidx[l] = (int32_t)k;
                    cnt[l] = 0;
                }
                int64_t jmax = k0 + 15 < i - 1 ? k0 + 15 : i - 1; /* j < k <= min(k0 + 15, i - 1) */
                for (int64_t j = 0; j < jmax; j++) {
                    float vj = row[j];
                    int32_t jj = (int32_t)j;
                    #pragma omp simd
                    for (int l = 0; l < 16; l++) cnt[l] += (vk[l] > vj) & (jj < kidx[l]);
                }
                for (int l = 0; l < 16; l++) total += cnt[l];
            }
        }
        counts[n] = total;
    }
}

/* For each row n0 .. n1 - 1 of x [N, T] (float64, contiguous, no NaN): the pairs j < k with
 * x[k] > x[j] into gt[n] and the pairs with x[k] == x[j] (both above -inf) into eq[n]. Every pair
 * compared directly, PK keys k at a time against each earlier j. A key that is -inf becomes NaN in
 * its lane: it then rises above nothing and ties with nothing (a -inf key rises above nothing
 * anyway, and may tie only with another -inf, which does not count); a key past the row's end is NaN
 * too, and a row's trailing -inf entries are skipped. O(T^2) per row: the caller keeps T small.
 * Vectors of 4 doubles (one AVX2 register: GCC lowers wider double comparisons to scalar code). */
#define PK 16

void poslens_pair_counts(const double *restrict x, int64_t N, int64_t T, int64_t *restrict gt,
                         int64_t *restrict eq, int64_t n0, int64_t n1) {
    (void)N;
    const double ninf = -__builtin_inf();
    for (int64_t n = n0; n < n1; n++) {
        const double *row = x + n * T;
        int64_t last = T - 1;
        while (last >= 0 && row[last] == ninf) last--;
        vl4 g[PK / 4], e[PK / 4];
        for (int v = 0; v < PK / 4; v++) g[v] = e[v] = (vl4){0, 0, 0, 0};
        for (int64_t k0 = 1; k0 <= last; k0 += PK) {
            double kv[PK];
            int64_t ki[PK];
            for (int l = 0; l < PK; l++) {
                int64_t k = k0 + l;
                kv[l] = k <= last && row[k] != ninf ? row[k] : __builtin_nan("");
                ki[l] = k;
            }
            vd4 vk[PK / 4];
            vl4 kidx[PK / 4];
            memcpy(vk, kv, sizeof vk);
            memcpy(kidx, ki, sizeof kidx);
            for (int64_t j = 0; j < k0; j++) { /* j before every lane's key */
                double a = row[j];
                vd4 b = {a, a, a, a};
                for (int v = 0; v < PK / 4; v++) {
                    g[v] -= (vk[v] > b);
                    e[v] -= (vk[v] == b);
                }
            }
            int64_t jmax = k0 + PK - 1 < last ? k0 + PK - 1 : last;
            for (int64_t j = k0; j < jmax; j++) { /* j among the lanes' keys: only the later lanes */
                double a = row[j];
                vd4 b = {a, a, a, a};
                for (int v = 0; v < PK / 4; v++) {
                    vl4 after = kidx[v] > j;
                    g[v] -= (vk[v] > b) & after;
                    e[v] -= (vk[v] == b) & after;
                }
            }
        }
        int64_t gs = 0, es = 0;
        for (int v = 0; v < PK / 4; v++)
            for (int l = 0; l < 4; l++) {
                gs += g[v][l];
                es += e[v][l];
            }
        gt[n] = gs;
        eq[n] = es;
    }
}

/* poslens_pair_counts' counts (rising pairs x[k] > x[j], j < k, and tied pairs of entries above
 * -inf) of the rows n0 .. n1 - 1 of x [N, T] (float64, no NaN, -inf only as a suffix) by a bottom-up
 * merge sort of each row: when two sorted runs of adjacent positions merge, an entry of the right run
 * is taken before every left entry not above it, so the left entries taken before it are the ones it
 * rises above, and each pair j < k is counted once, at the merge that first joins them. The tied pairs
 * are those of equal values whatever their order: the runs of equal entries of the sorted row.
 * O(T log T) per row, branch-free merges, for rows too long for the all-pairs count. Returns -1 where
 * the scratch memory is refused. */
#define MB 8

int64_t poslens_merge_pair_counts(const double *restrict x, int64_t N, int64_t T, int64_t *restrict gt,
                                  int64_t *restrict eq, int64_t n0, int64_t n1) {
    (void)N;
    const double ninf = -__builtin_inf();
    double *a = malloc(sizeof(double) * (size_t)(T > 0 ? T : 1));
    double *b = malloc(sizeof(double) * (size_t)(T > 0 ? T : 1));
    if (!a || !b) {
        free(a);
        free(b);
        return -1;
    }
    for (int64_t n = n0; n < n1; n++) {
        const double *row = x + n * T;
        int64_t len = T;
        while (len > 0 && row[len - 1] == ninf) len--;
        memcpy(a, row, sizeof(double) * (size_t)len);
        int64_t g = 0, e = 0;
        double *src = a, *dst = b;
        for (int64_t lo = 0; lo < len; lo += MB) { /* runs of MB: their pairs compared, then an insertion sort */
            int64_t hi = lo + MB < len ? lo + MB : len;
            for (int64_t k = lo + 1; k < hi; k++)
                for (int64_t j = lo; j < k; j++) g += src[k] > src[j];
            for (int64_t k = lo + 1; k < hi; k++) {
                double v = src[k];
                int64_t j = k;
                while (j > lo && src[j - 1] > v) {
                    src[j] = src[j - 1];
                    j--;
                }
                src[j] = v;
            }
        }
        for (int64_t w = MB; w < len; w *= 2) {
            for (int64_t lo = 0; lo < len; lo += 2 * w) {
                int64_t mid = lo + w < len ? lo + w : len, hi = lo + 2 * w < len ? lo + 2 * w : len;
                int64_t i = lo, j = mid, o = lo;
                while (i < mid && j < hi) {
                    double l = src[i], r = src[j];
                    int64_t right = r <= l;
                    dst[o++] = right ? r : l;
                    g += right * (i - lo);
                    j += right;
                    i += 1 - right;
                }
                while (i < mid) dst[o++] = src[i++];
                g += (hi - j) * (mid - lo);
                while (j < hi) dst[o++] = src[j++];
            }
            double *t = src;
            src = dst;
            dst = t;
        }
        for (int64_t k = 1, run = 0; k < len; k++) {
            run = src[k] == src[k - 1] ? run + 1 : 0;
            e += run;
        }
        gt[n] = g;
        eq[n] = e;
    }
    free(a);
    free(b);
    return 0;
}

/* The lower diagonals of the maps m [B, S, S] (float64, contiguous) as rows: out [B, S - first, S] with
 * out[b, k - first, t] = m[b, t + k, t], NaN where t + k >= S. In tiles of DT x DT (diagonal, column)
 * pairs, whose reads (2 DT rows of DT columns of m) and writes (DT rows of DT entries) both stay in L1:
 * a diagonal read straight through touches a new cache line per entry. */
#define DT 32

void poslens_diagonal_rows(const double *restrict m, int64_t B, int64_t S, int64_t first, double *restrict out) {
    const double nan = __builtin_nan("");
    const int64_t R = S - first;
    for (int64_t b = 0; b < B; b++) {
        const double *mb = m + b * S * S;
        double *ob = out + b * R * S;
        for (int64_t r0 = 0; r0 < R; r0 += DT) {
            int64_t r1 = r0 + DT < R ? r0 + DT : R;
            for (int64_t t0 = 0; t0 < S; t0 += DT) {
                int64_t t1 = t0 + DT < S ? t0 + DT : S;
                for (int64_t r = r0; r < r1; r++) {
                    const int64_t k = r + first;
                    double *o = ob + r * S;
                    int64_t stop = S - k < t1 ? S - k : t1; /* t + k < S */
                    int64_t t = t0;
                    for (; t < stop; t++) o[t] = mb[(t + k) * S + t];
                    for (; t < t1; t++) o[t] = nan;
                }
            }
        }
    }
}

/* For each row r of D [R, S] (float64, contiguous: a map's diagonals as rows), over its entries that
 * count (finite, and in no column with excluded[t] != 0): out[r] = {count, sum, sum of squares about
 * the row's mean sum / max(count, 1), least, greatest} (least +inf and greatest -inf without an entry),
 * and the row packed in place: its counted entries in column order at the front, -inf after them (the
 * layout the pair counts read). seen[t] is set to 1 for every column t with a counted entry (left as
 * given elsewhere). Two passes over each row, both in cache. */
void poslens_diagonal_stats(double *restrict D, int64_t R, int64_t S, const uint8_t *restrict excluded,
                            double *restrict out, uint8_t *restrict seen) {
    const double inf = __builtin_inf();
    for (int64_t r = 0; r < R; r++) {
        double *row = D + r * S;
        int64_t n = 0;
        double sum = 0.0, lo = inf, hi = -inf;
        for (int64_t t = 0; t < S; t++) {
            double v = row[t];
            if (fabs(v) < inf && !excluded[t]) {
                sum += v;
                lo = v < lo ? v : lo;
                hi = v > hi ? v : hi;
                seen[t] = 1;
                row[n++] = v; /* n <= t: packing in place reads each entry before it is overwritten */
            }
        }
        for (int64_t t = n; t < S; t++) row[t] = -inf;
        double mean = sum / (double)(n > 0 ? n : 1), ss = 0.0;
        for (int64_t t = 0; t < n; t++) {
            double d = row[t] - mean;
            ss += d * d;
        }
        double *o = out + r * 5;
        o[0] = (double)n;
        o[1] = sum;
        o[2] = ss;
        o[3] = lo;
        o[4] = hi;
    }
}

/* x [B, H, S, D] (float32, contiguous) rotated back by RoPE's angles in the rotate-half layout, into
 * out (same shape): with the tables cos, sin [Bc, S, r] (Bc = 1 or B; already divided by
 * cos^2 + sin^2), out1 = x1 cos1 + x2 sin1 and out2 = x2 cos2 - x1 sin2 on the halves of the first r
 * dimensions; dimensions r .. D - 1 (partial rotary) pass through. The (sequence, head) pairs
 * bh0 .. bh1 - 1 (flattened) only. */
void poslens_unrotate_half(const float *restrict x, int64_t B, int64_t H, int64_t S, int64_t D, int64_t r,
                           const float *restrict cos, const float *restrict sin, int64_t Bc, float *restrict out,
                           int64_t bh0, int64_t bh1) {
    int64_t h2 = r / 2;
    (void)B;
    for (int64_t bh = bh0; bh < bh1; bh++) {
        int64_t b = bh / H, h = bh % H;
        const float *cb = cos + (Bc > 1 ? b : 0) * S * r;
        const float *sb = sin + (Bc > 1 ? b : 0) * S * r;
        {
            for (int64_t i = 0; i < S; i++) {
                const float *xi = x + ((b * H + h) * S + i) * D;
                float *oi = out + ((b * H + h) * S + i) * D;
                const float *c = cb + i * r, *s = sb + i * r;
                #pragma omp simd
                for (int64_t d = 0; d < h2; d++) {
                    oi[d] = xi[d] * c[d] + xi[h2 + d] * s[d];
                    oi[h2 + d] = xi[h2 + d] * c[h2 + d] - xi[d] * s[h2 + d];
                }
                for (int64_t d = r; d < D; d++) oi[d] = xi[d];
            }
        }
    }
}

/* dst += alpha * src for a float64 dst and a float32 src, both [R, C] and contiguous, in one pass:
 * rows i add columns j <= i alone with `lower` (a map whose upper triangle is zero or unread). Each
 * entry is one fused multiply-add of the widened value, as torch's add_(src, alpha=alpha) computes
 * it on the CPU, so the sums are the same bit for bit. Rows r0 .. r1 - 1 only. */
void poslens_add_widened(double *restrict dst, const float *restrict src, int64_t R, int64_t C, double alpha,
                         int32_t lower, int64_t r0, int64_t r1) {
    (void)R;
    for (int64_t i = r0; i < r1; i++) {
        int64_t n = lower ? (i + 1 < C ? i + 1 : C) : C;
        double *d = dst + i * C;
        const float *x = src + i * C;
        #pragma omp simd
        for (int64_t j = 0; j < n; j++) d[j] = __builtin_fma(alpha, (double)x[j], d[j]);
    }
}

/* For x [B, S, d] (float32; row (b, s) at x + b * sb + s * ss, its d values contiguous): norms[b, s]
 * = |x[b, s]| (sum of squares in float64) and out[s, b, :] = x[b, s] / max(norm, 1e-30) (float32,
 * the reciprocal taken in float32), one read of x. Positions s0 .. s1 - 1 only. */
void poslens_unit_rows(const float *restrict x, int64_t B, int64_t S, int64_t d, int64_t sb, int64_t ss,
                       float *restrict out, float *restrict norms, int64_t s0, int64_t s1) {
    for (int64_t s = s0; s < s1; s++) {
        for (int64_t b = 0; b < B; b++) {
            const float *row = x + b * sb + s * ss;
            double acc = 0.0;
            #pragma omp simd reduction(+:acc)
            for (int64_t j = 0; j < d; j++) acc += (double)row[j] * (double)row[j];
            float n = (float)__builtin_sqrt(acc);
            norms[b * S + s] = n;
            float inv = 1.0f / (n > 1e-30f ? n : 1e-30f);
            float *o = out + (s * B + b) * d;
            #pragma omp simd
            for (int64_t j = 0; j < d; j++) o[j] = row[j] * inv;
        }
    }
}
