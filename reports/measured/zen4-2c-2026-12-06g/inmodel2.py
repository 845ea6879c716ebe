# scratch: where in-model MoE decode time goes (block vs layer, with other work between calls)
import sys, time, statistics, torch, numpy as np
from colibri_bench import e2e
from colibri import hf
dt = sys.argv[1] if len(sys.argv) > 1 else "int4"
rounds = int(sys.argv[2]) if len(sys.argv) > 2 else 12
m = e2e.build_model("qwen3-30b-a3b", 4)
hf.patch(m, weight_dtype=dt, linear=True, handoff=None, check=False)
blocks = [l.mlp for l in m.model.layers]
qs = [l.self_attn.q_proj for l in m.model.layers]
H = 2048
xs = [torch.randn(1, 1, H, dtype=torch.bfloat16) for _ in range(64)]
xn = [x.float().numpy().reshape(1, H) for x in xs]
nb = e2e.decode_bytes(m, 128, 8)['moe'] / 4
lays = [b.layer for b in blocks]
def run(kind, n=120):
    tot = 0.0
    with torch.no_grad():
        for i in range(n):
            if kind == "between": qs[i % 4](xs[i % 64]); m.lm_head(xs[i%64]) if i % 4 == 0 else None
            t0 = time.perf_counter()
            if kind == "layer": lays[i % 4](xn[i % 64])
            else: blocks[i % 4](xs[i % 64])
            tot += time.perf_counter() - t0
    return tot / n
kinds = ["layer", "block", "between"]
res = {k: [] for k in kinds}
bws = [e2e.read_bw(2)]
for r in range(rounds):
    for k in kinds: res[k].append(run(k))
    bws.append(e2e.read_bw(2))
    print(f"round {r}: bw {bws[-2]:.1f}/{bws[-1]:.1f} " + "  ".join(f"{k} {res[k][-1]*1e3:.3f} ms ({100*nb/res[k][-1]/1e9/max(bws[-2:]):.0f}%)" for k in kinds), flush=True)
for k in kinds:
    p = [100*nb/t/1e9/max(bws[i], bws[i+1]) for i, t in enumerate(res[k])]
    fast = [p[i] for i in range(rounds) if min(bws[i], bws[i+1]) > 50]
    print(k, "median %", round(statistics.median(p)), "fast-window rounds", [round(v) for v in fast])
