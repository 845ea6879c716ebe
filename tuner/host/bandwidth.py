"""Measure this host's memory bandwidth with the library's own kernels (kernels/membw.c).

The kernels are compiled into libcolibri.so by the same SCons pipeline, with the same
profile flags, as the engine; this module only picks the sizes and thread counts,
calls them through cffi, and shapes the figures for HostInfo.bandwidth.

What the figures mean (see kernels/membw.c for the method):
  read   GB/s of a vectorised sum over one array (8 bytes counted per element).
  triad  GB/s of a[i] = b[i] + s*c[i], STREAM's convention: 24 bytes per element,
         the write-allocate read of a[] not counted.
  Each figure is the MEDIAN timed pass (robust on noisy, shared machines; best and
  worst are kept as the spread), in 1e9 bytes per second.

Working set: `bytes` is the footprint of all arrays of one kernel together,
max(4 x the machine's total last-level cache, 256 MiB), capped at a quarter of the
memory available now. "Total" LLC is one instance times the number of instances
(sysfs.llc_total_bytes): threads spread over several L3s (AMD CCDs, sockets) would
otherwise stream from cache.
"""
from __future__ import annotations

import os
import time
from pathlib import Path

MiB = 1 << 20
READ, TRIAD = 0, 1
KINDS = {"read": READ, "triad": TRIAD}
MIN_BYTES = 256 * MiB        # floor of the working set
LLC_FACTOR = 4               # working set >= LLC_FACTOR x total last-level cache
AVAILABLE_FRACTION = 0.25    # never take more than this share of the available memory
FLOOR_BYTES = 16 * MiB       # below this a figure would mean nothing

COUNTING = {
    "read": "8 bytes per element: each double of one array loaded once",
    "triad": "STREAM convention: 24 bytes per element of a[i] = b[i] + s*c[i] "
             "(two loads, one store); the write-allocate read of a[] is not counted",
}
STATISTIC = "median of the timed passes (one warm-up pass first); best and worst kept as spread"


class BandwidthError(RuntimeError):
    """The bandwidth kernels could not run (no library, a failed call)."""


def thread_ladder(n_threads: int, cores: int | None = None) -> tuple[int, ...]:
    """1, 2, 4, ... up to n_threads, plus the physical core count and n_threads itself.

    All of 1..N on a small machine; a short ladder on a 192-thread one, where every
    count would take minutes and tell little more.
    """
    n = max(1, int(n_threads))
    out, t = set(), 1
    while t < n:
        out.add(t)
        t *= 2
    out.add(n)
    if cores and 1 <= cores <= n:
        out.add(int(cores))
    return tuple(sorted(out))


def working_set_bytes(llc_total: int | None, available: int | None = None) -> tuple[int, str]:
    """(bytes, how it was chosen) for a DRAM-bound pass."""
    want = max(LLC_FACTOR * (llc_total or 0), MIN_BYTES)
    rule = (f"max({LLC_FACTOR} x total LLC {llc_total} B, {MIN_BYTES >> 20} MiB)" if llc_total
            else f"{MIN_BYTES >> 20} MiB (last-level cache unknown)")
    if available is not None:
        cap = int(available * AVAILABLE_FRACTION)
        if cap < want:
            want = max(cap, FLOOR_BYTES)
            rule += f", capped at {AVAILABLE_FRACTION:g} of the {available} B available"
    return int(want), rule


def _available_memory() -> int | None:
    try:
        import psutil
        return int(psutil.virtual_memory().available)
    except Exception:  # psutil missing or unusable: no cap, the kernel reports NOMEM
        return None


MAX_COPIES = 8   # enough for the reference shapes in int4; a toy shape stays in cache anyway
# all copies together at most: a bench or tuner process holds two or three packed copies of
# the file at once (two libraries and a throwaway), beside the file in the page cache
MAX_COPY_BYTES = 3 << 30


