/*
 * Fused CPU kernels behind goblin_assets.opscope.sketches (loaded with ctypes by
 * goblin_assets/opscope/ckernel.py; no Python C API).
 *
 * The torch path of sketch_vector reads a float32 activation four times
 * (per-channel min, per-channel max, sum, per-row l2 norm) and runs about a
 * hundred small ops for the sampled sketches.  goblin_rows_f32 does the exact
 * tier in one pass (per-channel min/max, per-row sum and sum of squares),
 * goblin_finish_f32 everything else (shape sample, row pairs, sample, the
 * packing into the float64 output vector in the order of sketches.STATS).
 * Same definitions as the torch path; sums are reassociated (vectorised), so
 * values agree to float32 rounding, not bit for bit (pinned by
 * tests/test_opscope_ckernel.py).
 *
 * Non-finite input is data (sketches.py, module docstring): the min/max passes
 * below skip a NaN, so when the total sum or sum of squares is not finite
 * goblin_finish_f32 reads the tensor once more (nonfinite_pass) to count NaN,
 * +inf and -inf and to mark the channels holding a NaN, and then gives the same
 * values as the torch path (NaN min/max/chan_maxabs/chan_outlier, NaN hist
 * bins).  A finite sum proves every element finite: the counts are then zero
 * at no cost.
 *
 * Compiled by setuptools at install time (pyproject.toml ext-modules) with
 * -O3 -fno-math-errno -fno-trapping-math -fassociative-math -fno-signed-zeros
 * -ffp-contract=off: reassociation vectorises the sums; no contraction keeps the
 * histogram's bin arithmetic identical to torch's float64 ops.  On x86-64 with
 * GCC the hot loops are also built for AVX2 and chosen at load time
 * (target_clones).
 */
#include <float.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define GOBLIN_CLONES __attribute__((target_clones("avx2", "default")))
#else
#define GOBLIN_CLONES
#endif

#define HIST_BINS 32
#define EPS 1e-12

/* Bits of the `want` mask, in the order of sketches.STATS. */
enum {
    S_MIN = 1 << 0, S_MAX = 1 << 1, S_MEAN = 1 << 2, S_L1 = 1 << 3, S_SUMSQ = 1 << 4, S_NNZ = 1 << 5,
    S_KURT = 1 << 6, S_CHOUT = 1 << 7, S_HIST = 1 << 8, S_CHAN = 1 << 9, S_POS = 1 << 10,
    S_ADJ = 1 << 11, S_FAR = 1 << 12, S_SAMPLE = 1 << 13, S_NONFIN = 1 << 14
};

/* Interface version, checked by ckernel.py: a library built from an older source (other `want` bits,
 * other outputs) is not used.  2: the nonfinite statistic. */
int64_t goblin_sketch_abi(void)
{
    return 2;
}

/*
 * Rows [r0, r1) of a contiguous (R, C) float32 matrix x, in one pass:
 * lo[j], hi[j] = min, max of x[r0:r1, j] (C,); rsum[i], rsq[i] = sum and sum of
 * squares of row i (indexed by absolute row, so blocks can run on threads).
 * Requires r1 > r0.
 */
GOBLIN_CLONES
void goblin_rows_f32(const float *restrict x, int64_t C, int64_t r0, int64_t r1,
                     float *restrict lo, float *restrict hi, float *restrict rsum, float *restrict rsq)
{
    const float *restrict first = x + r0 * C;
    for (int64_t j = 0; j < C; j++) {
        lo[j] = first[j];
        hi[j] = first[j];
    }
    for (int64_t i = r0; i < r1; i++) {
        const float *restrict row = x + i * C;
        float s = 0.f, q = 0.f;
        for (int64_t j = 0; j < C; j++) {
            float v = row[j];
            lo[j] = v < lo[j] ? v : lo[j];
            hi[j] = v > hi[j] ? v : hi[j];
            s += v;
            q += v * v;
        }
        rsum[i] = s;
        rsq[i] = q;
    }
}

/* Eight float lanes (GCC/Clang vector extensions: ymm under AVX2, two xmm otherwise). */
typedef float v8f __attribute__((vector_size(32)));
typedef int32_t v8i __attribute__((vector_size(32)));

/* lanes of a where m is set, else of b (m from a vector comparison: all ones or zero); a macro, since
 * a function passing 32-byte vectors draws GCC's -Wpsabi note on builds without AVX */
