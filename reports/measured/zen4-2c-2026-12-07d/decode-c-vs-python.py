# scratch: one OLMoE-shaped int4 layer set (4 layers, colibri.MoELayer), decode calls timed
# (a) inside C (colibri_bench_layers: the layer bench's loop), (b) from Python one by one,
# (c) through the hf block's forward path (bf16 in and out); median and mean of each
import sys, time, statistics, numpy as np, torch, colibri
from colibri._lib import ffi
LIB = sys.argv[1]; DT = sys.argv[2] if len(sys.argv) > 2 else "int4"
torch.set_num_threads(2)
E, H, I, K = 64, 2048, 1024, 8
rng = np.random.default_rng(0)
layers = []
for c in range(4):
    w = lambda *s: (rng.standard_normal(s, dtype=np.float32) * 0.02)
    layers.append(colibri.MoELayer(w(E, H), w(E, I, H), w(E, I, H), w(E, H, I), top_k=K, norm_topk_prob=False,
                                   weight_dtype=DT, threads=2, lib=LIB))
lib = layers[0]._lib
print("page kind", layers[0].page_kind, "weight bytes", layers[0].weight_bytes)
nb = {"int4": K * 3 * I * H * 0.5625, "int8": K * 3 * I * H * 1.0 + K * (2 * I + H) * 4, "bf16": K * 3 * I * H * 2.0}[DT] + E * H * 4
xs = rng.standard_normal((64, 1, H), dtype=np.float32)
ptrs = ffi.new("colibri_layer *[]", [L._live() for L in layers])
def c_bench(nl=4):
    out = np.empty((1, H), np.float32); s = np.empty(100000); n = ffi.new("int *")
    st = lib.colibri_bench_layers(ptrs, nl, ffi.from_buffer("float[]", xs), 64, 1, ffi.from_buffer("float[]", out), 2, nl, 0.5, len(s), ffi.from_buffer("double[]", s), n)
    assert st == 0
    return s[:n[0]]
def py_calls(n=400):
    ts = []
    for i in range(n):
        t0 = time.perf_counter(); layers[i % 4](xs[i % 64]); ts.append(time.perf_counter() - t0)
    return np.array(ts)
xb = torch.from_numpy(xs).to(torch.bfloat16)
def bf16_ptrs(n=400):
    ts = []
    for i in range(n):
        x = xb[i % 64]; out = torch.empty_like(x)
        t0 = time.perf_counter(); layers[i % 4]._forward_ptrs(x.data_ptr(), out.data_ptr(), 1, bf16=True); ts.append(time.perf_counter() - t0)
    return np.array(ts)
for r in range(int(sys.argv[3]) if len(sys.argv) > 3 else 3):
    for name, f in (("C loop", c_bench), ("C 1 layer", lambda: c_bench(1)), ("python", py_calls), ("bf16 ptrs", bf16_ptrs)):
        s = f()
        med, mean = np.median(s), s.mean()
        print(f"{name:9} n={len(s):4} median {1e3*med:.3f} ms ({nb/med/1e9:5.1f} GB/s)  mean {1e3*mean:.3f} ms ({nb/mean/1e9:5.1f} GB/s)  p90 {1e3*np.percentile(s,90):.3f}", flush=True)
