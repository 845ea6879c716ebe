"""python -m colibri_bench e2e: whole transformers models, patched (colibri.hf) against
unpatched, end to end: prefill and decode tokens/s of generate(), and the time spent inside
the MoE blocks, attention projections and lm_head (each one's forward timed), on random-init models with
real shapes (no download).

    python -m colibri_bench e2e [--shape qwen3-30b-a3b|olmoe-1b-7b] [--layers 4]
                                [--variant moe:bf16 --variant all:int4 ...] [--prompt-tokens 128]
                                [--new-tokens 16] [--rounds 3] [--prefill-repeats 3] [--threads 2]
                                [--peer llama.cpp] [--handoff auto|off|N] [--out FILE]

The model is built in bf16 with the shape's real hidden, expert, attention and vocabulary
sizes and `--layers` decoder layers. For each variant (moe:DTYPE, the MoE blocks on
Colibri in DTYPE; all:DTYPE, with linear=True every projection and lm_head too) a second
model (same seed) is patched, and the two run interleaved, `--rounds` rounds each (the order alternating), so
slow phases of a shared machine fall on both; the table gives medians and [min, max] of
the patched/unpatched ratios. A round's prefill figures are the median of
`--prefill-repeats` prefills (the run's own, then generates of one new token). A second table splits a decode step by part (the MoE blocks,
the attention projections, lm_head, and the rest), so a speed-up can be read against where
the time goes; a third gives each part's decode GB/s (the weight bytes a token reads there
over its time) and its % of the read bandwidth measured between rounds (issue 31's 85%;
the JSON also splits it into fast and slow windows, judged against the run's best reading),
and beside the patched MoE blocks' figure, the same blocks called back to back outside the
model right after each patched run (one fresh token a call, as the layer bench times a
layer): what the blocks read without the rest of the step between their calls, in the same
window of the machine, by their total time and by their median call (the layer bench's
statistic, which a few slow calls do not move).
With --peer llama.cpp, each variant also runs the same model through llama.cpp
(colibri_bench/peers/llamacpp.py: a GGUF file in the variant's weight type, bf16, q8_0 for
int8 or q4_0 for int4, run by llama-cpp-python) in the same rounds, checked first against
transformers' logits. --handoff is patch()'s (colibri.hf: which calls go to the original
module; auto, the default, times both at patch time); each variant's JSON lists every
module's threshold. The JSON goes to reports/<host-id>/e2e.json beside bench.json.
"""
from __future__ import annotations

import datetime
import gc
import json
import statistics
import sys
import time
from pathlib import Path

import numpy as np

from colibri import _cli
from colibri_bench import windows

SHAPES = {
    # Qwen3-30B-A3B's config.json sizes; the number of layers is the run's
    "qwen3-30b-a3b": ("Qwen3MoeConfig", dict(
        vocab_size=151936, hidden_size=2048, intermediate_size=6144, moe_intermediate_size=768,
        num_experts=128, num_experts_per_tok=8, norm_topk_prob=True, num_attention_heads=32,
        num_key_value_heads=4, head_dim=128, max_position_embeddings=4096, tie_word_embeddings=False)),
    # OLMoE-1B-7B's
    "olmoe-1b-7b": ("OlmoeConfig", dict(
        vocab_size=50304, hidden_size=2048, intermediate_size=1024, num_experts=64,
        num_experts_per_tok=8, norm_topk_prob=False, num_attention_heads=16, num_key_value_heads=16,
        max_position_embeddings=4096, tie_word_embeddings=False)),
    # a small one for the test suite
    "tiny": ("Qwen3MoeConfig", dict(
        vocab_size=512, hidden_size=128, intermediate_size=256, moe_intermediate_size=64,
        num_experts=8, num_experts_per_tok=2, norm_topk_prob=True, num_attention_heads=4,
        num_key_value_heads=2, head_dim=32, max_position_embeddings=512, tie_word_embeddings=False)),
}


VARIANTS = [f"{scope}:{dt}" for scope in ("moe", "all") for dt in ("f32", "bf16", "int8", "int4", "int4g32")]


