# Scratch: the module's forward as it is against leaner versions, after a big call (cold) and warm.
import sys, time, numpy as np, torch, colibri
from colibri._lib import ffi
from colibri import hf
E, H, I, K = 128, 2048, 768, 8; TH = 2; NL = 4
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
xt = torch.randn(1, 1, 64).to(torch.bfloat16)
BF16, F32 = torch.bfloat16, torch.float32
fwd_bf16 = lib.colibri_layer_forward_bf16
def lean(self, h):
    if not h.is_cpu:
        raise ValueError("cpu")
    shape = h.shape
    if not shape or shape[-1] != self.layer.hidden:
        raise ValueError("shape")
    dtype = h.dtype
    T = h.numel() // shape[-1]
    if self.handoff_tokens is not None and T >= self.handoff_tokens:
        out = self._handoff[0](h)
        return out[0] if isinstance(out, tuple) else out
    bf16 = dtype is BF16
    x = h if bf16 or dtype is F32 else h.to(F32)
    if not x.is_contiguous():
        x = x.contiguous()
    out = torch.empty(shape, dtype=x.dtype)
    self.layer._forward_ptrs(x.data_ptr(), out.data_ptr(), T, bf16=bf16)
    return out if x.dtype is dtype else out.to(dtype)
def leaner(self, h):  # no lock, no checks in python: a bound for what python can save
    out = torch.empty(h.shape, dtype=h.dtype)
    fwd_bf16(self.layer._ptr, ffi.cast("uint16_t *", h.data_ptr()), ffi.cast("uint16_t *", out.data_ptr()), 1, TH)
    return out
ops = {"current": lambda: tb.forward(xt), "lean": lambda: lean(tb, xt), "leaner": lambda: leaner(tb, xt),
       "engine only": lambda: fwd_bf16(tiny._ptr, ffi.cast("uint16_t *", xt.data_ptr()), ffi.cast("uint16_t *", xt.data_ptr()), 1, TH)}
res = {k: [] for k in ops}; warm = {k: [] for k in ops}
with torch.no_grad():
    for k, f in ops.items(): f()
    for r in range(400):
        for k, f in (list(ops.items()) if r % 2 else list(ops.items())[::-1]):
            lib.colibri_layer_forward(raw[r % NL], xps[r % 64], outp, 1, TH)
            t0 = time.perf_counter(); f(); t1 = time.perf_counter()
            f(); t2 = time.perf_counter()
            res[k].append(t1 - t0); warm[k].append(t2 - t1)
for k in ops:
    print(f"{k:12} after a big call: median {1e6*np.median(res[k]):6.1f} us  mean {1e6*np.mean(res[k]):6.1f};  warm {1e6*np.median(warm[k]):5.1f}")
