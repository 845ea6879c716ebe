"""python -m colibri_bench soak: run the engine for a long time and watch its resident memory.

A 72-hour deployment dies of a leak of a few bytes per call, or per layer created and
freed. The soak runs one layer of a reference shape (problems.SHAPES) over N fresh
tokens, cycling the tokens per call through 1, 2, 7 and 64 (decode and short prefill
take different scratch sizes and kernel paths), and at every sample point also creates
and frees layers (and loads and frees a model file, with --model or --with-model). It
samples resident memory (/proc/self/statm) and malloc's bytes in use every K tokens, prints tokens vs RSS, and
fails when RSS after the warm-up grew beyond a threshold. A fixed probe input is re-run
at every sample: its output must stay bitwise equal to the first one (memory corruption
shows there before it crashes).

It is not a benchmark: the figures are memory, not speed.

Why here and not under `python -m colibri`: the shape table and the other measuring
commands (probe, bench) live in the tuner; `python -m colibri` stays the user's small CLI.

Exit status: 0 no growth and stable outputs; 1 memory grew beyond the threshold, the
probe output changed or the engine refused the input (e.g. a broken --model file);
2 usage error.
"""
from __future__ import annotations

import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Callable

import numpy as np

from colibri import _cli

T_CYCLE = (1, 2, 7, 64)  # tokens per call, in turn
TAIL = 3                  # samples at the end whose minimum is the final RSS
EXIT_OK, EXIT_GROWTH, EXIT_USAGE = 0, 1, 2


def rss_bytes() -> int:
    """Resident set size of this process (the second field of /proc/self/statm, in pages)."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except OSError:  # not Linux: psutil reads the same figure elsewhere
        import psutil

        return int(psutil.Process().memory_info().rss)


def heap_bytes() -> int | None:
    """Bytes malloc has handed out and not had back (glibc mallinfo2: in-use arena chunks
    plus mmapped ones), or None off glibc. RSS alone misses a leak that reuses pages the
    process already holds (freed earlier but still resident); this counter does not."""
    global _mallinfo2
    if _mallinfo2 is None:
        try:
            import ctypes

            class _MallInfo2(ctypes.Structure):
                _fields_ = [(n, ctypes.c_size_t) for n in (
                    "arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks",
                    "uordblks", "fordblks", "keepcost")]
            fn = ctypes.CDLL(None).mallinfo2
            fn.restype = _MallInfo2
            _mallinfo2 = fn
        except (OSError, AttributeError):
            _mallinfo2 = False
    if not _mallinfo2:
        return None
    m = _mallinfo2()
    return int(m.uordblks + m.hblkhd)


_mallinfo2 = None


def detect_growth(samples: list[tuple[int, int]], warmup_tokens: int,
                  max_growth_bytes: float) -> dict:
    """Growth of RSS after the warm-up, from (tokens, rss_bytes) samples in token order.

    baseline: the first sample at or after warm-up (allocators have reached their steady
    state by then); final: the smallest of the last TAIL samples (so one sample caught
    mid-allocation is not a leak). slope: least-squares bytes per 1000 tokens after the
    warm-up, reported for the record. leaked: final - baseline > max_growth_bytes."""
    post = [(t, r) for t, r in samples if t >= warmup_tokens]
    if len(post) < 2:
        raise ValueError(f"need at least 2 samples after the warm-up ({warmup_tokens} tokens), "
                         f"got {len(post)}: run more tokens or sample more often")
    baseline = post[0][1]
    final = min(r for _, r in post[-TAIL:])
    t = np.array([p[0] for p in post], np.float64)
    r = np.array([p[1] for p in post], np.float64)
    slope = float(np.polyfit(t, r, 1)[0] * 1000.0) if np.ptp(t) > 0 else 0.0
    growth = final - baseline
    return {"baseline_bytes": baseline, "final_bytes": final, "growth_bytes": growth,
            "slope_bytes_per_1k_tokens": slope, "max_growth_bytes": max_growth_bytes,
            "leaked": bool(growth > max_growth_bytes)}


def sample_plan(tokens: int, every: int | None, warmup: int | None) -> tuple[int, int]:
    """(sample every K tokens, warm-up tokens): defaults 40 samples and a tenth of the run."""
    every = max(1, tokens // 40) if every is None else every
    return every, (max(every, tokens // 10) if warmup is None else warmup)


def _weights(shape: dict, seed: int) -> dict:
    rng = np.random.default_rng(seed)
    H, I, E, S = shape["H"], shape["I"], shape["E"], shape.get("S", 0)

    def w(*dims, fan_in):
        a = rng.standard_normal(dims, dtype=np.float32)
        a *= np.float32(1.0 / np.sqrt(fan_in))
        return a

    out = dict(router=w(E, H, fan_in=H) * np.float32(3.0), gate=w(E, I, H, fan_in=H),
               up=w(E, I, H, fan_in=H), down=w(E, H, I, fan_in=I))
    if S:
        out.update(shared_gate=w(S, H, fan_in=H), shared_up=w(S, H, fan_in=H),
                   shared_down=w(H, S, fan_in=S))
        if shape.get("gated"):
            out["shared_expert_gate"] = w(H, fan_in=H)
    return out


def budget_for(path: str | os.PathLike, share: float) -> int:
    """A memory budget holding `share` of the model file's routed experts beside the parts
    that stay resident (routers, shared experts): the file's other payloads."""
    from colibri.modelfile import expert_payload_bytes, read_header

    h = read_header(path)
    experts = expert_payload_bytes(h)
    rest = sum(t["nbytes"] for t in h["tensors"]) - experts
    return int(rest + share * experts)


