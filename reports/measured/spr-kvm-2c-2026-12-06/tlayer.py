# scratch: time one layer's forward (colibri_bench_layers) with $COLIBRI_LIB, no verification
import os, sys, numpy as np, colibri
from colibri._lib import ffi
from tuner.measure.problems import problem
from tuner.measure import weights
name, reps, thr = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
p = problem(name)
path = weights.ensure_model("/work/main/build/tuner/weights", p, 0, 1)
m = colibri.Model.load(str(path)); lib = m._lib; L = m._layer(0)
T = p.T
xs = np.random.default_rng(0).standard_normal((2, T, m.hidden), dtype=np.float32)
out = np.empty((T, m.hidden), np.float32); s = np.empty(reps); k = ffi.new("int *"); ptrs = ffi.new("colibri_layer *[]", [L])
X = ffi.from_buffer("float[]", xs); O = ffi.from_buffer("float[]", out); S = ffi.from_buffer("double[]", s)
lib.colibri_bench_layers(ptrs, 1, X, 2, T, O, thr, 1, 100.0, 2, S, k)
lib.colibri_bench_layers(ptrs, 1, X, 2, T, O, thr, 1, 100.0, reps, S, k)
print(f"{np.median(s[:k[0]])*1e3:.2f}")
