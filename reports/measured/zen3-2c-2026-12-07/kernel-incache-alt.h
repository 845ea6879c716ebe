/* Two hand-written alternatives to packed.j2's pk8_pre_v2_t4 for kernel-incache.c:
 * alt_v2_t4 token-major with |w| hoisted and the float sums in acc (no spills), and
 * alt2_v2_t4 the same with its int32 sums scaled every 64 k instead of 32 (wrong results,
 * timing only: what the per-group epilogue costs). GS groups per step, KS words of 4 k. */
#define ALT_V2_T4(NAME, GS, KS)                                                                      \
    static inline void NAME(const uint8_t *const *p, const pk_x *x, int g0, int g1, float *acc,      \
                            int first, size_t bb, size_t skip) {                                     \
        (void)bb; (void)skip;                                                                        \
        if (first) for (int i = 0; i < 8; ++i) V_STOREX(acc + i * PK_RV, V_ZERO());                  \
        const __m256i ones = _mm256_set1_epi16(1);                                                   \
        for (int g = g0; g < g1; g += GS) {                                                          \
            __m256i d[2][4];                                                                         \
            for (int t = 0; t < 4; ++t) d[0][t] = d[1][t] = _mm256_set1_epi32(x[t].nb[g]);           \
            for (int k4 = 0; k4 < KS; ++k4) {                                                        \
                const __m256i w0 = VI_LOAD(p[0] + (size_t)g * PK_GS + (size_t)k4 * PK_RV * 4);      \
                const __m256i w1 = VI_LOAD(p[1] + (size_t)g * PK_GS + (size_t)k4 * PK_RV * 4);      \
                const __m256i a0 = _mm256_sign_epi8(w0, w0), a1 = _mm256_sign_epi8(w1, w1);          \
                for (int t = 0; t < 4; ++t) {                                                        \
                    const __m256i xb = VI_BCAST((const uint8_t *)(x[t].q + (size_t)g * 32 + k4 * 4)); \
                    d[0][t] = _mm256_add_epi32(d[0][t], _mm256_madd_epi16(_mm256_maddubs_epi16(a0, _mm256_sign_epi8(xb, w0)), ones)); \
                    d[1][t] = _mm256_add_epi32(d[1][t], _mm256_madd_epi16(_mm256_maddubs_epi16(a1, _mm256_sign_epi8(xb, w1)), ones)); \
                }                                                                                    \
            }                                                                                        \
            for (int t = 0; t < 4; ++t) {                                                            \
                const vf s = V_SET1(x[t].s[g]);                                                      \
                V_STOREX(acc + t * PK_RV, V_FMA(VI_CVT(d[0][t]), s, V_LOADX(acc + t * PK_RV)));      \
                V_STOREX(acc + (4 + t) * PK_RV, V_FMA(VI_CVT(d[1][t]), s, V_LOADX(acc + (4 + t) * PK_RV))); \
            }                                                                                        \
        }                                                                                            \
    }
ALT_V2_T4(alt_v2_t4, 1, 8)
ALT_V2_T4(alt2_v2_t4, 2, 16)
