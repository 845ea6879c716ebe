# Scratch: the cost of torch/Python code right after a big decode call, by library, interleaved.
import sys, time, numpy as np, torch, colibri
from colibri._lib import ffi
from colibri import hf
from tuner.measure.problems import Problem
libs = sys.argv[1].split(",")
E, H, I, K = [int(v) for v in (sys.argv[2] if len(sys.argv) > 2 else "128,2048,768,8").split(",")]
DT = sys.argv[3] if len(sys.argv) > 3 else "int4"
N = int(sys.argv[4]) if len(sys.argv) > 4 else 300
TH = 2; NL = 4
torch.set_num_threads(TH)
rng = np.random.default_rng(0)
w = lambda *s: (rng.standard_normal(s, dtype=np.float32) * 0.02)
ws = [(w(E, H), w(E, I, H), w(E, I, H), w(E, H, I)) for _ in range(NL)]
Ls = {l: [colibri.MoELayer(*ws[i], top_k=K, weight_dtype=DT, threads=TH, lib=l) for i in range(NL)] for l in libs}
del ws
tiny = colibri.MoELayer(w(4, 64), w(4, 32, 64), w(4, 32, 64), w(4, 64, 32), top_k=2, weight_dtype="int4", threads=TH, lib=libs[0])
tb = hf._module_class()[0](tiny, "t")
nb = Problem("", "decode", DT, 1, H, I, E, K).decode_bytes
xs = np.random.default_rng(1).standard_normal((64, 1, H), dtype=np.float32)
outf = np.empty((1, H), np.float32)
xps = [ffi.cast("float *", xs[j].ctypes.data) for j in range(64)]
outp = ffi.cast("float *", outf.ctypes.data)
xt = torch.randn(1, 1, 64).to(torch.bfloat16)
ops = {"torch.empty": lambda: torch.empty((1, 1, H), dtype=torch.bfloat16), "tiny module fwd": lambda: tb.forward(xt)}
res = {(l, k): [] for l in libs for k in ops}; big = {l: [] for l in libs}
with torch.no_grad():
    for r in range(N):
        for l in (libs if r % 2 == 0 else libs[::-1]):
            for k, f in ops.items():
                L = Ls[l][r % NL]
                t0 = time.perf_counter()
                L._lib.colibri_layer_forward(L._live(), xps[r % 64], outp, 1, TH)
                t1 = time.perf_counter(); f(); t2 = time.perf_counter()
                big[l].append(t1 - t0); res[(l, k)].append(t2 - t1)
for l in libs:
    print(f"{l}: big call median {1e6*np.median(big[l]):.0f} us ({nb/np.median(big[l])/1e9:.1f} GB/s); " +
          "; ".join(f"{k} after it: median {1e6*np.median(res[(l, k)]):.1f} us mean {1e6*np.mean(res[(l, k)]):.1f}" for k in ops))
