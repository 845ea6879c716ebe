# scratch: in-cache decode (E=8, k=8: the same 8 experts every call), static vs claimed alternated
import os, sys, time, numpy as np
from colibri.layer import MoELayer
H, I, E = (int(v) for v in os.environ.get("HIE", "2048,768,8").split(","))
rng = np.random.default_rng(0)
w = lambda *s: rng.standard_normal(s, dtype=np.float32) * np.float32(0.05)
L = MoELayer(w(E, H), w(E, I, H), w(E, I, H), w(E, H, I), top_k=E, weight_dtype=sys.argv[1], threads=2)
x = rng.standard_normal((1, H), dtype=np.float32); out = np.empty_like(x)
for _ in range(200): L(x, out)
a, b = [], []
for p in range(int(sys.argv[2])):
    for mode in (("0", "1") if p % 2 == 0 else ("1", "0")):
        os.environ["CB_CLAIM"] = mode
        L(x, out)
        t0 = time.perf_counter()
        for _ in range(20): L(x, out)
        (a if mode == "0" else b).append((time.perf_counter() - t0) / 20)
a, b = np.array(a), np.array(b)
print(f"{sys.argv[1]} HIE={H},{I},{E}: static {np.median(a)*1e6:.1f} us, claimed {np.median(b)*1e6:.1f} us, per-pair ratio {np.median(a/b):.3f}")
