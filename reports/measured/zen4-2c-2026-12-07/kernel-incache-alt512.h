/* Hand-written alternatives to packed.j2's packed int8 prefill blocks for AVX-512, for
 * ../zen3-2c-2026-12-07/kernel-incache.c (-DALT_H='"<this file>"'; measured 2026-12-07,
 * README.md): NVA vectors x NTA tokens, the float sums in registers; GS groups share one
 * epilogue (GS > 1: wrong results, timing only: what the per-group epilogue costs). Build
 * against a zen4 build tree's part, with the zen4 flags (gcc 12.2: -march=znver3 plus Zen 4's
 * AVX-512 extensions, -mavx512f -mavx512bw -mavx512cd -mavx512dq -mavx512vl -mavx512vnni
 * -mavx512bf16), -DKFN=alt_v2_t4 -DNV=2 -DNT=4 (or the part's pk8_pre_v2_t4), and run it
 * with 20000 calls. */
#define ALT(NAME, NVA, NTA, GS)                                                                          \
static inline void NAME(const uint8_t *const *p, const pk_x *x, int g0, int g1, float *acc, int first, size_t bb, size_t skip) { \
    (void)bb; (void)skip; vf f[NVA][NTA];                                                                  \
    for (int v = 0; v < NVA; ++v) for (int t = 0; t < NTA; ++t) f[v][t] = first ? V_ZERO() : V_LOADX(acc + (v * NTA + t) * PK_RV); \
    for (int g = g0; g < g1; g += GS) {                                                                    \
        vi d[NVA][NTA];                                                                                    \
        for (int t = 0; t < NTA; ++t) { const vi n = VI_BCAST((const uint8_t *)(x[t].nb + g)); for (int v = 0; v < NVA; ++v) d[v][t] = n; } \
        for (int k4 = 0; k4 < 8 * GS; ++k4) {                                                              \
            vi w[NVA];                                                                                     \
            for (int v = 0; v < NVA; ++v) w[v] = VI_LOAD(p[v] + (size_t)g * PK_GS + (size_t)k4 * PK_RV * 4); \
            for (int t = 0; t < NTA; ++t) { const vi xb = VI_BCAST((const uint8_t *)(x[t].q + (size_t)g * 32 + k4 * 4)); \
                for (int v = 0; v < NVA; ++v) d[v][t] = VI_DP(d[v][t], w[v], xb); }                        \
        }                                                                                                  \
        for (int t = 0; t < NTA; ++t) { const vf s = V_SET1(x[t].s[g]); for (int v = 0; v < NVA; ++v) f[v][t] = V_FMA(VI_CVT(d[v][t]), s, f[v][t]); } \
    }                                                                                                      \
    for (int v = 0; v < NVA; ++v) for (int t = 0; t < NTA; ++t) V_STOREX(acc + (v * NTA + t) * PK_RV, f[v][t]); \
}
ALT(alt_v2_t4, 2, 4, 1)
ALT(alt_v2_t4_g2, 2, 4, 2)
ALT(alt_v2_t6, 2, 6, 1)
ALT(alt_v2_t8, 2, 8, 1)
ALT(alt_v4_t4, 4, 4, 1)
ALT(alt_v4_t3, 4, 3, 1)
ALT(alt_v1_t4, 1, 4, 1)
ALT(alt_v1_t8, 1, 8, 1)