#define VSEL(m, a, b) ((v8f)(((v8i)(a) & (m)) | ((v8i)(b) & ~(m))))

/* min and max of a contiguous run r[0:n] (n >= 1) into *mn, *mx; NaN is skipped as in goblin_rows_f32. */
static inline void run_minmax(const float *restrict r, int64_t n, float *mn, float *mx)
{
    v8f lo, hi;
    for (int l = 0; l < 8; l++) lo[l] = hi[l] = r[0];
    int64_t k = 0;
    for (; k + 8 <= n; k += 8) {
        v8f v;
        memcpy(&v, r + k, sizeof v);
        lo = VSEL(v < lo, v, lo);
        hi = VSEL(v > hi, v, hi);
    }
    float a = r[0], b = r[0];
    for (; k < n; k++) {
        a = r[k] < a ? r[k] : a;
        b = r[k] > b ? r[k] : b;
    }
    for (int l = 0; l < 8; l++) {
        a = lo[l] < a ? lo[l] : a;
        b = hi[l] > b ? hi[l] : b;
    }
    *mn = a;
    *mx = b;
}

/*
 * The same exact tier when the channel axis is not the last in memory: x is a
 * contiguous (A, C, N) block (attention's K^T: the view's channel, the key
 * position, is the middle axis), for a in [a0, a1).  lo[j], hi[j] = min, max of
 * x[a0:a1, j, :] (C,); the rows are the (a, n) pairs: rsum[a * N + n],
 * rsq[a * N + n] = sum and sum of squares over j.  Requires a1 > a0, N >= 1.
 */
GOBLIN_CLONES
void goblin_rows_mid_f32(const float *restrict x, int64_t C, int64_t N, int64_t a0, int64_t a1,
                         float *restrict lo, float *restrict hi, float *restrict rsum, float *restrict rsq)
{
    for (int64_t a = a0; a < a1; a++) {
        float *restrict s = rsum + a * N, *restrict q = rsq + a * N;
        for (int64_t n = 0; n < N; n++) s[n] = q[n] = 0.f;
        for (int64_t j = 0; j < C; j++) {
            const float *restrict row = x + (a * C + j) * N;
            for (int64_t n = 0; n < N; n++) {
                float v = row[n];
                s[n] += v;
                q[n] += v * v;
            }
            float mn, mx;
            run_minmax(row, N, &mn, &mx);
            if (a == a0) {
                lo[j] = mn;
                hi[j] = mx;
            } else {
                lo[j] = mn < lo[j] ? mn : lo[j];
                hi[j] = mx > hi[j] ? mx : hi[j];
            }
        }
    }
}

/* sum over j < C of (b[j cs] - a[j cs])^2, float32 accumulation (as torch's vector_norm of the difference). */
GOBLIN_CLONES
static float sqdiff(const float *restrict a, const float *restrict b, int64_t C, int64_t cs)
{
    float q = 0.f;
    if (cs == 1) {
        for (int64_t j = 0; j < C; j++) {
            float d = b[j] - a[j];
            q += d * d;
        }
    } else {
        for (int64_t j = 0; j < C; j++) {
            float d = b[j * cs] - a[j * cs];
            q += d * d;
        }
    }
    return q;
}

/*
 * The slow path of non-finite input: x is a dense (A, C, N) block with A * N = R
 * rows (N = cs: 1 for a contiguous (R, C) matrix), channel j of element
 * (a, j, n).  Counts NaN, +inf and -inf into counts[0..2] and sets lo[j] and
 * hi[j] to NaN for every channel holding a NaN (the min/max passes skip NaN;
 * torch's amin/amax propagate it).
 */
static void nonfinite_pass(const float *restrict x, int64_t R, int64_t C, int64_t N,
                           float *restrict lo, float *restrict hi, double *restrict counts)
{
    int64_t nan = 0, pinf = 0, ninf = 0;
    const int64_t A = R / N;
    for (int64_t a = 0; a < A; a++)
        for (int64_t j = 0; j < C; j++) {
            const float *restrict row = x + (a * C + j) * N;
            int64_t cn = 0;
            for (int64_t n = 0; n < N; n++) {
                float v = row[n];
                cn += isnan(v) != 0;
                pinf += v == INFINITY;
                ninf += v == -INFINITY;
            }
            if (cn) {
                lo[j] = hi[j] = NAN;
                nan += cn;
            }
        }
    counts[0] = (double)nan;
    counts[1] = (double)pinf;
    counts[2] = (double)ninf;
}

