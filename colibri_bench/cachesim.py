"""python -m colibri_bench cachesim: eviction policies of the expert cache, and a predictor of
the next layer's experts, measured on a routing trace instead of assumed.

    python -m colibri_bench cachesim [--model FILE | --shape qwen3-30b-a3b --layers 8]
                                     [--tokens 256] [--share 0.1 --share 0.25 --share 0.5]
                                     [--out FILE]

The trace: `--tokens` decode steps, each a fresh token run through the model's layers one
after the other (h = h + moe(h), on the engine), recording the experts each layer's router
picks (the top-k of its logits), and the top-k that layer l + 1's router gives for the
hidden state entering layer l: the cheap predictor, which could start layer l + 1's reads
while layer l computes. Without --model, a model of the shape's hidden size, expert count
and top-k, with distinct random layers and narrow experts (only the routing matters here).

The simulation: a cache of `share` x (layers x experts) slots shared by all layers, each
layer's experts held together while it runs (as kernels/expert_cache.c does), under
  lru  the least recently used (the engine's default policy);
  lfu  the least often used so far, ties to the least recent (the engine's policy="lfu",
       whose counts also halve every 1024 turns per layer: longer than these traces);
  min  Belady's: the one needed again furthest ahead. It knows the future, so no policy
       can hit more: it bounds what any other policy could gain.
It prints the hit rate of each, and the predictor's precision (its share of the next
layer's picks). Random
routers route near uniformly, so these figures say little about a trained model's traces;
the command takes any model file.
Exit status: 0 done; 2 usage."""
from __future__ import annotations

import json
import sys
from collections import OrderedDict
from pathlib import Path

import numpy as np

from colibri import _cli


def synthetic_model(path: Path, H: int, E: int, k: int, layers: int, inter: int = 32, seed: int = 0) -> Path:
    """A model file of `layers` distinct random layers (router spread like a trained one's)."""
    from colibri.modelfile import ModelWriter

    rng = np.random.default_rng(seed)

    def w(*shape, fan_in):
        return (rng.standard_normal(shape, dtype=np.float32) / np.float32(np.sqrt(fan_in))).astype(np.float32)

    with ModelWriter(path, weight_dtype="f32", share=False) as mw:
        for _ in range(layers):
            mw.add_layer(dict(router=w(E, H, fan_in=H) * np.float32(3.0), gate=w(E, inter, H, fan_in=H),
                              up=w(E, inter, H, fan_in=H), down=w(E, H, inter, fan_in=inter), top_k=k,
                              scoring="softmax", norm_topk_prob=True))
    return path


def record(model_path: Path, tokens: int, seed: int = 0, threads: int = 1) -> dict:
    """The routing trace: picks[t][l] and predicted[t][l] (layer l + 1's router on layer l's
    input; none for the last layer), expert ids sorted."""
    from colibri._lib import ffi
    from colibri.model import Model
    from colibri.modelfile import read_header

    hdr = read_header(model_path)
    E, k, L, H = hdr["n_experts"], hdr["top_k"], hdr["n_layers"], hdr["hidden"]
    raw = np.memmap(model_path, np.uint8, mode="r")
    routers = []
    for slots in hdr["slots"]:
        t = hdr["tensors"][slots[0]]
        routers.append(np.frombuffer(raw, "<f4", E * H, t["offset"]).reshape(E, H))
    rng = np.random.default_rng(seed)
    picks, predicted = [], []
    with Model.load(model_path) as m:
        lib = m._lib
        layers = [m._layer(i) for i in range(L)]
        y = np.empty((1, H), np.float32)
        for _ in range(tokens):
            h = rng.standard_normal((1, H), dtype=np.float32)
            pt, pr = [], []
            for li in range(L):
                pt.append(sorted(np.argsort(-(routers[li] @ h[0]), kind="stable")[:k].tolist()))
                if li + 1 < L:
                    pr.append(sorted(np.argsort(-(routers[li + 1] @ h[0]), kind="stable")[:k].tolist()))
                st = lib.colibri_layer_forward(layers[li], ffi.from_buffer("float[]", h),
                                               ffi.from_buffer("float[]", y, require_writable=True), 1, threads)
                if st:
                    raise RuntimeError(f"colibri_layer_forward: status {st}")
                h = h + y
            picks.append(pt)
            predicted.append(pr)
    return {"layers": L, "experts": E, "top_k": k, "picks": picks, "predicted": predicted}


