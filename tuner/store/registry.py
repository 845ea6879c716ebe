"""The fleet registry: per-machine results stores merged into one, and what a new
machine takes from it.

A registry is an ordinary results store (tuner/store/__init__.py) holding the rows of many
machines; `merge()` copies rows in by signature key, so merging the same store twice
adds nothing. `seed_variants()` reads the rows that are worth starting from on this
host: same kernel and problems, same profile, same microarchitecture, same compiler
family and major version (recorded in each row's `extra` by `tuner run`; rows
without those fields cannot be matched and are left out, counted). Their variants are
only seeds: `tuner run --from-registry` still builds, verifies and times them here.
"""
from __future__ import annotations

import math
import os
from dataclasses import dataclass
from pathlib import Path

from tuner.build.signature import variant_id
from tuner.store import Store, StoreError


def merge(sources: list[str | os.PathLike], into: str | os.PathLike, *,
          wait: bool | float = 60.0) -> dict:
    """Copy every row of each source store into `into` (created if missing).

    Returns {"into", "sources": [{"path", "rows", "added"}], "added", "total"}.
    Idempotent: a row whose key is already in `into` is left as it is. Raises
    StoreError for a missing or foreign source before anything is written."""
    if not sources:
        raise StoreError("merge needs at least one source store")
    into = Path(into)
    rows = {}
    for src in sources:  # check them all first: a bad third file must not leave a half merge
        p = Path(src)
        if not p.is_file():
            raise StoreError(f"results store {p} does not exist")
        with Store(p, readonly=True) as s:
            rows[str(p)] = len(s)
    out = []
    with Store(into, exclusive=True, wait=wait) as reg:
        for src in sources:
            added = reg.merge_from(src)
            out.append({"path": str(src), "rows": rows[str(src)], "added": added})
        total = len(reg)
    return {"into": str(into), "sources": out, "added": sum(s["added"] for s in out),
            "total": total}


def major(version: str | None) -> int | None:
    """12 of '12.2.0'; None when there is no leading number."""
    if not version:
        return None
    head = str(version).strip().split(".")[0]
    return int(head) if head.isdigit() else None


@dataclass(frozen=True)
class Seed:
    knobs: dict
    cost: float          # geometric mean over the problems of the median over hosts
    hosts: tuple[str, ...]

    @property
    def vid(self) -> str:
        return variant_id(self.knobs)


def seed_variants(registry: str | os.PathLike, *, kernel: str, problems: list[str],
                  profile: str, microarchitecture: str | None, compiler: str,
                  compiler_version: str, top: int = 3, ignore: tuple[str, ...] = ()) -> dict:
    """The `top` best variants the registry knows for these problems on this kind of host.

    A variant qualifies when it has an ok row for every problem from matching hosts;
    its cost is the geometric mean over problems of the median over those rows (so
    ranking agrees with tuner run's cost). Knobs named in `ignore` (those another kernel
    class tunes, which differ between hosts) are left out of a variant's identity, so
    hosts that agree on this class's knobs pool their rows. Returns {"seeds": [Seed], "matching_rows",
    "rows", "unmatched": {reason: count}}."""
    path = Path(registry)
    if not path.is_file():
        raise StoreError(f"registry {path} does not exist")
    want_major = major(compiler_version)
    unmatched: dict[str, int] = {}
    per: dict[str, dict[str, list[float]]] = {}
    knobs_of: dict[str, dict] = {}
    hosts_of: dict[str, set] = {}
    wanted = set(problems)
    with Store(path, readonly=True) as reg:
        rows = [m for m in reg.query(kernel=kernel, status="ok") if m.problem in wanted]
    for m in rows:
        why = None
        if m.profile != profile:
            why = "other profile"
        elif "compiler" not in m.extra or "microarchitecture" not in m.extra:
            why = "no compiler/microarchitecture recorded"
        elif m.extra.get("microarchitecture") != microarchitecture:
            why = "other microarchitecture"
        elif m.extra.get("compiler") != compiler or major(m.extra.get("compiler_version")) != want_major:
            why = "other compiler or major version"
        if why:
            unmatched[why] = unmatched.get(why, 0) + 1
            continue
        knobs = {k: v for k, v in m.knobs.items() if k not in ignore}
        vid = variant_id(knobs)
        knobs_of[vid] = knobs
        per.setdefault(vid, {}).setdefault(m.problem, []).append(m.median_s)
        hosts_of.setdefault(vid, set()).add(m.host_id)
    seeds = []
    for vid, by_problem in per.items():
        if set(by_problem) != wanted:
            continue
        meds = [sorted(v)[len(v) // 2] for v in (by_problem[p] for p in problems)]
        cost = math.exp(sum(math.log(x) for x in meds) / len(meds))
        seeds.append(Seed(knobs_of[vid], cost, tuple(sorted(hosts_of[vid]))))
    seeds.sort(key=lambda s: (s.cost, s.vid))
    return {"seeds": seeds[:max(0, top)], "matching_rows": len(rows) - sum(unmatched.values()),
            "rows": len(rows), "unmatched": unmatched}


# ---------------------------------------------------------------- command line

def add_command(sub) -> None:
    p = sub.add_parser("merge", help="combine per-machine results stores into a registry",
                       description="Copy every measurement of the given results stores into "
                       "REGISTRY (created if missing). Rows are keyed by signature, so merging a "
                       "store again adds nothing. `tuner run --from-registry REGISTRY` then "
                       "starts from what hosts of the same kind found.",
                       epilog="Exit status: 0 merged; 1 failed (a source is missing or not a "
                       "results store: nothing is written); 2 usage; 3 registry locked.")
    p.add_argument("stores", nargs="+", metavar="STORE", help="results stores (.sqlite) to merge")
    p.add_argument("--into", required=True, metavar="REGISTRY", help="the registry store")
    p.add_argument("--json", action="store_true", help="print the counts as JSON")
    p.set_defaults(func=main)


def main(args) -> int:
    import json
    import sys

    from tuner.store import StoreLocked

    try:
        res = merge(args.stores, args.into)
    except StoreLocked as exc:
        print(f"tuner merge: {exc}", file=sys.stderr)
        return 3
    except (StoreError, OSError) as exc:
        print(f"tuner merge: {exc}", file=sys.stderr)
        return 1
    if args.json:
        json.dump(res, sys.stdout, indent=1)
        print()
        return 0
    for s in res["sources"]:
        print(f"{s['path']}: {s['rows']} row(s), {s['added']} new")
    print(f"{res['into']}: {res['total']} row(s) ({res['added']} added)")
    return 0
