/* bench.c — timing inside C, so the tuner measures the kernels, not the Python call.
 *
 * Each call of the layer takes the next input of a rotating set (for decode: a
 * fresh token per call, so the router picks other experts and their weights come
 * from memory, not cache). */
#include <time.h>

#include "internal.h"

int colibri_bench_layers(colibri_layer *const *layers, int n_layers, const float *inputs,
                         int n_inputs, int n_tokens, float *out, int n_threads, int warmup,
                         double min_seconds, int max_samples, double *samples, int *n_samples) {
    cb_clear_error();
    if (n_samples) *n_samples = 0; /* nothing timed until the loop ends */
    if (!layers || !inputs || !out || !samples || !n_samples)
        return cb_fail(COLIBRI_ERR_INVALID,
                       "colibri_bench_layer: layer, inputs, out, samples and n_samples must not be NULL");
    if (n_layers < 1)
        return cb_fail(COLIBRI_ERR_INVALID, "colibri_bench_layers: n_layers must be >= 1, got %d",
                       n_layers);
    for (int l = 0; l < n_layers; ++l) {
        if (!layers[l])
            return cb_fail(COLIBRI_ERR_INVALID, "colibri_bench_layer: layer %d is NULL", l);
        if (layers[l]->hidden != layers[0]->hidden)
            return cb_fail(COLIBRI_ERR_INVALID, "colibri_bench_layers: layer %d has hidden size %d, "
                           "layer 0 has %d", l, layers[l]->hidden, layers[0]->hidden);
    }
    if (n_inputs < 1 || n_tokens < 1 || max_samples < 1 || warmup < 0)
        return cb_fail(COLIBRI_ERR_INVALID,
                       "colibri_bench_layer: n_inputs, n_tokens, max_samples must be >= 1 and warmup "
                       ">= 0, got %d, %d, %d, %d", n_inputs, n_tokens, max_samples, warmup);
    if (n_threads < 0 || n_threads > COLIBRI_MAX_THREADS)
        return cb_fail(COLIBRI_ERR_INVALID, "colibri_bench_layer: n_threads %d out of range [0, %d]",
                       n_threads, COLIBRI_MAX_THREADS);
    if (min_seconds != min_seconds)
        return cb_fail(COLIBRI_ERR_INVALID, "colibri_bench_layer: min_seconds is NaN");
    const size_t stride = (size_t)n_tokens * (size_t)layers[0]->hidden;
    int next = 0, layer = 0, st;
    for (int i = 0; i < warmup; ++i) {
        st = colibri_layer_forward(layers[layer], inputs + stride * (size_t)next, out, n_tokens,
                                   n_threads);
        if (st) return st;
        next = (next + 1) % n_inputs;
        layer = (layer + 1) % n_layers;
    }
    const double t_start = cb_now_s();
    int n = 0;
    while (n < max_samples) {
        const double t0 = cb_now_s();
        st = colibri_layer_forward(layers[layer], inputs + stride * (size_t)next, out, n_tokens,
                                   n_threads);
        const double t1 = cb_now_s();
        if (st) return st;
        samples[n++] = t1 - t0;
        next = (next + 1) % n_inputs;
        layer = (layer + 1) % n_layers;
        if (t1 - t_start >= min_seconds) break;
    }
    *n_samples = n;
    return COLIBRI_OK;
}

int colibri_bench_layer(colibri_layer *layer, const float *inputs, int n_inputs, int n_tokens,
                        float *out, int n_threads, int warmup, double min_seconds,
                        int max_samples, double *samples, int *n_samples) {
    colibri_layer *one[1] = {layer};
    return colibri_bench_layers(one, 1, inputs, n_inputs, n_tokens, out, n_threads, warmup,
                                min_seconds, max_samples, samples, n_samples);
}

int colibri_bench_route(const float *logits, int n_tokens, int n_experts,
                        const colibri_route_config *cfg, int32_t *idx, float *weights,
                        int warmup, double min_seconds, int max_samples, double *samples,
                        int *n_samples) {
    cb_clear_error();
    if (!samples || !n_samples) return cb_fail(COLIBRI_ERR_INVALID, "bench: NULL argument");
    if (max_samples < 1 || warmup < 0)
        return cb_fail(COLIBRI_ERR_INVALID, "bench: max_samples must be >= 1, warmup >= 0");
    int st;
    for (int i = 0; i < warmup; ++i)
        if ((st = colibri_route(logits, n_tokens, n_experts, cfg, idx, weights, NULL))) return st;
    const double t_start = cb_now_s();
    int n = 0;
    while (n < max_samples) {
        const double t0 = cb_now_s();
        st = colibri_route(logits, n_tokens, n_experts, cfg, idx, weights, NULL);
        const double t1 = cb_now_s();
        if (st) return st;
        samples[n++] = t1 - t0;
        if (t1 - t_start >= min_seconds) break;
    }
    *n_samples = n;
    return COLIBRI_OK;
}