def build_model(shape: str, layers: int, seed: int = 0):
    import torch
    import transformers

    cls, sizes = SHAPES[shape]
    config = getattr(transformers, cls)(**sizes, num_hidden_layers=layers)
    torch.manual_seed(seed)
    prev = torch.get_default_dtype()
    torch.set_default_dtype(torch.bfloat16)  # built in bf16: no float32 copy of the weights
    try:
        model = transformers.AutoModelForCausalLM.from_config(config)
    finally:
        torch.set_default_dtype(prev)
    model.generation_config.eos_token_id = None  # every run generates all it is asked for
    return model.eval()


def _rss() -> int:
    import psutil

    return psutil.Process().memory_info().rss


# the parts of a model whose time PartClock measures: what Colibri replaces (the MoE blocks,
# and with linear=True the attention projections and lm_head); the rest of a step (attention
# itself, norms, embedding, sampling, Python) is the step's time minus these
PARTS = ("moe", "attn_proj", "lm_head")
PART_NAMES = {"moe": "MoE blocks", "attn_proj": "attention projections", "lm_head": "lm_head"}
# the patched MoE blocks timed alone (time_moe_alone): by the total, and by the median call
ALONE = ("moe_alone", "moe_alone_median")
_ATTN_PROJ = ("q_proj", "k_proj", "v_proj", "o_proj")


def part_of(name: str, mod) -> str | None:
    """Which of PARTS the module named `name` is, or None."""
    from colibri import hf

    if hf._looks_like_moe(mod) or isinstance(mod, hf.colibri_block_class()):
        return "moe"
    if name == "lm_head":
        return "lm_head"
    parent, _, leaf = name.rpartition(".")
    if leaf in _ATTN_PROJ and parent.endswith("attn"):
        return "attn_proj"
    return None


class PartClock:
    """Seconds spent inside each of PARTS, split into prefill (calls on more than one token)
    and decode (one token) calls: each part module's forward is wrapped (an instance
    attribute; remove() restores the module). Not forward hooks: they put every call of a
    module on nn.Module's slow path, whose hook dispatch runs on the cold caches that a
    streamed call leaves, a cost of the measurement and not of the model (docs/whole-models.md,
    "the parts timed by their forward")."""

    def __init__(self, model):
        self.prefill, self.decode = {}, {}
        self._wrapped = []
        self.reset()
        for name, mod in model.named_modules():
            part = part_of(name, mod) if name else None
            if part:
                self._wrapped.append((mod, mod.__dict__.get("forward")))
                mod.forward = self._timed(part, mod.forward)

    def _timed(self, part, forward):
        clock = time.perf_counter

        def timed(x, *args, **kwargs):
            t0 = clock()
            out = forward(x, *args, **kwargs)
            dt = clock() - t0
            tokens = x.shape[0] * x.shape[1] if x.dim() == 3 else x.shape[0]
            (self.prefill if tokens > 1 else self.decode)[part] += dt
            return out

        return timed

    def reset(self):
        self.prefill = dict.fromkeys(PARTS, 0.0)
        self.decode = dict.fromkeys(PARTS, 0.0)

    def remove(self):
        for mod, own in self._wrapped:
            if own is None:
                del mod.forward
            else:
                mod.forward = own
        self._wrapped = []


def decode_bytes(model, n_experts: int, top_k: int) -> dict[str, int]:
    """Weight bytes one decode token reads in each of PARTS: a MoE block its router, its
    shared expert and top_k of its n_experts routed experts (in its weight dtype on
    Colibri, scales included), a projection or lm_head all of its weight."""
    from colibri import hf
    from tuner.measure.problems import Problem

    out = dict.fromkeys(PARTS, 0)
    for name, mod in model.named_modules():
        part = part_of(name, mod) if name else None
        if part is None:
            continue
        if isinstance(mod, hf.colibri_block_class()):
            L = mod.layer
            out[part] += Problem("", "decode", L.weight_dtype, 1, L.hidden, L.inter, L.n_experts, L.top_k,
                                 S=L.shared_inter).decode_bytes
        elif isinstance(mod, hf.colibri_linear_class()):
            out[part] += mod.lin.weight_bytes
        else:  # torch's: a block reads its routed experts' share of their tensors
            for pname, prm in mod.named_parameters():
                b = prm.numel() * prm.element_size()
                out[part] += b * top_k // n_experts if pname.split(".")[0] == "experts" else b
    return out


