/* headlab's CPU dropout (headlab/model/dropout.py) in one pass over memory each way, on one thread.
 *
 * bits: four 15-bit uniforms per 64-bit draw of torch's generator, read as uint16 and masked to 15 bits; an
 * element is kept when its uniform >= threshold. Forward: keep[i] = kept, y[i] = x[i] * keep[i] * scale, in that
 * order and in float, which is exactly what the torch ops compute (x * 1 * scale, x * 0 * scale), so both paths
 * give the same bits. Apply (the backward pass): out[i] = g[i] * keep[i] * scale. Built without fast math: no
 * reassociation, NaN and infinity behave as in torch. Built and loaded by headlab/model/kernels/__init__.py.
 */
#include <stdint.h>

void dropout_forward(const uint16_t *restrict bits, const float *restrict x, float *restrict y,
                     uint8_t *restrict keep, long n, long threshold, float scale) {
    const int t = (int)threshold; /* an int compare: the loop vectorises */
    for (long i = 0; i < n; i++) {
        const int k = (int)(bits[i] & 0x7fff) >= t;
        keep[i] = (uint8_t)k;
        y[i] = x[i] * (float)k * scale;
    }
}

void dropout_apply(const float *restrict g, const uint8_t *restrict keep, float *restrict out, long n, float scale) {
    for (long i = 0; i < n; i++) out[i] = g[i] * (float)keep[i] * scale;
}
