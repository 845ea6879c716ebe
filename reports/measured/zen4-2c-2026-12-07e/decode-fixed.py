# Run by hand on 2026-12-07 (README.md): where a small decode call's time goes, by the router's
# size (E) and the experts routed (k), I=32, int4, weights in cache; python decode-fixed.py LIB
import sys, numpy as np, colibri
from colibri._lib import ffi
LIB = sys.argv[1]
for E, K in ((128, 8), (128, 1), (8, 8), (8, 1)):
    H, I = 2048, 32
    rng = np.random.default_rng(0)
    w = lambda *s: (rng.standard_normal(s, dtype=np.float32) * 0.02)
    R, G, U, D = w(E, H), w(E, I, H), w(E, I, H), w(E, H, I)
    xs = rng.standard_normal((64, 1, H), dtype=np.float32)
    L = colibri.MoELayer(R, G, U, D, top_k=K, norm_topk_prob=False, weight_dtype="int4", threads=2, lib=LIB)
    lib = L._lib; ptrs = ffi.new("colibri_layer *[]", [L._live()])
    row = []
    for th in (1, 2):
        out = np.empty((1, H), np.float32); s = np.empty(400000); n = ffi.new("int *")
        assert lib.colibri_bench_layers(ptrs, 1, ffi.from_buffer("float[]", xs), 64, 1, ffi.from_buffer("float[]", out), th, 50, 1.0, len(s), ffi.from_buffer("double[]", s), n) == 0
        row.append(f"{th} thr {1e6*np.median(s[:n[0]]):6.1f} us")
    print(f"int4 E={E:3} k={K} I={I}: " + " | ".join(row), flush=True)
    L.close()
# output, 2026-12-07 (base.so, copied from the terminal), median per call inside C:
# int4 E=128 k=8 I=32: 1 thr   64.8 us | 2 thr   36.2 us
# int4 E=128 k=1 I=32: 1 thr   23.2 us | 2 thr   15.3 us
# int4 E=  8 k=8 I=32: 1 thr   33.6 us | 2 thr   19.4 us
# int4 E=  8 k=1 I=32: 1 thr    6.9 us | 2 thr    8.6 us
