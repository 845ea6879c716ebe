/* route.c — expert routing: scores, top-k or dynamic-count selection, weights.
 *
 * Ties are broken toward the lower expert index (a scan in index order that only
 * a strictly larger score displaces). NaN logits are never chosen; a row of
 * only NaN gets no expert (count 0). Infinite logits give finite weights: the
 * +Inf experts share the mass equally (and -Inf ones get 0), as the softmax's
 * limit does, instead of the NaN that exp(inf - inf) would give. */
#include <math.h>
#include <stdlib.h>

#include "internal.h"

int colibri_route_slots(const colibri_route_config *cfg) {
    if (!cfg) return cb_fail(COLIBRI_ERR_INVALID, "colibri_route_slots: route config is NULL"), 0;
    return cfg->dyn_p > 0.0f ? cfg->k_max : cfg->top_k;
}

int cb_route_config_check(const colibri_route_config *cfg, int n_experts) {
    if (!cfg) return cb_fail(COLIBRI_ERR_INVALID, "route config is NULL");
    if (n_experts < 1 || n_experts > COLIBRI_MAX_EXPERTS)
        return cb_fail(COLIBRI_ERR_INVALID, "n_experts %d out of range [1, %d]", n_experts,
                       COLIBRI_MAX_EXPERTS);
    if (cfg->scoring != COLIBRI_SCORING_SOFTMAX && cfg->scoring != COLIBRI_SCORING_SOFTMAX_TOPK)
        return cb_fail(COLIBRI_ERR_INVALID, "scoring %d is not 0 (softmax) or 1 (softmax_topk)",
                       cfg->scoring);
    if (!(cfg->dyn_p >= 0.0f && cfg->dyn_p <= 1.0f))
        return cb_fail(COLIBRI_ERR_INVALID, "dyn_p %g out of range [0, 1]", (double)cfg->dyn_p);
    if (cfg->dyn_p > 0.0f) {
        if (cfg->k_min < 1 || cfg->k_min > cfg->k_max || cfg->k_max > n_experts)
            return cb_fail(COLIBRI_ERR_INVALID,
                           "dynamic routing needs 1 <= k_min <= k_max <= n_experts, got %d, %d, %d",
                           cfg->k_min, cfg->k_max, n_experts);
    } else if (cfg->top_k < 1 || cfg->top_k > n_experts) {
        return cb_fail(COLIBRI_ERR_INVALID, "top_k %d out of range [1, n_experts=%d]", cfg->top_k,
                       n_experts);
    }
    return COLIBRI_OK;
}

/* exp(v - mx) where v <= mx, with equal infinities counted as a difference of 0. */
static double exp_shifted(float v, float mx) {
    return v == mx ? 1.0 : exp((double)v - (double)mx);
}

/* Keeps the m largest logits of row in descending order (idx, val). */
static int select_top(const float *row, int n, int m, int32_t *idx, float *val) {
    int have = 0;
    for (int e = 0; e < n; ++e) {
        float v = row[e];
        if (isnan(v)) continue;
        if (have == m && !(v > val[m - 1])) continue;
        int pos = have < m ? have++ : m - 1;
        while (pos > 0 && v > val[pos - 1]) {
            val[pos] = val[pos - 1];
            idx[pos] = idx[pos - 1];
            --pos;
        }
        val[pos] = v;
        idx[pos] = e;
    }
    return have;
}

static void route_one(const float *row, int E, const colibri_route_config *cfg, int slots,
                      int32_t *idx, float *w, int32_t *count) {
    float val[COLIBRI_MAX_EXPERTS];
    for (int s = 0; s < slots; ++s) {
        idx[s] = -1;
        w[s] = 0.0f;
    }
    int have = select_top(row, E, slots, idx, val);
    if (have == 0) {
        *count = 0;
        return;
    }
    const float mx = val[0];
    int n = have;
    int renorm = cfg->norm_topk_prob || cfg->scoring == COLIBRI_SCORING_SOFTMAX_TOPK;
    if (cfg->scoring == COLIBRI_SCORING_SOFTMAX || cfg->dyn_p > 0.0f) {
        /* probabilities over all experts: exp(v - max) / sum */
        double z = 0.0;
        for (int e = 0; e < E; ++e)
            if (!isnan(row[e])) z += exp_shifted(row[e], mx);
        double cum = 0.0;
        for (int s = 0; s < have; ++s) {
            w[s] = (float)(exp_shifted(val[s], mx) / z);
            cum += w[s];
            if (cfg->dyn_p > 0.0f && s + 1 >= cfg->k_min && cum >= (double)cfg->dyn_p) {
                n = s + 1;
                break;
            }
        }
        if (cfg->dyn_p > 0.0f && cfg->scoring == COLIBRI_SCORING_SOFTMAX_TOPK) renorm = 1;
    } else {
        for (int s = 0; s < have; ++s) w[s] = (float)exp_shifted(val[s], mx);
    }
    for (int s = n; s < slots; ++s) {
        idx[s] = -1;
        w[s] = 0.0f;
    }
    if (renorm) {
        double sum = 0.0;
        for (int s = 0; s < n; ++s) sum += w[s];
        for (int s = 0; s < n; ++s) w[s] = (float)(w[s] / sum);
    }
    *count = n;
}

int colibri_route(const float *logits, int n_tokens, int n_experts, const colibri_route_config *cfg,
                  int32_t *indices, float *weights, int32_t *counts) {
    cb_clear_error();
    int st = cb_route_config_check(cfg, n_experts);
    if (st) return st;
    if (n_tokens < 0) return cb_fail(COLIBRI_ERR_INVALID, "n_tokens %d < 0", n_tokens);
    if (n_tokens == 0) return COLIBRI_OK;
    if (!logits || !indices || !weights)
        return cb_fail(COLIBRI_ERR_INVALID, "logits, indices and weights must not be NULL");
    cb_route_rows(logits, 0, n_tokens, n_experts, cfg, indices, weights, counts);
    return COLIBRI_OK;
}

void cb_route_rows(const float *logits, int t0, int t1, int n_experts, const colibri_route_config *cfg,
                   int32_t *indices, float *weights, int32_t *counts) {
    const int slots = colibri_route_slots(cfg);
    for (int t = t0; t < t1; ++t) {
        int32_t c;
        route_one(logits + (size_t)t * n_experts, n_experts, cfg, slots, indices + (size_t)t * slots,
                  weights + (size_t)t * slots, &c);
        if (counts) counts[t] = c;
    }
}
