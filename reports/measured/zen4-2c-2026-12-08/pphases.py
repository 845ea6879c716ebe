# Scratch: prefill phase times (layer.c instrumented, PT[][]) of Qwen3-shaped layers called back to back in C
import sys, time, statistics, os, numpy as np, colibri, cffi
from colibri._lib import ffi
E, H, I, K = [int(v) for v in (sys.argv[1] if len(sys.argv) > 1 else "128,2048,768,8").split(",")]
DT = sys.argv[2] if len(sys.argv) > 2 else "int4"
ROUNDS = int(sys.argv[3]) if len(sys.argv) > 3 else 10
T = int(sys.argv[4]) if len(sys.argv) > 4 else 128
NL, TH, SL = 2, 2, 0.3
rng = np.random.default_rng(0)
w = lambda *s: (rng.standard_normal(s, dtype=np.float32) * 0.02)
Ls = [colibri.MoELayer(w(E, H), w(E, I, H), w(E, I, H), w(E, H, I), top_k=K, norm_topk_prob=True, weight_dtype=DT, threads=TH) for _ in range(NL)]
lib = Ls[0]._lib
f2 = cffi.FFI(); f2.cdef("double PT[16][2]; long PTN;"); pt = f2.dlopen(os.environ["COLIBRI_LIB"])
xs = np.random.default_rng(1).standard_normal((4, T, H), dtype=np.float32)
ptrs = ffi.new("colibri_layer *[]", [L._live() for L in Ls])
def snap(): return np.array([[pt.PT[i][j] for j in range(2)] for i in range(10)]), pt.PTN
acc = []
for r in range(ROUNDS):
    p0, n0 = snap()
    out = np.empty((T, H), np.float32); s = np.empty(100000); n = ffi.new("int *")
    assert lib.colibri_bench_layers(ptrs, NL, ffi.from_buffer("float[]", xs), 4, T, ffi.from_buffer("float[]", out), TH, NL, SL, len(s), ffi.from_buffer("double[]", s), n) == 0
    p1, n1 = snap()
    d = (p1 - p0) / (n1 - n0) * 1e3
    acc.append(d)
    print(f"median call {statistics.median(s[:n[0]])*1e3:6.2f} ms | call {d[1][0]:.2f} pre {d[0][0]:.2f} fork {d[3][0]:.2f}/{d[3][1]:.2f} gateup {d[4][0]:.2f}/{d[4][1]:.2f} wait {d[5][0]:.2f}/{d[5][1]:.2f} prep {d[6][0]:.2f}/{d[6][1]:.2f} down {d[7][0]:.2f}/{d[7][1]:.2f}", flush=True)
m = np.median(np.array(acc), axis=0)
print(f"MEDIAN call {m[1][0]:.2f} pre {m[0][0]:.2f} gateup {m[4][0]:.2f}/{m[4][1]:.2f} wait {m[5][0]:.2f}/{m[5][1]:.2f} prep {m[6][0]:.2f}/{m[6][1]:.2f} down {m[7][0]:.2f}/{m[7][1]:.2f}")