def soak(*, tokens: int | None = None, minutes: float | None = None, shape: str = "tiny", dtype: str = "f32",
         threads: int | None = None, every: int | None = None, warmup: int | None = None, churn: int = 1,
         model: str | os.PathLike | None = None, with_model: bool = False, budget_share: float | None = None,
         max_growth_mib: float = 4.0, seed: int = 0,
         step_hook: Callable[[], None] | None = None,
         progress: Callable[[dict], None] | None = None) -> dict:
    """Run the soak; returns the report (see module doc). Either `tokens`, or `minutes` of
    wall time (then a sample every 1/60 of it, the warm-up its first tenth). budget_share
    loads the model under a memory budget holding that share of its experts (the expert
    cache then turns over all run long). step_hook runs after every call (the tests use it
    to leak on purpose); progress gets each sample as it is taken."""
    import colibri
    from colibri import quant

    from tuner.measure import problems

    if (tokens is None) == (minutes is None):
        raise ValueError("give tokens or minutes, one of them")
    if minutes is not None and not minutes > 0:
        raise ValueError(f"minutes must be > 0, got {minutes}")
    if tokens is not None and tokens < 1:
        raise ValueError(f"tokens must be >= 1, got {tokens}")
    if budget_share is not None and not 0 < budget_share <= 1:
        raise ValueError(f"budget_share must be in (0, 1], got {budget_share}")
    if budget_share is not None and model is None and not with_model:
        raise ValueError("a memory budget needs a model: --model FILE or --with-model")
    if shape not in problems.SHAPES:
        raise ValueError(f"unknown shape {shape!r}; known: {', '.join(problems.SHAPES)}")
    if dtype not in quant.DTYPES:
        raise ValueError(f"dtype must be one of {quant.DTYPES}, got {dtype!r}")
    if churn < 0:
        raise ValueError(f"churn must be >= 0, got {churn}")
    if model is not None and with_model:
        raise ValueError("give --model FILE or --with-model, not both")
    deadline = None
    if minutes is not None:  # by the clock: samples and warm-up in seconds, tokens found after
        every_s, tokens = minutes * 60 / 40, 1 << 62
        every, warmup = tokens, 0
    else:
        every, warmup = sample_plan(tokens, every, warmup)
    if every < 1:
        raise ValueError(f"every must be >= 1, got {every}")
    if not 0 <= warmup < tokens:
        raise ValueError(f"warm-up ({warmup} tokens) must be in [0, tokens={tokens})")

    spec = problems.SHAPES[shape]
    w = _weights(spec, seed)
    router = w.pop("router")
    seg = w.pop("shared_expert_gate", None)
    encoded = {n: quant.encode(a, dtype) for n, a in w.items()}
    route = dict(top_k=spec["k"], scoring=spec["scoring"], norm_topk_prob=spec["norm"])

    def new_layer():
        return colibri.MoELayer.from_encoded(router, encoded, weight_dtype=dtype,
                                             shared_expert_gate=seg, threads=threads, **route)

    tmp = None
    model_path = None if model is None else Path(model)
    if with_model:
        tmp = tempfile.TemporaryDirectory(prefix="colibri-soak-")
        model_path = Path(tmp.name) / "soak.colibri"
        layer_dict = dict(router=router, **w, **route)
        if seg is not None:
            layer_dict["shared_expert_gate"] = seg
        colibri.save_model(model_path, [layer_dict, layer_dict], weight_dtype=dtype)

    lib = colibri.open_library()
    if threads:  # the model runs with the library default: make it the same count
        if lib.colibri_set_num_threads(threads) != 0:
            raise ValueError(f"threads {threads}: {colibri._lib.last_error(lib)}")
    budget = budget_for(model_path, budget_share) if budget_share is not None else None

    def load_model():
        return colibri.Model.load(model_path, memory_budget=budget)

    try:
        layer = new_layer()
        mdl = load_model() if model_path is not None else None
        H = spec["H"]
        Tmax = max(T_CYCLE)
        rng = np.random.default_rng(seed + 1)
        xb, yb = np.empty((Tmax, H), np.float32), np.empty((Tmax, H), np.float32)
        if mdl is not None:
            xm, ym = np.empty((Tmax, mdl.hidden), np.float32), np.empty((Tmax, mdl.hidden), np.float32)
        probe = rng.standard_normal((7, H), dtype=np.float32)
        probe_ref = layer(probe).copy()
        stable = True

        samples: list[dict] = []
        created = loaded = calls = done = 0
        model_s = model_tokens = 0.0  # the model's calls since the last sample
        t0 = time.monotonic()
        if minutes is not None:
            deadline, next_s = t0 + minutes * 60, t0 + every_s

        def sample():
            nonlocal model_s, model_tokens
            rec = {"tokens": done, "calls": calls, "rss_bytes": rss_bytes(),
                   "heap_bytes": heap_bytes(),
                   "layers_created": created, "models_loaded": loaded,
                   "seconds": round(time.monotonic() - t0, 3)}
            if mdl is not None and model_s > 0:
                rec["model_tokens_per_s"] = round(model_tokens / model_s, 2)
            if budget is not None:
                rec["cache"] = {k: v for k, v in mdl.stats().items()
                                if k in ("hits", "misses", "evictions", "stall_seconds", "resident_bytes")}
            model_s = model_tokens = 0.0
            samples.append(rec)
            if progress:
                progress(rec)

        sample()
        next_at = every
        while done < tokens if deadline is None else time.monotonic() < deadline:
            T = T_CYCLE[calls % len(T_CYCLE)]
            x = xb[:T]
            rng.standard_normal(dtype=np.float32, out=x)  # fresh tokens, no new array per call
            layer(x, out=yb[:T])
            if mdl is not None:
                rng.standard_normal(dtype=np.float32, out=xm[:T])
                m0 = time.monotonic()
                mdl(xm[:T], out=ym[:T])
                model_s += time.monotonic() - m0
                model_tokens += T
            calls += 1
            done += T
            if step_hook:
                step_hook()
            due = done >= next_at or done >= tokens if deadline is None else \
                time.monotonic() >= min(next_s, deadline)
            if due:
                for _ in range(churn):  # what a long-running server does on reloads
                    extra = new_layer()
                    extra(x, out=yb[:T])
                    extra.close()
                    created += 1
                    if model_path is not None:
                        with load_model() as m2:
                            m2(xm[:T], out=ym[:T])
                        loaded += 1
                if stable and not np.array_equal(layer(probe), probe_ref):
                    stable = False
                sample()
                while next_at <= done:
                    next_at += every
                if deadline is not None:
                    next_s += every_s
        layer.close()
        if mdl is not None:
            mdl.close()
    finally:
        if threads:
            lib.colibri_set_num_threads(0)
        if tmp is not None:
            tmp.cleanup()

    if minutes is not None:  # the warm-up: the first tenth of the time
        warmup = next(s["tokens"] for s in samples if s["seconds"] >= minutes * 6 or s is samples[-1])
    growth = detect_growth([(s["tokens"], s["rss_bytes"]) for s in samples], warmup,
                           max_growth_mib * 2**20)
    post = [s for s in samples if s["tokens"] >= warmup]
    if len(post) >= 2 and post[-1]["seconds"] > post[0]["seconds"]:  # for runs of hours and days
        secs = np.array([s["seconds"] for s in post], np.float64)
        growth["growth_bytes_per_hour"] = float(np.polyfit(secs, [s["rss_bytes"] for s in post], 1)[0] * 3600)
    growth["growth_share"] = growth["growth_bytes"] / growth["baseline_bytes"]
    if all(s["heap_bytes"] is not None for s in samples):
        heap = detect_growth([(s["tokens"], s["heap_bytes"]) for s in samples], warmup,
                             max_growth_mib * 2**20)
        growth["heap_growth_bytes"] = heap["growth_bytes"]
        growth["heap_slope_bytes_per_1k_tokens"] = heap["slope_bytes_per_1k_tokens"]
        growth["leaked"] = growth["leaked"] or heap["leaked"]
    return {"shape": shape, "dtype": dtype, "threads": threads or 0, "tokens": done, "minutes": minutes,
            "calls": calls, "t_cycle": list(T_CYCLE), "every": every if minutes is None else None,
            "every_seconds": every_s if minutes is not None else None, "warmup_tokens": warmup,
            "churn": churn, "model": None if model is None else str(model), "memory_budget": budget,
            "with_model": with_model, "layers_created": created, "models_loaded": loaded,
            "seconds": round(time.monotonic() - t0, 3), "outputs_stable": stable,
            "samples": samples, **growth, "ok": stable and not growth["leaked"]}


