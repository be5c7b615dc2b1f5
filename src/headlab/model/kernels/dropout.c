/* headlab's CPU dropout (headlab/model/dropout.py) in one pass over memory each way.
 *
 * bits: four 15-bit uniforms per 64-bit draw of torch's generator, read as uint16 and masked to 15 bits; an
 * element is kept when its uniform >= threshold. Forward: keep[i] = kept, y[i] = x[i] * keep[i] * scale, in that
 * order and in float, which is exactly what the torch ops compute (x * 1 * scale, x * 0 * scale), so both paths
 * give the same bits. Apply (the backward pass): out[i] = g[i] * keep[i] * scale. Built without fast math: no reassociation, NaN
 * and infinity behave as in torch. Long tensors are split over threads.
 * Built and loaded by headlab/model/kernels/__init__.py.
 */
#include <pthread.h>
#include <stdint.h>

typedef struct {
    const uint16_t *bits;
    const float *x; /* the input: x, or the incoming gradient */
    float *y;
    uint8_t *keep; /* written by the forward pass, read by apply */
    long first, last, threshold;
    float scale;
} Span;

static void *forward_span(void *p) {
    const Span *s = p;
    const uint16_t *restrict bits = s->bits;
    const float *restrict x = s->x;
    float *restrict y = s->y;
    uint8_t *restrict keep = s->keep;
    const int threshold = (int)s->threshold; /* an int compare: the loop vectorises */
    const float scale = s->scale;
    /* bounds in locals: a byte store may alias *s, which would keep the loop from vectorising */
    const long first = s->first, last = s->last;
    for (long i = first; i < last; i++) {
        const int k = (int)(bits[i] & 0x7fff) >= threshold;
        keep[i] = (uint8_t)k;
        y[i] = x[i] * (float)k * scale;
    }
    return NULL;
}

static void *apply_span(void *p) {
    const Span *s = p;
    const float *restrict g = s->x;
    const uint8_t *restrict keep = s->keep;
    float *restrict out = s->y;
    const float scale = s->scale;
    const long first = s->first, last = s->last;
    for (long i = first; i < last; i++) out[i] = g[i] * (float)keep[i] * scale;
    return NULL;
}

#define PER_THREAD (1L << 18) /* elements a thread is worth starting for */

/* Run fn over [0, n) in up to `threads` spans (at most 64); the caller's thread takes the first. */
static void parallel(void *(*fn)(void *), Span whole, long n, long threads) {
    if (threads > n / PER_THREAD) threads = n / PER_THREAD;
    if (threads > 64) threads = 64;
    if (threads < 1) threads = 1;
    pthread_t ids[64];
    Span spans[64];
    int started[64] = {0};
    for (long t = 0; t < threads; t++) {
        spans[t] = whole;
        spans[t].first = n * t / threads;
        spans[t].last = n * (t + 1) / threads;
        if (t > 0) started[t] = pthread_create(&ids[t], NULL, fn, &spans[t]) == 0;
    }
    fn(&spans[0]);
    for (long t = 1; t < threads; t++) {
        if (started[t]) pthread_join(ids[t], NULL);
        else fn(&spans[t]); /* no thread to be had: do its share here */
    }
}

void dropout_forward(const uint16_t *bits, const float *x, float *y, uint8_t *keep, long n, long threshold,
                     float scale, long threads) {
    parallel(forward_span, (Span){.bits = bits, .x = x, .y = y, .keep = keep, .threshold = threshold,
                                  .scale = scale}, n, threads);
}

void dropout_apply(const float *g, const uint8_t *keep, float *out, long n, float scale, long threads) {
    parallel(apply_span, (Span){.x = g, .y = out, .keep = (uint8_t *)keep, .scale = scale}, n, threads);
}
