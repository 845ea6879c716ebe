"""python -m colibri_bench quant: what each weight format costs in bits and in accuracy.

For Colibri's weight dtypes (colibri/quant.py, the engine's own encoding) and the formats
of colibri_bench/qformats.py (ggml's q4_0, q4_1 and q8_0 as references, and candidates),
on weights [rows, cols] drawn from a Gaussian and from a Student-t with 4 degrees of
freedom (heavier tails, closer to real checkpoints):
- bits per weight, scales included;
- weight error: ||W' - W|| / ||W||, W' the weights the kernels multiply;
- layer error: ||x' W'^T - x W^T|| / ||x W^T|| for `tokens` Gaussian tokens x, x' the
  activations as the format's kernels see them (Colibri's int8/int4g32 kernels and its
  candidates round them per group of 32 to int8; ggml's quantised dot products to q8_0
  blocks, the same with an f16 scale).
All in float64 sums of float32 values; the same seed gives the same figures.

Writes the table to stdout and the figures to JSON (--out, default
reports/<host-id>/quant.json).
"""
from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np

from colibri import _cli, quant
from colibri_bench import qformats
from colibri_build import hostid
from colibri_build.paths import reports_dir_default

DISTRIBUTIONS = ("gaussian", "student_t4")


def weights(dist: str, rows: int, cols: int, rng: np.random.Generator) -> np.ndarray:
    if dist == "gaussian":
        return rng.standard_normal((rows, cols)).astype(np.float32)
    if dist == "student_t4":
        return rng.standard_t(4, (rows, cols)).astype(np.float32)
    raise ValueError(f"distribution must be one of {DISTRIBUTIONS}, got {dist!r}")


def formats() -> dict[str, tuple]:
    """name -> (weights round-trip, activations round-trip, bits per weight for
    (rows, cols), what it is): Colibri's dtypes first, then qformats.FORMATS."""
    out = {}
    for dt in quant.DTYPES:
        out[dt] = (lambda a, dt=dt: quant.roundtrip(a, dt),
                   quant.ACTIVATION_ROUNDING.get(dt, lambda x: x),
                   lambda rows, cols, dt=dt: 8 * quant.stored_bytes(dt, rows, cols) / (rows * cols),
                   f"Colibri {dt}")
    for name, (fn, bpw, what) in qformats.FORMATS.items():
        # ggml's quantised dot products take q8_0 activations (q8_1, the same values, for
        # the formats with a min); a Colibri candidate, the int kernels' rounding
        acts = qformats.q8_0 if name.startswith("ggml-") else quant.quantize_activations
        out[name] = (fn, acts, lambda rows, cols, bpw=bpw: bpw, what)
    return out


def _rel(a: np.ndarray, b: np.ndarray) -> float:
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.linalg.norm(a - b) / np.linalg.norm(b))


def measure(names=None, rows=2048, cols=2048, tokens=16, seed=0, say=None) -> list[dict]:
    """One row per format: bits per weight and, per distribution, weight and layer error."""
    fmts = formats()
    names = list(names or fmts)
    unknown = [n for n in names if n not in fmts]
    if unknown:
        raise ValueError(f"unknown format(s) {', '.join(unknown)}; known: {', '.join(fmts)}")
    rng = np.random.default_rng(seed)
    data = {d: weights(d, rows, cols, rng) for d in DISTRIBUTIONS}
    x = rng.standard_normal((tokens, cols)).astype(np.float32)
    exact = {d: x.astype(np.float64) @ w.astype(np.float64).T for d, w in data.items()}
    out = []
    for name in names:
        fn, acts, bits, what = fmts[name]
        row = {"format": name, "what": what, "bits_per_weight": bits(rows, cols)}
        xq = np.asarray(acts(x), np.float64)
        for d, w in data.items():
            wq = fn(w)
            row[f"weight_err_{d}"] = _rel(wq, w)
            row[f"layer_err_{d}"] = _rel(xq @ np.asarray(wq, np.float64).T, exact[d])
        out.append(row)
        if say:
            say(_fmt(row))
    return out


HEADER = (f"{'format':10} {'bits/w':>6}  " + "  ".join(f"{d + ' weight':>18} {d + ' layer':>17}"
                                                       for d in DISTRIBUTIONS) + "  what")


def _fmt(r: dict) -> str:
    return (f"{r['format']:10} {r['bits_per_weight']:6.2f}  "
            + "  ".join(f"{r[f'weight_err_{d}']:18.4f} {r[f'layer_err_{d}']:17.4f}" for d in DISTRIBUTIONS)
            + f"  {r['what']}")


def main(argv=None) -> int:
    fmts = formats()
    ap = _cli.Parser(prog="python -m colibri_bench quant", description=__doc__.split("\n\n")[0],
                     epilog="Exit status: 0 done, 2 usage error.")
    ap.add_argument("--format", action="append", choices=list(fmts),
                    help="repeatable; default all: " + ", ".join(fmts))
    ap.add_argument("--rows", type=_cli.positive_int, default=2048, help="weight rows (default 2048)")
    ap.add_argument("--cols", type=_cli.positive_int, default=2048, help="weight columns (default 2048)")
    ap.add_argument("--tokens", type=_cli.positive_int, default=16,
                    help="tokens of the layer product (default 16)")
    ap.add_argument("--seed", type=int, default=0, help="random seed (default 0)")
    ap.add_argument("--out", help="JSON output (default reports/<host-id>/quant.json)")
    args = ap.parse_args(argv)
    print(HEADER, flush=True)
    rows = measure(args.format, args.rows, args.cols, args.tokens, args.seed,
                   say=lambda m: print(m, flush=True))
    path = Path(args.out) if args.out else reports_dir_default() / hostid.host_id() / "quant.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps({"rows": rows, "shape": [args.rows, args.cols], "tokens": args.tokens,
                               "seed": args.seed, "distributions": list(DISTRIBUTIONS)}, indent=1))
    os.replace(tmp, path)
    print(f"written: {path}")
    return 0
