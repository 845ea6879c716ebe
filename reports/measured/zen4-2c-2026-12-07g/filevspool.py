# Scratch: the bench's Qwen3 int4 layer copies (model file, Mapped) against colibri.MoELayer copies of the
# same weights, and of random ones, called back to back inside C; each 0.15 s slice between its own readings.
import sys, time, statistics, numpy as np, colibri
from colibri._lib import ffi
from colibri_bench.bench import Mapped, read_bandwidth
from colibri_bench import windows
from tuner.measure.problems import Problem
W = "/work/exp/build/tuner/weights/qwen3-30b-a3b-seed0"
LIB = "/work/libs/base.so"; TH = 2; ROUNDS = int(sys.argv[1]) if len(sys.argv) > 1 else 20
E, H, I, K = 128, 2048, 768, 8
nb = Problem("", "decode", "int4", 1, H, I, E, K).decode_bytes
A = Mapped(W + "/int4-x3.colibri", LIB)
r, g, u, d = (np.load(f"{W}/{n}.f32.npy", mmap_mode="r") for n in ("router", "gate", "up", "down"))
B = [colibri.MoELayer(r, g, u, d, top_k=K, weight_dtype="int4", threads=TH, lib=LIB) for _ in range(3)]
rng = np.random.default_rng(0); w = lambda *s: rng.standard_normal(s, dtype=np.float32) * 0.02
C = [colibri.MoELayer(w(E, H), w(E, I, H), w(E, I, H), w(E, H, I), top_k=K, weight_dtype="int4", threads=TH, lib=LIB) for _ in range(3)]
lib = A.lib
print("kernels", A.model.layer_kernels(0), B[0].kernels, "pages", A.model.layer_page_kind(0), B[0].page_kind, flush=True)
ptrs = {"file (bench)": (A.ptrs, A.count), "pool, same weights": (ffi.new("colibri_layer *[]", [L._live() for L in B]), 3),
        "pool, random weights": (ffi.new("colibri_layer *[]", [L._live() for L in C]), 3)}
xs = np.random.default_rng(1).standard_normal((64, 1, H), dtype=np.float32)
def c_loop(p, n):
    out = np.empty((1, H), np.float32); s = np.empty(100000); k = ffi.new("int *")
    assert lib.colibri_bench_layers(p, n, ffi.from_buffer("float[]", xs), 64, 1, ffi.from_buffer("float[]", out),
                                    TH, n, 0.15, len(s), ffi.from_buffer("double[]", s), k) == 0
    return s[:k[0]]
res = {k: [] for k in ptrs}; around = {k: [] for k in ptrs}
keys = list(ptrs)
for rr in range(ROUNDS):
    for k in keys[rr % 3:] + keys[:rr % 3]:
        b0 = read_bandwidth(lib, TH, 1 << 30, 0.1); s = c_loop(*ptrs[k]); b1 = read_bandwidth(lib, TH, 1 << 30, 0.1)
        res[k].append(nb / np.median(s) / 1e9); around[k].append((b0, b1))
best = max(max(p) for v in around.values() for p in v)
for k in keys:
    wsum = windows.summary_of_pairs(res[k], around[k], best)
    print(f"{k:22} median call {statistics.median(res[k]):5.1f} GB/s; {windows.text(wsum)}; all {100*wsum['all']:.1f}% (best reading {best:.1f})")