def read_bw(threads: int) -> float | None:
    """Read bandwidth (GB/s) at `threads`, as the layer bench measures it."""
    from colibri import open_library
    from colibri_bench.bench import read_bandwidth
    from tuner.host.bandwidth import _llc_total_here, working_set_bytes

    return read_bandwidth(open_library(), threads, working_set_bytes(_llc_total_here())[0], min_seconds=0.15)


def part_bandwidth(nbytes: dict, ms_per_token: dict, bw: float | None, rounds: list[dict] | None = None,
                   around: list | None = None, parts=PARTS, best: float | None = None) -> dict:
    """{part: {bytes, gbps, pct_bw, pct_bw_paired, windows}} of a decode step: each part's
    weight bytes over its time; pct_bw against the median read bandwidth of the run,
    pct_bw_paired the median over rounds of each round's GB/s against the better of the two
    bandwidth readings around that round (around[r]: right before it and right after it): a
    window that changes between rounds then moves both sides of the ratio; windows:
    colibri_bench/windows.py's summary (the fast and the slow windows' shares apart, judged
    against `best`, the variant's best reading; judge_windows judges them again against the
    whole run's)."""
    out = {}
    for part in parts:
        key = f"{part}_decode_ms_per_token"
        ms = ms_per_token[key]
        gbps = nbytes[part] / (ms * 1e-3) / 1e9 if ms > 0 and nbytes[part] else None
        win = round_windows(nbytes[part], key, rounds, around, best)
        out[part] = {"bytes": nbytes[part], "gbps": gbps,
                     "pct_bw": 100.0 * gbps / bw if gbps is not None and bw else None,
                     "pct_bw_paired": 100.0 * win["all"] if win else None, "windows": win}
    return out


def round_windows(nbytes: int, key: str, rounds: list[dict] | None, around: list | None,
                  best: float | None) -> dict | None:
    """windows.summary_of_pairs of a part's GB/s per round (nbytes over each round's `key`
    ms) against the readings around each round, judged against `best` (None where there
    are no rounds or readings)."""
    if not (rounds and around and nbytes and len(around) >= len(rounds)):
        return None
    return windows.summary_of_pairs([nbytes / (row[key] * 1e-3) / 1e9 if row[key] > 0 else None for row in rounds],
                                    around, best)


def judge_windows(results: dict) -> None:
    """Every variant's fast and slow windows judged again against the best reading of the
    whole run: against its own best, a variant whose rounds all fell in a slow window would
    call them fast."""
    readings = [x for r in results.values()
                for x in r["read_bw_rounds"] + [y for v in r["read_bw_around"].values() for p in v for y in p] if x]
    if not readings:
        return
    best = max(readings)
    for r in results.values():
        bws, around, rounds = r["read_bw_rounds"], r["read_bw_around"], r["rounds"]
        pairs = {"unpatched": (rounds["unpatched"], list(zip(bws, bws[1:]))),
                 "patched": (rounds["patched"], around["patched"]),
                 "patched_moe_alone": (rounds["patched"], around["alone"])}
        for side, cells in r["decode_bandwidth"].items():
            for part, cell in (cells or {}).items():
                cell["windows"] = round_windows(cell["bytes"], f"{part}_decode_ms_per_token", *pairs[side], best)


def prompt_logits(model, ids) -> np.ndarray:
    """The model's logits for the last prompt token (float32 [vocab])."""
    import torch

    with torch.no_grad():
        return model(ids).logits[0, -1].float().numpy()


def rel_err(got: np.ndarray, want: np.ndarray) -> float:
    return float(np.linalg.norm(got - want) / np.linalg.norm(want))


def prompt_ids(prompt_tokens: int, vocab: int):
    """The prompt every run times: random token ids [1, prompt_tokens], the same each time."""
    import torch

    return torch.randint(0, vocab, (1, prompt_tokens), generator=torch.Generator().manual_seed(1))