def _mib(b: float) -> str:
    return f"{b / 2**20:9.2f}"


def _header(rep_or_args: dict) -> str:
    return (f"{'tokens':>10} {'calls':>8} {'RSS MiB':>9} {'vs start':>9}  {'layers':>6} {'models':>6} "
            f"{'model tok/s':>11}")


def _row(s: dict, start: int, warmup_tokens: int) -> str:
    mark = "  (warm-up)" if s["tokens"] < warmup_tokens else ""
    tps = f"{s['model_tokens_per_s']:>11.1f}" if "model_tokens_per_s" in s else f"{'':>11}"
    return (f"{s['tokens']:>10} {s['calls']:>8} {_mib(s['rss_bytes'])} "
            f"{_mib(s['rss_bytes'] - start)}  {s['layers_created']:>6} {s['models_loaded']:>6} {tps}{mark}")


def _summary(rep: dict) -> str:
    verdict = "OK" if rep["ok"] else "FAIL"
    return (f"soak: {rep['shape']} {rep['dtype']}, {rep['tokens']} tokens in {rep['calls']} calls "
            f"(T cycling {rep['t_cycle']}), {rep['layers_created']} layers created/freed, "
            f"{rep['models_loaded']} model loads, {rep['seconds']:.1f} s\n"
            f"growth after warm-up: {rep['growth_bytes'] / 2**20:+.2f} MiB "
            f"(threshold {rep['max_growth_bytes'] / 2**20:.2f} MiB), slope "
            f"{rep['slope_bytes_per_1k_tokens'] / 1024:+.2f} KiB per 1k tokens"
            + (f"; malloc'd bytes in use {rep['heap_growth_bytes'] / 2**20:+.2f} MiB"
               if "heap_growth_bytes" in rep else "")
            + f"; probe output "
            f"{'stable' if rep['outputs_stable'] else 'CHANGED'}: {verdict}")


