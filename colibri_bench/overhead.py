"""python -m colibri_bench overhead: what the Python wrappers cost per call, on a layer so
small that the engine's own work is a few microseconds.

Ways into one tiny MoE layer and one tiny Linear, timed in interleaved rounds (each
round times every way for --calls calls, one call at a time, after a warm-up):
- `hf`: the torch module colibri.hf.patch puts in a model (float32 tensors in and out);
- `hf-bf16`: the same module on bf16 tensors (a bf16 model's);
- `python`: MoELayer / Linear called on NumPy arrays with `out=` (every argument checked);
- `engine`, `engine-bf16`: the C entry point alone through cffi (f32, and its bf16-activation
  form), its buffers made once.
The wrapper's cost is the hf median minus the engine median (hf-bf16 over engine-bf16), the
median over rounds of the per-round difference (issue 31: at most 30 us a call). Prints a table and writes
reports/<host-id>/overhead.json. Needs torch for the hf rows (skipped without it)."""
from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import numpy as np

from colibri import _cli
from colibri.timing import interleaved

BUDGET_US = 30.0  # issue 31's per-call budget for the wrapper
TINY = dict(E=4, H=64, I=32, k=2, T=1)  # the engine's work is a few microseconds


def _median(xs):
    return float(np.median(np.asarray(xs, float)))


def ways(E, H, I, k, T, seed=0, lib=None) -> dict:
    """{(kind, way): a function of no arguments making one call} for kind moe and linear."""
    import colibri
    from colibri._lib import ffi

    rng = np.random.default_rng(seed)
    f = lambda *s: rng.standard_normal(s, dtype=np.float32)  # noqa: E731
    layer = colibri.MoELayer(f(E, H), f(E, I, H), f(E, I, H), f(E, H, I), top_k=k, weight_dtype="f32",
                             threads=1, lib=lib)
    lin = colibri.Linear(f(H, H), weight_dtype="f32", threads=1, lib=lib)
    x, out, lout = f(T, H), np.empty((T, H), np.float32), np.empty((T, H), np.float32)
    px, po = ffi.from_buffer("float[]", x), ffi.from_buffer("float[]", out, require_writable=True)
    plo = ffi.from_buffer("float[]", lout, require_writable=True)
    xb, ob = np.zeros((T, H), np.uint16), np.empty((T, H), np.uint16)
    pxb = ffi.from_buffer("uint16_t[]", xb)
    pob = ffi.from_buffer("uint16_t[]", ob, require_writable=True)
    xb[:] = x.view(np.uint32) >> 16
    lp, ll = layer._live(), layer._lib
    dp, dl = lin._live(), lin._lib
    out_ways = {("moe", "python"): lambda: layer(x, out=out),
                ("moe", "engine"): lambda: ll.colibri_layer_forward(lp, px, po, T, 1),
                ("linear", "python"): lambda: lin(x, out=lout),
                ("linear", "engine"): lambda: dl.colibri_dense_forward(dp, px, plo, T, 1),
                ("moe", "engine-bf16"): lambda: ll.colibri_layer_forward_bf16(lp, pxb, pob, T, 1),
                ("linear", "engine-bf16"): lambda: dl.colibri_dense_forward_bf16(dp, pxb, pob, T, 1)}
    try:
        import torch

        from colibri import hf
    except ImportError:
        return out_ways
    blk = hf.colibri_block_class()(layer, "tiny MoE block")
    tlin = hf.colibri_linear_class()(lin, None, "tiny Linear")
    xt = torch.from_numpy(x.copy()).reshape(1, T, H)
    xtb = xt.to(torch.bfloat16)

    def no_grad(mod, arg):
        def call():
            with torch.no_grad():
                mod(arg)
        return call
    for kind, mod in (("moe", blk), ("linear", tlin)):
        out_ways[(kind, "hf")] = no_grad(mod, xt)
        out_ways[(kind, "hf-bf16")] = no_grad(mod, xtb)
    return out_ways


def measure(rounds: int, calls: int, lib=None, say=print) -> dict:
    per = interleaved(ways(**TINY, lib=lib), rounds, calls)
    rows = []
    for (kind, way), ts in per.items():
        rows.append({"kind": kind, "way": way, "seconds": _median(ts), "round_seconds": ts})
    overhead = {}
    for kind in ("moe", "linear"):
        for suffix in ("", "-bf16"):
            if (kind, "hf" + suffix) in per:
                d = [a - b for a, b in zip(per[(kind, "hf" + suffix)], per[(kind, "engine" + suffix)])]
                overhead[kind + suffix] = {"us": 1e6 * _median(d), "round_us": [1e6 * v for v in d],
                                           "within_budget": 1e6 * _median(d) <= BUDGET_US}
    return {"rows": rows, "wrapper_overhead": overhead, "budget_us": BUDGET_US, "rounds": rounds,
            "calls": calls, "shape": TINY}


def main(argv=None) -> int:
    ap = _cli.Parser(prog="python -m colibri_bench overhead", description=__doc__.split("\n\n")[0],
                     epilog="Exit status: 0 measured, 1 failed, 2 usage error.")
    ap.add_argument("--rounds", type=_cli.positive_int, default=7, help="interleaved rounds (default 7)")
    ap.add_argument("--calls", type=_cli.positive_int, default=2000, help="timed calls per way and round "
                                                                        "(default 2000)")
    ap.add_argument("--out", help="JSON output (default reports/<host-id>/overhead.json)")
    args = ap.parse_args(argv)
    from colibri_build import hostid
    from colibri_build.paths import reports_dir_default

    try:
        res = measure(args.rounds, args.calls)
    except (RuntimeError, ValueError, OSError) as e:
        print(f"overhead: {e}", file=sys.stderr)
        return 1
    print(f"{'kind':7} {'way':11} {'us/call':>8}")
    for r in res["rows"]:
        print(f"{r['kind']:7} {r['way']:11} {r['seconds'] * 1e6:8.1f}")
    for kind, o in res["wrapper_overhead"].items():
        print(f"{kind}: the hf module costs {o['us']:.1f} us a call over the engine "
              f"({'within' if o['within_budget'] else 'over'} the {BUDGET_US:.0f} us budget)")
    if not res["wrapper_overhead"]:
        print("overhead: torch is not installed: the hf module's rows are skipped")
    path = Path(args.out) if args.out else reports_dir_default() / hostid.host_id() / "overhead.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(dict(res, host_id=hostid.host_id(), created=time.time()), indent=1))
    print(f"written: {path}")
    return 0
