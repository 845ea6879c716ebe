"""The tuning report: reports/<host-id>/report.html (one self-contained page) and report.md.

    write_report(store_path, tuned_dir, out_dir, *, bench_json=None) -> dict

Reads files only, never the benchmark code (DESIGN.md: data flows one way):
  the results store            every measured variant (tuner/store/__init__.py), oldest first
  <tuned_dir>/manifest.json    host, profile, compiler, flags, winners, default, the
                               acceptance gate's record (tuner/build/emit.py, tuner/gate.py)
  <tuned_dir>/build_info.json  what the emitted library was built from
  <tuned_dir>/config.h         the emitted knobs and signature
  <tuned_dir>/libcolibri.so    disassembled by tuner.build.isacheck (registers vs promise)
  bench.json                   `colibri_bench bench` (default <out_dir>/bench.json)
A missing input is named on the page, never a crash. Each plot is drawn on its own:
a plot that fails is replaced by its error on the page and listed in "errors", and
the rest of the report is still written.

The HTML page embeds its plots as base64 PNG data URIs and its CSS inline: no
network, no script. The Markdown summary links the same PNGs, written beside it.
"""
from __future__ import annotations

import base64
import io
import json
import math
import os
import sqlite3
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from pathlib import Path

import jinja2

from tuner.build.signature import variant_id
from tuner.measure import problems as problems_mod
from tuner.measure.problems import DECODE_MAX_TOKENS

TEMPLATES = Path(__file__).resolve().parent / "templates"
# Reasons shown per failed variant: the head of the message (the whole one is in the store)
REASON_CHARS = 600
FAILED_ROWS_MAX = 200


@dataclass
class Plot:
    name: str                 # file stem: report-<name>.png
    title: str
    caption: str
    png: bytes | None = None
    note: str = ""            # why there is no image (no data), or the drawing error
    error: bool = False

    @property
    def data_uri(self) -> str:
        return "data:image/png;base64," + base64.b64encode(self.png).decode() if self.png else ""


@dataclass
class Inputs:
    """What the report was made from; each loader fills `missing` rather than raising."""
    store_path: Path | None
    tuned_dir: Path | None
    bench_path: Path | None
    rows: list = field(default_factory=list)          # Measurements, store order
    manifest: dict | None = None
    build_info: dict | None = None
    config: object = None                             # render.ConfigH
    bench: dict | None = None
    isa_check: dict | None = None
    missing: list = field(default_factory=list)       # (what, why)
    found: list = field(default_factory=list)         # (what, path)


# ------------------------------------------------------------------ loading

def _load_json(path: Path, what: str, inp: Inputs) -> dict | None:
    if not path.exists():
        inp.missing.append((what, f"{path} does not exist"))
        return None
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        inp.missing.append((what, f"{path} is unreadable: {exc}"))
        return None
    if not isinstance(data, dict):
        inp.missing.append((what, f"{path} is not a JSON object"))
        return None
    inp.found.append((what, str(path)))
    return data


# manifest keys the report reads, and the JSON type each must have (tuner/build/emit.py)
MANIFEST_SHAPE = {"host": dict, "summary": dict, "knobs": dict, "compiler": dict, "cflags": list,
                  "ldflags": list, "notes": list, "profile": str, "signature": str}
SUMMARY_SHAPE = {"classes": list, "rows": list, "default": dict, "winner": dict}


def _checked_manifest(man: dict | None, inp: Inputs) -> dict | None:
    """Drop (and name) the parts of a manifest that do not have the shape emit writes,
    so a hand-edited or truncated manifest gives a page that says so, not a crash."""
    if man is None:
        return None
    for shape, where, d in ((MANIFEST_SHAPE, "", man), (SUMMARY_SHAPE, "summary.", man.get("summary"))):
        if not isinstance(d, dict):
            continue
        for key, typ in shape.items():
            if key in d and d[key] is not None and not isinstance(d[key], typ):
                inp.missing.append(("manifest", f"{where}{key} is a {type(d[key]).__name__}, not a "
                                                f"{typ.__name__}: ignored"))
                del d[key]
        for key in ("classes", "rows"):
            if isinstance(d.get(key), list) and not all(isinstance(x, dict) for x in d[key]):
                inp.missing.append(("manifest", f"{where}{key} holds non-objects: ignored"))
                del d[key]
    return man


