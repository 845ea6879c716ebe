# Scratch: what Python/torch code costs right after a big decode call (cold caches).
import sys, time, numpy as np, torch, colibri
from colibri._lib import ffi
from colibri import hf
E, H, I, K = [int(v) for v in (sys.argv[1] if len(sys.argv) > 1 else "128,2048,768,8").split(",")]; TH = 2; NL = 4
torch.set_num_threads(TH)
rng = np.random.default_rng(0)
w = lambda *s: (rng.standard_normal(s, dtype=np.float32) * 0.02)
Ls = [colibri.MoELayer(w(E, H), w(E, I, H), w(E, I, H), w(E, H, I), top_k=K, weight_dtype="int4", threads=TH) for _ in range(NL)]
tiny = colibri.MoELayer(w(4, 64), w(4, 32, 64), w(4, 32, 64), w(4, 64, 32), top_k=2, weight_dtype="int4", threads=TH)
lib = Ls[0]._lib
xs = np.random.default_rng(1).standard_normal((64, 1, H), dtype=np.float32)
outf = np.empty((1, H), np.float32)
xps = [ffi.cast("float *", xs[j].ctypes.data) for j in range(64)]
outp = ffi.cast("float *", outf.ctypes.data)
raw = [L._live() for L in Ls]
Block = hf._module_class()[0]
tb = Block(tiny, "t")
xb = torch.randn(1, 1, H).to(torch.bfloat16)
xt = torch.randn(1, 1, 64).to(torch.bfloat16)
bigb = Block(Ls[0], "b")
def prep_out(): return torch.empty((1, 1, H), dtype=torch.bfloat16)
ops = {
  "nothing": lambda: None,
  "torch.empty": prep_out,
  "attrs": lambda: (xb.shape, xb.dtype, xb.device.type),
  "is_contiguous": lambda: xb.is_contiguous(),
  "data_ptr": lambda: xb.data_ptr(),
  "numpy alloc": lambda: np.empty((1, H), np.float32),
  "tiny engine (cffi)": lambda: tiny._forward_ptrs(xt.data_ptr(), xt.data_ptr(), 1, bf16=True),
  "tiny module fwd": lambda: tb.forward(xt),
  "tiny module call": lambda: tb(xt),
}
res = {k: [] for k in ops}; warm = {k: [] for k in ops}
with torch.no_grad():
    for r in range(300):
        for k, f in ops.items():
            lib.colibri_layer_forward(raw[r % NL], xps[r % 64], outp, 1, TH)
            t0 = time.perf_counter(); f(); t1 = time.perf_counter()
            f(); t2 = time.perf_counter()
            res[k].append(t1 - t0); warm[k].append(t2 - t1)
for k in ops:
    print(f"{k:20} after a big call: median {1e6*np.median(res[k]):6.1f} us  mean {1e6*np.mean(res[k]):6.1f};  warm {1e6*np.median(warm[k]):5.1f}")