def time_generate(model, clock: PartClock, prompt_tokens: int, new_tokens: int, vocab: int) -> dict:
    """One greedy generate(): prefill seconds (to the first new token), decode tokens/s, and
    the seconds inside each of PARTS: the MoE blocks' per phase, every part's per decode token
    (a part the model lacks reads 0). With new_tokens 1 the prefill's figures only."""
    import torch

    times = []

    class Stamp:
        def put(self, value):
            times.append(time.perf_counter())

        def end(self):
            pass

    ids = prompt_ids(prompt_tokens, vocab)
    clock.reset()
    start = time.perf_counter()
    with torch.no_grad():
        model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=new_tokens,
                       min_new_tokens=new_tokens, do_sample=False, streamer=Stamp(), pad_token_id=0)
    prefill = times[1] - start
    out = {"prefill_s": prefill, "prefill_tok_s": prompt_tokens / prefill, "moe_prefill_s": clock.prefill["moe"]}
    decode = times[-1] - times[1]
    steps = len(times) - 2
    if steps:
        out.update({"decode_tok_s": steps / decode, "decode_ms_per_token": 1e3 * decode / steps,
                    **{f"{part}_decode_ms_per_token": 1e3 * clock.decode[part] / steps for part in PARTS}})
    return out


def prefill_again(run_one, row: dict, repeats: int, prompt_tokens: int) -> None:
    """Times run_one's prefill (run_one(1): a generate of one new token) repeats - 1 more
    times and sets row's prefill figures to the median over those and row's own: one
    128-token prefill is a fraction of a second, and single samples of it moved by half or
    more from round to round (docs/whole-models.md, Zen 4, 2026-12-07h). The samples stay in row."""
    more = [run_one(1) for _ in range(repeats - 1)]
    for key in ("prefill_s", "moe_prefill_s"):
        if key in row:
            row[f"{key[:-2]}_samples_s"] = [row[key]] + [m[key] for m in more]
            row[key] = statistics.median(row[f"{key[:-2]}_samples_s"])
    row["prefill_tok_s"] = prompt_tokens / row["prefill_s"]


def time_moe_alone(model, steps: int, seed: int = 2) -> dict | None:
    """ms per decode token of the model's Colibri MoE blocks called one after another outside
    the model, `steps` tokens' worth (each block once a token, a fresh random token each call
    so that its experts come from memory as in a decode), through the blocks' own forward: from
    the total time (as the model's figures are), and from the median call times the blocks (as
    the layer bench reports a layer: a few slow calls do not move it); None where the model has
    none."""
    import torch

    from colibri import hf

    blocks = [m for m in model.modules() if isinstance(m, hf.colibri_block_class())]
    if not blocks:
        return None
    H = blocks[0].layer.hidden
    dtype = next(p.dtype for p in model.parameters())
    xs = torch.randn(64, 1, 1, H, generator=torch.Generator().manual_seed(seed)).to(dtype)
    ts = []
    with torch.no_grad():
        for i in range(steps):
            for j, b in enumerate(blocks):
                t0 = time.perf_counter()
                type(b).forward(b, xs[(i * len(blocks) + j) % 64])  # not PartClock's wrapper
                ts.append(time.perf_counter() - t0)
    return {"moe_alone_decode_ms_per_token": 1e3 * sum(ts) / steps,
            "moe_alone_median_decode_ms_per_token": 1e3 * statistics.median(ts) * len(blocks)}


def _summary(rows_a: list[dict], rows_b: list[dict]) -> dict:
    """Medians of each figure and of the per-round ratios patched/unpatched (speed-ups)."""
    med = lambda rows, k: statistics.median(r[k] for r in rows)
    figures = lambda rows: [k for k, v in rows[0].items() if not isinstance(v, list)]  # not the samples
    out = {"unpatched": {k: med(rows_a, k) for k in figures(rows_a)}, "patched": {k: med(rows_b, k) for k in figures(rows_b)}}
    speed = {"decode": lambda a, b: b["decode_tok_s"] / a["decode_tok_s"],
             "prefill": lambda a, b: b["prefill_tok_s"] / a["prefill_tok_s"],
             "moe_decode": lambda a, b: a["moe_decode_ms_per_token"] / b["moe_decode_ms_per_token"],
             "moe_prefill": lambda a, b: a["moe_prefill_s"] / b["moe_prefill_s"]}
    out["speedup"] = {}
    for k, f in speed.items():
        r = [f(a, b) for a, b in zip(rows_a, rows_b)]
        out["speedup"][k] = {"median": statistics.median(r), "min": min(r), "max": max(r)}
    return out