def simulate(tr: dict, slots: int, policy: str) -> dict:
    """Hits and misses of a cache of `slots` experts over the trace under `policy`."""
    L, E = tr["layers"], tr["experts"]
    turns = [[li * E + e for e in tr["picks"][t][li]] for t in range(len(tr["picks"])) for li in range(L)]
    if slots < max(map(len, turns)):
        raise ValueError(f"{slots} slots cannot hold one layer's {max(map(len, turns))} experts")
    # for MIN: for each turn index and key, the next turn that needs the key again
    nxt: list[dict] = [{} for _ in turns]
    later: dict[int, int] = {}
    for i in range(len(turns) - 1, -1, -1):
        for key in turns[i]:
            nxt[i][key] = later.get(key, 1 << 62)
        for key in turns[i]:
            later[key] = i
    cache: OrderedDict[int, None] = OrderedDict()  # recency order, oldest first
    count: dict[int, int] = {}
    next_use: dict[int, int] = {}
    hits = misses = 0
    for i, turn in enumerate(turns):
        held = set(turn)
        for key in turn:
            count[key] = count.get(key, 0) + 1
            if key in cache:
                hits += 1
                cache.move_to_end(key)
            else:
                misses += 1
                if len(cache) >= slots:
                    free = [c for c in cache if c not in held]
                    if policy == "lru":
                        victim = free[0]
                    elif policy == "lfu":
                        victim = min(free, key=lambda c: count[c])  # ties: the first, least recent
                    elif policy == "min":
                        victim = max(free, key=lambda c: next_use[c])
                    else:
                        raise ValueError(f"unknown policy {policy!r}")
                    del cache[victim]
                cache[key] = None
            next_use[key] = nxt[i][key]
    return {"policy": policy, "slots": slots, "hits": hits, "misses": misses, "hit_rate": hits / (hits + misses)}


def predictor(tr: dict) -> dict:
    """The predictor's precision: the share of layer l + 1's picks it names from layer l."""
    k, got, n = tr["top_k"], 0, 0
    for t, pr in enumerate(tr["predicted"]):
        for li, guess in enumerate(pr):
            got += len(set(guess) & set(tr["picks"][t][li + 1]))
            n += k
    return {"precision": got / n if n else None, "predictions": n // k if k else 0}


def main(argv: list[str] | None = None) -> int:
    from tuner.measure import problems

    p = _cli.Parser(prog="python -m colibri_bench cachesim", description=__doc__.split("\n")[0])
    p.add_argument("--model", metavar="FILE", help="trace this model file (default: a synthetic one of --shape)")
    p.add_argument("--shape", default="qwen3-30b-a3b", choices=sorted(problems.SHAPES))
    p.add_argument("--layers", type=_cli.positive_int, default=8, help="layers of the synthetic model (default 8)")
    p.add_argument("--tokens", type=_cli.positive_int, default=256, help="decode steps traced (default 256)")
    p.add_argument("--share", type=_cli.fraction, action="append", metavar="S",
                   help="cache size as a share of all experts, repeatable (default 0.1, 0.25, 0.5)")
    p.add_argument("--seed", type=_cli.count, default=0)
    p.add_argument("--out", metavar="FILE", help="also write the results as JSON")
    try:
        args = p.parse_args(argv)
    except SystemExit as exc:
        return _cli.EXIT_USAGE if exc.code else 0
    import tempfile

    with tempfile.TemporaryDirectory(prefix="colibri-cachesim-") as tmp:
        if args.model:
            path = Path(args.model)
            if not path.is_file():
                print(f"{p.prog}: error: --model {path}: no such file", file=sys.stderr)
                return _cli.EXIT_USAGE
        else:
            s = problems.SHAPES[args.shape]
            path = synthetic_model(Path(tmp) / "m.colibri", s["H"], s["E"], s["k"], args.layers, seed=args.seed)
        tr = record(path, args.tokens, seed=args.seed)
    total = tr["layers"] * tr["experts"]
    rows = []
    for share in args.share or [0.1, 0.25, 0.5]:
        slots = max(tr["top_k"], int(share * total))
        rows.append({"share": share, **{r["policy"]: r["hit_rate"] for r in
                                         (simulate(tr, slots, pol) for pol in ("lru", "lfu", "min"))},
                     "slots": slots})
    pred = predictor(tr)
    print(f"{tr['layers']} layers x {tr['experts']} experts, top-{tr['top_k']}, {args.tokens} tokens"
          f"{'' if args.model else ' (synthetic, random routers)'}")
    print("| cache (of all experts) | slots | LRU | LFU | MIN (the bound) |")
    print("| --- | --- | --- | --- | --- |")
    for r in rows:
        print(f"| {r['share']:.0%} | {r['slots']} | {r['lru']:.1%} | {r['lfu']:.1%} | {r['min']:.1%} |")
    print(f"next-layer predictor: {pred['precision']:.1%} of layer l+1's picks named from layer l's input "
          f"({pred['predictions']} predictions)")
    if args.out:
        Path(args.out).write_text(json.dumps({"model": args.model, "shape": None if args.model else args.shape,
                                              "layers": tr["layers"], "experts": tr["experts"],
                                              "top_k": tr["top_k"], "tokens": args.tokens, "rows": rows,
                                              "predictor": pred}, indent=1))
    return 0
