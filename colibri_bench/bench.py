"""python -m colibri_bench bench: the MoE layer side by side — Colibri (tuned and default
library) in each weight dtype, NumPy per-expert matmuls as a user would write them,
PyTorch eager when installed — with the host's read bandwidth measured in the same
rounds, so every figure is a ratio within one run.

Interleaving: each group (shape, phase, dtype, threads) is timed in `rounds` rounds;
a round measures the read bandwidth, then every implementation for `min_seconds`. Every
Colibri library runs the layer from the same model file (tuner/measure/weights.py's
ensure_model). Where the layer reads its file in place they read the same memory; where
it packs the weights at load, each library has an arena of its own, and each group first
loads a throwaway copy that it holds and never times (held_copy), so that no timed layer
gets the first-loaded arena's penalty.
A figure is the median over rounds of each round's median, and a ratio the median
over rounds of the per-round ratios, so a minute-to-minute swing of this machine's
bandwidth moves both sides of a ratio together.

Every row carries `major_faults`: the pages its group had to read from disk during its
rounds (the process's major page faults). Above FAULT_WARN_PAGES the bench says so: the
page cache did not hold that model file, and its rows read partly from disk (a peer that
holds its own copy of the weights, as ggml does, makes that likelier on a small machine).

Decode (T=1) takes a fresh token per call (the router picks other experts; all
experts' weights are resident). Where one layer's weights are less than 4x the
last-level cache (int4, int8, bf16 on the smaller shapes), or its shared expert (read
by every call) is, Colibri cycles through that many copies of the layer (layers of the
model file; at most 8, and 3 GiB), as a model's layers follow each other, so its
weights come from memory as they would in a model (`layer_copies` in the JSON); and
where a decode call's weights are, enough copies that the calls between two on one copy
stream the cache's size, since consecutive tokens share some experts
(tuner/host/bandwidth.py's copies_for). Colibri is timed
inside C; NumPy and PyTorch by wall clock around each call, with their thread pools
pinned to the same thread count. GB/s counts the weight bytes a decode token streams
(k experts with their scales, the shared expert, the router).

The roof of a row is its roofline time, max(bytes / read bandwidth, flops / compute
peak): the bytes of the experts the inputs' routing reaches (with their scales, the
shared expert and the router), over the read bandwidth measured in the same rounds at
the same thread count, and the call's flops over the fastest unit that can compute
the row's weight dtype (tuner.host.peak: f32 FMA, bf16 and int8 dots, AMX; its roof_gops
says which unit counts for which dtype). The peaks are measured at the start (best of a
few bursts, printed and in the JSON) and again in every round of a prefill group, one
short burst per unit beside the bandwidth pass; a group's roof takes the best of its
rounds' bursts, the machine's capability while that group ran (a neighbour arriving
mid-run slowed a whole group by 1.2-2x here, and a roof from the start would have
counted that against the kernels). "% roof" is
roof time over measured time: for decode that is the share of the read bandwidth, for
prefill of whichever bound is higher ("roof by" names it). Both are the median over rounds
of each round's share (its time against the bandwidth read in that round), so a swing of
the bandwidth between rounds does not pair one round's time with another's reading.
Where the tuned library runs, for a row's shape and dtype, the same kernel part as the
default build (kernel_tables.json: the part's name is the hash of its text) from the same
compiler and flags, the two run the same machine code: the tuned library is not timed
there (a tie by construction; --time-same-code times it, and its ratio is then this
machine's noise, marked "(same code)"). The last line counts those cells and gives the
range of the others' tuned/default ratios. Prefill's figure is GFLOP/s. NumPy and PyTorch always run on the f32 weights
(neither has a bf16/int8/int4 matmul a user would reach for), so "vs numpy" on a
bf16 row is what switching from NumPy f32 to Colibri bf16 buys.
"""
from __future__ import annotations

import contextlib
import json
import os
import resource
import sys
import time
import warnings
from pathlib import Path

import numpy as np

from colibri import _cli, quant
from colibri._lib import ffi, open_library
from colibri.layer import _route_config
from colibri_build import hostid, parts
from colibri_build.paths import build_dir_default, reports_dir_default
from tuner.host.peak import KINDS
from tuner.measure import problems as problems_mod, weights
from tuner.measure.worker import round_order

BLAS_ENV = ("OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE")
REFERENCE_SHAPES = ("qwen3-30b-a3b", "mixtral-8x7b", "olmoe-1b-7b", "qwen1.5-moe-a2.7b")
PHASES = ("decode", "prefill128", "prefill512")
ROUTE_T = 512


def _median(xs):
    return float(np.median(np.asarray(xs, dtype=float)))


def read_bandwidth(lib, threads: int, nbytes: int, min_seconds: float = 0.2) -> float | None:
    out = ffi.new("double *")
    st = lib.colibri_membw(0, nbytes, threads, min_seconds, out)
    return float(out[0]) if st == 0 else None


def _inputs(p, n, seed):
    rng = np.random.default_rng(seed)
    return rng.standard_normal((n, p.T, p.H), dtype=np.float32)


class Mapped:
    """One library's layers of a model file: the copies of one layer that stand for a
    model's consecutive layers."""

    def __init__(self, path, lib_path):
        from colibri.model import Model

        self.model = Model.load(path, lib=str(lib_path))
        self.lib, self.hidden, self.count = self.model._lib, self.model.hidden, self.model.n_layers
        self.ptrs = ffi.new("colibri_layer *[]", [self.lib.colibri_model_layer(self.model._handle, i)
                                                  for i in range(self.count)])