def run(args, say) -> dict:
    import torch

    from colibri import hf

    torch.set_num_threads(args.threads)
    sizes = SHAPES[args.shape][1]
    vocab = sizes["vocab_size"]
    say(f"building the {args.shape}-shaped model ({args.layers} layers, bf16, random init)")
    base = build_model(args.shape, args.layers)
    base_clock = PartClock(base)
    base_bytes = decode_bytes(base, sizes["num_experts"], sizes["num_experts_per_tok"])
    results = {}
    want = prompt_logits(base, prompt_ids(args.prompt_tokens, vocab))
    peer = _Peer(args, base, want, vocab, say) if args.peer else None
    try:
        for variant in args.variant:
            results[variant] = _run_variant(args, variant, base, base_clock, base_bytes, sizes, want, peer, say)
    finally:
        if peer:
            peer.cleanup()
    judge_windows(results)
    return results


class _Peer:
    """llama.cpp beside the bench (--peer llama.cpp): one GGUF file per weight type, written
    from the unpatched model when a variant first needs it, checked against its logits."""

    def __init__(self, args, base, want, vocab, say):
        import tempfile

        from colibri_build.paths import build_dir_default
        from colibri_bench.peers import llamacpp

        llamacpp._modules()  # a missing package is said before any model is written
        self.lc, self.args, self.base, self.say = llamacpp, args, base, say
        build_dir_default().mkdir(parents=True, exist_ok=True)
        self.dir = tempfile.TemporaryDirectory(prefix="gguf-", dir=build_dir_default())
        self.files, self.ids, self.want = {}, prompt_ids(args.prompt_tokens, vocab), want

    def model(self, wdt: str):
        """(the loaded peer of wdt's GGUF type, its facts for the JSON)."""
        qt = self.lc.PEER_TYPE[wdt]
        if qt not in self.files:
            t0 = time.perf_counter()
            self.files[qt] = (self.lc.write_gguf(self.base, Path(self.dir.name) / f"{self.args.shape}-{qt}.gguf",
                                                 qt, self.say), time.perf_counter() - t0)
        path, write_s = self.files[qt]
        m = self.lc.LlamaCppModel(path, self.args.threads, self.args.prompt_tokens + self.args.new_tokens + 8)
        got = m.prompt_logits(self.ids[0].tolist())
        err = rel_err(got, self.want)
        import llama_cpp

        return m, {"type": qt, "file_bytes": path.stat().st_size, "write_s": write_s, "logits_rel_err": err,
                   "package": f"llama-cpp-python {llama_cpp.__version__}"}

    def cleanup(self):
        self.dir.cleanup()


