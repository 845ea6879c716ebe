"""Variants measured in a child process: verify against the NumPy reference, then time
inside C. A variant that crashes, hangs, eats memory or computes wrong costs its own
result, never the tuner run.

Parent side:
- `measure(job, timeout_s)`: one library on several problems. It runs
  `python -m tuner.measure.worker` with the job as JSON on stdin, under a timeout and an
  address-space cap, and reads one JSON line per problem from its stdout (so the problems
  finished before a crash still count).
- `Session`: several libraries timed in interleaved rounds, one round per request, in one
  child that keeps their layers loaded (tuner/measure/interleave.py drives it).

Every library loads a problem's weights from the same model file (weights.ensure_model),
mapped in place: all of them read the same memory.
Child side: `main()`.
"""
from __future__ import annotations

import ctypes
import json
import os
import resource
import signal
import subprocess
import sys
import time
from dataclasses import dataclass

STATUS_OK, STATUS_WRONG, STATUS_CRASH, STATUS_TIMEOUT, STATUS_ERROR, STATUS_LEAK = (
    "ok", "wrong", "crash", "timeout", "error", "leak")

# Canary floats on each side of the output of a verification call (one page's worth):
# a kernel that writes past its output is caught here, past its scratch by the engine's
# guarded mode (colibri_set_guards).
OUT_CANARY_FLOATS = 1024
_CANARY = 0x7FC0BEEF  # a NaN bit pattern: no kernel computes it
# A variant whose heap or resident memory grows by more than this over the timing loop
# (after warm-up) leaks; both floors keep one-off allocations from counting.
LEAK_MB_PER_1000_CALLS = 0.25
LEAK_MIN_HEAP_BYTES = 256 << 10
LEAK_MIN_RSS_BYTES = 2 << 20
# Growth is judged again over as many more calls (at least this many) before it counts: a
# slow problem (Qwen3 prefill512 in a --quick run) can grow the heap once (glibc placing a
# buffer of another size on fresh pages, 5.8 MB, seen over 2 and over 4 timed calls), which
# is no evidence of a leak on its own; a leak grows again.
LEAK_MIN_CALLS = 4


@dataclass(frozen=True)
class Outcome:
    problem: str
    status: str
    reason: str = ""
    samples: tuple[float, ...] = ()
    max_rel_err: float | None = None


# ---------------------------------------------------------------- parent side


def round_order(names: list, r: int) -> list:
    """The order round r times the implementations in: rotated by r."""
    k = r % len(names) if names else 0
    return names[k:] + names[:k]


def memory_cap(problems, n_libs: int = 1, llc_total: int | None = None) -> int:
    """Address-space cap of a measuring worker, twice what it maps plus 2 GiB: the f32
    weights the reference reads, each library's mapping of the model files (the copies
    of a layer it cycles through, bandwidth.copies_for), and a session's throwaway."""
    from dataclasses import replace

    from tuner.host.bandwidth import _llc_total_here, copies_for

    llc = llc_total if llc_total is not None else _llc_total_here()
    groups = {(p.shape, p.dtype): p for p in problems}
    f32 = max((replace(p, dtype="f32").layer_bytes for p in groups.values()), default=0)
    sizes = [copies_for(p, llc) * p.layer_bytes for p in groups.values()]
    # and the throwaway copy a session holds (_first_packed_model), at most the largest
    return max(4 << 30, 2 * (f32 + n_libs * sum(sizes) + max(sizes, default=0)) + (2 << 30))


def _limit(mem_bytes: int | None):
    def apply():
        os.setsid()  # own process group: a timeout kills OpenMP threads' process too
        if mem_bytes:
            resource.setrlimit(resource.RLIMIT_AS, (mem_bytes, mem_bytes))
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))  # a crash leaves no core file
    return apply


