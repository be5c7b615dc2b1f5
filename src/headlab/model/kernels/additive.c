/* Bahdanau scores s_ij = sum_d w_d tanh(q_id + k_jd) and their gradients, one (batch, head) slice per task.
 *
 * The (n, m, d_k) hidden tensor is never stored: each tanh is computed in registers and folded into its sums,
 * once in the forward pass and once in the backward pass. Keys arrive transposed, (d_k, m), so that the inner
 * loop runs over keys: contiguous, vectorised by the compiler, with no horizontal sums.
 * Shapes: BH batch x heads, n queries, m keys, D = d_k; q (BH, n, D), kt (BH, D, m), w (H, D), s (BH, n, m).
 * Built and loaded by headlab/kernels/__init__.py.
 */
#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

/* tanh as a 13/6 rational function on [-7.9, 7.9] (Eigen's float tanh): within 2e-7 of tanhf, branch-free. */
static inline float tanh_rational(float x) {
    x = x < -7.90531110763549805f ? -7.90531110763549805f : x;
    x = x > 7.90531110763549805f ? 7.90531110763549805f : x;
    const float x2 = x * x;
    float p = x2 * -2.76076847742355e-16f + 2.00018790482477e-13f;
    p = p * x2 + -8.60467152213735e-11f;
    p = p * x2 + 5.12229709037114e-08f;
    p = p * x2 + 1.48572235717979e-05f;
    p = p * x2 + 6.37261928875436e-04f;
    p = p * x2 + 4.89352455891786e-03f;
    float q = x2 * 1.19825839466702e-06f + 1.18534705686654e-04f;
    q = q * x2 + 2.26843463243900e-03f;
    q = q * x2 + 4.89352518554385e-03f;
    return x * p / q;
}

#define SATURATED 10.0f /* |x| >= 10: tanh(x) is +-1 to within 5e-9 */
#define EXP_RANGE 17.0f /* |k'| <= R < 17 and |q'| <= R + 10: e^{2q'} e^{2k'} < e^{88}, finite (1/inf would not be) */

/* tanh(q + k) = 1 - 2 r with r = 1 / (e^{2q} e^{2k} + 1): one multiply, one add and one reciprocal per (i, j, d),
 * the exponentials computed once per query and once per key (n + m per dimension, not n m). To keep both factors
 * finite, k_jd + q_id = k'_jd + q'_id with k' = k + c_d centred on 0 (|k'| <= R_d), and q' = q - c_d clamped to
 * +-(R_d + 10), beyond which q' + k' has q's sign and |q' + k'| >= 10 whatever k is. Dimensions whose keys spread
 * wider than 2 EXP_RANGE take tanh_rational (rational[d] = 1). Absolute error of t: about 1e-7 either way. */
typedef struct {
    float *eq, *ek; /* e^{2q'} (n, D), e^{2k'} (D, m) */
    char *rational; /* (D,) */
} Factors;

static int factors_init(Factors *f, const float *q, const float *kt, long n, long m, long D) {
    f->eq = malloc(sizeof(float) * (n * D + D * m));
    f->rational = malloc(D);
    if (!f->eq || !f->rational) return 0;
    f->ek = f->eq + n * D;
    for (long d = 0; d < D; d++) {
        const float *kd = kt + d * m;
        float lo = kd[0], hi = kd[0];
        for (long j = 1; j < m; j++) {
            lo = kd[j] < lo ? kd[j] : lo;
            hi = kd[j] > hi ? kd[j] : hi;
        }
        const float c = -0.5f * (lo + hi), limit = 0.5f * (hi - lo) + SATURATED;
        f->rational[d] = !(limit < EXP_RANGE + SATURATED);
        for (long j = 0; j < m; j++) f->ek[d * m + j] = expf(2.0f * (kd[j] + c));
        for (long i = 0; i < n; i++) {
            float x = q[i * D + d] - c;
            x = x < -limit ? -limit : (x > limit ? limit : x);
            f->eq[i * D + d] = expf(2.0f * x);
        }
    }
    return 1;
}

static void factors_free(Factors *f) {
    free(f->eq);
    free(f->rational);
}

typedef struct {
    const float *q, *kt, *w, *grad;
    float *s, *grad_q, *grad_kt, *grad_w;
    long bh_count, heads, n, m, d;
    int failed; /* set when scratch memory could not be had */
} Args;

/* s[i, :] = sum_d w_d tanh(q_id + kt[d, :]) for one (batch, head) slice. */
static void scores_slice(Args *a, long bh) {
    const long n = a->n, m = a->m, D = a->d;
    const float *q = a->q + bh * n * D, *kt = a->kt + bh * D * m, *w = a->w + (bh % a->heads) * D;
    float *s = a->s + bh * n * m;
    Factors f;
    if (!factors_init(&f, q, kt, n, m, D)) {
        a->failed = 1;
        factors_free(&f);
        return;
    }
    float base = 0.0f; /* sum of w_d over the dimensions in exponential form: their 1 in 1 - 2 r */
    for (long d = 0; d < D; d++) base += f.rational[d] ? 0.0f : w[d];
    for (long i = 0; i < n; i++) {
        float *row = s + i * m;
        for (long j = 0; j < m; j++) row[j] = base;
        for (long d = 0; d < D; d++) {
            if (f.rational[d]) {
                const float qd = q[i * D + d], wd = w[d], *kd = kt + d * m;
                for (long j = 0; j < m; j++) row[j] += wd * tanh_rational(qd + kd[j]);
            } else {
                const float a_id = f.eq[i * D + d], minus_2w = -2.0f * w[d], *e = f.ek + d * m;
                for (long j = 0; j < m; j++) row[j] += minus_2w / (a_id * e[j] + 1.0f);
            }
        }
    }
    factors_free(&f);
}

