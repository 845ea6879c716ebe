"""One variant, measured in a child process: verify against the NumPy reference, then
time inside C. A variant that crashes, hangs, eats memory or computes wrong costs
its own result, never the tuner run.

Parent side: `measure(job, timeout_s)` runs `python -m tuner.measure.worker` with the job as
JSON on stdin, under a timeout and an address-space cap, and reads one JSON line
per problem from its stdout (so the problems finished before a crash still count).
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


def memory_cap(problems, llc_total: int | None = None) -> int:
    """Address-space cap of a measuring worker, twice what it needs plus 2 GiB: it holds
    the f32 weights it verifies against, the encoded weights, and the layer with the
    copies it cycles through (bandwidth.resident_copies)."""
    from dataclasses import replace

    from tuner.host.bandwidth import _llc_total_here, resident_copies

    llc = llc_total if llc_total is not None else _llc_total_here()
    need = max(replace(p, dtype="f32").layer_bytes
               + (1 + resident_copies(p.layer_bytes, llc)) * p.layer_bytes for p in problems)
    return max(4 << 30, 2 * need + (2 << 30))

def _limit(mem_bytes: int | None):
    def apply():
        os.setsid()  # own process group: a timeout kills OpenMP threads' process too
        if mem_bytes:
            resource.setrlimit(resource.RLIMIT_AS, (mem_bytes, mem_bytes))
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))  # a crash leaves no core file
    return apply


def _spawn(job: dict, timeout_s: float, mem_bytes: int | None):
    """Run `python -m tuner.measure.worker` on the job: (stdout, stderr, returncode, timed out)."""
    proc = subprocess.Popen([sys.executable, "-m", "tuner.measure.worker"], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            preexec_fn=_limit(mem_bytes), env=dict(os.environ, PYTHONHASHSEED="0"))
    try:
        out, err = proc.communicate(json.dumps(job), timeout=timeout_s)
        return out, err, proc.returncode, False
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        return out, err, proc.returncode, True


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
        why = f"timed out after {timeout_s:.0f} s"
        status = STATUS_TIMEOUT
    elif returncode < 0:
        sig = -returncode
        why = f"killed by signal {sig} ({signal.Signals(sig).name})"
        if sig in (signal.SIGKILL,) and mem_bytes:
            why += f"; memory cap {mem_bytes >> 20} MiB"
        status = STATUS_CRASH
    elif returncode != 0:
        tail = err.strip().splitlines()[-3:]
        why = f"worker exited with {returncode}: " + " | ".join(tail)
        status = STATUS_CRASH if "MemoryError" not in err else STATUS_ERROR
    else:
        why, status = "worker ended without a result", STATUS_ERROR
    return [done.get(p) or Outcome(p, status, why) for p in problems]


# ----------------------------------------------------------------- child side

def _emit(**d) -> None:
    sys.stdout.write(json.dumps(d) + "\n")
    sys.stdout.flush()


def _run_problem(lib, pd: dict, job: dict) -> None:
    from colibri._lib import ffi
    from colibri.layer import MoELayer

    from tuner.measure.problems import problem

    p = problem(pd["name"])
    enc, sh, router, route = _layer_inputs(p, job)
    layer = MoELayer.from_encoded(router, enc, weight_dtype=p.dtype, shared_expert_gate=sh,
                                  threads=job.get("threads"), lib=job["lib"], **route)
    # 1. verify against the float64 reference
    bad = _verify(lib, job["lib"], layer, router, p, job)
    if isinstance(bad, dict):
        _emit(problem=p.name, **bad)
        return
    worst = bad
    # 2. time inside C, fresh inputs per call (decode: other experts each call)
    xs, out, samples, n = _timing_buffers(p, job)
    n_inputs, max_samples = len(xs), len(samples)
    warmup = job.get("warmup", 3)

    # copies of the layer, cycled through, where one layer's weights would sit in the
    # last-level cache (as in bench: a model's layers follow each other)
    from tuner.host.bandwidth import _llc_total_here, resident_copies
    copies = [layer] + [MoELayer.from_encoded(router, enc, weight_dtype=p.dtype,
                                              shared_expert_gate=sh, threads=job.get("threads"),
                                              lib=job["lib"], **route)
                        for _ in range(resident_copies(p.layer_bytes, _llc_total_here()) - 1)]
    ptrs = ffi.new("colibri_layer *[]", [c._ptr for c in copies])

    def bench(warm, seconds, most):
        return lib.colibri_bench_layers(ptrs, len(copies), ffi.from_buffer("float[]", xs), n_inputs,
                                        p.T, ffi.from_buffer("float[]", out), layer.threads, warm,
                                        seconds, most, ffi.from_buffer("double[]", samples), n)

    # a short warm-up first, so that memory sampled around the timing loop only grows
    # if the variant leaks; the loop's own warm-up calls count as calls
    st = bench(warmup, 0.0, 1)
    mem0 = _memory()
    st = st or bench(warmup, job.get("min_seconds", 0.5), max_samples)
    mem1 = _memory()
    if st:
        from colibri._lib import last_error
        _emit(problem=p.name, status=STATUS_ERROR, reason=f"bench failed: {last_error(lib)}")
        return
    leak = leak_reason(mem0, mem1, warmup + n[0])
    _emit(problem=p.name, status=STATUS_LEAK if leak else STATUS_OK, reason=leak or "",
          samples=samples[:n[0]].tolist(), max_rel_err=worst)


def _verify(lib, lib_path: str, layer, router, p, job: dict):
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
    x = reference.inputs_with_margin(router, 1, seed=1, **route)
    act = quant.ACTIVATION_ROUNDING.get(p.dtype)
    ref = reference.moe_layer(x, router, *(quant.PerExpert(f32[n], p.dtype)
                                           for n in ("gate", "up", "down")), **route, **shared,
                              act=act)
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


def _layer_inputs(p, job: dict):
    """The problem's encoded weights from the weights directory: (expert and shared weights,
    the shared expert's gate or None, the router, the routing arguments of MoELayer)."""
    from tuner.measure import weights

    enc = weights.load_encoded(job["weights_dir"], p, job.get("seed", 0))
    sh = enc.pop("shared_expert_gate", (None, None))[0]
    router = enc.pop("router")[0]
    return enc, sh, router, dict(top_k=p.k, scoring=p.scoring, norm_topk_prob=p.norm)


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


