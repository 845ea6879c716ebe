# Scratch: in one patched model, rounds alternating A (main's forward, forward-hook clock) and
# B (the work tree's forward, forward-wrapping clock); the engine's own time beside both.
import sys, time, importlib.util, torch, colibri
from colibri import hf, layer as clayer
from colibri_bench import e2e
def load(name, path):
    spec = importlib.util.spec_from_file_location(name, path); spec.submodule_search_locations = None; m = importlib.util.module_from_spec(spec); m.__package__ = name.rpartition('.')[0] or None; sys.modules[name] = m; spec.loader.exec_module(m); return m
e2e_old = load("e2e_old", "/work/main/colibri_bench/e2e.py")
hf_old = load("colibri.hf_old", "/work/main/colibri/hf.py")
shape = sys.argv[1]; wdt = sys.argv[2]; rounds = int(sys.argv[3])
torch.set_num_threads(2)
sizes = e2e.SHAPES[shape][1]; vocab = sizes["vocab_size"]
m = e2e.build_model(shape, 4)
hf.patch(m, weight_dtype=wdt, linear=True, threads=2)
Block, Lin = hf.colibri_block_class(), hf.colibri_linear_class()
OB, OL = hf_old._module_class()
fwd = {"A": (OB.forward, OL.forward), "B": (Block.forward, Lin.forward)}
nb = e2e.decode_bytes(m, sizes["num_experts"], sizes["num_experts_per_tok"])
eng = {"t": 0.0}
orig = clayer.MoELayer._forward_ptrs
def timed(self, xa, oa, T, bf16=False):
    t0 = time.perf_counter(); orig(self, xa, oa, T, bf16=bf16)
    if T == 1: eng["t"] += time.perf_counter() - t0
clayer.MoELayer._forward_ptrs = timed
res = {"A": [], "B": []}
for r in range(rounds):
    for k in (("A", "B") if r % 2 == 0 else ("B", "A")):
        Block.forward, Lin.forward = fwd[k]
        clock = (e2e_old if k == "A" else e2e).PartClock(m)
        e2e.time_generate(m, clock, 128, 2, vocab)
        b0 = e2e.read_bw(2); eng["t"] = 0.0
        row = e2e.time_generate(m, clock, 128, 16, vocab)
        b1 = e2e.read_bw(2); clock.remove()
        bw = max(b0, b1); steps = 15
        part = row["moe_decode_ms_per_token"]; en = 1e3 * eng["t"] / steps
        res[k].append((part, en, bw, row["decode_ms_per_token"], row["attn_proj_decode_ms_per_token"]))
        print(f"{k} round {r}: read {b0:.1f}/{b1:.1f}; step {row['decode_ms_per_token']:.2f} ms; MoE part {part:.3f} ms "
              f"({100*nb['moe']/part/1e6/bw:.0f}%), engine {en:.3f} ms ({100*nb['moe']/en/1e6/bw:.0f}%), gap {1e3*(part-en)/4:.1f} us/call; "
              f"attn {row['attn_proj_decode_ms_per_token']:.2f} ms", flush=True)
import statistics as st
for k in res:
    print(k, "median gap us/call", f"{st.median(1e3*(p-e)/4 for p,e,*_ in res[k]):.1f}", "MoE part % of bw",
          f"{st.median(100*nb['moe']/p/1e6/b for p,e,b,*_ in res[k]):.1f}", "engine %", f"{st.median(100*nb['moe']/e/1e6/b for p,e,b,*_ in res[k]):.1f}",
          "step ms", f"{st.median(x[3] for x in res[k]):.2f}", "attn ms", f"{st.median(x[4] for x in res[k]):.2f}")