def _run_variant(args, variant, base, base_clock, base_bytes, sizes, want, peer, say) -> dict:
    """One variant: a second model patched, timed against the unpatched one (and the peer,
    where asked) in interleaved rounds, each round in another order."""
    from colibri import hf

    vocab = sizes["vocab_size"]
    scope, wdt = variant.split(":")
    say(f"building and patching a second model: {'MoE blocks' if scope == 'moe' else 'everything'} "
        f"on Colibri in {wdt}")
    patched = build_model(args.shape, args.layers)
    rss0 = _rss()
    t0 = time.perf_counter()
    n = hf.patch(patched, weight_dtype=wdt, linear=scope == "all", threads=args.threads, handoff=args.handoff)
    patch_s = time.perf_counter() - t0
    handoffs = hf.handoffs(patched)
    say(f"  patched {n} modules in {patch_s:.1f} s; {hf.handoff_summary(handoffs)}")
    gc.collect()
    rss1 = _rss()
    # the patched model's prompt logits against the unpatched model's (as the peer's are)
    err = rel_err(prompt_logits(patched, prompt_ids(args.prompt_tokens, vocab)), want)
    say(f"  patched: logits' relative error against the unpatched model {err:.3g}")
    clock = PartClock(patched)
    runs = [lambda new: time_generate(base, base_clock, args.prompt_tokens, new, vocab),
            lambda new: time_generate(patched, clock, args.prompt_tokens, new, vocab)]
    peer_model = peer_facts = None
    if peer:
        peer_model, peer_facts = peer.model(wdt)
        say(f"  llama.cpp peer: {peer_facts['type']}, logits' relative error against transformers "
            f"{peer_facts['logits_rel_err']:.3g}")
        runs.append(lambda new: peer_model.time_generate(peer.ids[0].tolist(), new))
    try:
        for run_one in runs:  # a warm-up of each (library load, page faults, first kernels)
            run_one(2)
        rows = [[] for _ in runs]
        bws = [read_bw(args.threads)]
        # readings right before and after each patched run (and its blocks alone): a round of
        # every run takes seconds, over which the memory's window can change
        around = {"patched": [], "alone": []}
        for r in range(args.rounds):
            for k in range(len(runs)):
                which = (k + r) % len(runs) if r % 2 == 0 else (r - k) % len(runs)
                if which == 1:
                    around["patched"].append([read_bw(args.threads)])
                rows[which].append(runs[which](args.new_tokens))
                if which == 1:
                    around["patched"][-1].append(read_bw(args.threads))
                prefill_again(runs[which], rows[which][-1], args.prefill_repeats, args.prompt_tokens)
                alone = time_moe_alone(patched, args.new_tokens - 1) if which == 1 else None
                if alone:  # the patched blocks alone, in the same window
                    rows[1][-1].update(alone)
                    around["alone"].append([around["patched"][-1][1], read_bw(args.threads)])
            say(f"  {variant} round {r + 1}/{args.rounds}: decode {rows[0][-1]['decode_tok_s']:.2f} -> "
                f"{rows[1][-1]['decode_tok_s']:.2f} tok/s, prefill {rows[0][-1]['prefill_tok_s']:.1f} -> "
                f"{rows[1][-1]['prefill_tok_s']:.1f} tok/s"
                + (f" (llama.cpp {rows[2][-1]['decode_tok_s']:.2f}, {rows[2][-1]['prefill_tok_s']:.1f})"
                   if peer else ""))
            bws.append(read_bw(args.threads))
    finally:
        if peer_model:
            peer_model.close()
    rows_a, rows_b = rows[0], rows[1]
    summary = _summary(rows_a, rows_b)
    bw = statistics.median(b for b in bws if b) if any(bws) else None
    best = max((b for b in bws + [x for v in around.values() for p in v for x in p] if b), default=None)
    nb = decode_bytes(patched, sizes["num_experts"], sizes["num_experts_per_tok"])
    # resident memory of the process (both models) before and after the patch: the
    # replaced modules' tensors go, Colibri's copies in wdt come
    out = {"modules": n, "patch_s": patch_s, "handoff": args.handoff, "handoffs": handoffs, "logits_rel_err": err, "rss_before_patch": rss0,
           "rss_after_patch": rss1, **summary,
           "read_bw_gbps": bw, "read_bw_rounds": bws, "read_bw_around": around,
           "decode_bandwidth": {"unpatched": part_bandwidth(base_bytes, summary["unpatched"], bw, rows_a,
                                                            list(zip(bws, bws[1:])), best=best),
                                "patched": part_bandwidth(nb, summary["patched"], bw, rows_b, around["patched"],
                                                          best=best),
                                "patched_moe_alone": part_bandwidth({p: nb["moe"] for p in ALONE}, summary["patched"], bw,
                                                                    rows_b, around["alone"], parts=ALONE, best=best)
                                if ALONE[0] + "_decode_ms_per_token" in summary["patched"] else None},
           "rounds": {"unpatched": rows_a, "patched": rows_b}}
    if peer:
        rows_c = rows[2]
        ratio = {k: [b[f"{k}_tok_s"] / c[f"{k}_tok_s"] for b, c in zip(rows_b, rows_c)]
                 for k in ("decode", "prefill")}
        out["llama.cpp"] = {**peer_facts, **{k: statistics.median(r[k] for r in rows_c) for k in figures(rows_c)},
                            "patched_over_peer": {k: {"median": statistics.median(v), "min": min(v), "max": max(v)}
                                                  for k, v in ratio.items()},
                            "rounds": rows_c}
    clock.remove()
    del patched, clock
    gc.collect()
    return out


