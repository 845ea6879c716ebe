# Scratch: per-call time distributions, modes interleaved in blocks of 50 calls.
import sys, time, statistics, numpy as np, torch, colibri, threading
from colibri._lib import ffi
from colibri import hf
from tuner.measure.problems import Problem
E, H, I, K = [int(v) for v in sys.argv[1].split(",")]
DT = sys.argv[2]; TH = int(sys.argv[3]); NB = int(sys.argv[4]) if len(sys.argv) > 4 else 40
NL = 4
torch.set_num_threads(TH)
rng = np.random.default_rng(0)
Ls = []
for l in range(NL):
    w = lambda *s: (rng.standard_normal(s, dtype=np.float32) * 0.02)
    Ls.append(colibri.MoELayer(w(E, H), w(E, I, H), w(E, I, H), w(E, H, I), top_k=K, weight_dtype=DT, threads=TH))
lib = Ls[0]._lib
print("threads alive:", threading.active_count(), flush=True)
nb = Problem("", "decode", DT, 1, H, I, E, K).decode_bytes
blocks = [hf._module_class()[0](L, "b") for L in Ls]
xs = np.random.default_rng(1).standard_normal((64, 1, H), dtype=np.float32)
xb3 = torch.from_numpy(xs).to(torch.bfloat16).reshape(64, 1, 1, H)
outf = np.empty((1, H), np.float32)
xps = [ffi.cast("float *", xs[j].ctypes.data) for j in range(64)]
outp = ffi.cast("float *", outf.ctypes.data)
raw = [L._live() for L in Ls]
xaddr = [xs[j].ctypes.data for j in range(64)]; oaddr = outf.ctypes.data
modes = {"cffi raw": lambda i: lib.colibri_layer_forward(raw[i % NL], xps[i % 64], outp, 1, TH),
         "ptrs f32": lambda i: Ls[i % NL]._forward_ptrs(xaddr[i % 64], oaddr, 1),
         "module bf16": lambda i: blocks[i % NL].forward(xb3[i % 64])}
ts = {k: [] for k in modes}; tot = {k: 0.0 for k in modes}
with torch.no_grad():
    i = 0
    for blk in range(NB):
        for k, f in modes.items():
            t00 = time.perf_counter()
            for _ in range(50):
                t0 = time.perf_counter(); f(i); ts[k].append(time.perf_counter() - t0); i += 1
            tot[k] += time.perf_counter() - t00
for k in modes:
    a = np.array(ts[k]) * 1e6
    print(f"{k:12} n={len(a)} mean {a.mean():7.1f} us ({nb/a.mean()/1e3:5.1f} GB/s) total/call {1e6*tot[k]/len(a):7.1f}  p10 {np.percentile(a,10):7.1f} p50 {np.median(a):7.1f} p90 {np.percentile(a,90):7.1f} p99 {np.percentile(a,99):7.1f} max {a.max():8.1f}")
