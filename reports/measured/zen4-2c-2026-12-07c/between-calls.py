# A scratch script, run by hand on 2026-12-07 (README.md): python between-calls.py
# scratch: an OLMoE-shaped int4 MoE layer's decode call timed back to back, after a 2 ms sleep, and after torch work
import time, numpy as np, torch, colibri
torch.set_num_threads(2)
E, H, I, K = 64, 2048, 1024, 8
rng = np.random.default_rng(0)
layers = []
for c in range(4):
    w = lambda *s: (rng.standard_normal(s, dtype=np.float32) * 0.02)
    layers.append(colibri.MoELayer(w(E, H), w(E, I, H), w(E, I, H), w(E, H, I), top_k=K, norm_topk_prob=False, weight_dtype="int4", threads=2))
print("built", layers[0].page_kind)
xs = [rng.standard_normal((1, H), dtype=np.float32) for _ in range(64)]
a = torch.randn(128, 2048, dtype=torch.bfloat16); b = torch.randn(2048, 2048, dtype=torch.bfloat16)
nbytes = K * 3 * I * H * 0.5625 + E * H * 4
def mode(kind, n=120):
    ts = []
    for i in range(n):
        if kind == "sleep": time.sleep(0.002)
        elif kind == "torch": (a @ b).sum()
        L = layers[i % 4]; x = xs[i % 64]
        t0 = time.perf_counter(); L(x); ts.append(time.perf_counter() - t0)
    return np.median(ts)
res = {k: [] for k in ("b2b", "sleep", "torch")}
for r in range(6):
    for k in (list(res) if r % 2 == 0 else list(res)[::-1]):
        res[k].append(mode(k))
for k, v in res.items():
    print(k, "median ms %.3f" % (1e3 * np.median(v)), "GB/s %.1f" % (nbytes / np.median(v) / 1e9), ["%.3f" % (1e3 * t) for t in v])
