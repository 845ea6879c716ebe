"""Measure this host's compute peaks with the library's own kernels (kernels/peak.c), the
compute half of a roofline (tuner.host.bandwidth is the memory half).

Each unit is timed on a register-resident loop of its one instruction, per thread count;
the figure is the median pass in 1e9 operations per second, a multiply-add counted as 2
(GFLOP/s, or GOP/s for int8). A unit this build or host cannot run (no such instruction
in the profile's flags, AMX tiles not granted) has no figure, and `reasons` says why.

roof_gops(peaks, dtype, threads) is the compute roof a layer of that weight dtype is held
to: the fastest unit that can do its products within the dtype's tolerance
(colibri.reference.compare: 1e-4 relative for f32 and bf16 weights, whose activations stay
f32; int8 and the int4 formats round activations to int8 by contract), where

  f32   the f32 FMA, or a bf16 unit at a third of its rate (the hi/lo split's three
        products, w_hi x_hi + w_hi x_lo + w_lo x_hi: templates/expert_ffn/amx.j2)
  bf16  the f32 FMA (weights widened), or a bf16 unit at half its rate (the weights are
        exact, the activations split: w x_hi + w x_lo)
  int8, int4(g32)  the int8 dot, AMX int8, or the f32 FMA
"""
from __future__ import annotations

import os
import time

KINDS = {"f32_fma": 0, "bf16_dot": 1, "int8_dot": 2, "amx_bf16": 3, "amx_int8": 4}
SYMBOL = "colibri_peak_run"
UNIT = "GOP/s (1e9 operations per second; a multiply-add is 2)"
STATISTIC = ("per burst the median of its timed passes (one warm-up pass first); the figure is "
             "the best of BURSTS bursts, interleaved over units and thread counts")
# A capability, not a sample of the moment: on a shared VM a neighbour can hold one vCPU
# for a whole burst (a tuner run's probe read the 2-thread FMA and bf16 peaks at one
# core's rate while the int8 dot, timed right after, had both), so each figure is the
# best of a few bursts spread over the measurement.
BURSTS = 3

# (unit, share of its rate) per weight dtype: which units can compute that dtype's products
ROOF_UNITS = {
    "f32": (("f32_fma", 1.0), ("amx_bf16", 1 / 3), ("bf16_dot", 1 / 3)),
    "bf16": (("f32_fma", 1.0), ("amx_bf16", 1 / 2), ("bf16_dot", 1 / 2)),
    "int8": (("int8_dot", 1.0), ("amx_int8", 1.0), ("f32_fma", 1.0)),
}
ROOF_UNITS["int4g32"] = ROOF_UNITS["int4"] = ROOF_UNITS["int8"]


# how kernels/peak.c begins the error of a unit this build or host cannot run
UNAVAILABLE = "peak: unavailable: "


class PeakError(RuntimeError):
    """The peak kernels could not run (no library, a failed call)."""


def run_kernel(lib, kind: str, n_threads: int, min_seconds: float) -> dict:
    """One colibri_peak_run call -> its figures, or {"reason": why} for a unit this build
    or host cannot run. Raises PeakError for anything else."""
    from colibri._lib import ffi, last_error
    try:
        fn = lib.colibri_peak_run
    except AttributeError:
        raise PeakError("the library has no colibri_peak_run (built before peak.c existed?); "
                        "rebuild it with scons") from None
    out = ffi.new("colibri_peak_result *")
    if fn(KINDS[kind], n_threads, float(min_seconds), out) != 0:
        msg = last_error(lib)
        if msg.startswith(UNAVAILABLE):
            return {"reason": msg.removeprefix(UNAVAILABLE)}
        raise PeakError(f"colibri_peak_run({kind}, {n_threads} threads): {msg}")
    return {"gops": round(out.gops_median, 2), "best_gops": round(out.gops_best, 2),
            "worst_gops": round(out.gops_worst, 2), "passes": int(out.passes),
            "threads_run": int(out.n_threads),
            "instruction": ffi.string(out.instruction).decode()}


def measure(threads=None, lib=None, min_seconds: float = 0.2, kinds=tuple(KINDS),
            bursts: int = BURSTS) -> dict:
    """Every unit's GOP/s per thread count.

    Returns: unit, statistic, threads, library, per kind {"<threads>": GOP/s} (absent
    for a unit that cannot run), runs (per thread count, each kind's best burst with
    every burst's median in burst_gops, or reason), reasons ({kind: why it has no
    figure}), seconds. min_seconds is the timing of one unit at one thread count, split
    over `bursts` bursts.
    threads: thread counts (default 1 .. os.cpu_count() as tuner.host.bandwidth's
    ladder); lib: None (this host's default library, built if missing), a path, or an
    open cffi library. One kernel at a time, never two at once.
    """
    from tuner.host.bandwidth import open_probe_library, thread_ladder
    t_start = time.monotonic()
    handle, path = open_probe_library(lib, SYMBOL)
    threads = tuple(int(t) for t in (threads or thread_ladder(os.cpu_count() or 1)))
    if not threads or min(threads) < 1:
        raise ValueError(f"thread counts must be >= 1, got {threads}")
    if bursts < 1:
        raise ValueError(f"bursts must be >= 1, got {bursts}")
    runs, reasons = [{"threads": t} for t in threads], {}
    for _ in range(bursts):
        for row in runs:
            for kind in kinds:
                if kind in reasons:
                    continue
                fig = run_kernel(handle, kind, row["threads"], min_seconds / bursts)
                if "reason" in fig:
                    reasons[kind] = fig["reason"]
                    continue
                seen = row[kind]["burst_gops"] if kind in row else []
                if kind not in row or fig["gops"] > row[kind]["gops"]:
                    row[kind] = fig
                row[kind]["burst_gops"] = [*seen, fig["gops"]]
    result = {"unit": UNIT, "statistic": STATISTIC, "threads": list(threads),
              "min_seconds": min_seconds, "library": path}
    for kind in kinds:
        if kind not in reasons:
            result[kind] = {str(row["threads"]): row[kind]["gops"] for row in runs}
    result.update(runs=runs, reasons=reasons, seconds=round(time.monotonic() - t_start, 3))
    return result


def roof_gops(peaks: dict, dtype: str, threads: int) -> tuple[float, str] | None:
    """(GOP/s, how) of the compute roof for weight dtype at a thread count that was
    measured, or None where no unit has a figure there."""
    best = None
    for kind, share in ROOF_UNITS[dtype]:
        g = (peaks.get(kind) or {}).get(str(threads))
        if g is not None and (best is None or g * share > best[0]):
            best = (g * share, kind if share == 1.0 else f"{kind} x {share:.3g}")
    return best
