# Scratch (2026-12-07g): the same 4 Qwen3-shaped int4 layers' decode calls, by call path, each
# 0.15 s slice set against read-bandwidth readings right before and after it.
import sys, time, statistics, numpy as np, torch, colibri
from colibri._lib import ffi
from colibri import hf
from colibri_bench import windows
from colibri_bench.bench import read_bandwidth
from tuner.measure.problems import Problem

E, H, I, K = [int(v) for v in (sys.argv[1] if len(sys.argv) > 1 else "128,2048,768,8").split(",")]
DT = sys.argv[2] if len(sys.argv) > 2 else "int4"
ROUNDS = int(sys.argv[3]) if len(sys.argv) > 3 else 20
NL = 4
TH = 2
torch.set_num_threads(TH)
rng = np.random.default_rng(0)
Ls = []
for l in range(NL):
    w = lambda *s: (rng.standard_normal(s, dtype=np.float32) * 0.02)
    Ls.append(colibri.MoELayer(w(E, H), w(E, I, H), w(E, I, H), w(E, H, I), top_k=K, norm_topk_prob=True,
                               weight_dtype=DT, threads=TH))
lib = Ls[0]._lib
print("page kind", Ls[0].page_kind, "kernels", Ls[0].kernels, flush=True)
nb = Problem("", "decode", DT, 1, H, I, E, K).decode_bytes
Block = hf._module_class()[0]
blocks = [Block(L, "b") for L in Ls]
xs = np.random.default_rng(1).standard_normal((64, 1, H), dtype=np.float32)
xb = torch.from_numpy(xs).to(torch.bfloat16)
xb3 = xb.reshape(64, 1, 1, H)
ptrs = ffi.new("colibri_layer *[]", [L._live() for L in Ls])
SL = 0.15


def c_loop():
    out = np.empty((1, H), np.float32); s = np.empty(100000); n = ffi.new("int *")
    t0 = time.perf_counter()
    assert lib.colibri_bench_layers(ptrs, NL, ffi.from_buffer("float[]", xs), 64, 1, ffi.from_buffer("float[]", out),
                                    TH, NL, SL, len(s), ffi.from_buffer("double[]", s), n) == 0
    return s[:n[0]]


def py_loop(f):
    def run():
        ts = []; i = 0; t_end = time.perf_counter() + SL
        while True:
            t0 = time.perf_counter(); f(i); t1 = time.perf_counter(); ts.append(t1 - t0); i += 1
            if t1 >= t_end: break
        return np.array(ts)
    return run


outf = np.empty((1, H), np.float32)
outb = torch.empty(1, H, dtype=torch.bfloat16)
xps = [ffi.cast("float *", xs[j].ctypes.data) for j in range(64)]
outp = ffi.cast("float *", outf.ctypes.data)
raw = [L._live() for L in Ls]


def total_loop(f):
    def run():
        n = 0; t0 = time.perf_counter(); t_end = t0 + SL
        while True:
            for _ in range(8):
                f(n); n += 1
            t1 = time.perf_counter()
            if t1 >= t_end: break
        return np.full(n, (t1 - t0) / n)
    return run


modes = {
    "C loop": c_loop,
    "cffi raw": py_loop(lambda i: lib.colibri_layer_forward(raw[i % NL], xps[i % 64], outp, 1, TH)),
    "cffi total": total_loop(lambda i: lib.colibri_layer_forward(raw[i % NL], xps[i % 64], outp, 1, TH)),
    "module total": total_loop(lambda i: blocks[i % NL].forward(xb3[i % 64])),
    "ptrs f32": py_loop(lambda i: Ls[i % NL]._forward_ptrs(xs[i % 64].ctypes.data, outf.ctypes.data, 1)),
    "ptrs bf16": py_loop(lambda i: Ls[i % NL]._forward_ptrs(xb[i % 64].data_ptr(), outb.data_ptr(), 1, bf16=True)),
    "module bf16": py_loop(lambda i: blocks[i % NL].forward(xb3[i % 64])),
}
with torch.no_grad():
    for m in modes.values(): m()
    rows = {k: {"mean": [], "median": []} for k in modes}
    bws = {k: [] for k in modes}
    keys = list(modes)
    for r in range(ROUNDS):
        order = keys[r % len(keys):] + keys[:r % len(keys)]
        for k in order:
            b0 = read_bandwidth(lib, TH, 1 << 30, 0.1)
            s = modes[k]()
            b1 = read_bandwidth(lib, TH, 1 << 30, 0.1)
            rows[k]["mean"].append(nb / s.mean() / 1e9); rows[k]["median"].append(nb / np.median(s) / 1e9)
            bws[k].append((b0, b1))
    best = max(max(a, b) for v in bws.values() for a, b in v)
    print(f"{DT} E={E} H={H} I={I} K={K}, {TH} threads, {ROUNDS} rounds, best reading {best:.1f} GB/s, bytes/call {nb/1e6:.1f} MB")
    for k in keys:
        for stat in ("mean", "median"):
            g = rows[k][stat]
            # windows.summary wants a chain of readings; give each slice its own pair
            fast = [x / max(a, b) for x, (a, b) in zip(g, bws[k]) if min(a, b) >= windows.FAST * best]
            slow = [x / max(a, b) for x, (a, b) in zip(g, bws[k]) if max(a, b) < windows.SLOW * best]
            allr = [x / max(a, b) for x, (a, b) in zip(g, bws[k])]
            f = lambda v: f"{100*statistics.median(v):5.1f}% (n={len(v)})" if v else "   -"
            print(f"{k:12} {stat:6} GB/s median {statistics.median(g):5.1f}  all {f(allr)}  fast {f(fast)}  slow {f(slow)}")
