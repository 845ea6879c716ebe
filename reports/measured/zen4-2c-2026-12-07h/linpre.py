# time each patched module kind against its original, interleaved, at 128 tokens, OLMoE shape bf16
import time, statistics, copy, sys, torch
from colibri_bench.e2e import build_model
from colibri import hf
torch.set_num_threads(2)
shape = sys.argv[1] if len(sys.argv) > 1 else "olmoe-1b-7b"
model = build_model(shape, 1).to(torch.bfloat16).eval()
orig = copy.deepcopy(model)
hf.patch(model, weight_dtype="bf16", linear=True, threads=2, handoff=None)
pm = dict(model.named_modules()); om = dict(orig.named_modules())
names = [n for n in pm if n.endswith(("q_proj", "o_proj", "mlp"))][:3]
H = model.config.hidden_size
for T in (128,):
    x = torch.randn(1, T, H, dtype=torch.bfloat16)
    res = {n: ([], []) for n in names}
    with torch.no_grad():
        for r in range(15):
            for n in names:
                for i, m in enumerate((om[n], pm[n])):
                    t0 = time.perf_counter(); m(x); res[n][i].append(time.perf_counter() - t0)
    for n, (a, b) in res.items():
        ra = sorted(x / y for x, y in zip(a, b))
        print(f"T={T} {n:40s} torch {1e3*statistics.median(a):8.3f} ms colibri {1e3*statistics.median(b):8.3f} ms  torch/colibri median {statistics.median(ra):.3f} [{ra[2]:.3f},{ra[-3]:.3f}]")
