"""`python -m tuner run`: probe -> profile -> space -> build -> verify+time -> store -> emit.

One knob assignment of the expert kernels is one variant. A variant is measured on
every problem of the run (decode and prefill, per dtype) in one worker process; its
cost is the geometric mean of its median times over the problems, which ranks
variants exactly as the geometric mean of their speed-ups over any baseline would.
Every (variant, problem) measurement is written to the store as soon as it exists,
keyed by its signature, so a re-run measures nothing already measured and a killed
run loses nothing it finished.
"""
from __future__ import annotations

import hashlib
import math
import os
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from colibri._lib import ROOT, build_dir_default

from . import problems as problems_mod
from . import profiles, render, variants, weights, worker
from .signature import signature, variant_id
from .space import Space
from .store import Measurement, Store

KERNEL = "expert_ffn"


@dataclass
class RunConfig:
    profile: str | None = None
    problems: tuple[str, ...] = problems_mod.DEFAULT_PROBLEMS
    strategy: str | None = None          # None: search.choose_default
    max_evals: int | None = None
    budget_s: float | None = None
    quick: bool = False
    threads: int | None = None
    min_seconds: float = 0.5             # timing per (variant, problem)
    retime_rounds: int = 5               # finalists re-timed interleaved with the default
    finalists: int = 3
    seed: int = 0
    build_dir: Path = field(default_factory=build_dir_default)
    store_path: Path | None = None
    worker_timeout_s: float = 300.0
    emit: bool = True
    inject: dict | None = None           # tests: {vid or "*": fault} for the worker
    space_overrides: dict | None = None  # restrict knobs: {knob: [values]}
    start_points: tuple[dict, ...] = ()  # seeds for the search (e.g. from a registry)
    log: object = None                   # callable(str) for progress; default stderr
    measure_bandwidth: bool = True       # probe the read bandwidth (for "% of bandwidth")