def print_table(out: dict, stream=sys.stdout) -> None:
    print(f"e2e {out['shape']}, {out['layers']} layers, bf16 model, {out['threads']} threads, "
          f"prompt {out['prompt_tokens']} + {out['new_tokens']} new tokens, {out['rounds']} rounds "
          "(medians; speed-ups [min, max] over rounds)", file=stream)
    print(f"{'patched':9} {'decode tok/s':>22} {'speed-up':>19} {'MoE ms/token':>17} {'speed-up':>19} "
          f"{'prefill tok/s':>20} {'speed-up':>19}", file=stream)
    for wdt, r in out["results"].items():
        a, b, s = r["unpatched"], r["patched"], r["speedup"]
        mem = f"RSS {r['rss_before_patch'] / 2**30:.2f} -> {r['rss_after_patch'] / 2**30:.2f} GiB"
        sp = lambda k: f"{s[k]['median']:.2f}x [{s[k]['min']:.2f}, {s[k]['max']:.2f}]"
        print(f"{wdt:9} {a['decode_tok_s']:9.2f} -> {b['decode_tok_s']:8.2f} {sp('decode'):>19} "
              f"{a['moe_decode_ms_per_token']:6.1f} -> {b['moe_decode_ms_per_token']:6.1f} {sp('moe_decode'):>19} "
              f"{a['prefill_tok_s']:8.1f} -> {b['prefill_tok_s']:8.1f} {sp('prefill'):>19}  {mem}", file=stream)
    print("decode ms/token by part (medians of the parts' forward times, unpatched -> patched; rest: the step less the "
          "parts)", file=stream)
    print(f"{'patched':9} " + " ".join(f"{PART_NAMES[p]:>23}" for p in PARTS) + f" {'rest':>17}", file=stream)
    for wdt, r in out["results"].items():
        a, b = r["unpatched"], r["patched"]
        cells = [f"{a[f'{p}_decode_ms_per_token']:9.1f} -> {b[f'{p}_decode_ms_per_token']:6.1f}" for p in PARTS]
        rest = [x["decode_ms_per_token"] - sum(x[f"{p}_decode_ms_per_token"] for p in PARTS) for x in (a, b)]
        print(f"{wdt:9} " + " ".join(f"{c:>23}" for c in cells) + f" {rest[0]:7.1f} -> {rest[1]:6.1f}",
              file=stream)
    print("decode GB/s by part and % of the read bandwidth measured between rounds (unpatched -> "
          "patched; weight bytes a token reads over the part's time; in brackets, the median of each "
          "round's % against the better reading around that round; MoE blocks alone: the patched "
          "blocks called back to back outside the model after each patched run, from their total "
          "time and, in parentheses, from their median call)", file=stream)
    print(f"{'patched':9} {'read bw':>8} " + " ".join(f"{PART_NAMES[p]:>27}" for p in PARTS)
          + f" {'MoE blocks alone (median call)':>38}", file=stream)
    f = lambda c: "-" if c is None or c["gbps"] is None else (
        f"{c['gbps']:.1f}" + (f" ({c['pct_bw']:.0f}%)" if c["pct_bw"] is not None else "")
        + (f" [{c['pct_bw_paired']:.0f}%]" if c.get("pct_bw_paired") is not None else ""))
    for wdt, r in out["results"].items():
        bw = r.get("read_bw_gbps")
        db = r["decode_bandwidth"]
        cells = [f"{f(db['unpatched'][p])} -> {f(db['patched'][p])}" for p in PARTS]
        alone = db.get("patched_moe_alone") or {}
        print(f"{wdt:9} {'-' if bw is None else f'{bw:.1f}':>8} " + " ".join(f"{c:>27}" for c in cells)
              + f" {f(alone.get('moe_alone')) + ' (' + f(alone.get('moe_alone_median')) + ')':>38}", file=stream)


