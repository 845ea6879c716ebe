# Scratch: decode phase times (a layer.c instrumented with per-phase clocks, PT[][]) of
# Qwen3-shaped layers called back to back in C, per 0.15 s slice, against the read bandwidth around it.
import sys, time, statistics, numpy as np, colibri, cffi
from colibri._lib import ffi
from colibri_bench.bench import read_bandwidth
from tuner.host.bandwidth import _llc_total_here, working_set_bytes
from tuner.measure.problems import Problem
E, H, I, K = [int(v) for v in (sys.argv[1] if len(sys.argv) > 1 else "128,2048,768,8").split(",")]
DT = sys.argv[2] if len(sys.argv) > 2 else "int4"
ROUNDS = int(sys.argv[3]) if len(sys.argv) > 3 else 20
NL, TH, SL = 3, 2, 0.15
rng = np.random.default_rng(0)
w = lambda *s: (rng.standard_normal(s, dtype=np.float32) * 0.02)
Ls = [colibri.MoELayer(w(E, H), w(E, I, H), w(E, I, H), w(E, H, I), top_k=K, norm_topk_prob=True, weight_dtype=DT, threads=TH) for _ in range(NL)]
lib = Ls[0]._lib
import os
f2 = cffi.FFI(); f2.cdef("double PT[16][2]; long PTN;"); pt = f2.dlopen(os.environ["COLIBRI_LIB"])
nb = Problem("", "decode", DT, 1, H, I, E, K).decode_bytes
xs = np.random.default_rng(1).standard_normal((64, 1, H), dtype=np.float32)
ptrs = ffi.new("colibri_layer *[]", [L._live() for L in Ls])
ws = working_set_bytes(_llc_total_here())[0]
bw = lambda: read_bandwidth(colibri.open_library(), TH, ws, min_seconds=0.1)
def snap(): return np.array([[pt.PT[i][j] for j in range(2)] for i in range(10)]), pt.PTN
rows = []
for r in range(ROUNDS):
    b0 = bw()
    p0, n0 = snap()
    out = np.empty((1, H), np.float32); s = np.empty(100000); n = ffi.new("int *")
    assert lib.colibri_bench_layers(ptrs, NL, ffi.from_buffer("float[]", xs), 64, 1, ffi.from_buffer("float[]", out), TH, NL, SL, len(s), ffi.from_buffer("double[]", s), n) == 0
    p1, n1 = snap()
    b1 = bw()
    d = (p1 - p0) / (n1 - n0) * 1e6
    med = statistics.median(s[:n[0]])
    rows.append((b0, b1, med, d))
best = max(max(r[0], r[1]) for r in rows)
names = ["call", "router", "route+group", "-", "fork", "gateup", "wait1", "down", "wait2", "sum"]
print(f"{DT} E={E} H={H} I={I} K={K}, {TH} threads, bytes/call {nb/1e6:.1f} MB, best reading {best:.1f}")
for r in rows:
    b0, b1, med, d = r
    win = "fast" if min(b0, b1) >= 0.8 * best else "slow" if max(b0, b1) < 0.7 * best else "mixed"
    print(f"{win:5s} bw {b0:5.1f}/{b1:5.1f} call {med*1e6:6.1f} us {nb/med/1e9:5.1f} GB/s {100*nb/med/1e9/max(b0,b1):5.1f}% | " +
          " ".join(f"{names[i]} {d[i][0]:.1f}" + (f"/{d[i][1]:.1f}" if i >= 4 else "") for i in [0,1,2,4,5,6,7,8,9]), flush=True)
