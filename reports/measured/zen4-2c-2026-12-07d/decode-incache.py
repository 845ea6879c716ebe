# Run by hand on 2026-12-07 (README.md): python decode-incache.py LIB [INTER]
# scratch: decode of a small layer whose weights stay in the last-level cache (every expert
# routed each call), timed inside C: the decode kernels' rate without DRAM, by dtype
import sys, numpy as np, colibri
from colibri._lib import ffi
LIB = sys.argv[1]
E, H, I, K = 8, 2048, int(sys.argv[2]) if len(sys.argv) > 2 else 256, 8
rng = np.random.default_rng(0)
w = lambda *s: (rng.standard_normal(s, dtype=np.float32) * 0.02)
R, G, U, D = w(E, H), w(E, I, H), w(E, I, H), w(E, H, I)
xs = rng.standard_normal((64, 1, H), dtype=np.float32)
per_w = {"bf16": 2.0, "int8": 1.0, "int4": 0.5625, "int4g32": 0.625}
for rnd in range(2):
  for dt in ("int8", "int4", "int4g32", "bf16"):
    L = colibri.MoELayer(R, G, U, D, top_k=K, norm_topk_prob=False, weight_dtype=dt, threads=2, lib=LIB)
    lib = L._lib; ptrs = ffi.new("colibri_layer *[]", [L._live()])
    nb = E * 3 * I * H * per_w[dt]
    row = []
    for th in (1, 2):
        out = np.empty((1, H), np.float32); s = np.empty(200000); n = ffi.new("int *")
        assert lib.colibri_bench_layers(ptrs, 1, ffi.from_buffer("float[]", xs), 64, 1, ffi.from_buffer("float[]", out), th, 20, 0.5, len(s), ffi.from_buffer("double[]", s), n) == 0
        med = np.median(s[:n[0]])
        row.append(f"{th} thr {1e6*med:7.1f} us {nb/med/1e9:6.1f} GB/s {E*3*I*H/med/1e9:6.1f} Gweights/s")
    print(f"{dt:8} {nb/2**20:5.1f} MiB  " + " | ".join(row), flush=True)
    L.close()