def resident_copies(layer_bytes: int, llc_total: int | None, reread_bytes: int = 0, call_bytes: int = 0) -> int:
    """How many copies of a layer to cycle through so that their weights together are
    at least LLC_FACTOR x the last-level cache (a model's layers follow each other the
    same way): a layer that fits in the cache would otherwise be timed from it. Where
    every call reads part of the layer again (reread_bytes: a shared expert, with the
    router), enough copies that those parts too add up to LLC_FACTOR x the cache: a
    shared expert that fits in it would otherwise come from it on every call, as it does
    in no model of more layers. Where one decode call's weights (call_bytes) are under
    LLC_FACTOR x the cache, enough copies that the calls between two on the same copy
    stream the cache's size at least: consecutive tokens route partly to the same experts
    (k / E of them, on random tokens), whose weights the call before left in the cache,
    where no call of a model of more layers finds them (an OLMoE-shaped int4 layer on a
    32 MiB cache: 3-17% faster alone than in turn with three others). At most MAX_COPIES,
    and MAX_COPY_BYTES of copies (one at least)."""
    if not llc_total or layer_bytes <= 0:
        return 1
    want = LLC_FACTOR * llc_total
    n = max(-(-want // layer_bytes), -(-want // reread_bytes) if reread_bytes > 0 else 1,
            1 - (-llc_total // call_bytes) if 0 < call_bytes < want else 1)
    return max(1, min(n, MAX_COPIES, MAX_COPY_BYTES // layer_bytes))


def copies_for(p, llc_total: int | None) -> int:
    """resident_copies for a measured problem (tuner.measure.problems.Problem): its layer,
    what every call reads again, and what a decode call reads. Its model file holds that
    many copies for every phase."""
    return resident_copies(p.layer_bytes, llc_total, p.reread_bytes, p.decode_bytes)


def _llc_total_here() -> int | None:
    from tuner.host import sysfs
    topo = sysfs.topology("/")
    return sysfs.llc_total_bytes(sysfs.caches("/"), topo["threads"])


SYMBOL = "colibri_membw_run"


def _has_symbol(path: Path, symbol: str = SYMBOL) -> bool:
    """Whether the library file exports `symbol` (a cheap look at its dynamic string
    table, before it is loaded: a loaded library cannot be reloaded)."""
    try:
        return symbol.encode() + b"\0" in path.read_bytes()
    except OSError:
        return False


def default_library(symbol: str = SYMBOL) -> Path:
    """This host's default library (colibri._lib.default_library_path: $COLIBRI_LIB,
    the tuned one, else build/<profile>/), rebuilt with scons when it predates the
    kernel that exports `symbol` (membw.c, peak.c)."""
    from colibri import _lib
    from colibri_build import hostid
    path = Path(_lib.default_library_path())
    if _has_symbol(path, symbol):
        return path
    if os.environ.get("COLIBRI_LIB"):
        raise BandwidthError(f"$COLIBRI_LIB={path} has no {symbol}; unset it or rebuild that library")
    # The tuned library or the profile's build is older than the kernel: bring the
    # profile's default build up to date (scons is incremental) and use that.
    return Path(_lib.build_profile(hostid.host_profile_name(), quiet=True))


def open_probe_library(lib, symbol: str = SYMBOL):
    """(cffi library, path or None) from None (this host's default), a path, or a library."""
    from colibri import _lib
    if lib is None:
        path = default_library(symbol)
        handle = _lib.open_library(path)
        if not hasattr(handle, symbol):
            raise BandwidthError(f"{path} was loaded by this process before it was rebuilt "
                                 f"with {symbol}; run again in a new process")
        return handle, str(path)
    if isinstance(lib, (str, os.PathLike)):
        return _lib.open_library(lib), str(lib)
    return lib, None


def run_kernel(lib, kind: str, nbytes: int, n_threads: int, min_seconds: float) -> dict:
    """One colibri_membw_run call -> its figures. Raises BandwidthError."""
    from colibri._lib import ffi, last_error
    try:
        fn = lib.colibri_membw_run
    except AttributeError:
        raise BandwidthError("the library has no colibri_membw_run (built before membw.c "
                             "existed?); rebuild it with scons") from None
    out = ffi.new("colibri_membw_result *")
    status = fn(KINDS[kind], nbytes, n_threads, float(min_seconds), out)
    if status != 0:
        raise BandwidthError(f"colibri_membw_run({kind}, {nbytes}, {n_threads} threads): "
                             f"{last_error(lib)}")
    return {"gbps": round(out.gbps_median, 3), "best_gbps": round(out.gbps_best, 3),
            "worst_gbps": round(out.gbps_worst, 3), "passes": int(out.passes),
            "threads_run": int(out.n_threads), "bytes": int(out.bytes),
            "seconds_timed": round(out.seconds_timed, 4),
            "setup_seconds": round(out.setup_seconds, 4)}


def measure(threads=None, lib=None, min_seconds: float = 0.3, *, bytes: int | None = None,  # noqa: A002
            llc_bytes: int | None = None, kinds=("read", "triad")) -> dict:
    """Read and triad GB/s for each thread count.

    Returns: bytes, llc_bytes, threads, read / triad ({"<threads>": GB/s}),
    read_gbps / triad_gbps (the best thread count's figure) with read_threads /
    triad_threads, runs (per thread count: each kernel's median, best, worst,
    passes, timing), and how the figures are defined (unit, statistic, counting).

    threads: iterable of thread counts (default thread_ladder(os.cpu_count())).
    lib: None (this host's default library, built if missing), a path, or an open
    cffi library. bytes: working set (default working_set_bytes(llc_bytes)).
    llc_bytes: the machine's total last-level cache (default: read from /sys).
    Runs one kernel at a time (never two at once), read before triad per count.
    """
    t_start = time.monotonic()
    handle, path = open_probe_library(lib)
    if threads is None:
        threads = thread_ladder(os.cpu_count() or 1)
    threads = tuple(int(t) for t in threads)
    if not threads or min(threads) < 1:
        raise ValueError(f"thread counts must be >= 1, got {threads}")
    if llc_bytes is None:
        llc_bytes = _llc_total_here()
    if bytes is None:
        nbytes, rule = working_set_bytes(llc_bytes, _available_memory())
    else:
        nbytes, rule = int(bytes), "given by the caller"
    runs = []
    for t in threads:
        row = {"threads": t}
        for kind in kinds:
            row[kind] = run_kernel(handle, kind, nbytes, t, min_seconds)
        runs.append(row)
    result = {
        "unit": "GB/s (1e9 bytes per second)",
        "statistic": STATISTIC,
        "counting": {k: COUNTING[k] for k in kinds},
        "bytes": nbytes,
        "bytes_rule": rule,
        "llc_bytes": llc_bytes,
        "min_seconds": min_seconds,
        "threads": list(threads),
        "library": path,
    }
    for kind in kinds:
        # per thread count (JSON keys are strings), then the headline: the best count
        result[kind] = {str(row["threads"]): row[kind]["gbps"] for row in runs}
        best = max(runs, key=lambda row: row[kind]["gbps"])
        result[f"{kind}_gbps"] = best[kind]["gbps"]
        result[f"{kind}_threads"] = best["threads"]
    result["runs"] = runs
    result["seconds"] = round(time.monotonic() - t_start, 3)
    return result