def print_report(rep: dict, file=sys.stdout) -> None:
    """The table of samples and the verdict (what the CLI prints, live, without --json)."""
    print(_header(rep), file=file)
    start = rep["samples"][0]["rss_bytes"]
    for s in rep["samples"]:
        print(_row(s, start, rep["warmup_tokens"]), file=file)
    print(_summary(rep), file=file)


def main(argv: list[str] | None = None) -> int:
    from tuner.measure import problems

    p = _cli.Parser(
        prog="python -m colibri_bench soak",
        description="Run an MoE layer over N fresh tokens (T per call cycling 1, 2, 7, 64), "
                    "creating and freeing layers and models as it goes, and report resident "
                    "memory over time; fail if it grows after the warm-up.",
        epilog="Exit status: 0 no growth; 1 memory grew beyond --max-growth-mib or the probe "
               "output changed; 2 usage error.")
    run = p.add_mutually_exclusive_group(required=True)
    run.add_argument("--tokens", type=_cli.positive_int, help="tokens to run through the layer")
    run.add_argument("--minutes", type=_cli.positive_float, help="run this long instead (72 hours: 4320), a "
                     "sample every 1/40 of it, the first tenth the warm-up")
    p.add_argument("--shape", default="tiny", choices=sorted(problems.SHAPES),
                   help="layer shape (default tiny; qwen3-30b-a3b needs ~5 GB in f32)")
    p.add_argument("--dtype", default="f32", choices=["f32", "bf16", "int8"])
    p.add_argument("--threads", type=_cli.positive_int, help="threads per call (default: the library's)")
    p.add_argument("--every", type=_cli.positive_int, metavar="K", help="sample RSS every K tokens "
                   "(default tokens/40)")
    p.add_argument("--warmup", type=_cli.count, metavar="TOKENS",
                   help="tokens before the baseline sample (default max(K, tokens/10))")
    p.add_argument("--churn", type=_cli.positive_int, default=1,
                   help="layers (and model loads) created and freed per sample (default 1)")
    g = p.add_mutually_exclusive_group()
    g.add_argument("--model", metavar="FILE", help="also run (and reload) this model file")
    g.add_argument("--with-model", action="store_true",
                   help="write a 2-layer model file of the shape to a temporary directory and "
                        "also run (and reload) it")
    p.add_argument("--memory-budget", type=_cli.fraction, metavar="SHARE",
                   help="load the model under a memory budget holding this share of its routed experts "
                        "(the expert cache turns over all run long; needs --model or --with-model)")
    p.add_argument("--out", metavar="FILE", help="also write the report as JSON to FILE and, with matplotlib, "
                   "a plot of RSS and the model's tokens/s over time beside it (FILE with .png)")
    p.add_argument("--max-growth-mib", type=_cli.non_negative_float, default=4.0,
                   help="allowed RSS growth after the warm-up (default 4 MiB)")
    p.add_argument("--seed", type=_cli.count, default=0)
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    try:
        args = p.parse_args(argv)
    except SystemExit as exc:
        return EXIT_USAGE if exc.code else EXIT_OK
    start: list[int] = []

    def live(sample: dict) -> None:  # a row as each sample is taken: soaks run for hours
        if not start:
            start.append(sample["rss_bytes"])
            print(_header({}))
        print(_row(sample, start[0], warmup_tokens), flush=True)

    warmup_tokens = sample_plan(args.tokens, args.every, args.warmup)[1] if args.tokens else 0
    try:
        rep = soak(tokens=args.tokens, minutes=args.minutes, shape=args.shape, dtype=args.dtype,
                   threads=args.threads, every=args.every, warmup=args.warmup, churn=args.churn,
                   model=args.model, with_model=args.with_model, budget_share=args.memory_budget,
                   max_growth_mib=args.max_growth_mib, seed=args.seed,
                   progress=None if args.json else live)
    except (ValueError, TypeError, FileNotFoundError) as exc:
        print(f"colibri_bench soak: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except Exception as exc:  # the engine refused something (e.g. a broken model file)
        from colibri import ColibriError

        if not isinstance(exc, ColibriError):
            raise
        print(f"colibri_bench soak: {exc}", file=sys.stderr)
        return EXIT_GROWTH
    if args.json:
        json.dump(rep, sys.stdout, indent=1)
        print()
    else:
        print(_summary(rep))
    if args.out:
        out = Path(args.out)
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(rep, indent=1))
        png = plot(rep, out.with_suffix(".png"))
        print(f"wrote {out}" + (f" and {png}" if png else " (no matplotlib: no plot)"), file=sys.stderr)
    return EXIT_OK if rep["ok"] else EXIT_GROWTH


def plot(rep: dict, path: Path) -> Path | None:
    """RSS, and the model's tokens/s where it ran, against time (None without matplotlib)."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    hours = [s["seconds"] / 3600 for s in rep["samples"]]
    fig, ax = plt.subplots(figsize=(7, 4))
    ax.plot(hours, [s["rss_bytes"] / 2**20 for s in rep["samples"]], "-", color="tab:blue")
    ax.set_xlabel("hours")
    ax.set_ylabel("RSS MiB", color="tab:blue")
    ax.set_ylim(bottom=0)
    tps = [(h, s["model_tokens_per_s"]) for h, s in zip(hours, rep["samples"]) if "model_tokens_per_s" in s]
    if tps:
        ax2 = ax.twinx()
        ax2.plot(*zip(*tps), ".", color="tab:orange")
        ax2.set_ylabel("model tokens/s", color="tab:orange")
        ax2.set_ylim(bottom=0)
    budget = rep.get("memory_budget")
    ax.set_title(f"soak: {rep['tokens']} tokens" + (f", model budget {budget / 2**20:.0f} MiB" if budget else ""))
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path