def load_inputs(store_path, tuned_dir, bench_json) -> Inputs:
    from colibri_build import render

    from tuner.build import isacheck
    from tuner.store import Store, StoreError

    inp = Inputs(Path(store_path) if store_path else None, Path(tuned_dir) if tuned_dir else None,
                 Path(bench_json) if bench_json else None)
    if inp.store_path is None:
        inp.missing.append(("results store", "no store path given"))
    elif not inp.store_path.exists():
        inp.missing.append(("results store", f"{inp.store_path} does not exist (run `python -m "
                                              f"tuner run` first)"))
    else:
        try:
            with Store(inp.store_path, readonly=True) as st:
                inp.rows = st.query()
            inp.found.append(("results store", f"{inp.store_path} ({len(inp.rows)} rows)"))
            if not inp.rows:
                inp.missing.append(("measurements", f"{inp.store_path} holds no measurements"))
        except (StoreError, sqlite3.Error) as exc:
            inp.missing.append(("results store", f"{inp.store_path}: {exc}"))
    if inp.tuned_dir is None:
        inp.missing.append(("tuned directory", "none given"))
    else:
        inp.manifest = _checked_manifest(_load_json(inp.tuned_dir / "manifest.json", "manifest", inp),
                                         inp)
        inp.build_info = _load_json(inp.tuned_dir / "build_info.json", "build info", inp)
        cpath = inp.tuned_dir / "config.h"
        if cpath.exists():
            try:
                inp.config = render.read_config_h(cpath)
                inp.found.append(("config.h", str(cpath)))
            except render.ConfigError as exc:
                inp.missing.append(("config.h", str(exc)))
        else:
            inp.missing.append(("config.h", f"{cpath} does not exist"))
        lib = inp.tuned_dir / "libcolibri.so"
        if lib.exists():
            isa = ((inp.manifest or {}).get("knobs") or {}).get("isa")
            inp.isa_check = isacheck.check_library(lib, isa=isa).to_dict()
            inp.found.append(("tuned library", str(lib)))
        else:
            inp.missing.append(("tuned library", f"{lib} does not exist: no ISA check"))
    # a merged store (a fleet registry) holds other hosts' rows: report this host's only
    hid = ((inp.manifest or {}).get("host") or {}).get("host_id")
    mine = [m for m in inp.rows if m.host_id == hid]
    if hid and mine and len(mine) < len(inp.rows):
        inp.found.append(("other hosts' rows", f"{len(inp.rows) - len(mine)} left out "
                                               f"(the report covers {hid})"))
        inp.rows = mine
    if inp.bench_path is not None:
        inp.bench = _load_json(inp.bench_path, "bench.json", inp)
        if inp.bench is not None and not isinstance(inp.bench.get("rows"), list):
            inp.missing.append(("bench.json", f"{inp.bench_path} has no rows list"))
            inp.bench = None
        elif inp.bench is not None:
            rows = inp.bench["rows"]
            inp.bench["rows"] = [r for r in rows if isinstance(r, dict)]
            if len(inp.bench["rows"]) < len(rows):
                inp.missing.append(("bench.json", f"{len(rows) - len(inp.bench['rows'])} row(s) "
                                                  f"of {inp.bench_path} are not objects: ignored"))
    return inp


# ------------------------------------------------------------------ derived figures

def _problem(name: str):
    try:
        return problems_mod.problem(name)
    except ValueError:
        return None


def _is_decode(name: str) -> bool:
    p = _problem(name)
    return p is not None and p.T <= DECODE_MAX_TOKENS


def _gbps(m) -> float | None:
    if m.gbps:
        return m.gbps
    p = _problem(m.problem)
    return p.decode_bytes / m.median_s / 1e9 if (p and p.T == 1 and m.median_s) else None


def _gflops(m) -> float | None:
    g = (m.extra or {}).get("gflops")
    if g:
        return g
    p = _problem(m.problem)
    return p.flops / m.median_s / 1e9 if (p and m.median_s) else None