/* With t = tanh(q_id + k_jd) and g = grad_ij:
 * grad_q_id = w_d sum_j g (1 - t^2), grad_k_jd = w_d sum_i g (1 - t^2), grad_w[bh, d] = sum_ij g t;
 * in exponential form 1 - t^2 = 4 (r - r^2) and g t = g - 2 g r. */
static void grads_slice(Args *a, long bh) {
    const long n = a->n, m = a->m, D = a->d;
    const float *q = a->q + bh * n * D, *kt = a->kt + bh * D * m, *w = a->w + (bh % a->heads) * D;
    const float *g = a->grad + bh * n * m;
    float *gq = a->grad_q + bh * n * D, *gkt = a->grad_kt + bh * D * m, *gw = a->grad_w + bh * D;
    Factors f;
    if (!factors_init(&f, q, kt, n, m, D)) {
        a->failed = 1;
        factors_free(&f);
        return;
    }
    memset(gkt, 0, sizeof(float) * D * m);
    memset(gw, 0, sizeof(float) * D);
    for (long i = 0; i < n; i++) {
        const float *gi = g + i * m;
        float g_sum = 0.0f;
        for (long j = 0; j < m; j++) g_sum += gi[j];
        for (long d = 0; d < D; d++) {
            float *gkd = gkt + d * m, sum_q = 0.0f, sum_w = 0.0f;
            if (f.rational[d]) {
                const float qd = q[i * D + d], *kd = kt + d * m;
                for (long j = 0; j < m; j++) {
                    const float t = tanh_rational(qd + kd[j]), u = gi[j] * (1.0f - t * t);
                    sum_q += u;
                    sum_w += gi[j] * t;
                    gkd[j] += u;
                }
                gq[i * D + d] = w[d] * sum_q;
                gw[d] += sum_w;
            } else {
                const float a_id = f.eq[i * D + d], *e = f.ek + d * m;
                for (long j = 0; j < m; j++) {
                    const float r = 1.0f / (a_id * e[j] + 1.0f), gr = gi[j] * r, u = gr - gr * r;
                    sum_q += u;
                    sum_w += gr;
                    gkd[j] += u;
                }
                gq[i * D + d] = 4.0f * w[d] * sum_q;
                gw[d] += g_sum - 2.0f * sum_w;
            }
        }
    }
    for (long d = 0; d < D; d++) {
        const float scale = f.rational[d] ? w[d] : 4.0f * w[d];
        for (long j = 0; j < m; j++) gkt[d * m + j] *= scale;
    }
    factors_free(&f);
}

typedef struct {
    Args *args;
    void (*slice)(Args *, long);
    long first, last;
} Task;

static void *run_task(void *p) {
    const Task *t = p;
    for (long bh = t->first; bh < t->last; bh++) t->slice(t->args, bh);
    return NULL;
}

/* Split the slices over up to 64 threads; the caller's thread takes the first share. */
static int run(Args *a, void (*slice)(Args *, long), long threads) {
    if (a->bh_count < 1 || a->n < 1 || a->m < 1) return 1; /* empty outputs: nothing to compute */
    if (threads < 1) threads = 1;
    if (threads > 64) threads = 64;
    if (threads > a->bh_count) threads = a->bh_count;
    pthread_t ids[64];
    Task tasks[64];
    long started = 0;
    for (long t = 0; t < threads; t++) {
        tasks[t] = (Task){a, slice, a->bh_count * t / threads, a->bh_count * (t + 1) / threads};
        if (t > 0 && pthread_create(&ids[t], NULL, run_task, &tasks[t]) == 0) started |= 1L << t;
    }
    run_task(&tasks[0]);
    for (long t = 1; t < threads; t++) {
        if (started & (1L << t)) pthread_join(ids[t], NULL);
        else run_task(&tasks[t]);  /* no thread to be had: do its share here */
    }
    return !a->failed;
}

/* Both return 1, or 0 when scratch memory ran out (the outputs are then incomplete). */
int additive_scores(const float *q, const float *kt, const float *w, float *s, long bh_count, long heads, long n,
                     long m, long d, long threads) {
    Args a = {.q = q, .kt = kt, .w = w, .s = s, .bh_count = bh_count, .heads = heads, .n = n, .m = m, .d = d};
    return run(&a, scores_slice, threads);
}

int additive_grads(const float *q, const float *kt, const float *w, const float *grad, float *grad_q,
                    float *grad_kt, float *grad_w, long bh_count, long heads, long n, long m, long d, long threads) {
    Args a = {.q = q, .kt = kt, .w = w, .grad = grad, .grad_q = grad_q, .grad_kt = grad_kt,
                    .grad_w = grad_w, .bh_count = bh_count, .heads = heads, .n = n, .m = m, .d = d};
    return run(&a, grads_slice, threads);
}