def _build_sets(libs: list, order: list[int], p, job: dict, verify: bool):
    """Each library's copies of the layer, allocated in `order`; (sets by library index, the
    fields of a failed verification or None)."""
    from colibri._lib import ffi
    from colibri.layer import MoELayer

    from tuner.host.bandwidth import _llc_total_here, resident_copies

    enc, sh, router, route = _layer_inputs(p, job)
    ncopies = resident_copies(p.layer_bytes, _llc_total_here())
    sets = [None] * len(libs)
    for i in order:
        lib, path = libs[i]
        copies = [MoELayer.from_encoded(router, enc, weight_dtype=p.dtype, shared_expert_gate=sh,
                                        lib=path, **route) for _ in range(ncopies)]
        if verify and (job.get("verify") or [False] * len(libs))[i]:
            bad = _verify(lib, path, copies[0], router, p, job)
            if isinstance(bad, dict):
                return sets, dict(bad, lib=i)
        sets[i] = (lib, copies, ffi.new("colibri_layer *[]", [c._ptr for c in copies]))
    return sets, None


def _compare_group(libs: list, pds: list[dict], job: dict) -> None:
    """Several libraries on the phases of one shape and dtype, interleaved: per problem and
    thread count, `rounds` rounds, each timing every library for min_seconds inside C (round
    r starts with library r mod n, so none is always first).

    Where a library's layers sit in memory moves its speed by several percent (two sets of
    the same library's layers, allocated one after the other, timed 1.06-1.09x apart in every
    round on qwen3 prefill128/f32), so the layers are built twice: in library order for the
    first half of the rounds, then freed and built in reverse order for the rest. Libraries
    marked in job["verify"] are checked against the reference on the first build; a failed
    check fails every phase. Emits one line per problem and thread count:
    seconds[i][r] = library i's median seconds per call in round r."""
    import numpy as np

    from colibri._lib import ffi, last_error

    from tuner.measure.problems import problem

    probs = [problem(pd["name"]) for pd in pds]
    rounds = job.get("rounds", 3)
    per = {(p.name, th): [[] for _ in libs] for p in probs for th in job["threads"]}
    halves = [(list(range(len(libs))), (rounds + 1) // 2),
              (list(reversed(range(len(libs)))), rounds // 2)]
    done_rounds = 0
    for placement, (order, nr) in enumerate(halves):
        if nr == 0:
            continue
        sets, bad = _build_sets(libs, order, probs[0], job, verify=placement == 0)
        if bad:
            for p in probs:
                for th in job["threads"]:
                    _emit(problem=p.name, threads=th, **bad)
            return
        for p in probs:
            xs, out, samples, n = _timing_buffers(p, job)
            for th in job["threads"]:
                for r in range(done_rounds, done_rounds + nr):
                    for i in round_order(list(range(len(libs))), r):
                        lib, copies, ptrs = sets[i]
                        st = lib.colibri_bench_layers(
                            ptrs, len(copies), ffi.from_buffer("float[]", xs), len(xs), p.T,
                            ffi.from_buffer("float[]", out), th,
                            # warm once per library, placement and problem
                            job.get("warmup", 1) if r == done_rounds and th == job["threads"][0] else 0,
                            job.get("min_seconds", 0.2), len(samples),
                            ffi.from_buffer("double[]", samples), n)
                        if st:
                            _emit(problem=p.name, threads=th, lib=i, status=STATUS_ERROR,
                                  reason=f"bench failed: {last_error(lib)}")
                            per.pop((p.name, th), None)
                            break
                        if (p.name, th) in per:
                            per[(p.name, th)][i].append(float(np.median(samples[:n[0]])))
        done_rounds += nr
        del sets  # free this placement's layers before the next is built
    for (name, th), secs in per.items():
        _emit(problem=name, threads=th, status=STATUS_OK, seconds=secs)


def compare(job: dict, timeout_s: float, mem_bytes: int | None = None) -> list[dict]:
    """Parent side of a compare job (libs, problems, threads, rounds, min_seconds, verify):
    one dict per (problem, threads): status, reason, seconds (see _compare_problem). A
    problem the worker never reported (crash, timeout) gets that status."""
    out, err, returncode, timed_out = _spawn(dict(job, mode="compare"), timeout_s, mem_bytes)
    why = (STATUS_TIMEOUT, f"timed out after {timeout_s:.0f} s") if timed_out else None
    done = {}
    for line in out.splitlines():
        try:
            d = json.loads(line)
            done[(d["problem"], d["threads"])] = d
        except (json.JSONDecodeError, KeyError, TypeError):
            continue
    if why is None and returncode != 0:
        tail = " | ".join(err.strip().splitlines()[-3:])
        why = (STATUS_CRASH, f"worker exited with {returncode}: {tail}")
    why = why or (STATUS_ERROR, "worker ended without a result")
    return [done.get((p["name"], th)) or {"problem": p["name"], "threads": th, "status": why[0],
                                          "reason": why[1]}
            for p in job["problems"] for th in job["threads"]]


def _small_checks(lib_path: str, p) -> list[tuple[str, object, object]]:
    """(what, engine output, float64 reference) on a small ragged layer in p's dtype, with
    1, 2 and 40 tokens over 6 experts: decode-class and prefill-class kernels both run."""
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
    for T in (1, 2, 40):
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
    """(heap bytes in use per glibc's mallinfo2, or None elsewhere; resident bytes)."""
    heap = None
    try:
        f = ctypes.CDLL(None).mallinfo2
        f.restype = _MallInfo2
        m = f()
        heap = int(m.uordblks + m.hblkhd)
    except (AttributeError, OSError):
        pass
    with open("/proc/self/statm") as fh:
        rss = int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
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
    job = json.loads(sys.stdin.read())
    from colibri._lib import open_library

    if job.get("mode") == "compare":
        libs = [(open_library(path), path) for path in job["libs"]]
        # the phases of one shape and dtype share their layers
        groups: dict = {}
        for pd in job["problems"]:
            shape, _, dtype = pd["name"].split("/")
            groups.setdefault((shape, dtype), []).append(pd)
        for key, pds in groups.items():
            t0 = time.perf_counter()
            _compare_group(libs, pds, job)
            print(f"{'/'.join(key)}: {time.perf_counter() - t0:.1f} s", file=sys.stderr)
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