def read_bandwidth(inp: Inputs) -> tuple[float | None, str]:
    """The host's measured read GB/s and where it came from (manifest, bench, store)."""
    summ = (inp.manifest or {}).get("summary") or {}
    if _is_num(summ.get("read_bandwidth_gbps")) and summ["read_bandwidth_gbps"] > 0:
        return float(summ["read_bandwidth_gbps"]), "manifest (tuner run's probe)"
    bw = ((inp.manifest or {}).get("host") or {}).get("bandwidth") or {}
    if isinstance(bw, dict) and _is_num(bw.get("read_gbps")) and bw["read_gbps"] > 0:
        return float(bw["read_gbps"]), "manifest host probe (best thread count)"
    bench = [r["read_bw_gbps"] for r in (inp.bench or {}).get("rows", [])
             if _is_num(r.get("read_bw_gbps")) and r["read_bw_gbps"] > 0]
    if bench:
        return max(bench), "bench.json (measured between cases)"
    # a store row keeps gbps and gbps / bandwidth: the bandwidth it was measured against
    derived = [m.gbps / m.bw_fraction for m in inp.rows if m.ok and m.gbps and m.bw_fraction]
    if derived:
        derived.sort()
        return derived[len(derived) // 2], "results store (gbps / bw_fraction)"
    return None, "not measured"


def _strategy_of(m, inp: Inputs) -> str:
    s = (m.extra or {}).get("strategy")
    if s:
        return s
    for c in ((inp.manifest or {}).get("summary") or {}).get("classes") or []:
        if m.problem in (c.get("problems") or []) and c.get("strategy"):
            return f"{c['strategy']} (from the manifest)"
    return "strategy not recorded"


def defaults_by_problem(inp: Inputs) -> dict:
    """problem -> the default variant id that run compared against (per class)."""
    summ = (inp.manifest or {}).get("summary") or {}
    out = {}
    for c in summ.get("classes") or []:
        if isinstance(c.get("default"), dict):
            for p in c.get("problems") or []:
                out[p] = variant_id(c["default"])
    glob = (summ.get("default") or {}).get("knobs")
    if isinstance(glob, dict):
        for m in inp.rows:
            out.setdefault(m.problem, variant_id(glob))
    return out


def groups(inp: Inputs) -> "OrderedDict[tuple, list]":
    g = OrderedDict()
    for m in sorted(inp.rows, key=lambda m: (m.kernel, m.problem)):
        g.setdefault((m.kernel, m.problem), []).append(m)
    for k in g:
        g[k].sort(key=lambda m: m.created)  # stable: store order breaks ties
    return g


# ------------------------------------------------------------------ plots

def _figure(nplots: int, width=6.4, height=3.6):
    from matplotlib.figure import Figure

    cols = min(nplots, 2)
    rows = math.ceil(nplots / cols)
    fig = Figure(figsize=(width * cols, height * rows), dpi=90, layout="constrained")
    axes = [fig.add_subplot(rows, cols, i + 1) for i in range(nplots)]
    return fig, axes


def _png(fig) -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", metadata={"Software": None})
    return buf.getvalue()


def convergence(inp: Inputs) -> "OrderedDict[tuple, OrderedDict[str, list]]":
    """(kernel, problem) -> strategy -> best-so-far seconds after each evaluation, in
    store order (a failed evaluation counts and keeps the previous best; None before
    the first success)."""
    out = OrderedDict()
    for key, rows in groups(inp).items():
        by = out.setdefault(key, OrderedDict())
        for m in rows:
            ys = by.setdefault(_strategy_of(m, inp), [])
            prev = ys[-1] if ys else None
            cur = m.median_s if m.ok else None
            ys.append(min(x for x in (prev, cur) if x is not None) if (prev or cur) else None)
    return out


def plot_convergence(inp: Inputs):
    series = convergence(inp)
    if not series:
        return None, "no measurements in the store"
    fig, axes = _figure(len(series))
    for ax, ((kernel, prob), by) in zip(axes, series.items()):
        for strat, ys in by.items():
            ax.step(range(1, len(ys) + 1), [math.nan if y is None else y * 1e3 for y in ys],
                    where="post", label=f"{strat} ({len(ys)} evals)")
        ax.set_title(f"{kernel}  {prob}", fontsize=9)
        ax.set_xlabel("evaluations (store order)")
        ax.set_ylabel("best so far [ms/call]")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    return fig, ""


def plot_distribution(inp: Inputs):
    g = groups(inp)
    ok = {k: [m for m in v if m.ok] for k, v in g.items()}
    ok = {k: v for k, v in ok.items() if v}
    if not ok:
        return None, "no successful measurements in the store"
    dflt = defaults_by_problem(inp)
    fig, axes = _figure(len(ok))
    for ax, ((kernel, prob), ms) in zip(axes, ok.items()):
        t = [m.median_s * 1e3 for m in ms]
        ax.hist(t, bins=min(40, max(5, len(t) // 4)), color="#4c78a8", alpha=0.85)
        best = min(ms, key=lambda m: m.median_s)
        ax.axvline(best.median_s * 1e3, color="#2ca02c", lw=2, label=f"best {best.median_s * 1e3:.3f} ms")
        d = next((m for m in ms if m.variant == dflt.get(prob)), None)
        if d is not None:
            ax.axvline(d.median_s * 1e3, color="#d62728", lw=2, ls="--",
                       label=f"default {d.median_s * 1e3:.3f} ms")
        ax.set_title(f"{kernel}  {prob}  ({len(ms)} variants)", fontsize=9)
        ax.set_xlabel("median time per call [ms]")
        ax.set_ylabel("variants")
        ax.legend(fontsize=7)
    return fig, ""


def prefill_bound_gflops(name: str, bw_gbps: float | None) -> float | None:
    """GFLOP/s a prefill call would reach if it only had to stream each touched expert's
    weights once at the read bandwidth: the memory roof of a roofline (an estimate:
    E * (1 - (1 - k/E)^T) experts expected to be touched by T tokens)."""
    p = _problem(name)
    if p is None or not bw_gbps:
        return None
    touched = p.E * (1 - (1 - p.k / p.E) ** p.T)
    # decode_bytes = k experts + shared expert + router: swap the k for the touched count
    nbytes = p.decode_bytes + (touched - p.k) * p.expert_bytes
    return p.flops / (nbytes / (bw_gbps * 1e9)) / 1e9


def throughput(inp: Inputs) -> dict:
    """decode: problem -> GB/s per ok variant, fastest first; prefill: problem -> GFLOP/s;
    bw: (read GB/s, source); prefill_bound: problem -> the memory-roof GFLOP/s."""
    dec, pre = OrderedDict(), OrderedDict()
    for (kernel, prob), rows in groups(inp).items():
        ok = [m for m in rows if m.ok]
        if _is_decode(prob):
            vals = [x for x in (_gbps(m) for m in ok) if x]
            if vals:
                dec[prob] = sorted(vals, reverse=True)
        else:
            vals = [x for x in (_gflops(m) for m in ok) if x]
            if vals:
                pre[prob] = sorted(vals, reverse=True)
    bw = read_bandwidth(inp)
    return {"decode": dec, "prefill": pre, "bw": bw,
            "prefill_bound": {p: prefill_bound_gflops(p, bw[0]) for p in pre}}


def plot_throughput(inp: Inputs):
    """Decode: GB/s of weights streamed per variant, against the measured read bandwidth
    (the roof a bandwidth-bound kernel cannot pass). Prefill: GFLOP/s per variant, with
    the memory roof where the bandwidth is known."""
    tp = throughput(inp)
    dec, pre, bw = tp["decode"], tp["prefill"], tp["bw"][0]
    if not dec and not pre:
        return None, "no successful measurements with a known problem shape"
    panels = [p for p in (dec and "decode", pre and "prefill") if p]
    fig, axes = _figure(len(panels))
    for ax, panel in zip(axes, panels):
        series = dec if panel == "decode" else pre
        for prob, ys in series.items():
            line, = ax.plot(range(1, len(ys) + 1), ys, marker=".", ms=3, lw=1, label=prob)
            bound = tp["prefill_bound"].get(prob) if panel == "prefill" else None
            if bound:
                ax.axhline(bound, color=line.get_color(), ls=":", lw=1.2,
                           label=f"memory roof {bound:.0f} GFLOP/s (estimate)")
        if panel == "decode":
            top = max(max(v) for v in dec.values())
            if bw:
                ax.axhline(bw, color="k", ls="--", lw=1.5, label=f"measured read bandwidth {bw:.1f} GB/s")
                ax.set_ylim(0, max(bw, top) * 1.1)
                ax.set_title(f"decode: weight GB/s per variant (best {100 * top / bw:.0f}% of read bandwidth)",
                             fontsize=9)
            else:
                ax.set_title("decode: weight GB/s per variant (read bandwidth not measured)", fontsize=9)
            ax.set_ylabel("GB/s of weights streamed")
        else:
            ax.set_title("prefill: GFLOP/s per variant", fontsize=9)
            ax.set_ylabel("GFLOP/s")
            ax.set_ylim(bottom=0)
        ax.set_xlabel("variants, fastest first")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    return fig, ""


def plot_default_vs_tuned(inp: Inputs):
    rows = [r for r in (((inp.manifest or {}).get("summary") or {}).get("rows") or [])
            if r.get("tuned_s")]
    bench = (inp.bench or {}).get("rows") or []
    if not rows and not bench:
        return None, "needs the manifest's re-timed rows or bench.json: neither is there"
    fig, axes = _figure(int(bool(rows)) + int(bool(bench)), width=7.0)
    axes = list(axes)
    if rows:
        ax = axes.pop(0)
        names = [r["problem"] for r in rows]
        x = range(len(rows))
        d = [(r.get("default_s") or math.nan) * 1e3 for r in rows]
        t = [r["tuned_s"] * 1e3 for r in rows]
        ax.bar([i - 0.2 for i in x], d, 0.4, label="default", color="#d62728")
        ax.bar([i + 0.2 for i in x], t, 0.4, label="tuned", color="#2ca02c")
        for i, r in enumerate(rows):
            if r.get("speedup"):
                ax.annotate(f"{r['speedup']:.2f}x", (i + 0.2, t[i]), ha="center", va="bottom", fontsize=8)
        ax.set_xticks(list(x), names, rotation=15, ha="right", fontsize=7)
        ax.set_xlim(-0.8, len(rows) - 0.2)
        ax.set_ylabel("ms per call (re-timed, interleaved)")
        ax.set_title("tuner run: default vs tuned per problem", fontsize=9)
        ax.legend(fontsize=7)
    if bench:
        ax = axes.pop(0)
        cases = list(OrderedDict.fromkeys(f"{r['case']} t{r['threads']}" for r in bench))
        impls = list(OrderedDict.fromkeys(r["impl"] for r in bench))
        w = 0.8 / max(1, len(impls))
        for j, impl in enumerate(impls):
            ys = []
            for c in cases:
                r = next((r for r in bench if f"{r['case']} t{r['threads']}" == c and r["impl"] == impl), None)
                ys.append(r["ms_per_token"] if r else math.nan)
            ax.bar([i - 0.4 + w * (j + 0.5) for i in range(len(cases))], ys, w, label=impl)
        ax.set_yscale("log")
        ax.set_xticks(range(len(cases)), cases, rotation=15, ha="right", fontsize=7)
        ax.set_ylabel("ms per token (log)")
        ax.set_title("colibri_bench bench: per case", fontsize=9)
        ax.legend(fontsize=7)
    return fig, ""


def plot_roofline(inp: Inputs):
    """bench.json's rows as % of their roofline: decode against the read bandwidth,
    prefill against max(bytes / bandwidth, flops / compute peak)."""
    bench = [r for r in ((inp.bench or {}).get("rows") or [])
             if r.get("pct_of_roof") and str(r.get("impl", "")).startswith("colibri")]
    if not bench:
        return None, "needs bench.json with roofline figures (python -m colibri_bench bench)"
    panels = [(ph, [r for r in bench if ("/decode/" in r["case"]) == (ph == "decode")])
              for ph in ("decode", "prefill")]
    panels = [(ph, rows) for ph, rows in panels if rows]
    fig, axes = _figure(len(panels), width=7.0)
    for ax, (ph, rows) in zip(axes, panels):
        cases = list(OrderedDict.fromkeys(f"{r['case']} t{r['threads']}" for r in rows))
        impls = list(OrderedDict.fromkeys(r["impl"] for r in rows))
        w = 0.8 / len(impls)
        for j, impl in enumerate(impls):
            ys = [next((r["pct_of_roof"] for r in rows if r["impl"] == impl
                        and f"{r['case']} t{r['threads']}" == c), math.nan) for c in cases]
            ax.barh([i - 0.4 + w * (j + 0.5) for i in range(len(cases))], ys, w, label=impl)
        ax.axvline(100, color="k", ls="--", lw=1)
        ax.set_yticks(range(len(cases)), cases, fontsize=6)
        ax.invert_yaxis()
        ax.set_xlabel("% of read bandwidth" if ph == "decode" else "% of roofline")
        ax.set_title("decode: weight stream against the read bandwidth" if ph == "decode" else
                     "prefill: against max(bytes / bandwidth, flops / compute peak)", fontsize=9)
        ax.legend(fontsize=7)
    return fig, ""


PLOTS = (
    ("convergence", "Search convergence",
     "Best time so far against the number of variants evaluated, per kernel and problem "
     "and per search strategy, in the order the store recorded them (failed variants "
     "count as evaluations).", plot_convergence),
    ("distribution", "Distribution of variant times",
     "Median time per call of every variant that passed verification; the default and "
     "the best are marked.", plot_distribution),
    ("throughput", "Achieved throughput against the hardware",
     "Decode streams weights from DRAM: GB/s of weight bytes per variant against the host's "
     "measured read bandwidth (roofline-style: the dashed line is the roof). Prefill: "
     "GFLOP/s per variant, with the memory roof (each touched expert's weights streamed "
     "once at the read bandwidth) where the bandwidth is known.", plot_throughput),
    ("default-vs-tuned", "Default vs tuned",
     "Per problem, the profile's default variant and the tuned winner re-timed "
     "interleaved by `tuner run` (manifest); per case, `colibri_bench bench`'s figures.",
     plot_default_vs_tuned),
    ("roofline", "Benchmark against the roofline",
     "colibri_bench bench's rows as a share of their roofline: decode's weight stream "
     "against the read bandwidth measured in the same rounds; prefill's time against "
     "max(the reached experts' bytes / read bandwidth, flops / the compute peak of the "
     "fastest unit for its weight dtype), the peaks measured at the start of the bench.",
     plot_roofline),
)


def draw_plots(inp: Inputs) -> list[Plot]:
    out = []
    for name, title, caption, fn in PLOTS:
        p = Plot(name, title, caption)
        try:
            fig, p.note = fn(inp)
            if fig is not None:
                p.png = _png(fig)
        except ModuleNotFoundError as exc:  # the plotting extra is not installed: said, not an error
            p.note = (f"not drawn: {exc.name} is not installed "
                      "(pip install 'colibri-moe[tune]' draws it)")
        except Exception as exc:  # one broken plot must not lose the report
            p.note, p.error = f"could not draw this plot: {type(exc).__name__}: {exc}", True
        out.append(p)
    return out


# ------------------------------------------------------------------ page content

def _fmt_bytes(n) -> str:
    if n is None:
        return "?"
    for unit, f in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= f:
            v = n / f
            return f"{v:.0f} {unit}" if v == int(v) else f"{v:.1f} {unit}"
    return f"{n} B"


VECTOR_FLAGS = ("sse4_2", "avx", "avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512vl",
                "avx512_bf16", "avx512_fp16", "avx512_vnni", "avx_vnni", "amx_tile", "amx_bf16",
                "amx_int8", "asimd", "asimdhp", "asimddp", "sve", "sve2", "bf16", "i8mm")


def host_summary(inp: Inputs) -> list[tuple[str, str]]:
    """(label, value) rows of the host section, from the manifest (and build_info)."""
    man = inp.manifest or {}
    h = man.get("host") or {}
    bi = inp.build_info or {}
    rows = []

    def add(label, value):
        if value not in (None, "", [], {}):
            rows.append((label, str(value)))

    add("host id", h.get("host_id"))
    add("CPU", " ".join(str(x) for x in (h.get("vendor"), h.get("model_name")) if x))
    ua = h.get("microarchitecture")
    if ua:
        src = h.get("microarchitecture_source")
        add("microarchitecture", ua + (f" (from {src}: {h.get('microarchitecture_reason')})"
                                       if src else ""))
    add("architecture", h.get("arch") or bi.get("arch"))
    if h.get("cores") or h.get("threads"):
        add("cores / threads / sockets", f"{h.get('cores')} / {h.get('threads')} / {h.get('sockets')}")
    isa = h.get("isa") or []
    if isa:
        vec = [f for f in VECTOR_FLAGS if f in isa]
        add("ISA (vector)", ", ".join(vec) + f"  ({len(isa)} flags in all)")
    caches = h.get("caches") or []
    if caches:
        kind = {"Data": "d", "Instruction": "i"}
        add("caches", "; ".join(
            f"L{c.get('level')}{kind.get(c.get('type'), '')} {_fmt_bytes(c.get('size_bytes'))}"
            + (f" (shared by {c['shared_cpu_count']} CPUs)" if (c.get("shared_cpu_count") or 1) > 1 else "")
            for c in caches))
    numa = h.get("numa") or {}
    if numa.get("nodes"):
        add("NUMA", f"{len(numa['nodes'])} node(s): " + "; ".join(
            f"node {n.get('id')} cpus {n.get('cpus')} {_fmt_bytes(n.get('memory_bytes'))}"
            for n in numa["nodes"]) + (f"; distances {numa.get('distances')}" if numa.get("distances") else ""))
    hp = h.get("hugepages") or {}
    if hp:
        pools = ", ".join(f"{_fmt_bytes(p.get('page_size_bytes'))}: {p.get('nr')} reserved"
                          for p in hp.get("hugetlb_pools") or [])
        add("huge pages", f"THP {hp.get('thp_enabled')} (defrag {hp.get('thp_defrag')})"
                          + (f"; hugetlb {pools}" if pools else ""))
    if h.get("memory_channels") is not None:
        add("memory channels", h["memory_channels"])
    elif h.get("memory_channels_reason"):
        add("memory channels", f"unknown: {h['memory_channels_reason']}")
    add("memory", _fmt_bytes(h.get("memory_total_bytes")) if h.get("memory_total_bytes") else None)
    bw = h.get("bandwidth") or {}
    if bw.get("read"):
        add("bandwidth (GB/s, by threads)",
            "read " + ", ".join(f"{k}: {v:.1f}" for k, v in bw["read"].items() if v)
            + ("; triad " + ", ".join(f"{k}: {v:.1f}" for k, v in bw["triad"].items() if v)
               if bw.get("triad") else ""))
    else:
        val, src = read_bandwidth(inp)
        add("read bandwidth", f"{val:.1f} GB/s ({src})" if val else
            (h.get("bandwidth_reason") or "not measured"))
    cp = h.get("compute") or {}
    if cp.get("runs"):
        add("compute peaks (GOP/s, by threads)", "; ".join(
            f"{kind} " + ", ".join(f"{t}: {g:.0f}" for t, g in cp[kind].items())
            for kind in cp if isinstance(cp.get(kind), dict) and kind not in ("reasons",)))
    elif h.get("compute_reason"):
        add("compute peaks", h["compute_reason"])
    comp = man.get("compiler") or bi.get("compiler") or {}
    if comp:
        add("compiler", f"{comp.get('family')} {comp.get('version')} ({comp.get('path')})")
    add("cflags", " ".join(man.get("cflags") or bi.get("cflags") or []))
    add("ldflags", " ".join(man.get("ldflags") or bi.get("ldflags") or []))
    prof = man.get("profile") or bi.get("profile")
    add("profile", prof)
    if prof and h.get("profile") and h["profile"] != prof:
        add("why this profile", f"chosen for the run (--profile); this host matches "
                                f"{h['profile']}: {h.get('profile_reason') or ''}")
    else:
        add("why this profile", h.get("profile_reason"))
    add("profile features", ", ".join(bi.get("features") or []))
    for n in man.get("notes") or bi.get("notes") or []:
        add("note", n)
    return rows


def winners(inp: Inputs) -> dict:
    man = inp.manifest or {}
    summ = man.get("summary") or {}
    classes = []
    for c in summ.get("classes") or []:
        w = c.get("winner") or {}
        # the class's own knobs (older manifests: the whole variant id)
        mine = ",".join(f"{k}={(w.get('knobs') or {}).get(k)}" for k in c.get("knobs") or [])
        overall = (w.get("verdict") or {}).get("overall") or {}
        sc = c.get("shape_class")
        classes.append({"class": f"{sc}/{c.get('class')}" if sc else c.get("class"),
                        "strategy": c.get("strategy"),
                        "evaluations": c.get("evaluations"), "space_size": c.get("space_size"),
                        "problems": c.get("problems") or [], "winner": mine or w.get("vid"),
                        "is_default": w.get("is_default"),
                        "ratio": (f"{overall['median']:.3f}x [{overall['lo']:.3f}, {overall['hi']:.3f}]"
                                  if overall and not w.get("is_default") else None)})
    best = []
    dflt = defaults_by_problem(inp)
    for (kernel, prob), ms in groups(inp).items():
        ok = [m for m in ms if m.ok]
        b = min(ok, key=lambda m: m.median_s) if ok else None
        d = next((m for m in ok if m.variant == dflt.get(prob)), None)
        best.append({"kernel": kernel, "problem": prob, "variants": len(ms), "ok": len(ok),
                     "best": b.variant if b else None,
                     "best_ms": b.median_s * 1e3 if b else None,
                     "default_ms": d.median_s * 1e3 if d else None,
                     "speedup": d.median_s / b.median_s if (b and d) else None,
                     "gbps": _gbps(b) if b else None, "gflops": _gflops(b) if b else None,
                     "bw_fraction": b.bw_fraction if b else None})
    return {"knobs": man.get("knobs") or (inp.config.knobs if inp.config else {}),
            "classes": classes, "rows": _records(summ.get("rows"), RUN_ROW_KEYS), "best": best,
            "strategy": summ.get("strategy"), "evaluations": summ.get("evaluations"),
            "space_size": summ.get("space_size")}


def failures(inp: Inputs) -> dict:
    bad = [m for m in inp.rows if not m.ok]
    counts = OrderedDict()
    for m in bad:
        counts[m.status] = counts.get(m.status, 0) + 1
    rows = [{"variant": m.variant, "problem": m.problem, "status": m.status,
             "reason": (m.reason or "")[:REASON_CHARS],
             "headline": (m.reason or "").strip().splitlines()[-1][:160] if m.reason else ""}
            for m in bad[:FAILED_ROWS_MAX]]
    return {"counts": counts, "rows": rows, "total": len(bad),
            "truncated": max(0, len(bad) - FAILED_ROWS_MAX)}


GATE_EMPTY = {"state": "absent", "message": "", "rows": [], "threads": [], "reverted": [],
              "passes": [], "rule": None, "shapes": [], "rounds": None, "min_seconds": None,
              "note": None}


def _gate_cell(c: dict | None) -> dict:
    """One matrix cell as the page shows it: its text, its colour class, a tooltip."""
    if c is None:
        return {"text": "-", "cls": "missing", "title": "not in the matrix"}
    if c.get("status") != "ok":
        reason = str(c.get("reason") or "")
        return {"text": str(c.get("status")), "cls": "failed", "title": reason[:REASON_CHARS]}
    text = f"{_fmt(c.get('median'), '.3f')}x [{_fmt(c.get('lo'), '.3f')}, {_fmt(c.get('hi'), '.3f')}]"
    # the verdict the gate recorded, not one recomputed here: the page shows what decided
    cls = "slower" if c.get("slower") else "faster" if c.get("faster") else "neutral"
    title = "; ".join(x for x in (
        f"default {_fmt(c.get('default_s'), '.3g')} s, tuned {_fmt(c.get('candidate_s'), '.3g')} s, "
        f"{c.get('rounds')} rounds",
        "classes: " + ", ".join(c.get("owners") or []) if c.get("owners") else "",
        str(c.get("note") or "")) if x)
    return {"text": text, "cls": cls, "title": title}


def gate_matrix(inp: Inputs) -> dict:
    """The acceptance gate (tuner/gate.py) as the manifest records it: the last pass's
    cells as a problem x threads table, the reverted classes and why, each pass."""
    man = inp.manifest
    if man is None:
        return dict(GATE_EMPTY, message="No manifest: the gate's record is unknown.")
    if "gate" not in man:
        return dict(GATE_EMPTY, message="This artifact predates the acceptance gate: its manifest "
                                        "has no gate record.")
    g = man["gate"]
    if g is None:
        return dict(GATE_EMPTY, message="The gate was not run for this artifact (tuner run --no-gate).")
    cells = [c for c in g.get("cells") or [] if isinstance(c, dict)]
    threads = list(g.get("threads") or []) or sorted({c.get("threads") for c in cells},
                                                     key=str)
    by = OrderedDict()
    for c in cells:
        by.setdefault(c.get("problem"), {})[c.get("threads")] = c
    rows = [{"problem": p, "cells": [_gate_cell(cs.get(th)) for th in threads]}
            for p, cs in by.items()]
    reverted = [{"class": cls, "cells": [str(x) for x in (r or {}).get("cells") or []]}
                for cls, r in (g.get("reverted") or {}).items()]
    passes = [{"vid": p.get("vid"), "changed": list(p.get("changed") or {}),
               "reverted": list(p.get("reverted") or []), "cells": len(p.get("cells") or [])}
              for p in g.get("passes") or [] if isinstance(p, dict)]
    return {"state": "passed" if g.get("passed") else "failed", "message": "", "rows": rows,
            "threads": threads, "reverted": reverted, "passes": passes, "rule": g.get("rule"),
            "shapes": list(g.get("shapes") or []), "rounds": g.get("rounds"),
            "min_seconds": g.get("min_seconds"), "note": g.get("note")}


def signatures(inp: Inputs) -> dict:
    man = inp.manifest or {}
    cfg = inp.config
    bi_cfg = (inp.build_info or {}).get("config") or {}
    sigs = {"manifest": man.get("signature"), "config.h": getattr(cfg, "signature", None),
            "library (build_info.json)": bi_cfg.get("signature")}
    present = {v for v in sigs.values() if v}
    return {"sigs": sigs, "agree": len(present) == 1 if present else None}


def _host_id(inp: Inputs, out_dir: Path) -> str:
    h = ((inp.manifest or {}).get("host") or {}).get("host_id")
    if h:
        return h
    ids = OrderedDict.fromkeys(m.host_id for m in inp.rows if m.host_id)
    return next(iter(ids), None) or out_dir.name


def _section(fn, inp: Inputs, empty):
    """A page section from inputs of an unexpected shape: named on the page, not a crash."""
    try:
        return fn(inp)
    except Exception as exc:
        inp.missing.append((fn.__name__.replace("_", " "),
                            f"could not be read from the inputs: {type(exc).__name__}: {exc}"))
        return empty


def context(inp: Inputs, plots: list[Plot], out_dir: Path) -> dict:
    return {
        "host_id": _host_id(inp, out_dir),
        "generated": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
        "inputs": inp, "missing": inp.missing, "found": inp.found,
        "host": _section(host_summary, inp, []),
        "winners": _section(winners, inp, {"knobs": {}, "classes": [], "rows": [], "best": []}),
        "failed": _section(failures, inp, {"counts": {}, "rows": [], "total": 0, "truncated": 0}),
        "signatures": _section(signatures, inp, {"sigs": {}, "agree": None}),
        "gate": _section(gate_matrix, inp, dict(GATE_EMPTY, message="The gate's record could "
                                                "not be read (see Missing inputs).")),
        "isa": inp.isa_check, "plots": plots,
        "bench": _records((inp.bench or {}).get("rows"), BENCH_ROW_KEYS),
        "read_bw": read_bandwidth(inp),
        "profile": (inp.manifest or {}).get("profile") or (inp.build_info or {}).get("profile"),
        # the run's one sentence: what tuning bought here, per shape class (tuner/summary.py)
        "headline": str((inp.manifest or {}).get("headline") or ""),
    }


# the keys the page shows of a run summary row (tuner/run.py) and of a bench.json row
RUN_ROW_KEYS = ("problem", "class", "default_s", "tuned_s", "speedup", "gbps", "bw_fraction",
                "gflops", "shape_class")
BENCH_ROW_KEYS = ("case", "threads", "impl", "ms_per_token", "gbps", "pct_of_roof", "gflops",
                  "vs_numpy", "vs_torch")


def _records(rows, keys) -> list[dict]:
    """Rows as dicts with exactly `keys` (absent ones None): the templates never meet a
    missing key, whatever a hand-edited file holds."""
    return [{k: r.get(k) for k in keys} for r in (rows if isinstance(rows, list) else [])
            if isinstance(r, dict)]


def _is_num(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def _fmt(v, spec: str) -> str:
    if v is None:
        return "-"
    return format(v, spec) if _is_num(v) else str(v)


def _env(autoescape: bool) -> jinja2.Environment:
    env = jinja2.Environment(loader=jinja2.FileSystemLoader(str(TEMPLATES)),
                             autoescape=autoescape, undefined=jinja2.StrictUndefined,
                             trim_blocks=True, lstrip_blocks=True, keep_trailing_newline=True)
    env.filters["ms"] = lambda v: _fmt(v, ".3f")
    env.filters["sec_ms"] = lambda v: _fmt(v * 1e3 if _is_num(v) else v, ".3f")
    env.filters["num"] = lambda v, spec=".1f": _fmt(v, spec)
    env.filters["pct"] = lambda v: _fmt(v * 100 if _is_num(v) else v, ".0f") + ("%" if _is_num(v) else "")
    env.filters["md"] = lambda v: str(v).replace("|", "\\|").replace("\n", " ")
    return env


def _atomic_write(path: Path, data: bytes) -> None:
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    tmp.write_bytes(data)
    os.replace(tmp, path)


def write_report(store_path, tuned_dir, out_dir, *, bench_json=None) -> dict:
    """Write <out_dir>/report.html, report.md and report-<plot>.png.

    Returns {"html": Path, "md": Path, "isa_check": dict or None, "plots": {name: png Path
    or None}, "missing": [(what, why)], "errors": [plot errors]}. Raises OSError only
    when out_dir cannot be written."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    if bench_json is None and (out_dir / "bench.json").exists():
        bench_json = out_dir / "bench.json"
    inp = load_inputs(store_path, tuned_dir, bench_json)
    if bench_json is None:
        inp.missing.append(("bench.json", f"none in {out_dir} (python -m colibri_bench bench writes it)"))
    plots = draw_plots(inp)
    ctx = context(inp, plots, out_dir)
    pngs = {}
    for p in plots:
        path = out_dir / f"report-{p.name}.png"
        if p.png:
            _atomic_write(path, p.png)
            pngs[p.name] = path
        else:
            path.unlink(missing_ok=True)  # never leave a stale plot beside a new page
            pngs[p.name] = None
    html_path, md_path = out_dir / "report.html", out_dir / "report.md"
    _atomic_write(html_path, _env(True).get_template("report.html.j2").render(ctx).encode())
    _atomic_write(md_path, _env(False).get_template("report.md.j2").render(ctx).encode())
    return {"html": html_path, "md": md_path, "isa_check": inp.isa_check, "plots": pngs,
            "missing": list(inp.missing),
            "errors": [f"{p.name}: {p.note}" for p in plots if p.error]}
