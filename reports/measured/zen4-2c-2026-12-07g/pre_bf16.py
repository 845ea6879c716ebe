# Scratch: an OLMoE-shaped bf16 layer's prefill (128 tokens, 4 layers in turn) from f32 rows and from bf16 rows.
import sys, time, statistics, numpy as np, torch, colibri
from colibri._lib import ffi
E, H, I, K = [int(v) for v in (sys.argv[1] if len(sys.argv) > 1 else "64,2048,1024,8").split(",")]
DT = sys.argv[2] if len(sys.argv) > 2 else "bf16"; T = int(sys.argv[3]) if len(sys.argv) > 3 else 128; TH = 2; NL = 4
torch.set_num_threads(TH)
rng = np.random.default_rng(0); w = lambda *s: rng.standard_normal(s, dtype=np.float32) * 0.02
Ls = [colibri.MoELayer(w(E, H), w(E, I, H), w(E, I, H), w(E, H, I), top_k=K, weight_dtype=DT, threads=TH) for _ in range(NL)]
xs = [np.random.default_rng(i).standard_normal((T, H), dtype=np.float32) for i in range(NL)]
xb = [torch.from_numpy(x).to(torch.bfloat16) for x in xs]
of = np.empty((T, H), np.float32); ob = torch.empty(T, H, dtype=torch.bfloat16)
modes = {"f32 rows": lambda i: Ls[i]._forward_ptrs(xs[i].ctypes.data, of.ctypes.data, T),
         "bf16 rows": lambda i: Ls[i]._forward_ptrs(xb[i].data_ptr(), ob.data_ptr(), T, bf16=True)}
res = {k: [] for k in modes}
for r in range(12):
    for k in (list(modes) if r % 2 == 0 else list(modes)[::-1]):
        ts = []
        for rep in range(3):
            for i in range(NL):
                t0 = time.perf_counter(); modes[k](i); ts.append(time.perf_counter() - t0)
        res[k].append(statistics.median(ts))
for k in modes:
    print(f"{DT} E={E} H={H} I={I} K={K} T={T}: {k:10} median {1e3*statistics.median(res[k]):.2f} ms/call  rounds {[round(1e3*x,1) for x in res[k]]}")
a, b = res["f32 rows"], res["bf16 rows"]
print("bf16 rows / f32 rows time, median of rounds:", round(statistics.median(y / x for x, y in zip(a, b)), 3))
