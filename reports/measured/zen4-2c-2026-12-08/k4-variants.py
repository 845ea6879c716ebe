# Scratch (2026-12-08): variants of one rendered int4 part's k4pk_pre_v2_t4 (the int4k prefill
# block, 2 packed blocks x 4 tokens), each with one piece of its arithmetic taken out (their
# results are wrong; only their speed is of interest), for ../zen3-2c-2026-12-07/kernel-incache.c:
#   python k4-variants.py build/zen4/gen/parts/cbp_int4_<hash>.c /tmp/k4v
# writes /tmp/k4v/part_{base,maddw,nounp,noscale,noM,noscaleM,scconst,srlv,pair}.c
import os, re, sys
src, out = sys.argv[1], sys.argv[2]
os.makedirs(out, exist_ok=True)
s = open(src).read()
i = s.index("static inline void k4pk_pre_v2_t4(")
j = s.index("\n}\n", i)
f = s[i:j]
scale = r"VI_SCALE16\((VI_LOAD\(Am \+ \d \* PK_RV\)), (d\d_\d_0), sc\)"
no_m = lambda g: re.sub(r"M(\d)_(\d) = VI_MADDW\(M\d_\d, mn, [^;]*\);", "/* no M */", g)
variants = {
    "base": f,
    # the group scale by vpdpwssd (int16 halves) instead of vpmulld + vpaddd
    "maddw": f.replace("VI_SCALE16(VI_LOAD(Am", "VI_MADDW(VI_LOAD(Am"),
    # no nibble unpacking: the weight vector as it is for both halves
    "nounp": f.replace("const vi lo = VI_LO4(w), hi = VI_HI4(w);", "const vi lo = w, hi = w;"),
    # no group scale: the group's dot added as it is
    "noscale": re.sub(scale, r"VI_ADD(\1, \2)", f),
    # no min term (M = sum mn_j bs_j, four vpdpwssd per block, token and super-block)
    "noM": no_m(f),
    "noscaleM": re.sub(scale, r"VI_ADD(\1, \2)", no_m(f)),
}
# the scale code as a constant (no extraction from the header), or extracted by a vector shift count
variants["scconst"] = f.replace("const vi sc = VI_AND(VI_SRL(VI_LOAD(hp0 + wsc * PK_RV), ssc), VI_SET1(63));",
                                "const vi sc = VI_SET1(5);").replace(
    "const vi sc = VI_AND(VI_SRL(VI_LOAD(hp1 + wsc * PK_RV), ssc), VI_SET1(63));", "const vi sc = VI_SET1(7);")
variants["srlv"] = f.replace("VI_SRL(VI_LOAD(hp0 + wsc * PK_RV), ssc)", "_mm512_srlv_epi32(VI_LOAD(hp0 + wsc * PK_RV), VI_SET1(ssc))").replace(
    "VI_SRL(VI_LOAD(hp1 + wsc * PK_RV), ssc)", "_mm512_srlv_epi32(VI_LOAD(hp1 + wsc * PK_RV), VI_SET1(ssc))")
# groups in pairs: the even group's dots kept in L1, the pair's int16 halves packed (shift + ternary
# logic) and scaled by one vpdpwssd, as activations of 7 bits (group dots within int16) would allow
a, b = f.index("            /* group j's scale code"), f.index("        }\n        {\n            const vf dv0")
variants["pair"] = (f[:a] + """            const int wsc = 4 * (j / 5), ssc = 6 * (j % 5);
            const vi s0 = VI_AND(VI_SRL(VI_LOAD(hp0 + wsc * PK_RV), ssc), VI_SET1(63));
            const vi s1 = VI_AND(VI_SRL(VI_LOAD(hp1 + wsc * PK_RV), ssc), VI_SET1(63));
            if (!(j & 1)) {
                VI_STORE(Dm + 0 * PK_RV, d0_0_0); VI_STORE(Dm + 1 * PK_RV, d0_1_0);
                VI_STORE(Dm + 2 * PK_RV, d0_2_0); VI_STORE(Dm + 3 * PK_RV, d0_3_0);
                VI_STORE(Dm + 4 * PK_RV, d1_0_0); VI_STORE(Dm + 5 * PK_RV, d1_1_0);
                VI_STORE(Dm + 6 * PK_RV, d1_2_0); VI_STORE(Dm + 7 * PK_RV, d1_3_0);
                sp0 = s0; sp1 = s1;
            } else {
                const vi sc0 = VI_OR(sp0, VI_SLLI(s0, 16)), sc1 = VI_OR(sp1, VI_SLLI(s1, 16)), m16 = VI_SET1(0xFFFF);
#define PAIR(i, d, sc) VI_STORE(Am + i * PK_RV, VI_MADDW(VI_LOAD(Am + i * PK_RV), _mm512_ternarylogic_epi32(VI_LOAD(Dm + i * PK_RV), VI_SLLI(d, 16), m16, 0xE4), sc))
                PAIR(0, d0_0_0, sc0); PAIR(1, d0_1_0, sc0); PAIR(2, d0_2_0, sc0); PAIR(3, d0_3_0, sc0);
                PAIR(4, d1_0_0, sc1); PAIR(5, d1_1_0, sc1); PAIR(6, d1_2_0, sc1); PAIR(7, d1_3_0, sc1);
#undef PAIR
            }
""" + f[b:]).replace("        memset(Am, 0, sizeof Am);\n",
                     "        memset(Am, 0, sizeof Am);\n        int32_t Dm[8 * PK_RV];\n        vi sp0 = VI_SET1(0), sp1 = VI_SET1(0);\n", 1)
for k, g in variants.items():
    assert k == "base" or g != f, k
    open(os.path.join(out, f"part_{k}.c"), "w").write(s[:i] + g + s[j:])
print("written", ", ".join(variants))