def held_copy(path, lib_path) -> Mapped | None:
    """A throwaway copy of the model file at `path`, loaded before a group's timed layers
    and held, never timed, to the group's end (None where the layers are read in place
    from the file: nothing is allocated). The first packed model a process allocates,
    and on this bench the first after a group's models were freed, ran 4-9% slower than
    its twins for as long as it lived (tuner.measure.worker._first_packed_model has the
    figures): without the copy, that fell on whichever implementation loaded first."""
    m = Mapped(path, lib_path)
    if m.model.layer_page_kind(0) == "file":
        m.model.close()
        return None
    return m


def kernel_code(libs: dict, path, dtype: str) -> dict:
    """Per library, the kernel table its layer of the model file at `path` runs, the part
    that table runs for `dtype` (kernel_tables.json beside the library; the part's name is
    the hash of its rendered text) and what it is built from (compiler, flags, and the part,
    or the knobs where the library has no kernel_tables.json). The hand-written sources
    read no knob, so two libraries whose built_from entries are equal run the same machine
    code on this shape and dtype: their ratio could only be the machine's noise."""
    out = {}
    for name, lib in libs.items():
        table = Mapped(path, lib).model.layer_kernels(0)
        info = json.loads(ffi.string(open_library(lib).colibri_build_info()).decode())
        tables = parts.read_tables(Path(lib).parent / "kernel_tables.json") or {}
        part = (tables.get(table) or {}).get(parts.part_of(dtype))
        knobs = dict(info.get("knobs") or {}, **(info.get("shape_classes") or {}).get(table, {}))
        out[name] = {"kernels": table, "part": part,
                     "built_from": [info.get("compiler"), info.get("cflags"), part or knobs]}
    return out


def same_code(code: dict) -> bool:
    """Whether every library in kernel_code's answer runs the same machine code."""
    return len({json.dumps(c["built_from"], sort_keys=True) for c in code.values()}) == 1


def time_colibri(layers: Mapped, xs, threads, min_seconds) -> float:
    """Median seconds per call, timed inside C (colibri_bench_layers), call i on layer
    i mod layers.count."""
    lib = layers.lib
    T = xs.shape[1]
    out = np.empty((T, layers.hidden), np.float32)
    samples = np.empty(100_000)
    n = ffi.new("int *")
    ptrs = layers.ptrs
    st = lib.colibri_bench_layers(ptrs, layers.count, ffi.from_buffer("float[]", xs), len(xs), T,
                                  ffi.from_buffer("float[]", out), threads, layers.count,
                                  min_seconds, len(samples), ffi.from_buffer("double[]", samples), n)
    if st:
        raise RuntimeError("colibri_bench_layers: " + ffi.string(lib.colibri_last_error()).decode())
    return _median(samples[:n[0]])


def time_route(lib, p, T, min_seconds, seed=0) -> float:
    """Median seconds of the routing step alone (softmax + top-k + weights) at T tokens."""
    logits = np.random.default_rng(seed).standard_normal((T, p.E), dtype=np.float32) * 3
    cfg = _route_config(p.E, p.k, p.scoring, p.norm, 0.0, 1, None)
    slots = lib.colibri_route_slots(cfg)
    idx = np.empty((T, slots), np.int32)
    w = np.empty((T, slots), np.float32)
    samples = np.empty(100_000)
    n = ffi.new("int *")
    st = lib.colibri_bench_route(ffi.from_buffer("float[]", logits), T, p.E, cfg,
                                 ffi.from_buffer("int32_t[]", idx), ffi.from_buffer("float[]", w),
                                 3, min_seconds, len(samples), ffi.from_buffer("double[]", samples), n)
    if st:
        raise RuntimeError("colibri_bench_route: " + ffi.string(lib.colibri_last_error()).decode())
    return _median(samples[:n[0]])


def _silu(g):
    return g / (1 + np.exp(-g))


def numpy_layer(x, w, p):
    """The layer as a NumPy user writes it: float32, route, then per expert one matmul
    over the tokens routed to it."""
    logits = x @ w["router"].T
    probs = np.exp(logits - logits.max(axis=1, keepdims=True))
    probs /= probs.sum(axis=1, keepdims=True)
    top = np.argpartition(-probs, p.k - 1, axis=1)[:, :p.k]
    wts = np.take_along_axis(probs, top, axis=1)
    if p.norm:
        wts /= wts.sum(axis=1, keepdims=True)
    y = np.zeros_like(x)
    for e in np.unique(top):
        rows, slot = np.nonzero(top == e)
        xe = x[rows]
        h = _silu(xe @ w["gate"][e].T) * (xe @ w["up"][e].T)
        y[rows] += wts[rows, slot][:, None] * (h @ w["down"][e].T)
    if p.S:
        s = (_silu(x @ w["shared_gate"].T) * (x @ w["shared_up"].T)) @ w["shared_down"].T
        if "shared_expert_gate" in w:
            s *= (1 / (1 + np.exp(-(x @ w["shared_expert_gate"]))))[:, None]
        y += s
    return y


def time_python(fn, xs, min_seconds) -> float:
    fn(xs[0])  # warm-up
    ts, t_end, i = [], time.perf_counter() + min_seconds, 1
    while time.perf_counter() < t_end or len(ts) < 2:
        x = xs[i % len(xs)]
        t0 = time.perf_counter()
        fn(x)
        ts.append(time.perf_counter() - t0)
        i += 1
    return _median(ts)