/*
 * Every requested sketch of x (R rows of C float32 channels; channel j of a row
 * at row start + j * cs) from its exact tier (lo, hi (C,); rsum, rsq (R,), rows
 * in memory order), written to out (float64) in the order of sketches.STATS,
 * only the stats whose bit is set in `want`.  Addresses are element offsets
 * from x, precomputed by the caller for the row order of the tensor's view:
 *
 *   rep (n_rep,)             indices into rsq of the reported rows (pos_sumsq);
 *   adj, adj2 (n_adj,)       row starts of the pairs (r, r + 1) (adj_sumsq);
 *   far, far2 (n_far,)       row starts of the pairs (r, r + lag) (far_sumsq, their mean);
 *   ss_off (ss_count,)       the shape sample's elements (l1 and nnz scaled by
 *                            R C / ss_count, kurtosis, hist); NULL: k * ss_stride;
 *   pos (n_pos,)             the `sample` elements.
 *
 * ys: scratch for the gathered shape sample, ss_count doubles (the caller's,
 * reused across calls: an allocation per call would page-fault).  x must be
 * the dense (R / cs, C, cs) block the exact tier was read from (the caller's
 * plan guarantees it); lo and hi are rewritten for channels holding a NaN.
 * Returns the number of values written.
 */
int64_t goblin_finish_f32(const float *restrict x, int64_t R, int64_t C, int64_t cs,
                          float *restrict lo, float *restrict hi,
                          const float *restrict rsum, const float *restrict rsq,
                          const int64_t *restrict rep, int64_t n_rep,
                          const int64_t *restrict adj, const int64_t *restrict adj2, int64_t n_adj,
                          const int64_t *restrict far, const int64_t *restrict far2, int64_t n_far,
                          const int64_t *restrict ss_off, int64_t ss_stride, int64_t ss_count,
                          const int64_t *restrict pos, int64_t n_pos, int64_t want, double *restrict ys,
                          double *restrict out)
{
    const double numel = (double)R * (double)C;
    double total = 0.0, sumsq = 0.0;
    for (int64_t i = 0; i < R; i++) {
        total += rsum[i];
        sumsq += rsq[i];
    }
    double counts[3] = {0.0, 0.0, 0.0};
    if (!isfinite(total) || !isfinite(sumsq))   /* a NaN or inf, or finite values whose squares overflow */
        nonfinite_pass(x, R, C, cs, lo, hi, counts);
    const int has_nan = counts[0] > 0.0, has_inf = counts[1] > 0.0 || counts[2] > 0.0;
    float mn = lo[0], mx = hi[0], cmax = 0.f;
    double csum = 0.0;
    for (int64_t j = 0; j < C; j++) {
        float c = hi[j] > -lo[j] ? hi[j] : -lo[j];
        mn = lo[j] < mn ? lo[j] : mn;
        mx = hi[j] > mx ? hi[j] : mx;
        cmax = c > cmax ? c : cmax;
        csum += c;
    }
    if (has_nan)    /* the comparisons above skip NaN; torch's amin/amax propagate it */
        mn = mx = cmax = NAN;

    /* the shape sample (l1, nnz, kurtosis, hist), gathered once: its strided reads miss the cache */
    double l1 = 0.0, nnz = 0.0, ysum = 0.0;
    const double scale = numel / (double)ss_count;
    if (ss_off)
        for (int64_t k = 0; k < ss_count; k++) ys[k] = (double)x[ss_off[k]];
    else
        for (int64_t k = 0; k < ss_count; k++) ys[k] = (double)x[k * ss_stride];
    for (int64_t k = 0; k < ss_count; k++) {
        l1 += fabs(ys[k]);
        nnz += (ys[k] != 0.0);
        ysum += ys[k];
    }
    double kurt = 0.0;
    if (want & S_KURT) {
        const double ymean = ysum / (double)ss_count;
        double m2 = 0.0, m4 = 0.0;
        for (int64_t k = 0; k < ss_count; k++) {
            double d = ys[k] - ymean;
            double d2 = d * d;
            m2 += d2;
            m4 += d2 * d2;
        }
        m2 /= (double)ss_count;
        m4 /= (double)ss_count;
        double den = m2 * m2;
        kurt = m4 / (den > DBL_MIN ? den : DBL_MIN);
    }

    double *o = out;
    if (want & S_MIN) *o++ = (double)mn;
    if (want & S_MAX) *o++ = (double)mx;
    if (want & S_MEAN) *o++ = total / numel;
    if (want & S_L1) *o++ = l1 * scale;
    if (want & S_SUMSQ) *o++ = sumsq;
    if (want & S_NNZ) *o++ = nnz * scale;
    if (want & S_KURT) *o++ = kurt;
    if (want & S_CHOUT) {
        double cmean = csum / (double)C;
        *o++ = has_nan ? NAN : (double)cmax / (cmean > EPS ? cmean : EPS);   /* inf: inf / inf = NaN */
    }
    if ((want & S_HIST) && (has_nan || has_inf)) {   /* max|x| is not finite: no scale, every bin NaN */
        for (int b = 0; b < HIST_BINS; b++)
            *o++ = NAN;
    } else if (want & S_HIST) {
        int64_t counts[HIST_BINS] = {0};
        const double bscale = (HIST_BINS / 2) / ((double)cmax + EPS);
        for (int64_t k = 0; k < ss_count; k++) {
            int64_t b = (int64_t)(ys[k] * bscale + HIST_BINS / 2);
            b = b < 0 ? 0 : (b > HIST_BINS - 1 ? HIST_BINS - 1 : b);
            counts[b]++;
        }
        for (int b = 0; b < HIST_BINS; b++)
            *o++ = (double)counts[b] / (double)ss_count;
    }
    if (want & S_CHAN)
        for (int64_t j = 0; j < C; j++)
            *o++ = (double)(hi[j] > -lo[j] ? hi[j] : -lo[j]);
    if (want & S_POS)
        for (int64_t i = 0; i < n_rep; i++)
            *o++ = (double)rsq[rep[i]];
    if (want & S_ADJ)
        for (int64_t i = 0; i < n_adj; i++)
            *o++ = (double)sqdiff(x + adj[i], x + adj2[i], C, cs);
    if (want & S_FAR) {
        double acc = 0.0;
        for (int64_t i = 0; i < n_far; i++)
            acc += (double)sqdiff(x + far[i], x + far2[i], C, cs);
        *o++ = n_far ? acc / (double)n_far : 0.0;
    }
    if (want & S_SAMPLE)
        for (int64_t i = 0; i < n_pos; i++)
            *o++ = (double)x[pos[i]];
    if (want & S_NONFIN)
        for (int k = 0; k < 3; k++)
            *o++ = counts[k];
    return (int64_t)(o - out);
}

