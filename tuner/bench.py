"""python -m tuner bench: the MoE layer side by side — Colibri (tuned and default
library), NumPy per-expert matmuls as a user would write them, PyTorch eager when
installed — with the host's read bandwidth measured between the cases, so every
figure is a ratio within one run.

Decode (T=1) takes a fresh token per call (the router picks other experts; all
experts' weights are resident, several times the last-level cache). Colibri is timed
inside C; NumPy and PyTorch by wall clock around each call. GB/s counts the weight
bytes a decode token streams (k experts, the shared expert, the router); the bound
is those bytes over the measured read bandwidth at the same thread count.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import numpy as np

from colibri import reference
from colibri._lib import build_dir_default, ffi, open_library
from colibri.layer import MoELayer

from . import hostmatch, problems as problems_mod, weights

BLAS_ENV = ("OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE")


def _median(xs):
    return float(np.median(np.asarray(xs)))


def read_bandwidth(lib, threads: int, nbytes: int, min_seconds: float = 0.2) -> float | None:
    out = ffi.new("double *")
    st = lib.colibri_membw(0, nbytes, threads, min_seconds, out)
    return float(out[0]) if st == 0 else None


def _inputs(p, n, seed):
    rng = np.random.default_rng(seed)
    return rng.standard_normal((n, p.T, p.H), dtype=np.float32)


def time_colibri(lib_path, p, enc, router, sh, threads, min_seconds, xs):
    layer = MoELayer.from_encoded(router, enc, weight_dtype=p.dtype, shared_expert_gate=sh,
                                  threads=threads, lib=str(lib_path), top_k=p.k,
                                  scoring=p.scoring, norm_topk_prob=p.norm)
    lib = layer._lib
    out = np.empty((p.T, p.H), np.float32)
    samples = np.empty(4096)
    n = ffi.new("int *")
    st = lib.colibri_bench_layer(layer._ptr, ffi.from_buffer("float[]", xs), len(xs), p.T,
                                 ffi.from_buffer("float[]", out), threads, 2, min_seconds,
                                 len(samples), ffi.from_buffer("double[]", samples), n)
    if st:
        raise RuntimeError("colibri_bench_layer failed")
    return _median(samples[:n[0]])


def numpy_layer(x, w, p):
    """The layer as a NumPy user writes it: float32, per-expert matmuls."""
    logits = x @ w["router"].T
    probs = np.exp(logits - logits.max(axis=1, keepdims=True))
    probs /= probs.sum(axis=1, keepdims=True)
    top = np.argsort(-probs, axis=1)[:, :p.k]
    y = np.zeros_like(x)
    for t in range(x.shape[0]):
        ws = probs[t, top[t]]
        if p.norm:
            ws = ws / ws.sum()
        for e, we in zip(top[t], ws):
            g = w["gate"][e] @ x[t]
            h = (g / (1 + np.exp(-g))) * (w["up"][e] @ x[t])
            y[t] += we * (w["down"][e] @ h)
    if p.S:
        g = x @ w["shared_gate"].T
        s = ((g / (1 + np.exp(-g))) * (x @ w["shared_up"].T)) @ w["shared_down"].T
        if "shared_expert_gate" in w:
            s *= 1 / (1 + np.exp(-(x @ w["shared_expert_gate"])))[:, None]
        y += s
    return y


def time_python(fn, xs, min_seconds):
    fn(xs[0])  # warm-up
    ts, t_end, i = [], time.perf_counter() + min_seconds, 1
    while time.perf_counter() < t_end or len(ts) < 3:
        x = xs[i % len(xs)]
        t0 = time.perf_counter()
        fn(x)
        ts.append(time.perf_counter() - t0)
        i += 1
    return _median(ts)


def torch_layer_fn(w, p, threads):
    try:
        import torch
    except ImportError:
        return None
    torch.set_num_threads(threads)
    tw = {k: torch.from_numpy(np.asarray(v)) for k, v in w.items()}

    def fn(x):
        with torch.no_grad():
            xt = torch.from_numpy(x)
            probs = torch.softmax(xt @ tw["router"].T, dim=-1)
            wts, idx = torch.topk(probs, p.k, dim=-1)
            if p.norm:
                wts = wts / wts.sum(dim=-1, keepdim=True)
            y = torch.zeros_like(xt)
            for t in range(xt.shape[0]):
                for e, we in zip(idx[t].tolist(), wts[t]):
                    h = torch.nn.functional.silu(tw["gate"][e] @ xt[t]) * (tw["up"][e] @ xt[t])
                    y[t] += we * (tw["down"][e] @ h)
            return y
    return fn


def run_bench(shapes, dtypes, phases, threads_list, min_seconds, seed=0, build_dir=None,
              say=print) -> dict:
    build_dir = Path(build_dir or build_dir_default())
    profile = hostmatch.host_profile_name()
    default_lib = build_dir / profile / "libcolibri.so"
    if not default_lib.exists():
        from colibri._lib import build_profile
        build_profile(profile, build_dir=build_dir)
    tuned_lib = hostmatch.tuned_library_path(build_dir)
    libs = {"colibri-default": default_lib}
    if tuned_lib is not None:
        libs["colibri-tuned"] = tuned_lib
    lib = open_library(default_lib)
    from .bandwidth import _llc_total_here, working_set_bytes

    bw_bytes = working_set_bytes(_llc_total_here())[0]
    wdir = build_dir / "tuner" / "weights"
    rows = []
    for shape in shapes:
        for dtype in dtypes:
            for phase in phases:
                p = problems_mod.problem(f"{shape}/{phase}/{dtype}")
                weights.ensure(wdir, p, seed, progress=say)
                enc = weights.load_encoded(wdir, p, seed)
                sh = enc.pop("shared_expert_gate", (None, None))[0]
                router = enc.pop("router")[0]
                w32 = weights.load(wdir, p, seed)
                xs = _inputs(p, max(2, 64 // p.T), seed + 1)
                for threads in threads_list:
                    bw = read_bandwidth(lib, threads, bw_bytes)
                    res = {}
                    for name, path in libs.items():
                        res[name] = time_colibri(path, p, dict(enc), router, sh, threads,
                                                 min_seconds, xs)
                    if dtype == "f32":
                        res["numpy"] = time_python(lambda x: numpy_layer(x, w32, p), xs, min_seconds)
                        tf = torch_layer_fn(w32, p, threads)
                        if tf is not None:
                            res["torch"] = time_python(tf, xs, min_seconds)
                    bw_after = read_bandwidth(lib, threads, bw_bytes)
                    bws = [b for b in (bw, bw_after) if b]
                    bw_mid = float(np.mean(bws)) if bws else None
                    for impl, t in res.items():
                        gbps = p.decode_bytes * p.T / t / 1e9 if p.T == 1 else None
                        rows.append({
                            "case": p.name, "threads": threads, "impl": impl,
                            "seconds": t, "ms_per_token": t / p.T * 1e3,
                            "gbps": gbps, "read_bw_gbps": bw_mid,
                            "pct_of_bound": (100 * gbps / bw_mid) if gbps and bw_mid else None,
                            "gflops": p.flops / t / 1e9,
                            "vs_numpy": (res["numpy"] / t) if "numpy" in res else None,
                            "vs_torch": (res["torch"] / t) if "torch" in res else None})
                        say(_fmt(rows[-1]))
    return {"host_id": hostmatch.host_id(), "profile": profile, "libs": {k: str(v) for k, v in libs.items()},
            "blas_env": {k: os.environ.get(k) for k in BLAS_ENV}, "rows": rows,
            "torch": _torch_version(), "created": time.time()}


def _torch_version():
    try:
        import torch
        return torch.__version__
    except ImportError:
        return None


HEADER = (f"{'case':32} {'thr':>3} {'impl':16} {'ms/token':>9} {'GB/s':>7} {'% bound':>8} "
          f"{'GFLOP/s':>8} {'vs numpy':>9} {'vs torch':>9}")


def _fmt(r):
    f = lambda v, spec: format(v, spec) if v is not None else "-"
    return (f"{r['case']:32} {r['threads']:>3} {r['impl']:16} {r['ms_per_token']:9.3f} "
            f"{f(r['gbps'], '7.1f'):>7} {f(r['pct_of_bound'], '7.1f'):>8} {r['gflops']:8.1f} "
            f"{f(r['vs_numpy'], '8.2f'):>9} {f(r['vs_torch'], '8.2f'):>9}")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m tuner bench", description=__doc__.split("\n\n")[0])
    ap.add_argument("--shape", action="append", choices=sorted(problems_mod.SHAPES),
                    help="model shape (repeatable; default qwen3-30b-a3b)")
    ap.add_argument("--dtype", action="append", choices=["f32", "bf16", "int8"],
                    help="weight dtype (repeatable; default all three)")
    ap.add_argument("--phase", action="append",
                    help="decode, prefill128, prefill512 ... (repeatable; default decode)")
    ap.add_argument("--threads", action="append", type=int,
                    help="threads (repeatable; default 1 and all CPUs)")
    ap.add_argument("--min-seconds", type=float, default=0.5, help="timing per case and impl")
    ap.add_argument("--out", help="JSON output (default reports/<host-id>/bench.json)")
    ap.add_argument("--keep-blas-env", action="store_true",
                    help=f"keep {' and '.join(BLAS_ENV)} (default: unset them so OpenBLAS "
                         "chooses its own kernel)")
    args = ap.parse_args(argv)
    if not args.keep_blas_env and any(k in os.environ for k in BLAS_ENV):
        # numpy reads these when it loads OpenBLAS: re-run without them
        env = {k: v for k, v in os.environ.items() if k not in BLAS_ENV}
        print(f"bench: unsetting {', '.join(k for k in BLAS_ENV if k in os.environ)} "
              "for this run (OpenBLAS picks its own kernel)", file=sys.stderr)
        os.execve(sys.executable, [sys.executable, "-m", "tuner", "bench", *(argv or sys.argv[2:])], env)
    print(HEADER)
    out = run_bench(args.shape or ["qwen3-30b-a3b"], args.dtype or ["f32", "bf16", "int8"],
                    args.phase or ["decode"], args.threads or sorted({1, os.cpu_count() or 1}),
                    args.min_seconds, say=print)
    root = Path(__file__).resolve().parent.parent
    path = Path(args.out) if args.out else root / "reports" / out["host_id"] / "bench.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(out, indent=1))
    print(f"written: {path}")
    return 0