def _torch():
    try:
        import torch
        return torch
    except ImportError:
        return None


def torch_layer_fn(w, p):
    """The same per-expert layer in PyTorch eager (f32), or None without torch."""
    torch = _torch()
    if torch is None:
        return None
    # the weights are a read-only mapping; torch warns that it could write through it,
    # which this inference-only function never does
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="The given NumPy array is not writable")
        tw = {k: torch.from_numpy(np.asarray(v)) for k, v in w.items()}
    silu = torch.nn.functional.silu

    def fn(x):
        with torch.no_grad():
            xt = torch.from_numpy(x)
            probs = torch.softmax(xt @ tw["router"].T, dim=-1)
            wts, idx = torch.topk(probs, p.k, dim=-1)
            if p.norm:
                wts = wts / wts.sum(dim=-1, keepdim=True)
            y = torch.zeros_like(xt)
            for e in torch.unique(idx).tolist():
                rows, slot = torch.nonzero(idx == e, as_tuple=True)
                xe = xt[rows]
                h = silu(xe @ tw["gate"][e].T) * (xe @ tw["up"][e].T)
                y.index_add_(0, rows, wts[rows, slot][:, None] * (h @ tw["down"][e].T))
            if p.S:
                s = (silu(xt @ tw["shared_gate"].T) * (xt @ tw["shared_up"].T)) @ tw["shared_down"].T
                if "shared_expert_gate" in tw:
                    s = s * torch.sigmoid(xt @ tw["shared_expert_gate"])[:, None]
                y += s
            return y.numpy()
    return fn


@contextlib.contextmanager
def pinned_threads(threads):
    """NumPy's BLAS and PyTorch's intra-op pool at `threads` for the block."""
    torch = _torch()
    old = torch.get_num_threads() if torch else None
    if torch:
        torch.set_num_threads(threads)
    try:
        from threadpoolctl import threadpool_limits
        with threadpool_limits(limits=threads):
            yield
    finally:
        if torch:
            torch.set_num_threads(old)


def blas_info() -> list[dict]:
    """Which BLAS NumPy runs and the kernel it chose (threadpoolctl), for the JSON."""
    try:
        from threadpoolctl import threadpool_info
        return [{k: v for k, v in d.items() if k in ("internal_api", "version", "architecture",
                                                       "num_threads", "filepath")}
                for d in threadpool_info()]
    except Exception as e:  # informational only
        return [{"error": str(e)}]


def _libs(build_dir: Path, profile: str, say) -> dict[str, Path]:
    """colibri-default, and colibri-tuned when a tuned library exists for this host."""
    from colibri._lib import current_default_build, is_current

    libs = {"colibri-default": current_default_build(profile, build_dir)}
    tuned = hostid.tuned_library_path(build_dir)
    if tuned is not None and tuned.exists():
        if is_current(tuned):
            libs["colibri-tuned"] = tuned
        else:
            say(f"bench: the tuned library {tuned} is older than the engine's sources: "
                "not benchmarked (re-run `python -m tuner run` to tune again)")
    return libs


def _bytes_per_token(p) -> int | None:
    return p.decode_bytes if p.T == 1 else None


def experts_reached(p, router, xs) -> float:
    """Mean over the inputs of how many distinct routed experts one call reaches (the
    layer's top-k of the router logits; softmax keeps their order)."""
    counts = []
    for x in xs:
        top = np.argpartition(-(x @ router.T), p.k - 1, axis=1)[:, :p.k]
        counts.append(len(np.unique(top)))
    return float(np.mean(counts))


def roof(p, reached, bw, peaks, threads) -> dict:
    """The row's roofline: seconds per call of memory (the reached experts' bytes with
    the shared expert and router, over read bandwidth bw GB/s) and of compute (flops over
    the dtype's best unit in `peaks`), the larger, and which one it is."""
    from tuner.host.peak import roof_gops
    nbytes = reached * p.expert_bytes + p.shared_bytes + p.E * p.H * 4
    mem = nbytes / (bw * 1e9) if bw else None
    unit = roof_gops(peaks, p.dtype, threads) if peaks else None
    comp = p.flops / (unit[0] * 1e9) if unit else None
    if mem is None and comp is None:
        return {"roof_seconds": None, "roof_by": None}
    if comp is None or (mem is not None and mem >= comp):
        return {"roof_seconds": mem, "roof_by": "read bw"}
    return {"roof_seconds": comp, "roof_by": unit[1]}


def time_rounds(layers, peers, xs, threads, rounds, min_seconds, bw_fn, per, bws, first=0,
                peak_fn=None, pks=None) -> None:
    """Rounds first .. first+rounds-1 of one (problem, threads) group, appended to per[name]
    (seconds per round), bws (read bandwidth per round) and, with peak_fn, pks (per round
    {unit: GOP/s})."""
    names = [*layers, *peers]
    for r in range(first, first + rounds):
        b = bw_fn(threads)
        if b:
            bws.append(b)
        if peak_fn is not None:
            pks.append(peak_fn(threads))
        # each round starts one implementation later: on this VM the implementation timed
        # right after the (memory-bound) bandwidth pass ran measurably faster at 2 threads
        # than the next one on identical code (tuned/default 0.70-0.86 on prefill rows)
        for name in round_order(names, r):
            if name in layers:
                per.setdefault(name, []).append(time_colibri(layers[name], xs, threads, min_seconds))
            elif hasattr(peers[name], "seconds"):  # a peer that times its calls itself (ggml)
                per.setdefault(name, []).append(peers[name].seconds(xs, threads, min_seconds))
            else:
                with pinned_threads(threads):
                    per.setdefault(name, []).append(time_python(peers[name], xs, min_seconds))