/*
 * Attention-concentration sketches of softmax probabilities p, contiguous
 * (G, Q, K) float32 (softmax over K; G = leading axes such as batch x heads):
 * out[q] = mean over g of max_k p[g, q, k] (peak_prob, Q values), then
 * out[Q + k] = mean over g of sum_q p[g, q, k] (key_mass, K values).
 * work: K floats.  Returns Q + K, or -1 when p holds a non-finite value.
 */
GOBLIN_CLONES
int64_t goblin_probs_f32(const float *restrict p, int64_t G, int64_t Q, int64_t K,
                         float *restrict work, double *restrict out)
{
    double *peak = out, *mass = out + Q;
    for (int64_t q = 0; q < Q; q++) peak[q] = 0.0;
    for (int64_t k = 0; k < K; k++) mass[k] = 0.0;
    double total = 0.0;
    for (int64_t g = 0; g < G; g++) {
        for (int64_t k = 0; k < K; k++) work[k] = 0.f;
        for (int64_t q = 0; q < Q; q++) {
            const float *restrict row = p + (g * Q + q) * K;
            for (int64_t k = 0; k < K; k++)
                work[k] += row[k];
            float mn, mx;
            run_minmax(row, K, &mn, &mx);
            peak[q] += (double)mx;
        }
        for (int64_t k = 0; k < K; k++) {
            mass[k] += (double)work[k];
            total += (double)work[k];
        }
    }
    if (!isfinite(total))
        return -1;
    for (int64_t q = 0; q < Q; q++) peak[q] /= (double)G;
    for (int64_t k = 0; k < K; k++) mass[k] /= (double)G;
    return Q + K;
}
