# Scratch: in the model, the MoE blocks' hook time against the time inside their engine call.
import sys, time, statistics, torch
from colibri import hf, layer as clayer
from colibri_bench import e2e
shape = sys.argv[1] if len(sys.argv) > 1 else "qwen3-30b-a3b"
wdt = sys.argv[2] if len(sys.argv) > 2 else "int4"
rounds = int(sys.argv[3]) if len(sys.argv) > 3 else 6
torch.set_num_threads(2)
sizes = e2e.SHAPES[shape][1]
m = e2e.build_model(shape, 4)
hf.patch(m, weight_dtype=wdt, linear=True, threads=2)
clock = e2e.PartClock(m)
nb = e2e.decode_bytes(m, sizes["num_experts"], sizes["num_experts_per_tok"])
eng = {"t": 0.0, "n": 0}
orig = clayer.MoELayer._forward_ptrs
def timed(self, xa, oa, T, bf16=False):
    t0 = time.perf_counter(); orig(self, xa, oa, T, bf16=bf16); dt = time.perf_counter() - t0
    if T == 1: eng["t"] += dt; eng["n"] += 1
clayer.MoELayer._forward_ptrs = timed

vocab = sizes["vocab_size"]
e2e.time_generate(m, clock, 128, 2, vocab)
print(f"{shape} {wdt}: MoE decode bytes/token {nb['moe']/1e6:.1f} MB")
for r in range(rounds):
    b0 = e2e.read_bw(2)
    eng.update(t=0.0, n=0)
    row = e2e.time_generate(m, clock, 128, 16, vocab)
    b1 = e2e.read_bw(2)
    steps = 15
    hook_ms = row["moe_decode_ms_per_token"]; eng_ms = 1e3 * eng["t"] / steps
    bw = max(b0, b1)
    print(f"round {r}: read {b0:.1f}/{b1:.1f} GB/s; decode {row['decode_tok_s']:.1f} tok/s ({row['decode_ms_per_token']:.2f} ms); "
          f"MoE hook {hook_ms:.3f} ms/token = {nb['moe']/hook_ms/1e6:.1f} GB/s ({100*nb['moe']/hook_ms/1e6/bw:.0f}%); "
          f"engine {eng_ms:.3f} ms = {nb['moe']/eng_ms/1e6:.1f} GB/s ({100*nb['moe']/eng_ms/1e6/bw:.0f}%); calls {eng['n']}; "
          f"attn {row['attn_proj_decode_ms_per_token']:.2f} lm_head {row['lm_head_decode_ms_per_token']:.2f}", flush=True)