def group_peaks(peaks, pks, threads):
    """The peaks a group's roof uses: per unit the best of its rounds' bursts (pks) where
    the rounds measured it, else the start-of-run figure (peaks, tuner.host.peak.measure's
    form)."""
    out = {kind: dict(v) for kind, v in (peaks or {}).items() if kind in KINDS}
    for kind in {k for sample in pks or () for k in sample}:
        out.setdefault(kind, {})[str(threads)] = max(s[kind] for s in pks if kind in s)
    return out or None


def group_rows(p, p_peer, per, bws, threads, copies, reached=None, peaks=None, pks=None,
               own=None) -> list[dict]:
    """One row per implementation of a (problem, threads) group from its rounds; reached
    (experts_reached), peaks (tuner.host.peak.measure) and the rounds' bursts pks
    (group_peaks) give its roofline. `own` names the peers that run p's dtype in a format
    of their own (ggml): {name: {"weights": its type, "decode_bytes": what a token reads}};
    their GB/s and share of the read bandwidth count their own bytes, their roof is p's."""
    own = own or {}
    bw = _median(bws) if bws else None
    peaks = group_peaks(peaks, pks, threads)
    rows = []
    for name, ts in per.items():
        t = _median(ts)
        peer_row = name not in copies
        nbytes = _bytes_per_token(p_peer if peer_row else p)
        if name in own:
            nbytes = own[name]["decode_bytes"] if p.T == 1 else None
        # each round's time against the bandwidth read in that round, where every round has
        # both: this VM's read bandwidth switches between about 31 and 57 GB/s within a group,
        # so medians of the two taken apart can pair a kernel's slow rounds with fast readings
        paired = len(bws) == len(ts) and all(bws)

        def ratio(peer):
            if peer not in per or peer == name:
                return None
            return _median([a / b for a, b in zip(per[peer], ts)])
        gbps = nbytes / t / 1e9 if nbytes else None
        rp = p_peer if peer_row and name not in own else p
        rk = reached if reached is not None else p.k
        rf = roof(rp, rk, bw, peaks, threads)
        if paired and rf["roof_seconds"]:
            share = _median([roof(rp, rk, b, peaks, threads)["roof_seconds"] / x for b, x in zip(bws, ts)])
            rf = dict(rf, roof_seconds=share * t)
        rows.append({
            "case": p.name, "threads": threads, "impl": name, "rounds": len(ts),
            "weights": own[name]["weights"] if name in own else p_peer.dtype if peer_row else p.dtype,
            "seconds": t, "ms_per_token": t / p.T * 1e3, "round_seconds": ts,
            "gbps": gbps, "read_bw_gbps": bw, "round_read_bw_gbps": list(bws),
            "roof_ms_per_token": rf["roof_seconds"] / p.T * 1e3 if rf["roof_seconds"] else None,
            "pct_of_roof": 100 * rf["roof_seconds"] / t if rf["roof_seconds"] else None,
            "roof_by": rf["roof_by"],
            "pct_of_read_bw": (100 * _median([nbytes / x / 1e9 / b for b, x in zip(bws, ts)]) if gbps and paired
                               else 100 * gbps / bw if gbps and bw else None),
            "compute_peaks_gops": {k: v[str(threads)] for k, v in (peaks or {}).items()
                                   if str(threads) in v},
            "gflops": p.flops / t / 1e9,
            "layer_copies": None if peer_row else copies[name],
            "vs_numpy": ratio("numpy"), "vs_torch": ratio("torch"), "vs_ggml": ratio("ggml"),
            "vs": {other: ratio(other) for other in per if other != name},
            "tuned_vs_default": ratio("colibri-default") if name == "colibri-tuned" else None})
    return rows


MIN_RATIO = 0.98


def _tuned_ratio(per: dict) -> float:
    """Median over rounds of default/tuned seconds (inf without a tuned library)."""
    if "colibri-tuned" not in per:
        return float("inf")
    return _median([a / b for a, b in zip(per["colibri-default"], per["colibri-tuned"])])


def timed_rounds(libs, build, peers, xs, threads_list, rounds, min_seconds, bw_fn, per, bws,
                 peak_fn=None, pks=None) -> None:
    """`rounds` more interleaved rounds at each thread count, appended to per[threads]; the
    libraries' layers mapped from the same file (module docstring)."""
    layers = {name: build(name) for name in libs}
    for threads in threads_list:
        time_rounds(layers, peers, xs, threads, rounds, min_seconds, bw_fn, per[threads],
                    bws[threads], first=len(per[threads].get("colibri-default", [])),
                    peak_fn=peak_fn, pks=None if pks is None else pks[threads])


