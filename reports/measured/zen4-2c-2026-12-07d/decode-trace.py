# scratch: per-thread entry delays and item shares of an int4 OLMoE-shaped layer's decode, by what runs between calls
import ctypes, sys, time, numpy as np, torch, colibri
LIB = sys.argv[1]
torch.set_num_threads(2)
E, H, I, K = 64, 2048, 1024, 8
rng = np.random.default_rng(0)
layers = []
for c in range(4):
    w = lambda *s: (rng.standard_normal(s, dtype=np.float32) * 0.02)
    layers.append(colibri.MoELayer(w(E, H), w(E, I, H), w(E, I, H), w(E, H, I), top_k=K, norm_topk_prob=False,
                                   weight_dtype="int4", threads=2, lib=LIB))
cl = ctypes.CDLL(LIB)
cl.colibri_trace_get.argtypes = [ctypes.POINTER(ctypes.c_double), ctypes.POINTER(ctypes.c_long)]
xs = [rng.standard_normal((1, H), dtype=np.float32) for _ in range(64)]
a = torch.randn(128, 2048, dtype=torch.bfloat16); b = torch.randn(2048, 2048, dtype=torch.bfloat16)
v = torch.randn(2048, dtype=torch.bfloat16); m = torch.randn(2048, 2048, dtype=torch.bfloat16)
nbytes = K * 3 * I * H * 0.5625 + E * H * 4
def mode(kind, n=200):
    ts = []
    cl.colibri_trace_reset()
    for i in range(n):
        if kind == "sleep": time.sleep(0.002)
        elif kind == "torch": (a @ b).sum()
        elif kind == "matvec":  # a decode's attention projections: small bf16 matvecs on torch's threads
            for _ in range(4): (m @ v)
        L = layers[i % 4]; x = xs[i % 64]
        t0 = time.perf_counter(); L(x); ts.append(time.perf_counter() - t0)
    out = (ctypes.c_double * 48)(); calls = ctypes.c_long()
    cl.colibri_trace_get(out, ctypes.byref(calls))
    c = max(calls.value, 1)
    tr = [[out[t * 6 + k] / c for k in range(5)] for t in range(2)]
    mm = (ctypes.c_double * 4)(); cl.colibri_trace_m(mm)
    print("   master: router joined %.1f, routed %.1f, jobs ready %.1f, items listed %.1f us" % tuple(1e6 * mm[k] / c for k in range(4)))
    return np.median(ts), tr
for r in range(2):
    for k in ("b2b", "sleep", "torch", "matvec"):
        t, tr = mode(k)
        print(f"{k:7} {1e3*t:.3f} ms {nbytes/t/1e9:5.1f} GB/s | " + " | ".join(
            f"thr{i}: router in {1e6*x[0]:6.1f} us, decode in {1e6*x[1]:6.1f} us, items {x[2]:4.1f}+{x[3]:4.1f}, done {1e6*x[4]:6.1f} us" for i, x in enumerate(tr)), flush=True)
