# Scratch scripts, run by hand on 2026-12-07 (README.md): an OLMoE-shaped layer set (4
# layers, colibri.MoELayer, random weights) and its decode calls, two ways.
#   python decode-timing.py trace LIB        each thread's entry into a decode call's
#       parallel regions, the items it claimed and when it finished, by what ran between
#       calls (LIB: a scratch build of kernels/layer.c with colibri_trace_* timestamps, not
#       committed)
#   python decode-timing.py c-vs-python LIB [DTYPE [ROUNDS]]   the same calls timed inside C
#       (colibri_bench_layers, the four layers in turn, and one alone), from Python one by
#       one, and through the bf16 entry; median and mean of each
import ctypes, sys, time, numpy as np, torch, colibri
from colibri._lib import ffi

E, H, I, K = 64, 2048, 1024, 8


def layers(lib, dtype):
    torch.set_num_threads(2)
    rng = np.random.default_rng(0)
    w = lambda *s: (rng.standard_normal(s, dtype=np.float32) * 0.02)
    return [colibri.MoELayer(w(E, H), w(E, I, H), w(E, I, H), w(E, H, I), top_k=K, norm_topk_prob=False,
                             weight_dtype=dtype, threads=2, lib=lib) for _ in range(4)]


def call_bytes(dtype):
    per = {"int4": K * 3 * I * H * 0.5625, "int8": K * 3 * I * H * 1.0 + K * (2 * I + H) * 4, "bf16": K * 3 * I * H * 2.0}
    return per[dtype] + E * H * 4


def trace(lib_path):
    Ls = layers(lib_path, "int4")
    cl = ctypes.CDLL(lib_path)
    cl.colibri_trace_get.argtypes = [ctypes.POINTER(ctypes.c_double), ctypes.POINTER(ctypes.c_long)]
    rng = np.random.default_rng(1)
    xs = [rng.standard_normal((1, H), dtype=np.float32) for _ in range(64)]
    a = torch.randn(128, 2048, dtype=torch.bfloat16); b = torch.randn(2048, 2048, dtype=torch.bfloat16)
    v = torch.randn(2048, dtype=torch.bfloat16); m = torch.randn(2048, 2048, dtype=torch.bfloat16)
    nb = call_bytes("int4")

    def mode(kind, n=200):
        ts = []
        cl.colibri_trace_reset()
        for i in range(n):
            if kind == "sleep": time.sleep(0.002)
            elif kind == "torch": (a @ b).sum()
            elif kind == "matvec":  # a decode's attention projections: small bf16 matvecs on torch's threads
                for _ in range(4): (m @ v)
            t0 = time.perf_counter(); Ls[i % 4](xs[i % 64]); ts.append(time.perf_counter() - t0)
        out = (ctypes.c_double * 48)(); calls = ctypes.c_long()
        cl.colibri_trace_get(out, ctypes.byref(calls))
        c = max(calls.value, 1)
        mm = (ctypes.c_double * 4)(); cl.colibri_trace_m(mm)
        print("   master: router joined %.1f, routed %.1f, jobs ready %.1f, items listed %.1f us" % tuple(1e6 * mm[k] / c for k in range(4)))
        return np.median(ts), [[out[t * 6 + k] / c for k in range(5)] for t in range(2)]

    for r in range(2):
        for k in ("b2b", "sleep", "torch", "matvec"):
            t, tr = mode(k)
            print(f"{k:7} {1e3*t:.3f} ms {nb/t/1e9:5.1f} GB/s | " + " | ".join(
                f"thr{i}: router in {1e6*x[0]:6.1f} us, decode in {1e6*x[1]:6.1f} us, items {x[2]:4.1f}+{x[3]:4.1f}, done {1e6*x[4]:6.1f} us"
                for i, x in enumerate(tr)), flush=True)


def c_vs_python(lib_path, dtype="int4", rounds=3):
    Ls = layers(lib_path, dtype)
    lib = Ls[0]._lib
    print("page kind", Ls[0].page_kind, "weight bytes", Ls[0].weight_bytes)
    nb = call_bytes(dtype)
    xs = np.random.default_rng(1).standard_normal((64, 1, H), dtype=np.float32)
    ptrs = ffi.new("colibri_layer *[]", [L._live() for L in Ls])

    def c_loop(nl=4):
        out = np.empty((1, H), np.float32); s = np.empty(100000); n = ffi.new("int *")
        assert lib.colibri_bench_layers(ptrs, nl, ffi.from_buffer("float[]", xs), 64, 1, ffi.from_buffer("float[]", out),
                                        2, nl, 0.5, len(s), ffi.from_buffer("double[]", s), n) == 0
        return s[:n[0]]

    def py_calls(n=400):
        ts = []
        for i in range(n):
            t0 = time.perf_counter(); Ls[i % 4](xs[i % 64]); ts.append(time.perf_counter() - t0)
        return np.array(ts)

    xb = torch.from_numpy(xs).to(torch.bfloat16)

    def bf16_ptrs(n=400):
        ts = []
        for i in range(n):
            x = xb[i % 64]; out = torch.empty_like(x)
            t0 = time.perf_counter(); Ls[i % 4]._forward_ptrs(x.data_ptr(), out.data_ptr(), 1, bf16=True); ts.append(time.perf_counter() - t0)
        return np.array(ts)

    for r in range(rounds):
        for name, f in (("C loop", c_loop), ("C 1 layer", lambda: c_loop(1)), ("python", py_calls), ("bf16 ptrs", bf16_ptrs)):
            s = f()
            med, mean = np.median(s), s.mean()
            print(f"{name:9} n={len(s):4} median {1e3*med:.3f} ms ({nb/med/1e9:5.1f} GB/s)  mean {1e3*mean:.3f} ms "
                  f"({nb/mean/1e9:5.1f} GB/s)  p90 {1e3*np.percentile(s,90):.3f}", flush=True)


if __name__ == "__main__":
    if sys.argv[1] == "trace":
        trace(sys.argv[2])
    else:
        c_vs_python(sys.argv[2], *(sys.argv[3:4] or ["int4"]), *[int(a) for a in sys.argv[4:5]])