def measure_group(name, libs, build, peers, xs, threads_list, rounds, min_seconds, bw_fn, say,
                  peak_fn=None, pks=None):
    """(per, bws) of one problem: per[threads][impl] seconds per round, bws[threads] read
    bandwidth per round; with peak_fn, pks[threads] gets each round's peaks. A tuned row
    whose median ratio reads below MIN_RATIO gets twice the rounds more (the libraries
    only), pooled with the first: a few rounds on all threads do not resolve 2%
    (docs/tuning.md, "How the tuner decides")."""
    per = {th: {} for th in threads_list}
    bws = {th: [] for th in threads_list}
    timed_rounds(libs, build, peers, xs, threads_list, rounds, min_seconds, bw_fn, per, bws,
                 peak_fn, pks)
    slow = [th for th in threads_list if _tuned_ratio(per[th]) < MIN_RATIO]
    if slow:
        say(f"bench: {name} at {', '.join(map(str, slow))} thread(s): tuned/default below "
            f"{MIN_RATIO} over {rounds} rounds; {2 * rounds} more rounds")
        timed_rounds(libs, build, {}, xs, slow, 2 * rounds, min_seconds, bw_fn, per, bws,
                     peak_fn, pks)
    return per, bws


FAULT_WARN_PAGES = 1024  # a group that read more than this from disk says so