class Tuner:
    """Holds what the pipeline's stages share for one run."""

    def __init__(self, cfg: RunConfig, host=None):
        self.cfg = cfg
        self.say = cfg.log or (lambda m: print(m, file=sys.stderr, flush=True))
        from . import hostmatch

        self.host = host if host is not None else _probe_host(cfg, self.say)
        self.profile_name = cfg.profile or hostmatch.host_profile_name()
        self.profile = profiles.get_profile(self.profile_name)
        self.resolved = profiles.resolve(self.profile)
        if not self.resolved.runnable_here:
            raise SystemExit(f"profile {self.profile_name} cannot run on this host "
                             f"({self.resolved.reason}); pick another with --profile")
        self.spec = render.load_knob_spec(KERNEL)
        tdir = Path(render.TEMPLATES_DIR)
        self.template_text = ((tdir / f"{KERNEL}{render.TEMPLATE_SUFFIX}").read_text()
                              + (tdir / f"{KERNEL}{render.KNOBS_SUFFIX}").read_text())
        self.default = render.resolve_knobs(self.spec, self.profile.knobs, None,
                                            self.profile.kernel_isas)
        self.space = self._space()
        self.problems = [problems_mod.problem(n) for n in cfg.problems]
        self.work = Path(cfg.build_dir) / "tuner"
        self.store_path = Path(cfg.store_path or self.work / f"results-{self.host_id}.sqlite")
        self.store = Store(self.store_path, exclusive=True)
        self.measured = 0      # variants measured in this run (not from the store)
        self.from_store = 0

    # ------------------------------------------------------------- identity
    @property
    def host_id(self) -> str:
        return self.host["host_id"]

    def key(self, knobs: dict, prob) -> str:
        return signature(host_fingerprint=self.host["fingerprint"],
                         compiler=self.resolved.compiler.family,
                         compiler_version=self.resolved.version,
                         flags=list(self.resolved.cflags) + list(self.resolved.ldflags),
                         template_source=self.template_text, knobs=knobs,
                         problem=dict(prob.to_dict(), threads=self.cfg.threads or os.cpu_count()))

    def _space(self) -> Space:
        space = Space.from_spec(self.spec, self.profile.kernel_isas)
        restrict = dict(self.cfg.space_overrides or {})
        if self.cfg.quick and not restrict:
            # --quick: the profile's ISA, the knobs' corners around the default
            d = self.default
            restrict = {"isa": [d["isa"]], "tok_block": sorted({1, d["tok_block"], 2}),
                        "unroll": sorted({1, 2, d["unroll"]}),
                        "prefetch": sorted({0, d["prefetch"]})}
        return space.subspace(**restrict) if restrict else space

    # ----------------------------------------------------------- measuring
    def cached(self, knobs: dict):
        rows = [self.store.get(self.key(knobs, p)) for p in self.problems]
        return rows if all(r is not None for r in rows) else None

    def cost(self, rows) -> float | None:
        if any(r.status != "ok" for r in rows):
            return None
        return math.exp(sum(math.log(r.median_s) for r in rows) / len(rows))

    def build(self, points: list[dict]) -> dict[str, variants.Built]:
        todo = [p for p in points if self.cached(p) is None]
        if not todo:
            return {}
        self.say(f"building {len(todo)} variant(s) with scons -j{os.cpu_count()} "
                 f"(profile {self.profile_name})")
        t0 = time.perf_counter()
        built = variants.build_batch(self.profile_name, todo, self.work / "variants")
        bad = sum(b.lib is None for b in built)
        self.say(f"built {len(built) - bad}, failed {bad} in {time.perf_counter() - t0:.1f} s")
        return {b.vid: b for b in built}

    def evaluate(self, knobs: dict, built: dict | None = None) -> float | None:
        rows = self.cached(knobs)
        if rows is not None:
            self.from_store += 1
            return self.cost(rows)
        vid = variant_id(knobs)
        b = (built or {}).get(vid) or self.build([knobs]).get(vid)
        if b is None:  # raced into the store meanwhile
            return self.cost(self.cached(knobs))
        if b.lib is None:
            rows = [self._put(knobs, p, "compile_error", b.error) for p in self.problems]
            self.say(f"  {vid}: compile error: {b.error.splitlines()[0] if b.error else ''}")
            return None
        outcomes = self.run_worker(b.lib, vid, self.cfg.min_seconds)
        rows = []
        for p, o in zip(self.problems, outcomes):
            rows.append(self._put(knobs, p, o.status, o.reason, o.samples, o.max_rel_err))
        self.measured += 1
        self.say("  " + vid + ": " + "; ".join(_fmt_row(r, p) for r, p in zip(rows, self.problems)))
        return self.cost(rows)

    def run_worker(self, lib: Path, vid: str, min_seconds: float):
        job = {"lib": str(lib), "problems": [{"name": p.name} for p in self.problems],
               "weights_dir": str(self.work / "weights"), "seed": self.cfg.seed,
               "threads": self.cfg.threads, "min_seconds": min_seconds}
        inject = self.cfg.inject or {}
        if vid in inject or "*" in inject:
            job["inject"] = inject.get(vid, inject.get("*"))
        mem = max(4 << 30, 4 * max(p.E * p.expert_bytes for p in self.problems) + (2 << 30))
        return worker.measure(job, self.cfg.worker_timeout_s, mem)

    def _put(self, knobs, prob, status, reason, samples=(), err=None) -> Measurement:
        med = spread = gbps = frac = None
        if samples:
            s = sorted(samples)
            med = s[len(s) // 2] if len(s) % 2 else 0.5 * (s[len(s) // 2 - 1] + s[len(s) // 2])
            q1, q3 = s[len(s) // 4], s[(3 * len(s)) // 4]
            spread = (q3 - q1) / med if med else None
            if prob.T == 1:
                gbps = prob.decode_bytes / med / 1e9
                bw = self.read_bandwidth()
                frac = gbps / bw if bw else None
        m = Measurement(key=self.key(knobs, prob), kernel=KERNEL, problem=prob.name,
                        knobs=dict(knobs), status=status, reason=reason, median_s=med,
                        spread=spread, samples=len(samples), gbps=gbps, bw_fraction=frac,
                        extra={"max_rel_err": err, "gflops": (prob.flops / med / 1e9) if med else None},
                        host_id=self.host_id, profile=self.profile_name, created=time.time())
        self.store.put(m)
        return m

    def read_bandwidth(self) -> float | None:
        bw = self.host.get("bandwidth") or {}
        read = bw.get("read") or {}
        n = str(self.cfg.threads or os.cpu_count())
        v = read.get(n) or read.get(int(n)) if read else None
        return float(v) if v else None


def _fmt_row(r: Measurement, p) -> str:
    if r.status != "ok":
        return f"{p.phase}/{p.dtype} {r.status} ({r.reason.splitlines()[0] if r.reason else ''})"
    extra = f" {r.gbps:.1f} GB/s" if r.gbps else ""
    return f"{p.phase}/{p.dtype} {r.median_s * 1e3:.3f} ms{extra}"


def _probe_host(cfg: RunConfig, say) -> dict:
    from . import probe

    say("probing the host (caches, NUMA, huge pages, compilers"
        + (", memory bandwidth)" if cfg.measure_bandwidth else ")"))
    info = probe.probe(measure_bandwidth=cfg.measure_bandwidth)
    return info.to_dict()


def weights_ready(t: Tuner) -> None:
    for p in t.problems:
        weights.ensure(t.work / "weights", p, t.cfg.seed, progress=t.say)


def run(cfg: RunConfig, host: dict | None = None) -> dict:
    """The whole pipeline; returns the summary (also written as the manifest when emitting)."""
    from . import emit, search

    t0 = time.perf_counter()
    t = Tuner(cfg, host)
    try:
        t.say(f"host {t.host_id}: profile {t.profile_name}, {t.resolved.compiler.family} "
              f"{t.resolved.version}; space {t.space.size()} variant(s); store {t.store_path}")
        weights_ready(t)
        budget = search.Budget(max_evals=cfg.max_evals or (t.space.size() if cfg.quick else None),
                               max_seconds=cfg.budget_s)
        name = cfg.strategy or search.choose_default(t.space, budget)
        t.say(f"strategy {name}, budget {budget}")
        # the default goes first: every run knows what tuning bought
        default_cost = t.evaluate(t.default, t.build([t.default]))
        if name in ("exhaustive", "random"):  # the points are known up front: build them in one batch
            pts = list(t.space.points())
            prebuilt = t.build(pts[: budget.max_evals] if budget.max_evals else pts)
        else:
            prebuilt = {}
        mod = search.STRATEGIES[name]
        import random

        result = mod.search(t.space, lambda k: t.evaluate(k, prebuilt), budget,
                            rng=random.Random(cfg.seed),
                            start=[t.default, *cfg.start_points])
        finals = _finalists(t, result)
        retimed = _retime(t, finals)
        winner = min(retimed, key=lambda r: r["cost"]) if retimed else None
        summary = _summary(t, name, result, default_cost, retimed, winner, time.perf_counter() - t0)
        if cfg.emit and winner is not None:
            summary["emitted"] = emit.emit(t, winner["knobs"], summary)
        return summary
    finally:
        t.store.close()


def _finalists(t: Tuner, result) -> list[dict]:
    ok = [(c, k) for k, c in result.history if c is not None]
    ok.sort(key=lambda ck: ck[0])
    out, seen = [], set()
    for c, k in ok:
        vid = variant_id(k)
        if vid not in seen:
            seen.add(vid)
            out.append(k)
        if len(out) == t.cfg.finalists:
            break
    if variant_id(t.default) not in seen and t.cached(t.default) and t.cost(t.cached(t.default)):
        out.append(t.default)
    return out


def _retime(t: Tuner, finals: list[dict]) -> list[dict]:
    """Finalists and the default timed again, interleaved (A B C A B C ...), so that a
    drift of the machine hits all of them alike; the winner is chosen on these.

    Kept beside the store under the hash of the finalists' signatures: a re-run that
    found the same finalists re-measures nothing."""
    if not finals:
        return []
    import json

    h = hashlib.sha256("".join(sorted(t.key(k, p) for k in finals for p in t.problems)).encode())
    cache = t.store_path.with_name(f"retime-{h.hexdigest()[:20]}.json")
    if cache.exists():
        t.say(f"finalists unchanged: re-timing taken from {cache.name}")
        return json.loads(cache.read_text())
    out = _retime_measure(t, finals)
    render.atomic_write(cache, json.dumps(out, indent=1))
    return out


def _retime_measure(t: Tuner, finals: list[dict]) -> list[dict]:
    libs = {variant_id(k): variants.variant_dir(t.work / "variants", t.profile_name, variant_id(k))
            / "libcolibri.so" for k in finals}
    per = {variant_id(k): [] for k in finals}
    t.say(f"re-timing {len(finals)} finalist(s) interleaved, {t.cfg.retime_rounds} round(s)")
    for _ in range(t.cfg.retime_rounds):
        for k in finals:
            vid = variant_id(k)
            outs = t.run_worker(libs[vid], vid, max(0.1, t.cfg.min_seconds / 2))
            if any(o.status != "ok" for o in outs):
                per[vid].append(None)
                continue
            meds = [sorted(o.samples)[len(o.samples) // 2] for o in outs]
            per[vid].append(meds)
    out = []
    for k in finals:
        rounds = [r for r in per[variant_id(k)] if r is not None]
        if not rounds:
            continue
        # per problem: median over rounds
        meds = [sorted(r[i] for r in rounds)[len(rounds) // 2] for i in range(len(t.problems))]
        cost = math.exp(sum(math.log(m) for m in meds) / len(meds))
        out.append({"knobs": k, "vid": variant_id(k), "cost": cost, "per_problem": meds,
                    "is_default": variant_id(k) == variant_id(t.default)})
    return out


def _summary(t: Tuner, strategy, result, default_cost, retimed, winner, wall) -> dict:
    dflt = next((r for r in retimed if r["is_default"]), None)
    rows = []
    if winner:
        for i, p in enumerate(t.problems):
            tuned = winner["per_problem"][i]
            base = dflt["per_problem"][i] if dflt else None
            gbps = p.decode_bytes / tuned / 1e9 if p.T == 1 else None
            bw = t.read_bandwidth()
            rows.append({"problem": p.name, "default_s": base, "tuned_s": tuned,
                         "speedup": (base / tuned) if base else None, "gbps": gbps,
                         "bw_fraction": (gbps / bw) if gbps and bw else None,
                         "gflops": p.flops / tuned / 1e9})
    failed = [m for m in t.store.query(kernel=KERNEL, host_id=t.host_id) if m.status != "ok"]
    return {
        "host_id": t.host_id, "profile": t.profile_name,
        "compiler": {"family": t.resolved.compiler.family, "version": t.resolved.version,
                     "path": t.resolved.compiler.path},
        "cflags": list(t.resolved.cflags), "ldflags": list(t.resolved.ldflags),
        "notes": list(t.resolved.notes), "strategy": strategy,
        "space_size": t.space.size(), "evaluations": result.evaluations,
        "measured_this_run": t.measured, "from_store": t.from_store,
        "default": {"knobs": t.default, "cost": default_cost},
        "winner": winner, "finalists": retimed, "rows": rows,
        "failed": [{"vid": variant_id(m.knobs), "problem": m.problem, "status": m.status,
                    "reason": m.reason[:500]} for m in failed],
        "wall_s": wall, "store": str(t.store_path),
        "read_bandwidth_gbps": t.read_bandwidth(),
    }


def print_summary(summary: dict, out=sys.stdout) -> None:
    w = summary.get("winner")
    print(f"\nhost {summary['host_id']}  profile {summary['profile']}  "
          f"strategy {summary['strategy']}  evaluated {summary['evaluations']} of "
          f"{summary['space_size']} (measured {summary['measured_this_run']} this run)  "
          f"{summary['wall_s']:.0f} s", file=out)
    if not w:
        print("no variant passed verification: nothing emitted", file=out)
        return
    print(f"winner {w['vid']}" + ("  (the default)" if w["is_default"] else ""), file=out)
    bw = summary.get("read_bandwidth_gbps")
    hdr = f"{'kernel':11} {'problem':32} {'default':>11} {'tuned':>11} {'speed-up':>8} {'GB/s':>7} {'% of bw':>8}"
    print(hdr, file=out)
    for r in summary["rows"]:
        d = f"{r['default_s'] * 1e3:.3f} ms" if r["default_s"] else "-"
        sp = f"{r['speedup']:.2f}x" if r["speedup"] else "-"
        g = f"{r['gbps']:.1f}" if r["gbps"] else "-"
        f = f"{100 * r['bw_fraction']:.0f}%" if r["bw_fraction"] else "-"
        print(f"{KERNEL:11} {r['problem']:32} {d:>11} {r['tuned_s'] * 1e3:8.3f} ms {sp:>8} {g:>7} {f:>8}",
              file=out)
    if bw:
        print(f"(% of bw: decode weight bytes per second over the measured read bandwidth, "
              f"{bw:.1f} GB/s)", file=out)
    if summary["failed"]:
        print(f"{len(summary['failed'])} failed measurement(s) recorded (see the manifest)", file=out)
    if summary.get("emitted"):
        print(f"emitted: {summary['emitted']['dir']}", file=out)


def signature_of_config(knobs: dict, t: Tuner) -> str:
    """The config.h signature: the same parts as a measurement's, without the problem."""
    h = hashlib.sha256()
    h.update(signature(host_fingerprint=t.host["fingerprint"], compiler=t.resolved.compiler.family,
                       compiler_version=t.resolved.version,
                       flags=list(t.resolved.cflags) + list(t.resolved.ldflags),
                       template_source=t.template_text, knobs=knobs, problem={}).encode())
    return h.hexdigest()
