"""Where an in-model MoE decode call loses bandwidth against the layer bench: Qwen3's int4
(or another dtype's) tuner model file (6 copies of the layer), decode T=1 at 2 threads, timed
in rotating rounds four ways:
  c-loop    colibri_bench_layers: calls back to back in C (the layer bench's way)
  py-loop   the engine entry through cffi from a Python loop, one layer after another
  hf        the colibri.hf module on a bf16 torch tensor (as a patched model calls it)
  hf+torch  the same with a torch matmul on a 2048x2048 bf16 weight between calls (the rest
            of a model step touching other memory and torch's threads)
Prints us per call and GB/s over the decode bytes. Usage: python decode-call-cost.py [dtype]"""
import statistics
import sys
import time

import numpy as np
import torch

import colibri
from colibri import hf
from colibri._lib import ffi
from colibri_bench.bench import read_bandwidth
from tuner.measure.problems import problem

dtype = sys.argv[1] if len(sys.argv) > 1 else "int4"
p = problem(f"qwen3-30b-a3b/decode/{dtype}")
copies = {"f32": 1, "bf16": 2, "int8": 4, "int4g32": 6, "int4": 6}[dtype]
m = colibri.Model.load(f"build/tuner/weights/qwen3-30b-a3b-seed0/{dtype}-x{copies}.colibri", check_crc=False)
lib = m._lib
torch.set_num_threads(2)
n = m.n_layers
layers = [m._layer(i) for i in range(n)]
x = np.random.default_rng(0).standard_normal((16, 1, p.H), dtype=np.float32)
out = np.empty((1, p.H), np.float32)
px, po = ffi.from_buffer("float[]", x), ffi.from_buffer("float[]", out, require_writable=True)
xb = torch.from_numpy(x[:, 0, :]).to(torch.bfloat16)


class Shim:  # what the hf module needs of a MoELayer: its hidden size and _forward_ptrs
    def __init__(self, ptr):
        self.ptr, self.hidden = ptr, p.H

    def _forward_ptrs(self, xa, oa, T, bf16=False):
        f = lib.colibri_layer_forward_bf16 if bf16 else lib.colibri_layer_forward
        t = "uint16_t *" if bf16 else "float *"
        assert f(self.ptr, ffi.cast(t, xa), ffi.cast(t, oa), T, 2) == 0


mods = [hf.colibri_block_class()(Shim(L), f"layer {i}") for i, L in enumerate(layers)]
W = torch.randn(2048, 2048).to(torch.bfloat16)
v = torch.randn(1, 2048).to(torch.bfloat16)
CALLS = 240


def c_loop():
    arr = ffi.new("colibri_layer *[]", layers)
    s = ffi.new("double[]", CALLS)
    ns = ffi.new("int *")
    assert lib.colibri_bench_layers(arr, n, ffi.cast("float *", px), 16, 1, ffi.cast("float *", po), 2, n,
                                    60.0, CALLS, s, ns) == 0
    return statistics.median(s[i] for i in range(ns[0]))


def py_loop():
    ts = []
    for i in range(CALLS):
        t0 = time.perf_counter()
        lib.colibri_layer_forward(layers[i % n], ffi.cast("float *", px) + (i % 16) * p.H, ffi.cast("float *", po), 1, 2)
        ts.append(time.perf_counter() - t0)
    return statistics.median(ts)


def hf_loop(between=False):
    ts = []
    with torch.no_grad():
        for i in range(CALLS):
            if between:
                v @ W
            t0 = time.perf_counter()
            mods[i % n](xb[i % 16].view(1, 1, -1))
            ts.append(time.perf_counter() - t0)
    return statistics.median(ts)


ways = {"c-loop": c_loop, "py-loop": py_loop, "hf": hf_loop, "hf+torch": lambda: hf_loop(True)}
res = {k: [] for k in ways}
for r in range(5):
    keys = list(ways)[r % 4:] + list(ways)[:r % 4]
    for k in keys:
        res[k].append(ways[k]())
bw = read_bandwidth(lib, 2, 1 << 30)
print(f"qwen3 decode {dtype}, {n} layers, 2 threads; decode bytes {p.decode_bytes / 1e6:.1f} MB; read bw {bw:.1f} GB/s")
for k, v_ in res.items():
    s = statistics.median(v_)
    gbps = p.decode_bytes / s / 1e9
    print(f"{k:9} {s * 1e6:8.1f} us  {gbps:5.1f} GB/s  {100 * gbps / bw:4.0f}%   rounds {[round(t * 1e6) for t in v_]}")