# NumPy's BLAS in the worker computes the reference, untimed, with one thread: its idle
# threads spin on the cores for a while after each call, and on a 2-CPU host the timing
# that follows a reference ran 1.5-4x slow for its first ~0.1 s (quick screening times a
# variant for 0.05 s). These variables are read by BLAS libraries only, not by OpenMP.
BLAS_ONE_THREAD = {"OPENBLAS_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "BLIS_NUM_THREADS": "1"}


def worker_env() -> dict:
    return dict(os.environ, PYTHONHASHSEED="0", **BLAS_ONE_THREAD)


def _spawn(job: dict, timeout_s: float, mem_bytes: int | None):
    """Run `python -m tuner.measure.worker` on the job: (stdout, stderr, returncode, timed out)."""
    proc = subprocess.Popen([sys.executable, "-m", "tuner.measure.worker"], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            preexec_fn=_limit(mem_bytes), env=worker_env())
    try:
        out, err = proc.communicate(json.dumps(job), timeout=timeout_s)
        return out, err, proc.returncode, False
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        return out, err, proc.returncode, True


def _exit_reason(returncode: int, err: str, mem_bytes: int | None) -> tuple[str, str]:
    """(status, why) of a worker that ended with `returncode` before it finished."""
    if returncode < 0:
        sig = -returncode
        why = f"killed by signal {sig} ({signal.Signals(sig).name})"
        if sig == signal.SIGKILL:
            # the address-space cap makes an allocation fail (MemoryError, an engine error), it
            # sends no signal: a SIGKILL comes from outside, most often the kernel's OOM killer
            why += ("; most likely the kernel's OOM killer (the machine or its cgroup ran out of memory"
                    + (f"; the worker's own address-space cap, {mem_bytes >> 20} MiB, fails allocations "
                       "instead" if mem_bytes else "") + ")")
        return STATUS_CRASH, why
    if returncode != 0:
        tail = err.strip().splitlines()[-3:]
        return (STATUS_CRASH if "MemoryError" not in err else STATUS_ERROR,
                f"worker exited with {returncode}: " + " | ".join(tail))
    return STATUS_ERROR, "worker ended without a result"


def measure(job: dict, timeout_s: float, mem_bytes: int | None = None) -> list[Outcome]:
    """Run one job (one library, several problems); one Outcome per problem."""
    problems = [p["name"] for p in job["problems"]]
    out, err, returncode, timed_out = _spawn(job, timeout_s, mem_bytes)
    done = {}
    for line in out.splitlines():
        try:
            d = json.loads(line)
        except json.JSONDecodeError:
            continue
        done[d["problem"]] = Outcome(d["problem"], d["status"], d.get("reason", ""),
                                     tuple(d.get("samples", ())), d.get("max_rel_err"))
    if timed_out:
        status, why = STATUS_TIMEOUT, f"timed out after {timeout_s:.0f} s"
    else:
        status, why = _exit_reason(returncode, err, mem_bytes)
    return [done.get(p) or Outcome(p, status, why) for p in problems]


# ----------------------------------------------------------------- child side

def _emit(**d) -> None:
    sys.stdout.write(json.dumps(d) + "\n")
    sys.stdout.flush()


class _ModelLayer:
    """Layer `index` of a model file loaded by one library, callable like MoELayer."""

    def __init__(self, model, index: int, threads):
        self.model, self.threads = model, int(threads or 0)
        self.ptr = model._lib.colibri_model_layer(model._handle, index)

    def __call__(self, x, out=None):
        import numpy as np

        from colibri._lib import check, ffi

        out = np.empty_like(x) if out is None else out
        st = self.model._lib.colibri_layer_forward(self.ptr, ffi.from_buffer("float[]", x),
                                                   ffi.from_buffer("float[]", out), x.shape[0],
                                                   self.threads)
        check(self.model._lib, st, "colibri_layer_forward")
        return out


def _load_layers(lib, lib_path: str, p, job: dict):
    """(the model file of p loaded by `lib`, a pointer array of its layers for
    colibri_bench_layers, their count)."""
    from colibri._lib import ffi
    from colibri.model import Model

    from tuner.host.bandwidth import _llc_total_here, copies_for
    from tuner.measure import weights

    copies = copies_for(p, _llc_total_here())
    # the tuner wrote the file, and _verify checks the layer's outputs: the CRC pass over
    # every copy (a quarter of a worker's time on Qwen3's int4 file) buys nothing here
    model = Model.load(weights.model_path(job["weights_dir"], p, job.get("seed", 0), copies), lib=lib,
                       check_crc=False)
    ptrs = ffi.new("colibri_layer *[]", [model._lib.colibri_model_layer(model._handle, i)
                                         for i in range(model.n_layers)])
    return model, ptrs, model.n_layers


def _run_problem(lib, pd: dict, job: dict) -> None:
    from colibri._lib import ffi

    from tuner.measure.problems import problem

    p = problem(pd["name"])
    model, ptrs, nlayers = _load_layers(lib, job["lib"], p, job)
    # 1. verify against the float64 reference
    bad = _verify(lib, job["lib"], _ModelLayer(model, 0, job.get("threads")), p, job)
    if isinstance(bad, dict):
        _emit(problem=p.name, **bad)
        return
    worst = bad
    # 2. time inside C, fresh inputs per call (decode: other experts each call), cycling
    # through the model's copies of the layer where one layer's weights would sit in the
    # last-level cache (as in bench: a model's layers follow each other)
    xs, out, samples, n = _timing_buffers(p, job)
    n_inputs, max_samples = len(xs), len(samples)
    warmup = job.get("warmup", 3)

    def bench(warm, seconds, most):
        return lib.colibri_bench_layers(ptrs, nlayers, ffi.from_buffer("float[]", xs), n_inputs,
                                        p.T, ffi.from_buffer("float[]", out), job.get("threads") or 0,
                                        warm, seconds, most, ffi.from_buffer("double[]", samples), n)

    # a short warm-up first, then the timing loop in two halves with memory sampled between:
    # a leak grows memory in the second half too, while memory that is touched once (the
    # first call to reach an expert, say: Mixtral int8 decode grew 2.1 MB in its first
    # timed calls and never again) only grows in the first
    seconds = job.get("min_seconds", 0.5)
    st = bench(warmup, 0.0, 1)
    st = st or bench(warmup, seconds / 2, max(1, max_samples // 2))
    first = samples[:n[0]].copy()
    mem0 = _memory()
    st = st or bench(0, seconds / 2, max_samples - len(first))
    mem1 = _memory()
    if st:
        from colibri._lib import last_error
        _emit(problem=p.name, status=STATUS_ERROR, reason=f"bench failed: {last_error(lib)}")
        return
    leak = leak_reason(mem0, mem1, n[0])
    timed = first.tolist() + samples[:n[0]].tolist()
    if leak:
        st = bench(0, float("inf"), min(max_samples, max(LEAK_MIN_CALLS, n[0])))
        mem2 = _memory()
        if st:
            from colibri._lib import last_error
            _emit(problem=p.name, status=STATUS_ERROR, reason=f"bench failed: {last_error(lib)}")
            return
        timed += samples[:n[0]].tolist()
        leak = leak_reason(mem1, mem2, n[0])
    _emit(problem=p.name, status=STATUS_LEAK if leak else STATUS_OK, reason=leak or "",
          samples=timed, max_rel_err=worst)


def _verify(lib, lib_path: str, layer, p, job: dict):
    """Check a layer of `lib` against the float64 reference: the real shape at T=1 (decode
    kernels), then a small ragged layer whose experts get many tokens (prefill and gemm
    kernels too); the kernels are not specialised by shape, so together they cover the
    variant. The worst relative error, or the fields of a failed result (a dict)."""
    from colibri import quant, reference

    from tuner.measure import weights

    route = dict(top_k=p.k, scoring=p.scoring, norm_topk_prob=p.norm)
    f32 = weights.load(job["weights_dir"], p, job.get("seed", 0))
    shared = {n: (f32[n] if n == "shared_expert_gate" else quant.roundtrip(f32[n], p.dtype))
              for n in weights.SHARED if n in f32}
    x = reference.inputs_with_margin(f32["router"], 1, seed=1, **route)
    act = quant.ACTIVATION_ROUNDING.get(p.dtype)
    ref = reference.moe_layer(x, f32["router"], *(quant.PerExpert(f32[n], p.dtype)
                                                  for n in ("gate", "up", "down")),
                              **route, **shared, act=act)
    guards = _set_guards(lib, True)
    try:
        checks = [(f"{p.shape} T=1", _guarded_call(layer, x, f"{p.shape} T=1"), ref, 1)]
        checks += _small_checks(lib_path, p)
    except OutOfBounds as exc:
        return {"status": STATUS_WRONG, "reason": str(exc)}
    finally:
        _set_guards(lib, guards)
    worst = 0.0
    for what, out, ref, T in checks:
        ok, rel, msg = reference.compare(out, ref, p.dtype)  # the same criterion as the tests
        if not ok:
            return {"status": STATUS_WRONG, "max_rel_err": None if rel == float("inf") else rel,
                    "reason": f"{msg} ({what})"}
        worst = max(worst, rel)
    return worst


def _timing_buffers(p, job: dict):
    """Inputs (a fresh one per call: decode routes to other experts each call), the output,
    the samples array and its count for colibri_bench_layers."""
    import numpy as np

    from colibri._lib import ffi

    rng = np.random.default_rng(job.get("seed", 0) + 7)
    n_inputs = max(1, job.get("inputs_per_problem", 64) // p.T)
    xs = rng.standard_normal((n_inputs, p.T, p.H), dtype=np.float32)
    return (xs, np.empty((p.T, p.H), np.float32), np.empty(job.get("max_samples", 2000), np.float64),
            ffi.new("int *"))


# ---------------------------------------------------------------- interleaved rounds

class Session:
    """Several libraries timed in interleaved rounds by one child process.

    The child loads every library's layers of every problem once (the model files of
    weights.ensure_model, which the caller made), verifies the libraries marked in
    `verify`, and then times one round per round() call: each live library on each problem
    and thread count for min_seconds inside C, the libraries in rotating order (round r
    starts with library r mod n, so none is always first). All of them read the same
    mapped weights, so memory placement favours none. With bandwidth=True each round
    first measures the read bandwidth at each thread count (Session.bandwidth).

        with Session(libs, problems, threads=[2], weights_dir=..., verify=[False, True]) as s:
            s.verified        # per library: None (not checked) or {"status", "reason", ...}
            secs = s.round([0, 1])   # {(problem, threads): [seconds per library or None]}

    A child that dies or overruns its time fails the session (SessionError) and costs
    only this session's measurements.
    """

    def __init__(self, libs, problems, *, threads, weights_dir, seed: int = 0,
                 min_seconds: float = 0.2, warmup: int = 1, verify=None,
                 timeout_s: float = 300.0, bandwidth: bool = False, say=None):
        self.libs = [str(x) for x in libs]
        self.problems = list(problems)
        self.threads = list(threads)
        self.timeout_s = timeout_s
        self.min_seconds = min_seconds
        self.rounds_done = 0
        self.verified: list = [None] * len(self.libs)
        self._job = {"mode": "session", "libs": self.libs,
                     "problems": [{"name": p.name} for p in self.problems],
                     "threads": self.threads, "weights_dir": str(weights_dir), "seed": seed,
                     "min_seconds": min_seconds, "warmup": warmup, "bandwidth": bandwidth,
                     "verify": list(verify or [False] * len(self.libs))}
        self.bandwidth: dict[int, list[float]] = {}  # threads -> read GB/s, one per round
        self._mem = memory_cap(self.problems, len(self.libs))
        self._proc = None
        self._err = None

    def __enter__(self) -> "Session":
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def start(self) -> None:
        import tempfile

        self._err = tempfile.TemporaryFile(mode="w+")
        self._proc = subprocess.Popen(
            [sys.executable, "-m", "tuner.measure.worker"], stdin=subprocess.PIPE,
            stdout=subprocess.PIPE, stderr=self._err, bufsize=0,
            preexec_fn=_limit(self._mem), env=worker_env())
        self._pending = b""  # bytes read from the child's stdout past the last whole line
        self._send(self._job)
        # loading and verifying: every library's layers and the reference calls
        while True:
            d = self._read(self.timeout_s)
            if d.get("event") == "verified":
                self.verified[d["lib"]] = {k: v for k, v in d.items() if k not in ("event", "lib")}
            elif d.get("event") == "ready":
                return

    def round(self, live) -> dict:
        """Time one round of the libraries `live` (indices); {(problem name, threads):
        [median seconds per call for each library, None for those not timed]}."""
        live = [i for i in live if self.verified[i] is None or self.verified[i]["status"] == STATUS_OK]
        self._send({"round": self.rounds_done, "libs": live})
        # the child reports each (problem, threads, library) it timed: a round of slow cases
        # (Mixtral prefill2048 runs seconds per call on an AVX2 VM) takes as long as it
        # needs, while a case that hangs fails after the session's timeout
        while (d := self._read(max(60.0, self.timeout_s))).get("event") == "progress":
            pass
        self.rounds_done += 1
        for th, v in (d.get("bandwidth") or {}).items():
            self.bandwidth.setdefault(int(th), []).append(v)
        out = {}
        for key, per in d["seconds"].items():
            name, th = key.rsplit("|", 1)
            row = [None] * len(self.libs)
            for i, v in per.items():
                row[int(i)] = v
            out[(name, int(th))] = row
        return out

    def close(self) -> None:
        if self._proc is None:
            return
        try:
            if self._proc.poll() is None:
                self._send({"stop": True})
                self._proc.wait(timeout=30)
        except (OSError, subprocess.TimeoutExpired, SessionError):
            pass
        if self._proc.poll() is None:
            os.killpg(self._proc.pid, signal.SIGKILL)
            self._proc.wait()
        self._proc = None
        self._err.close()

    def _send(self, obj: dict) -> None:
        try:
            self._proc.stdin.write((json.dumps(obj) + "\n").encode())
        except OSError:
            raise self._failure(False) from None

    def _read(self, timeout_s: float) -> dict:
        """The child's next line as JSON, waiting at most timeout_s for it (read from the
        descriptor itself: a buffered reader would hold lines select() cannot see)."""
        import selectors

        deadline = time.monotonic() + timeout_s
        fd = self._proc.stdout.fileno()
        with selectors.DefaultSelector() as sel:
            sel.register(fd, selectors.EVENT_READ)
            while b"\n" not in self._pending:
                left = deadline - time.monotonic()
                if left <= 0 or not sel.select(left):
                    os.killpg(self._proc.pid, signal.SIGKILL)
                    self._proc.wait()
                    raise self._failure(True, timeout_s)
                chunk = os.read(fd, 1 << 16)
                if not chunk:
                    self._proc.wait()
                    raise self._failure(False)
                self._pending += chunk
        line, self._pending = self._pending.split(b"\n", 1)
        d = json.loads(line)
        if d.get("event") == "error":
            raise SessionError(STATUS_ERROR, d.get("reason", ""))
        return d

    def _failure(self, timed_out: bool, timeout_s: float = 0.0) -> "SessionError":
        if timed_out:
            return SessionError(STATUS_TIMEOUT, f"timed out after {timeout_s:.0f} s")
        self._err.seek(0)
        status, why = _exit_reason(self._proc.returncode if self._proc.returncode is not None else 0,
                                   self._err.read(), self._mem)
        return SessionError(status, why)


class SessionError(RuntimeError):
    """A session's child failed: status (crash, timeout, error) and why."""

    def __init__(self, status: str, reason: str):
        super().__init__(f"{status}: {reason}")
        self.status, self.reason = status, reason


def _session(job: dict) -> None:
    """Child side of a Session: load, verify, then one round per request line."""
    from colibri._lib import ffi, last_error, open_library

    from tuner.measure.problems import problem

    libs = [open_library(path) for path in job["libs"]]
    probs = [problem(pd["name"]) for pd in job["problems"]]
    verify = job.get("verify") or [False] * len(libs)
    loaded = {}   # (lib index, problem name) -> (model, pointers, count)
    failed = set()
    # held to the end of the session: freed, it did nothing
    # (reports/measured/spr-kvm-2c-2026-12-05/session5)
    held = _first_packed_model(libs[-1], job["libs"][-1], probs, job)  # noqa: F841
    for p in probs:
        # the reference (index 0: the default, ab's A) loads last: should any first-load
        # penalty outlive the held throwaway copy (_first_packed_model), it falls on a
        # candidate, never on the default
        for i in reversed(range(len(libs))):
            lib, path = libs[i], job["libs"][i]
            key = (p.shape, p.dtype)
            if i in failed:
                continue
            same = next((v for (j, q), v in loaded.items() if j == i and (q.shape, q.dtype) == key), None)
            loaded[(i, p)] = same or _load_layers(lib, path, p, job)
            if verify[i] and same is None:
                bad = _verify(lib, path, _ModelLayer(loaded[(i, p)][0], 0, 0), p, job)
                if isinstance(bad, dict):
                    failed.add(i)
                    _emit(event="verified", lib=i, problem=p.name, **bad)
    for i in range(len(libs)):
        if verify[i] and i not in failed:
            _emit(event="verified", lib=i, status=STATUS_OK)
    _emit(event="ready")
    buffers = {p: _timing_buffers(p, job) for p in probs}
    warmed = set()
    bw_bytes = 0
    if job.get("bandwidth"):
        from tuner.host.bandwidth import _llc_total_here, working_set_bytes

        bw_bytes = working_set_bytes(_llc_total_here())[0]
    gbps = ffi.new("double *")
    for line in sys.stdin:
        cmd = json.loads(line)
        if cmd.get("stop"):
            return
        r, live = cmd["round"], [i for i in cmd["libs"] if i not in failed]
        seconds, bandwidth = {}, {}
        # the read bandwidth in this round, at each thread count: what "% of bandwidth"
        # divides by (a figure from minutes earlier can be a third off on a shared machine)
        for th in job["threads"] if bw_bytes else ():
            if libs[0].colibri_membw(0, bw_bytes, th, 0.1, gbps) == 0:
                bandwidth[str(th)] = float(gbps[0])
        for p in probs:
            xs, out, samples, n = buffers[p]
            for th in job["threads"]:
                row = seconds.setdefault(f"{p.name}|{th}", {})
                for i in round_order(live, r):
                    model, ptrs, count = loaded[(i, p)]
                    warm = 0 if (i, p, th) in warmed else job.get("warmup", 1)
                    warmed.add((i, p, th))
                    st = libs[i].colibri_bench_layers(
                        ptrs, count, ffi.from_buffer("float[]", xs), len(xs), p.T,
                        ffi.from_buffer("float[]", out), th, warm, job.get("min_seconds", 0.2),
                        len(samples), ffi.from_buffer("double[]", samples), n)
                    if st:
                        _emit(event="error", reason=f"library {i} ({job['libs'][i]}) on {p.name} "
                                                    f"at {th} thread(s): {last_error(libs[i])}")
                        return
                    s = sorted(samples[:n[0]])
                    k = len(s)
                    row[str(i)] = float(s[k // 2] if k % 2 else 0.5 * (s[k // 2 - 1] + s[k // 2]))
                    _emit(event="progress")  # the parent's timeout runs per case, not per round
        _emit(event="round", round=r, seconds=seconds, bandwidth=bandwidth)


def _first_packed_model(lib, lib_path: str, probs, job: dict):
    """A throwaway copy of the first of `probs`' models that is packed at load (None if
    none is), which the session holds and never times. On a Sapphire Rapids-class KVM
    guest, whichever library's packed model a worker loaded first ran 4-9% slower for the
    whole session (three copies of one library: 0.915x; `colibri_bench ab` of one build
    against another: B, loaded first, 0.94-0.96x either way round): the first large
    allocation of a new process gets memory that stays slow. A copy freed before the real
    loads does nothing (their pages take its place); held, the comparison reads
    0.98-1.00x."""
    for p in {(q.shape, q.dtype): q for q in probs}.values():
        try:
            model = _load_layers(lib, lib_path, p, job)[0]
        except Exception:  # a file that does not load: the real load reports it
            return None
        if model.layer_page_kind(0) != "file":
            return model
        model.close()  # read in place from its file: nothing allocated
    return None


def _small_checks(lib_path: str, p) -> list[tuple[str, object, object]]:
    """(what, engine output, float64 reference) on a small ragged layer in p's dtype, with
    1, 2, 40 and 100 tokens over 6 experts: decode-class and prefill-class kernels both run,
    and at 100 (27-43 tokens an expert) the gemm paths at every gemm_min_tokens value (at
    40, no expert reaches 32 tokens)."""
    import numpy as np

    from colibri import quant, reference
    from colibri.layer import MoELayer

    rng = np.random.default_rng(12345)
    H, I, E, k, S = 200, 72, 6, 2, (40 if p.S else 0)
    w = lambda *sh: rng.standard_normal(sh, dtype=np.float32) * np.float32(1 / np.sqrt(sh[-1]))
    router = w(E, H) * np.float32(3)
    gate, up, down = w(E, I, H), w(E, I, H), w(E, H, I)
    sh = dict(shared_gate=w(S, H), shared_up=w(S, H), shared_down=w(H, S),
              shared_expert_gate=w(H)) if S else {}
    route = dict(top_k=k, scoring=p.scoring, norm_topk_prob=p.norm)
    layer = MoELayer(router, gate, up, down, weight_dtype=p.dtype, lib=lib_path, **route, **sh)
    rt = {n: (v if n == "shared_expert_gate" else quant.roundtrip(v, p.dtype)) for n, v in sh.items()}
    out = []
    for T in (1, 2, 40, 100):
        x = reference.inputs_with_margin(router, T, seed=T, **route)
        ref = reference.moe_layer(x, router, *(quant.PerExpert(a, p.dtype) for a in (gate, up, down)),
                                  **route, **rt, act=quant.ACTIVATION_ROUNDING.get(p.dtype))
        what = f"small ragged layer T={T}"
        out.append((what, _guarded_call(layer, x, what), ref, T))
    return out


class OutOfBounds(Exception):
    """A verification call wrote outside its output or scratch."""


def _set_guards(lib, on: bool) -> bool:
    """The engine's guarded mode on or off; returns the previous setting (False when the
    library predates it)."""
    fn = getattr(lib, "colibri_set_guards", None)
    return bool(fn(1 if on else 0)) if fn is not None else False


def _guarded_call(layer, x, what: str):
    """layer(x) into an output with canaries on both sides; OutOfBounds if the kernel wrote
    past its output, or (guarded mode) past its scratch."""
    import numpy as np

    from colibri._lib import ColibriError

    n, g = x.shape[0] * x.shape[1], OUT_CANARY_FLOATS
    raw = np.full(n + 2 * g, _CANARY, np.uint32)
    out = raw.view(np.float32)[g:g + n].reshape(x.shape)
    try:
        layer(x, out=out)
    except ColibriError as exc:
        if "out-of-bounds write" in str(exc):
            raise OutOfBounds(f"{str(exc).split(': ', 1)[-1]} ({what})") from None
        raise
    before = int(np.count_nonzero(raw[:g] != _CANARY))
    after = int(np.count_nonzero(raw[g + n:] != _CANARY))
    if before or after:
        where = " and ".join(f"{c} float(s) {side} the output" for c, side in
                             ((after, "past"), (before, "before")) if c)
        raise OutOfBounds(f"out-of-bounds write: a kernel wrote {where} ({what})")
    return out.copy()


class _MallInfo2(ctypes.Structure):
    _fields_ = [(n, ctypes.c_size_t) for n in
                ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks",
                 "uordblks", "fordblks", "keepcost")]


def _memory() -> tuple[int | None, int]:
    """(heap bytes in use per glibc's mallinfo2, or None elsewhere; resident anonymous
    bytes). statm's resident less its shared: the pages of a mapped model file are resident
    once first touched, so a variant slow enough to reach some experts' pages only in the
    second half of its timing loop could be judged a leak by them (the likely cause of a
    "slow" test variant read as leaking once in CI's kill test, 2026-12-05); a leak is
    memory the process allocated, not file pages it read."""
    heap = None
    try:
        f = ctypes.CDLL(None).mallinfo2
        f.restype = _MallInfo2
        m = f()
        heap = int(m.uordblks + m.hblkhd)
    except (AttributeError, OSError):
        pass
    with open("/proc/self/statm") as fh:
        fields = fh.read().split()
    rss = (int(fields[1]) - int(fields[2])) * os.sysconf("SC_PAGE_SIZE")
    return heap, rss


def leak_reason(before: tuple, after: tuple, calls: int) -> str | None:
    """"leaks N MB per 1000 calls ..." when memory grew beyond the thresholds, else None."""
    (h0, r0), (h1, r1) = before, after
    found = []
    if h0 is not None and h1 is not None and h1 - h0 >= LEAK_MIN_HEAP_BYTES:
        found.append(("heap", h1 - h0))
    if r1 - r0 >= LEAK_MIN_RSS_BYTES:
        found.append(("resident memory", r1 - r0))
    if not found or calls <= 0:
        return None
    what, grew = max(found, key=lambda f: f[1])
    per_1000 = grew / calls * 1000 / 1e6
    if per_1000 < LEAK_MB_PER_1000_CALLS:
        return None
    return (f"leaks {per_1000:.2f} MB per 1000 calls ({what} grew {grew / 1e6:.1f} MB "
            f"over {calls} calls after warm-up)")


def main() -> int:
    job = json.loads(sys.stdin.readline())
    from colibri._lib import open_library

    if job.get("mode") == "session":
        _session(job)
        return 0
    lib = open_library(job["lib"])
    if job.get("inject"):  # fault injection for the tuner's own tests
        _inject(job["inject"])
    for pd in job["problems"]:
        t0 = time.perf_counter()
        _run_problem(lib, pd, job)
        print(f"{pd['name']}: {time.perf_counter() - t0:.1f} s", file=sys.stderr)
    return 0


def _inject(kind: str) -> None:
    """Test-only faults of the worker process itself (the C-level ones live in templates)."""
    if kind == "segfault":
        os.kill(os.getpid(), signal.SIGSEGV)
    elif kind == "hang":
        time.sleep(3600)
    elif kind == "oom":
        blocks = []
        while True:
            blocks.append(bytearray(1 << 28))


if __name__ == "__main__":
    sys.exit(main())