def print_peer_table(out: dict, stream=sys.stdout) -> None:
    rows = {v: r["llama.cpp"] for v, r in out["results"].items() if "llama.cpp" in r}
    if not rows:
        return
    pkg = next(iter(rows.values()))["package"]
    print(f"llama.cpp beside ({pkg}, the same model as GGUF; tok/s medians; patched/llama.cpp "
          "[min, max] over rounds; logits' relative error against unpatched transformers, "
          "patched / llama.cpp)", file=stream)
    print(f"{'patched':9} {'type':5} {'decode unpatched/patched/llama.cpp':>36} {'patched/llama.cpp':>19} "
          f"{'prefill unpatched/patched/llama.cpp':>37} {'patched/llama.cpp':>19} {'logits err':>15}", file=stream)
    for v, c in rows.items():
        r = out["results"][v]
        a, b = r["unpatched"], r["patched"]
        q = c["patched_over_peer"]
        sp = lambda k: f"{q[k]['median']:.2f}x [{q[k]['min']:.2f}, {q[k]['max']:.2f}]"
        dec = f"{a['decode_tok_s']:.2f} / {b['decode_tok_s']:.2f} / {c['decode_tok_s']:.2f}"
        pre = f"{a['prefill_tok_s']:.1f} / {b['prefill_tok_s']:.1f} / {c['prefill_tok_s']:.1f}"
        errs = f"{r['logits_rel_err']:.3g} / {c['logits_rel_err']:.3g}"
        print(f"{v:9} {c['type']:5} {dec:>36} {sp('decode'):>19} {pre:>37} {sp('prefill'):>19} "
              f"{errs:>15}", file=stream)


def main(argv: list[str] | None = None) -> int:
    ap = _cli.Parser(prog="python -m colibri_bench e2e", description=__doc__.split("\n\n")[0])
    ap.add_argument("--shape", choices=sorted(SHAPES), default="qwen3-30b-a3b")
    ap.add_argument("--layers", type=_cli.positive_int, default=4)
    ap.add_argument("--variant", action="append", choices=VARIANTS,
                    help="what is patched, in which weight dtype: moe:DTYPE (the MoE blocks) or all:DTYPE "
                    "(linear=True); repeatable; default moe:bf16, all:bf16, all:int8, all:int4")
    ap.add_argument("--prompt-tokens", type=_cli.positive_int, default=128)
    ap.add_argument("--new-tokens", type=_cli.positive_int, default=16)
    ap.add_argument("--rounds", type=_cli.positive_int, default=3)
    ap.add_argument("--threads", type=_cli.positive_int, default=2)
    ap.add_argument("--prefill-repeats", type=_cli.positive_int, default=3,
                    help="prefills timed per run and round, their median the round's figure (default 3: "
                    "the run's own and two generates of one new token)")
    ap.add_argument("--peer", choices=["llama.cpp"],
                    help="also run the same model through llama.cpp (llama-cpp-python; GGUF written with "
                    "the gguf package) in each variant's weight type: bf16, q8_0 for int8, q4_0 for int4")
    ap.add_argument("--handoff", type=_cli.handoff, default="auto",
                    help="patch()'s hand-off to the original modules: auto (timed at patch time, the "
                    "default), off, or a token count")
    ap.add_argument("--out", help="JSON output (default reports/<host-id>/e2e.json)")
    args = ap.parse_args(argv)
    if args.new_tokens < 2:
        ap.error("--new-tokens must be >= 2 (decode is timed from the first new token on)")
    args.variant = args.variant or ["moe:bf16", "all:bf16", "all:int8", "all:int4"]
    try:
        import torch  # noqa: F401
        import transformers  # noqa: F401
    except ImportError as exc:
        print(f"colibri_bench e2e: needs torch and transformers ({exc})", file=sys.stderr)
        return 1
    say = lambda m: print(m, file=sys.stderr, flush=True)
    if args.peer:
        from colibri_bench.peers import llamacpp

        try:
            llamacpp._modules()
        except llamacpp.PeerUnavailable as exc:
            print(f"colibri_bench e2e: --peer llama.cpp: {exc}", file=sys.stderr)
            return 1
    results = run(args, say)
    from colibri_build import hostid

    out = {"shape": args.shape, "layers": args.layers, "threads": args.threads,
           "prompt_tokens": args.prompt_tokens, "new_tokens": args.new_tokens, "rounds": args.rounds,
           "peer": args.peer, "host_id": hostid.host_id(), "created": datetime.datetime.now(datetime.timezone.utc).isoformat(
               timespec="seconds"), "results": results}
    print_table(out)
    print_peer_table(out)
    from colibri_build.paths import reports_dir_default

    path = Path(args.out) if args.out else reports_dir_default() / out["host_id"] / "e2e.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(out, indent=1))
    say(f"wrote {path}")
    return 0
