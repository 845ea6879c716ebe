"""Decode in cache: one Qwen3-shaped int4 layer with E=8, k=8 (every call reads the same 8
experts, 21 MB, which stay in the LLC), one token, median us per call of 2000 calls after
200 warm-up; prints the median and the GB/s of expert bytes."""
import os, sys, time
import numpy as np
from colibri.layer import MoELayer
H, I, E = (int(v) for v in os.environ.get("HIE", "2048,768,8").split(","))
rng = np.random.default_rng(0)
w = lambda *s: rng.standard_normal(s, dtype=np.float32) * np.float32(0.05)
L = MoELayer(w(E, H), w(E, I, H), w(E, I, H), w(E, H, I), top_k=E, weight_dtype=sys.argv[1] if len(sys.argv) > 1 else "int4",
             threads=int(os.environ.get("T", "2")))
x = rng.standard_normal((1, H), dtype=np.float32)
out = np.empty_like(x)
for _ in range(200):
    L(x, out)
ts = []
for _ in range(2000):
    t0 = time.perf_counter(); L(x, out); ts.append(time.perf_counter() - t0)
med = float(np.median(ts))
nbytes = E * 3 * H * I * (0.5625 if (len(sys.argv) < 2 or sys.argv[1] == "int4") else 1.0)
print(f"{med * 1e6:.1f} {nbytes / med / 1e9:.1f}")
