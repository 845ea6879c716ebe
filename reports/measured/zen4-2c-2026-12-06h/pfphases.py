# scratch: prefill, static split (CB_CLAIM=0) vs claimed, alternated every PER calls in one
# process; per-thread phase times from the instrumented build (cb_inst_get).
import os, sys, numpy as np, cffi, colibri
from colibri._lib import ffi
from tuner.measure.problems import problem
from tuner.measure import weights
name, per, pairs = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
root = os.environ.get("WDIR", "/work/main/build/tuner/weights")
p = problem(name)
path = weights.ensure_model(root, p, 0, 1)
m = colibri.Model.load(str(path)); lib = m._lib; L = m._layer(0)
f2 = cffi.FFI(); f2.cdef("void cb_inst_get(double *out, long *n);"); ilib = f2.dlopen(os.environ["COLIBRI_LIB"])
T = p.T
xs = np.random.default_rng(0).standard_normal((4, T, m.hidden), dtype=np.float32)
out = np.empty((T, m.hidden), np.float32); s = np.empty(per); k = ffi.new("int *"); ptrs = ffi.new("colibri_layer *[]", [L])
X = ffi.from_buffer("float[]", xs); O = ffi.from_buffer("float[]", out); S = ffi.from_buffer("double[]", s)
buf = f2.new("double[128]"); nn = f2.new("long *")
res = {"0": [], "1": []}; ph = {"0": np.zeros((3, 8)), "1": np.zeros((3, 8))}; cnt = {"0": 0, "1": 0}
for q in range(pairs):
    for mode in (("0", "1") if q % 2 == 0 else ("1", "0")):
        os.environ["CB_CLAIM"] = mode
        ilib.cb_inst_get(buf, nn)
        lib.colibri_bench_layers(ptrs, 1, X, 4, T, O, 2, 2, 100.0, per, S, k)
        ilib.cb_inst_get(buf, nn)
        res[mode].append(s[:k[0]].mean())
        a = np.frombuffer(f2.buffer(buf), dtype=np.float64).reshape(16, 8)[:3]
        ph[mode] += a; cnt[mode] += nn[0]
a, b = np.array(res["0"]), np.array(res["1"]); r = a / b
print(f"{name}: static/claimed per pair median {np.median(r):.3f} IQR [{np.percentile(r,25):.3f}, {np.percentile(r,75):.3f}]; static {np.median(a)*1e3:.3f} ms, claimed {np.median(b)*1e3:.3f} ms")
for mode in "01":
    q = ph[mode] / max(cnt[mode], 1) * 1e3
    print(f"  {'static ' if mode=='0' else 'claimed'} ms/call: gate/up t0 {q[0,0]:.3f} t1 {q[1,0]:.3f} | wait {q[0,1]:.3f}/{q[1,1]:.3f} | prep {q[0,2]:.3f}/{q[1,2]:.3f} | down {q[0,3]:.3f}/{q[1,3]:.3f} | pre-turn {q[2,0]:.3f} turn {q[2,1]:.3f}")
