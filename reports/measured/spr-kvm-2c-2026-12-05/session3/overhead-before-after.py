"""Per-call cost of the Python wrappers around one tiny MoE layer and one tiny Linear:
median seconds of the hf module's forward (torch in/out), of MoELayer.__call__ (numpy
in/out), and of the engine call alone (colibri_layer_forward through cffi with buffers
made once), interleaved, 1 thread."""
import time, numpy as np, torch, colibri
from colibri._lib import ffi
from colibri import hf

rng = np.random.default_rng(0)
E, H, I, k, T = 4, 64, 32, 2, 1
L = colibri.MoELayer(rng.standard_normal((E, H), np.float32), rng.standard_normal((E, I, H), np.float32),
                     rng.standard_normal((E, I, H), np.float32), rng.standard_normal((E, H, I), np.float32),
                     top_k=k, weight_dtype="f32", threads=1)
Block, Lin = hf.colibri_block_class(), hf.colibri_linear_class()
blk = Block(L, "tiny")
lin = colibri.Linear(rng.standard_normal((64, 64), np.float32), weight_dtype="f32", threads=1)
tl = Lin(lin, None, "tiny")
x = rng.standard_normal((T, H), np.float32); out = np.empty_like(x)
xt = torch.from_numpy(x.copy()).reshape(1, T, H)
px, po = ffi.from_buffer("float[]", x), ffi.from_buffer("float[]", out, require_writable=True)
ptr, lib = L._live(), L._lib
lptr, llib = lin._live(), lin._lib
lo = np.empty((T, 64), np.float32); plo = ffi.from_buffer("float[]", lo, require_writable=True)
fns = {"moe hf forward": lambda: blk(xt), "moe MoELayer()": lambda: L(x, out=out),
       "moe engine call": lambda: lib.colibri_layer_forward(ptr, px, po, T, 1),
       "linear hf forward": lambda: tl(xt), "linear Linear()": lambda: lin(x, out=lo),
       "linear engine call": lambda: llib.colibri_dense_forward(lptr, px, plo, T, 1)}
res = {n: [] for n in fns}
with torch.no_grad():
    for r in range(7):
        for n, f in fns.items():
            for _ in range(200): f()
            ts = []
            for _ in range(2000):
                t0 = time.perf_counter(); f(); ts.append(time.perf_counter() - t0)
            res[n].append(np.median(ts))
for n, v in res.items():
    print(f"{n:22} {np.median(v)*1e6:7.1f} us  (rounds {min(v)*1e6:.1f}-{max(v)*1e6:.1f})")
print(f"moe wrapper overhead (hf forward - engine call): {(np.median(res['moe hf forward']) - np.median(res['moe engine call']))*1e6:.1f} us")
print(f"linear wrapper overhead: {(np.median(res['linear hf forward']) - np.median(res['linear engine call']))*1e6:.1f} us")
