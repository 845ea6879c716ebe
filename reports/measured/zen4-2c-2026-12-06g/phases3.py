# scratch: static (CB_CLAIM=0) vs claimed, alternated every few calls in one process (C-timed means)
import os, sys, numpy as np, colibri
from colibri._lib import ffi
path = sys.argv[1]; per = int(sys.argv[2]); pairs = int(sys.argv[3])
m = colibri.Model.load(path); lib = m._lib; L = m._layer(0)
xs = np.random.default_rng(0).standard_normal((256, 1, m.hidden), dtype=np.float32)
out = np.empty((1, m.hidden), np.float32); s = np.empty(per); k = ffi.new("int *"); ptrs = ffi.new("colibri_layer *[]", [L])
X = ffi.from_buffer("float[]", xs); O = ffi.from_buffer("float[]", out); S = ffi.from_buffer("double[]", s)
a, b = [], []
for p in range(pairs):
    for mode in (("0", "1") if p % 2 == 0 else ("1", "0")):
        os.environ["CB_CLAIM"] = mode
        lib.colibri_bench_layers(ptrs, 1, X, 256, 1, O, 2, 2, 100.0, per, S, k)
        (a if mode == "0" else b).append(s[:k[0]].mean())
a, b = np.array(a), np.array(b); r = a / b
lo, hi = np.percentile(r, [25, 75])
print(f"static/claimed per pair: median {np.median(r):.3f} IQR [{lo:.3f}, {hi:.3f}]; sums {a.sum()/b.sum():.3f}; static mean {a.mean()*1e6:.0f} us, claimed {b.mean()*1e6:.0f} us")
g = np.sqrt(a * b)
for lo_, hi_ in [(0, 33), (33, 67), (67, 100)]:
    sel = (g >= np.percentile(g, lo_)) & (g <= np.percentile(g, hi_))
    print(f"pairs by speed, percentile {lo_}-{hi_} (geo-mean {np.median(g[sel])*1e6:.0f} us): median ratio {np.median(r[sel]):.3f}, sums {a[sel].sum()/b[sel].sum():.3f}")