def major_faults() -> int:
    """This process's major page faults so far: pages it had to read from disk, such as
    those of a mapped model file the page cache evicted (a peer's own copy of the weights
    in anonymous memory makes that likelier on a small machine)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_majflt


GGML_MAX_ERR = 0.5  # a ggml layer further than this from the f32 reference computes something else


def ggml_peer(so, p32, w32, dtype, copies, x, ref, threads, info, say):
    """ggml's layer for one dtype (colibri_bench/peers/ggml.py), or None where the harness
    cannot build it or its output is not the layer's; each case's outcome goes to
    info["cells"]."""
    from colibri_bench.peers import ggml as gp

    cell = {"case": f"{p32.shape}/{p32.phase}/{dtype}"}
    info["cells"].append(cell)
    why = gp.unsupported(p32, dtype)
    if why:
        cell["skipped"] = why
        say(f"bench: ggml not run on {cell['case']}: {why}")
        return None
    t0 = time.perf_counter()
    try:
        layer = gp.GgmlLayer(so, p32, w32, dtype, copies)
        y = layer.forward(x, threads)
    except gp.GgmlError as e:
        cell["skipped"] = str(e)
        say(f"bench: ggml not run on {cell['case']}: {e}")
        return None
    err = float(np.linalg.norm(y - ref) / np.linalg.norm(ref))
    cell.update(type=layer.type_name, placed=layer.placed, rel_err=err,
                setup_seconds=time.perf_counter() - t0)
    if not err <= GGML_MAX_ERR:
        cell["skipped"] = f"relative error {err:.3g} against the f32 reference"
        say(f"bench: ggml not timed on {cell['case']}: {cell['skipped']}")
        return None
    say(f"bench: ggml {layer.type_name} for {dtype} ({layer.placed}): layer error {err:.3f} "
        f"against the f32 reference, set up in {cell['setup_seconds']:.1f} s")
    return layer


def beside_name(lib_name: str, dtype: str) -> str:
    """The row name of library `lib_name`'s layer in weight dtype `dtype` beside a group:
    colibri-DTYPE for the default build, colibri-tuned-DTYPE for the tuned library."""
    return f"colibri-{dtype}" if lib_name == "colibri-default" else f"{lib_name}-{dtype}"


def beside_ratios(rows, case: str, threads: int, dtype: str, tuned: bool) -> str:
    """'1.080 default, 1.090 tuned': per library, the median ratio of its `dtype` layer's
    time to its own layer's in the group's rounds (each row's "vs"). A tuned library that
    runs the default's code in either dtype was not timed in it, and is named so."""
    out = []
    for name in ("colibri-default", "colibri-tuned"):
        r = next((r for r in rows if r["case"] == case and r["threads"] == threads and r["impl"] == name), None)
        v = r["vs"].get(beside_name(name, dtype)) if r else None
        if v is not None:
            out.append(f"{v:.3f} {name.removeprefix('colibri-')}")
    if tuned and len(out) < 2:
        out.append("tuned: the default's code in one of the two")
    return ", ".join(out)


class Beside:
    """The default library on the same shape and phase in another weight dtype, as a peer of a
    group: timed in the same rounds (colibri_bench_layers, as the group's own layers), so a
    ratio between two dtypes does not take in this machine's swings from one group to the
    next (two dtypes timed in groups of their own moved their ratio by +-3% between runs).
    Their layers sit in arenas of their own, loaded after the group's held copy
    (held_copy): before it, the peer loaded first and carried the first-load penalty (int4
    beside int4g32 measured 1.155-1.175, int4g32 beside int4 1.006-1.046 on Qwen3 decode,
    2026-12-05)."""

    def __init__(self, path, lib_path):
        self.layers = Mapped(path, lib_path)

    def seconds(self, xs, threads, min_seconds):
        return time_colibri(self.layers, xs, threads, min_seconds)


def run_bench(shapes, dtypes, phases, threads_list, min_seconds, rounds=4, seed=0,
              build_dir=None, peers=("numpy", "torch"), say=print, time_same=False,
              ggml=None, beside=None) -> dict:
    build_dir = Path(build_dir or build_dir_default())
    profile = hostid.host_profile_name()
    libs = _libs(build_dir, profile, say)
    lib = open_library(libs["colibri-default"])
    amx = {name: bool(open_library(path).colibri_uses_amx()) for name, path in libs.items()}
    say("bench: f32/bf16 experts with many tokens on AMX tiles: "
        + ", ".join(f"{name} {'yes' if on else 'no'}" for name, on in amx.items()))
    from tuner.host.bandwidth import _llc_total_here, copies_for, working_set_bytes

    llc = _llc_total_here()
    bw_bytes = working_set_bytes(llc)[0]
    bw_fn = lambda threads: read_bandwidth(lib, threads, bw_bytes, min_seconds=0.15)
    peaks = compute_peaks(libs["colibri-default"], threads_list, say)
    peak_fn = round_peaks(libs["colibri-default"], peaks)
    if "torch" in peers and _torch() is None:
        say("bench: PyTorch is not installed: its column is skipped "
            "(pip install torch to compare against it)")
    ggml_so = ggml_info = None
    if ggml:
        from colibri_bench.peers import ggml as gp
        ggml_so, commit = gp.build(ggml, build_dir / "peers", say)
        ggml_info = {"source": str(gp.source_dir(ggml)), "commit": commit, "cells": []}
        say(f"bench: ggml {commit} built natively with its CPU repack buffers ({ggml_so.parent})")
    wdir = build_dir / "tuner" / "weights"
    rows, route_rows = [], []
    where = None
    try:
        for shape in shapes:
            for phase in phases:
                p32 = problems_mod.problem(f"{shape}/{phase}/f32")
                where = f"{shape}/{phase}"
                weights.ensure_f32(wdir, p32, seed, progress=say)
                w32 = weights.load(wdir, p32, seed)
                xs = _inputs(p32, max(2, min(64, 2048 // p32.T)), seed + 1)
                reached = experts_reached(p32, w32["router"], xs)
                peer_fns = {}
                if "numpy" in peers:
                    peer_fns["numpy"] = lambda x, w=w32, p=p32: numpy_layer(x, w, p)
                if "torch" in peers and _torch() is not None:
                    peer_fns["torch"] = torch_layer_fn(w32, p32)
                ref = numpy_layer(xs[0], w32, p32) if ggml_so else None
                for dtype in dtypes:
                    p = problems_mod.problem(f"{shape}/{phase}/{dtype}")
                    where = p.name
                    # the f32 weights the peers run are >= 4x the LLC for every reference shape
                    copies = copies_for(p, llc)
                    path = weights.ensure_model(wdir, p, seed, copies, progress=say)
                    held = held_copy(path, libs["colibri-default"])
                    dtype_peers, own = peer_fns, {}
                    gl = ggml_so and ggml_peer(ggml_so, p32, w32, dtype, copies, xs[0], ref,
                                               max(threads_list), ggml_info, say)
                    if gl:
                        dtype_peers = dict(peer_fns, ggml=gl)
                        own = {"ggml": {"weights": gl.type_name, "decode_bytes": gl.decode_bytes}}
                    if beside and beside != dtype:
                        pb = problems_mod.problem(f"{shape}/{phase}/{beside}")
                        pb_copies = copies_for(pb, llc)
                        pb_path = weights.ensure_model(wdir, pb, seed, pb_copies, progress=say)
                        # the tuned library too, where it runs other code than the default's
                        # in that dtype (same_code): two tuned libraries' formats compared
                        same_b = len(libs) > 1 and same_code(kernel_code(libs, pb_path, beside))
                        for name in (["colibri-default"] if same_b and not time_same else libs):
                            name_b = beside_name(name, beside)
                            dtype_peers = dict(dtype_peers, **{name_b: Beside(pb_path, libs[name])})
                            own = dict(own, **{name_b: {"weights": beside, "decode_bytes": pb.decode_bytes}})
                    build = lambda name, path=path: Mapped(path, libs[name])  # noqa: E731
                    code = kernel_code(libs, path, dtype)
                    same = len(libs) > 1 and same_code(code)
                    # identical machine code is a tie by construction: timing it again would only
                    # measure this machine's noise (0.92-1.05 on a 2-vCPU VM)
                    timed = libs if time_same or not same else {"colibri-default": libs["colibri-default"]}
                    pks = {th: [] for th in threads_list}
                    faults = major_faults()
                    per, bws = measure_group(p.name, timed, build, dtype_peers, xs, threads_list, rounds,
                                             min_seconds, bw_fn, say,
                                             peak_fn(p.dtype) if p.T > 1 else None, pks)
                    faults = major_faults() - faults
                    if faults > FAULT_WARN_PAGES:
                        say(f"bench: {p.name}: {faults} pages came from disk during the rounds (major "
                            "faults): the page cache did not hold the weights, and those rows read "
                            "them partly from disk")
                    for threads in threads_list:
                        for r in group_rows(p, p32, per[threads], bws[threads], threads,
                                            {name: copies for name in libs}, reached, peaks,
                                            pks[threads], own):
                            r["major_faults"] = faults  # the group's, every implementation's rounds
                            if r["impl"] in code:
                                r["kernels"] = code[r["impl"]]["kernels"]
                                r["part"] = code[r["impl"]]["part"]
                                r["same_code"] = same if r["impl"] == "colibri-tuned" else None
                            rows.append(r)
                            say(_fmt(r))
                            if r["impl"] == "colibri-default" and same and timed is not libs:
                                r["tuned_same_code"] = {"kernels": code["colibri-tuned"]["kernels"],
                                                        "part": code["colibri-tuned"]["part"]}
                                say(_fmt_same(r))
                    if beside and beside != dtype:
                        for threads in threads_list:
                            say(f"bench: {p.name} at {threads} thread(s): {beside} time / {dtype} time "
                                + beside_ratios(rows, p.name, threads, beside, len(libs) > 1) + " (the same rounds)")
                    del gl, dtype_peers, held  # ggml's copy of the weights goes before the next dtype's
            p = problems_mod.problem(f"{shape}/prefill{ROUTE_T}/f32")
            t_route = time_route(lib, p, ROUTE_T, min_seconds)
            layer_rows = [r for r in rows if r["case"] == p.name and r["impl"] == "colibri-default"]
            fastest = min((r["seconds"] for r in layer_rows), default=None)
            route_rows.append({"shape": shape, "T": ROUTE_T, "E": p.E, "k": p.k,
                               "route_seconds": t_route,
                               "layer_seconds": fastest,
                               "pct_of_layer": 100 * t_route / fastest if fastest else None})
            say(_fmt_route(route_rows[-1]))
    except (OSError, RuntimeError, MemoryError) as e:
        # a full disk or a failed group keeps the rows measured before it
        incomplete = f"stopped at {where}: {type(e).__name__}: {e}"
    else:
        incomplete = None
    if len(libs) > 1:
        say(tuned_summary(rows))
    return {"host_id": hostid.host_id(), "profile": profile,
            "libs": {k: str(v) for k, v in libs.items()}, "amx": amx,
            "blas_env": {k: os.environ.get(k) for k in BLAS_ENV}, "blas": blas_info(),
            "rounds": rounds, "min_seconds": min_seconds, "compute_peaks": peaks,
            "rows": rows, "routing": route_rows,
            "torch": getattr(_torch(), "__version__", None), "ggml": ggml_info, "created": time.time(),
            "incomplete": incomplete}


ROUND_PEAK_SECONDS = 0.05  # one unit's burst in a round


def round_peaks(lib_path, peaks):
    """peak_fn(dtype) -> a function of threads that times one short burst of each unit
    the dtype's roof can use (those the start-of-run measure found), or None without peaks."""
    if not peaks:
        return lambda dtype: None
    from tuner.host.bandwidth import open_probe_library
    from tuner.host.peak import ROOF_UNITS, SYMBOL, run_kernel
    handle = open_probe_library(str(lib_path), SYMBOL)[0]

    def peak_fn(dtype):
        kinds = [k for k, _ in ROOF_UNITS[dtype] if k in peaks]
        if not kinds:
            return None
        return lambda threads: {k: f["gops"] for k in kinds
                                if "gops" in (f := run_kernel(handle, k, threads, ROUND_PEAK_SECONDS))}
    return peak_fn


def compute_peaks(lib_path, threads_list, say) -> dict | None:
    """tuner.host.peak.measure at the bench's thread counts, or None (said) where the
    library cannot run it: the rows then have a bandwidth roof only."""
    from tuner.host import peak
    try:
        peaks = peak.measure(threads=threads_list, lib=str(lib_path), min_seconds=0.2)
    except (peak.PeakError, OSError) as e:
        say(f"bench: compute peaks not measured ({e}): roofs are bandwidth only")
        return None
    say("bench: compute peaks (GOP/s) " + "; ".join(
        f"{kind} " + ", ".join(f"{t} thr {g:.0f}" for t, g in peaks[kind].items())
        for kind in peak.KINDS if kind in peaks)
        + "".join(f"; {kind}: {why}" for kind, why in peaks["reasons"].items()))
    return peaks


HEADER = (f"{'case':34} {'thr':>3} {'impl':15} {'ms/token':>9} {'GB/s':>6} {'bw GB/s':>7} "
          f"{'roof ms':>8} {'% roof':>6} {'roof by':>8} {'GFLOP/s':>8} {'vs numpy':>8} "
          f"{'vs torch':>8} {'vs ggml':>7} {'tuned/def':>9}")


def _f(v, spec):
    return format(v, spec) if v is not None else "-"


def _fmt(r):
    return (f"{r['case']:34} {r['threads']:>3} {r['impl']:15} {r['ms_per_token']:9.3f} "
            f"{_f(r['gbps'], '.1f'):>6} {_f(r['read_bw_gbps'], '.1f'):>7} "
            f"{_f(r['roof_ms_per_token'], '.3f'):>8} {_f(r['pct_of_roof'], '.1f'):>6} "
            f"{_f(r['roof_by'], '').replace('read bw', 'bw'):>8} "
            f"{r['gflops']:8.1f} {_f(r['vs_numpy'], '.2f'):>8} {_f(r['vs_torch'], '.2f'):>8} "
            f"{_f(r.get('vs_ggml'), '.2f'):>7} "
            f"{_f(r['tuned_vs_default'], '.3f'):>9}"
            + (" (same code)" if r.get("same_code") else ""))


def _fmt_same(r):
    return (f"{r['case']:34} {r['threads']:>3} {'colibri-tuned':15} not timed: the same machine "
            f"code as colibri-default ({r['tuned_same_code']['part'] or 'same knobs'}, same "
            f"compiler and flags)")


def tuned_summary(rows) -> str:
    """One line: how many cells run the default's machine code, and the timed ratios."""
    same = [r for r in rows if r.get("tuned_same_code") or r.get("same_code")]
    ratios = [(r["tuned_vs_default"], f"{r['case']} {r['threads']} thr") for r in rows
              if r.get("tuned_vs_default") is not None and not r.get("same_code")]
    line = (f"tuned vs default: {len(same)} cell(s) run the default's machine code"
            + (" (not timed)" if any(r.get("tuned_same_code") for r in same) else "")
            + f"; {len(ratios)} cell(s) differ")
    if ratios:
        lo = min(ratios)
        below = [c for v, c in ratios if v < MIN_RATIO]
        line += (f": tuned/default {lo[0]:.3f} ({lo[1]}) to {max(ratios)[0]:.3f}; below "
                 f"{MIN_RATIO}: {', '.join(below) if below else 'none'}")
    return line


def _fmt_route(r):
    layer = _f(r["layer_seconds"] and r["layer_seconds"] * 1e3, ".2f")
    return (f"routing {r['shape']} T={r['T']} E={r['E']} top-{r['k']}: "
            f"{r['route_seconds'] * 1e6:.1f} us = {_f(r['pct_of_layer'], '.3f')}% "
            f"of the layer ({layer} ms, f32, fastest thread count)")


def main(argv=None) -> int:
    ap = _cli.Parser(
        prog="python -m colibri_bench bench", description=__doc__.split("\n\n")[0],
        epilog="Exit status: 0 done, 1 a measurement failed (the rows measured before it are still "
               "written, with \"incomplete\" saying where and why), 2 usage error.")
    ap.add_argument("--shape", action="append", choices=sorted(problems_mod.SHAPES),
                    help=f"model shape (repeatable; default: {', '.join(REFERENCE_SHAPES)})")
    ap.add_argument("--dtype", action="append", choices=list(quant.DTYPES),
                    help=f"weight dtype (repeatable; default all: {', '.join(quant.DTYPES)})")
    ap.add_argument("--phase", action="append",
                    help=f"decode, prefillN (repeatable; default {', '.join(PHASES)})")
    ap.add_argument("--threads", action="append", type=_cli.positive_int,
                    help="threads (repeatable; default 1 and all CPUs)")
    ap.add_argument("--rounds", type=_cli.positive_int, default=4, help="interleaved rounds per group (default 4)")
    ap.add_argument("--min-seconds", type=_cli.positive_float, default=0.3,
                    help="timing per implementation per round (default 0.3)")
    ap.add_argument("--no-numpy", action="store_true", help="skip the NumPy peer")
    ap.add_argument("--no-torch", action="store_true", help="skip the PyTorch peer")
    ap.add_argument("--beside", metavar="DTYPE", choices=list(quant.DTYPES),
                    help="also time the default library in this weight dtype in every other dtype's "
                         "rounds (a row colibri-DTYPE, and each row's \"vs\" ratios), and the tuned "
                         "library where it runs other code (colibri-tuned-DTYPE): two formats "
                         "compared in the same rounds, e.g. --dtype int4 --beside int4g32")
    ap.add_argument("--ggml", metavar="DIR",
                    help="also time ggml (llama.cpp's CPU backend) from this checkout of "
                         "github.com/ggml-org/ggml or llama.cpp: built natively with its CPU repack "
                         "buffers into build/peers/, never committed (colibri_bench/peers/ggml.py)")
    ap.add_argument("--time-same-code", action="store_true",
                    help="time the tuned library also on cells where it runs the default "
                         "build's machine code (default: such a cell is a tie, not timed)")
    ap.add_argument("--out", help="JSON output (default reports/<host-id>/bench.json)")
    ap.add_argument("--keep-blas-env", action="store_true",
                    help=f"keep {' and '.join(BLAS_ENV)} (default: unset them for this run so "
                         "OpenBLAS chooses its own kernel)")
    args = ap.parse_args(argv)
    if args.rounds < 1 or args.min_seconds <= 0:
        ap.error("--rounds must be >= 1 and --min-seconds > 0")
    for ph in args.phase or ():
        try:
            problems_mod.problem(f"tiny/{ph}/f32")
        except ValueError as e:
            ap.error(str(e))
    if not args.keep_blas_env and any(k in os.environ for k in BLAS_ENV):
        # numpy reads these when it loads OpenBLAS: re-run without them
        env = {k: v for k, v in os.environ.items() if k not in BLAS_ENV}
        print(f"bench: unsetting {', '.join(k for k in BLAS_ENV if k in os.environ)} "
              "for this run (OpenBLAS picks its own kernel)", file=sys.stderr)
        os.execve(sys.executable, [sys.executable, "-m", "colibri_bench", "bench",
                                   *(sys.argv[2:] if argv is None else argv)], env)
    peers = tuple(n for n, off in (("numpy", args.no_numpy), ("torch", args.no_torch)) if not off)
    print(HEADER, flush=True)
    try:
        out = run_bench(args.shape or list(REFERENCE_SHAPES), args.dtype or list(quant.DTYPES),
                        args.phase or list(PHASES), args.threads or sorted({1, os.cpu_count() or 1}),
                        args.min_seconds, rounds=args.rounds, peers=peers,
                        say=lambda m: print(m, flush=True), time_same=args.time_same_code,
                        ggml=args.ggml, beside=args.beside)
    except (RuntimeError, MemoryError) as e:
        print(f"bench: {e}", file=sys.stderr)
        return 1
    path = Path(args.out) if args.out else reports_dir_default() / out["host_id"] / "bench.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    try:
        tmp.write_text(json.dumps(out, indent=1))
        os.replace(tmp, path)
    except OSError as e:
        print(f"bench: cannot write {path}: {e}", file=sys.stderr)
        return 1
    if out["incomplete"]:
        print(f"bench: {out['incomplete']}; the {len(out['rows'])} row(s) measured before it are "
              f"written: {path}", file=sys.stderr)
        return 1
    print(f"written: {path}")
    return 0
