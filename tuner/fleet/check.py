"""`python -m tuner check ARTIFACT`: does a tuned artifact belong on this host, and is it
still as fast as it was?

ARTIFACT is a tarball made by `tuner ci` or a directory holding its manifest.json (the
unpacked tarball, or build/tuned/<host-id>/).

1. Signature: the manifest's signature parts (host fingerprint, microarchitecture,
   profile, compiler, compiler version, flags, template) against this host and
   toolchain: the flags are those the artifact's profile resolves to here, the template
   the one in this checkout. Every part that differs is named.
2. Drift (unless --no-retime, and only when the library can run here): the artifact's
   library and the default build of its profile (scons profile=<p>, no config) are
   verified and timed on the artifact's problems, interleaved (A B, B A, ...), a few
   rounds; per problem the median over rounds. Drift: the artifact is slower than its
   manifest recorded, or slower than the default, by more than --threshold.
3. Gate sample (with the re-timing, unless --gate-sample 0): a few cells of the
   acceptance gate's matrix the manifest records (tuner/gate.py), the recorded slowest
   among them, re-measured default vs artifact interleaved as the gate did. Drift: a
   cell's new ratio is slower by the gate's own rule (tuner/decide.py).

Exit status: 0 matches and no drift; 1 drift, or a failure (unreadable artifact, a
library that does not verify); 2 usage; 4 the artifact was made for another host or
toolchain (takes precedence over drift).
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
import tarfile
import tempfile
from dataclasses import dataclass
from pathlib import Path

from colibri import _cli
from tuner import cli

EXIT_OK, EXIT_DRIFT, EXIT_USAGE, EXIT_MISMATCH = 0, 1, 2, 4
PARTS = ("host", "microarchitecture", "profile", "compiler", "compiler_version", "flags",
         "template")


class ArtifactError(RuntimeError):
    """The artifact cannot be read (not a tarball or directory, no manifest, bad member)."""


def add_command(sub) -> None:
    p = sub.add_parser("check", help="does a tuned artifact match this host and toolchain? "
                       "re-time it against the default to flag drift",
                       description=__doc__.split("\n\n")[0].split(": ", 1)[1].replace("\n", " "),
                       epilog="Exit status: 0 match, no drift; 1 drift or failure; 2 usage; "
                       "4 artifact for another host or toolchain.")
    p.add_argument("artifact", metavar="ARTIFACT",
                   help="a colibri-*.tar.gz from tuner ci, or a directory with its manifest.json")
    p.add_argument("--no-retime", action="store_true", help="compare signatures only")
    p.add_argument("--rounds", type=_cli.positive_int, default=3, help="interleaved timing rounds (default 3)")
    p.add_argument("--min-seconds", type=_cli.positive_float,
                   help="timing per library, problem and round (default: the run's, halved; "
                   "for the gate sample, the gate's)")
    p.add_argument("--threshold", type=_cli.non_negative_float, default=0.10,
                   help="relative slow-down flagged as drift (default 0.10 = 10%%)")
    p.add_argument("--gate-sample", type=_cli.count, default=4, metavar="N",
                   help="re-measure at most N cells of the manifest's gate matrix, the recorded "
                   "slowest first, spread over dtypes and phases (default 4; 0: none)")
    p.add_argument("--build-dir", help="where the default build and the weights live (default build/)")
    p.add_argument("--json", action="store_true", help="print the result as one JSON object")
    p.set_defaults(func=main)


# ---------------------------------------------------------------- the artifact

@dataclass
class Artifact:
    root: Path          # the directory holding manifest.json
    manifest: dict
    source: str         # what the user named

    @property
    def library(self) -> Path:
        return self.root / "libcolibri.so"


def _safe_extract(tar: tarfile.TarFile, dest: Path) -> None:
    for m in tar.getmembers():
        target = (dest / m.name).resolve()
        if not (m.isfile() or m.isdir()) or not str(target).startswith(str(dest.resolve()) + os.sep):
            raise ArtifactError(f"refusing tar member {m.name!r} (not a plain file inside the archive)")
    if hasattr(tarfile, "data_filter"):  # every member was checked above; this checks again
        tar.extractall(dest, filter="data")
    else:
        tar.extractall(dest)


def open_artifact(path: str | os.PathLike, scratch: Path) -> Artifact:
    """The artifact at `path` (tarball unpacked into `scratch`)."""
    p = Path(path)
    if not p.exists():
        raise ArtifactError(f"{p} does not exist")
    if p.is_file():
        try:
            with tarfile.open(p, "r:*") as tar:
                _safe_extract(tar, scratch)
        except tarfile.TarError as exc:
            raise ArtifactError(f"{p} is not a readable tarball ({exc})") from None
        base = scratch
    else:
        base = p
    found = [base] if (base / "manifest.json").is_file() else sorted(
        d for d in base.iterdir() if d.is_dir() and (d / "manifest.json").is_file())
    if len(found) != 1:
        raise ArtifactError(f"{p}: expected one manifest.json at its top or in one top "
                            f"directory, found {len(found)}")
    try:
        manifest = json.loads((found[0] / "manifest.json").read_text())
    except ValueError as exc:
        raise ArtifactError(f"{found[0] / 'manifest.json'} is not JSON ({exc})") from None
    for key in ("profile", "knobs"):
        if key not in manifest:
            raise ArtifactError(f"{found[0] / 'manifest.json'} has no {key!r}: not a tuner manifest")
    return Artifact(found[0], manifest, str(p))


def artifact_parts(m: dict) -> dict:
    """The signature parts the manifest records (older manifests: from their fields)."""
    sp = m.get("signature_parts")
    if sp:
        return {k: sp.get(k) for k in PARTS}
    comp = m.get("compiler") or {}
    return {"host": (m.get("host") or {}).get("fingerprint"),
            "microarchitecture": (m.get("host") or {}).get("microarchitecture"),
            "profile": m.get("profile"), "compiler": comp.get("family"),
            "compiler_version": comp.get("version"),
            "flags": list(m.get("cflags") or []) + list(m.get("ldflags") or []), "template": None}


# ---------------------------------------------------------------- this host

def host_parts(profile: str, knobs: dict) -> tuple[dict, dict, str]:
    """(parts, signature payload, config signature) of this host for `profile` and `knobs`;
    the payload is None when the profile is unknown here."""
    from colibri_build import hostid, profiles, render

    from tuner.host import probe
    from tuner.run import KERNEL
    from tuner.build.signature import BuildIdentity

    info = probe.probe(measure_bandwidth=False).to_dict()
    parts = {"host": info["fingerprint"], "microarchitecture": info["microarchitecture"],
             "profile": hostid.host_profile_name()}
    try:
        resolved = profiles.resolve(profiles.get_profile(profile))
    except Exception as exc:  # unknown profile, no compiler for it here
        parts.update(compiler=None, compiler_version=None, flags=None, template=None)
        return parts, {"error": f"profile {profile!r}: {exc}"}, ""
    template = render.source_text(KERNEL)
    identity = BuildIdentity.of(info["fingerprint"], resolved, template)
    payload = identity.payload(knobs)
    parts.update(compiler=identity.compiler, compiler_version=identity.compiler_version,
                 flags=list(identity.flags), template=payload["template"])
    sig = identity.config(knobs)
    runnable = {"runnable": resolved.runnable_here, "reason": resolved.reason}
    return parts, runnable, sig


def config_signature(parts: dict) -> str | None:
    """The config.h signature that signature parts (as emit records them) hash to."""
    from tuner.build.signature import canonical_json

    payload = {k: v for k, v in parts.items() if k not in ("microarchitecture", "profile")}
    if not {"version", "host", "compiler", "compiler_version", "flags", "template",
            "knobs"} <= set(payload):
        return None
    inner = hashlib.sha256(canonical_json(payload).encode()).hexdigest()
    return hashlib.sha256(inner.encode()).hexdigest()


def compare(art: Artifact) -> dict:
    mine = artifact_parts(art.manifest)
    here, runnable, sig = host_parts(art.manifest["profile"], art.manifest["knobs"])
    rows = []
    for part in PARTS:
        a, h = mine.get(part), here.get(part)
        if a is None and part == "template":  # an old manifest: nothing to compare
            continue
        rows.append({"part": part, "artifact": a, "here": h, "same": a == h})
    differ = [r["part"] for r in rows if not r["same"]]
    recorded = art.manifest.get("signature")
    sp = art.manifest.get("signature_parts")
    # do the recorded parts hash to the recorded signature? (not: an edited manifest)
    consistent = (config_signature(sp) == recorded) if sp else None
    return {"parts": rows, "differ": differ,
            "match": not differ and "error" not in runnable and consistent is not False,
            "runnable": runnable,
            "signature": {"artifact": recorded, "here": sig or None,
                          "same": bool(sig) and recorded == sig, "consistent": consistent}}


# ---------------------------------------------------------------- re-timing

def retime(art: Artifact, build_dir: Path, rounds: int, min_seconds: float | None,
           threshold: float, say) -> dict:
    """Artifact vs default build, interleaved (tuner/measure/interleave.py); per problem the
    median over rounds."""
    from colibri._lib import LibraryNotFound, build_profile
    from colibri_build import hostid

    from tuner.measure import interleave, problems as problems_mod

    m = art.manifest
    rows = {r["problem"]: r for r in (m.get("summary") or {}).get("rows", [])}
    names = list(rows) or [p for c in (m.get("summary") or {}).get("classes", [])
                           for p in c.get("problems", [])]
    names = list(dict.fromkeys(names))
    if not names:
        raise ArtifactError("the manifest names no problems to re-time")
    probs = [problems_mod.problem(n) for n in names]
    mismatch = hostid.library_mismatch(art.library)
    if mismatch:
        raise LibraryNotFound(mismatch)
    measure = m.get("measure") or {}
    threads = measure.get("threads") or os.cpu_count()
    seed = measure.get("seed") or 0
    secs = min_seconds if min_seconds is not None else max(0.1, (measure.get("min_seconds") or 0.5) / 2)
    say(f"building the default library of profile {m['profile']} (scons profile={m['profile']})")
    default = build_profile(m["profile"], build_dir=build_dir, quiet=True)
    say(f"re-timing the artifact against the default, {rounds} round(s) interleaved, "
        f"{threads} thread(s)")
    # the default first, as in every comparison: the worker loads it last (a first-loaded
    # model runs slow, which would hide an artifact's drift)
    res = interleave.interleave([default, art.library], probs, threads=[threads],
                                weights_dir=build_dir / "tuner" / "weights", seed=seed,
                                rounds=(rounds, rounds), min_seconds=secs, verify=[False, True],
                                say=say)
    failures = []
    if not res.ok:
        failures.append(f"{res.status} ({res.reason.splitlines()[0] if res.reason else ''})")
    bad = res.verified[1] if res.verified else None
    if bad and bad.get("status") != "ok":
        failures.append(f"artifact {bad.get('problem', '')}: {bad['status']} ({bad.get('reason', '')[:200]})")
    out_rows, drift = [], False
    if not failures:
        from tuner import decide

        for name in names:
            d, a = res.seconds[(name, threads)]
            now, dflt = decide._median(a), decide._median(d)
            recorded = (rows.get(name) or {}).get("tuned_s")
            vs_rec = now / recorded if recorded else None
            vs_def = now / dflt
            why = []
            if vs_rec is not None and vs_rec > 1 + threshold:
                why.append(f"{100 * (vs_rec - 1):.0f}% slower than recorded")
            if vs_def > 1 + threshold:
                why.append(f"{100 * (vs_def - 1):.0f}% slower than the default")
            drift |= bool(why)
            out_rows.append({"problem": name, "artifact_s": now, "default_s": dflt,
                             "recorded_s": recorded, "vs_recorded": vs_rec, "vs_default": vs_def,
                             "drift": why})
    return {"rounds": rounds, "min_seconds": secs, "threads": threads, "threshold": threshold,
            "default_library": str(default), "rows": out_rows, "failures": failures,
            "drift": drift}


# ---------------------------------------------------------------- the gate's matrix, sampled

def _dtype_phase(cell: dict) -> tuple[str, str]:
    parts = str(cell.get("problem", "")).split("/")
    return (parts[2] if len(parts) > 2 else "", parts[1] if len(parts) > 1 else "")


def gate_sample(cells: list[dict], n: int) -> list[dict]:
    """At most n of the gate's ok cells: the recorded slowest ratio first, then each next
    the one adding the most unseen dtypes and phases (ties: an unseen problem, then the
    slower ratio, then name and threads), so a few cells cover what the matrix spans."""
    ok = sorted((c for c in cells if c.get("status") == "ok"
                 and isinstance(c.get("median"), (int, float))),
                key=lambda c: (c["median"], c["problem"], c["threads"]))
    picked: list[dict] = []
    while ok and len(picked) < n:
        dtypes = {_dtype_phase(c)[0] for c in picked}
        phases = {_dtype_phase(c)[1] for c in picked}
        probs = {c["problem"] for c in picked}

        def gain(c):
            d, ph = _dtype_phase(c)
            return -((d not in dtypes) + (ph not in phases)), c["problem"] in probs

        best = min(ok, key=gain)  # min is stable: among equal gains, ok's order decides
        picked.append(best)
        ok.remove(best)
    return picked


def gate_recheck(art: Artifact, build_dir: Path, default: Path, n: int, rounds: int,
                 min_seconds: float | None, say) -> dict:
    """Re-measure gate_sample(...) of the manifest's gate cells, default vs artifact
    interleaved; {"skipped": why} when there is nothing to re-measure."""
    if n <= 0:
        return {"skipped": "--gate-sample 0"}
    g = art.manifest.get("gate")
    g = g if isinstance(g, dict) else {}
    passes = g.get("passes") or []
    if passes and passes[-1].get("reverted"):
        # the gate's last pass reverted every class it measured: its cells are not this library's
        return {"skipped": "the gate's last pass measured a candidate that was not emitted"}
    cells = gate_sample(g.get("cells") or [], n)
    if not cells:
        note = f" ({g['note']})" if g.get("note") else ""
        return {"skipped": "the manifest records no gate cells" + note}
    from tuner import decide
    from tuner.measure import interleave, problems as problems_mod

    seed = (art.manifest.get("measure") or {}).get("seed") or 0
    # as many rounds as the recorded intervals had
    rounds = max([rounds, *(c.get("rounds") or 0 for c in cells)])
    secs = min_seconds or g.get("min_seconds") or 0.2
    say(f"re-measuring {len(cells)} cell(s) of the gate's matrix, default vs artifact, "
        f"{rounds} round(s) interleaved")
    got = {}
    for th in sorted({c["threads"] for c in cells}):  # one session per thread count: no unsampled cell
        probs = [problems_mod.problem(c["problem"]) for c in cells if c["threads"] == th]
        res = interleave.interleave([default, art.library], probs, threads=[th],
                                    weights_dir=build_dir / "tuner" / "weights", seed=seed,
                                    rounds=(rounds, rounds), min_seconds=secs, verify=[False, True],
                                    say=say)
        v = res.verified[1] if res.verified else None
        for p in probs:
            if not res.ok or (v and v.get("status") != "ok"):
                why = res.reason if not res.ok else v.get("reason", "")
                got[(p.name, th)] = {"status": res.status if not res.ok else v["status"], "reason": why}
            else:
                got[(p.name, th)] = {"status": "ok", "seconds": res.seconds[(p.name, th)]}
    rows, failures = [], []
    for c in cells:
        r = got.get((c["problem"], c["threads"])) or {"status": "error", "reason": "not measured"}
        row = {"problem": c["problem"], "threads": c["threads"],
               "recorded": {k: c.get(k) for k in ("median", "lo", "hi")}, "status": r["status"]}
        if r["status"] != "ok":
            why = (r.get("reason") or "").strip().splitlines() or [""]
            failures.append(f"{c['problem']} at {c['threads']} thread(s): {r['status']} "
                            f"({why[0][:200]})")
        else:
            d, a = r["seconds"]
            now = decide.ratio([x / y for x, y in zip(d, a)])
            row.update(now.to_dict(), drift=now.slower)
        rows.append(row)
    return {"rounds": rounds, "min_seconds": secs, "rows": rows, "failures": failures,
            "drift": any(r.get("drift") for r in rows)}


# ---------------------------------------------------------------- command

def _fmt(v) -> str:
    if isinstance(v, list):
        return " ".join(str(x) for x in v) if v else "(none)"
    return "(unknown)" if v is None else str(v)


def print_result(res: dict, out=None) -> None:
    out = out or sys.stdout
    cmp_ = res["compare"]
    verdict = "matches this host and toolchain" if cmp_["match"] else \
        "was made for another host or toolchain"
    print(f"{res['artifact']}: profile {res['profile']}: {verdict}", file=out)
    for r in cmp_["parts"]:
        if r["same"]:
            print(f"  same     {r['part']:18} {_fmt(r['here'])[:90]}", file=out)
        else:
            print(f"  DIFFERS  {r['part']:18} artifact: {_fmt(r['artifact'])[:90]}", file=out)
            print(f"  {'':27}here:     {_fmt(r['here'])[:90]}", file=out)
    if cmp_["signature"]["consistent"] is False:
        print("  the manifest's signature parts do not hash to its signature: it was edited "
              "or is damaged", file=out)
    if not cmp_["runnable"].get("runnable", False):
        why = cmp_["runnable"].get("error") or cmp_["runnable"].get("reason")
        print(f"  the artifact's profile cannot run here: {why}", file=out)
    rt = res.get("retime")
    if rt is None:
        if res.get("retime_skipped"):
            print(f"  not re-timed: {res['retime_skipped']}", file=out)
        return
    for f in rt["failures"]:
        print(f"  FAILED   {f}", file=out)
    for r in rt["rows"]:
        rec = f"{r['recorded_s'] * 1e3:.3f} ms recorded, " if r["recorded_s"] else ""
        flag = ("  DRIFT: " + "; ".join(r["drift"])) if r["drift"] else "  ok"
        print(f"  {r['problem']:32} {r['artifact_s'] * 1e3:.3f} ms now ({rec}default "
              f"{r['default_s'] * 1e3:.3f} ms){flag}", file=out)
    gs = res.get("gate_sample")
    if gs and gs.get("skipped"):
        print(f"  gate sample: not re-measured: {gs['skipped']}", file=out)
    elif gs:
        print(f"  gate sample (speed ratio default/artifact, {gs['rounds']} round(s)):", file=out)
        for f in gs["failures"]:
            print(f"  FAILED   {f}", file=out)
        for r in gs["rows"]:
            if r["status"] != "ok":
                continue
            was = r["recorded"]
            rec = (f"{was['median']:.3f}x [{was['lo']:.3f}, {was['hi']:.3f}]"
                   if None not in was.values() else "(not recorded)")
            now = f"{r['median']:.3f}x [{r['lo']:.3f}, {r['hi']:.3f}]"
            print(f"  {r['problem']:32} {r['threads']:>2} thr  recorded {rec}  now {now}"
                  + ("  DRIFT: slower than the default" if r["drift"] else "  ok"), file=out)


def main(args: argparse.Namespace) -> int:
    if args.rounds < 1 or args.threshold < 0 or args.gate_sample < 0 or (
            args.min_seconds is not None and args.min_seconds <= 0):
        print("tuner check: --rounds wants >= 1, --threshold >= 0, --gate-sample >= 0, "
              "--min-seconds > 0",
              file=sys.stderr)
        return EXIT_USAGE
    say = cli.plain_log()
    from colibri_build.paths import build_dir_default

    build_dir = Path(args.build_dir) if args.build_dir else build_dir_default()
    with tempfile.TemporaryDirectory(prefix="colibri-check-") as scratch:
        try:
            art = open_artifact(args.artifact, Path(scratch))
            res = {"artifact": art.source, "profile": art.manifest["profile"],
                   "compare": compare(art), "retime": None, "retime_skipped": None,
                   "gate_sample": None}
            runnable = res["compare"]["runnable"].get("runnable", False)
            if args.no_retime:
                res["retime_skipped"] = "--no-retime"
            elif not runnable:
                res["retime_skipped"] = "its profile cannot run on this host"
            elif not art.library.is_file():
                raise ArtifactError(f"{art.root} has no libcolibri.so")
            else:
                res["retime"] = retime(art, build_dir, args.rounds, args.min_seconds,
                                       args.threshold, say)
                res["gate_sample"] = gate_recheck(art, build_dir,
                                                  Path(res["retime"]["default_library"]),
                                                  args.gate_sample, args.rounds,
                                                  args.min_seconds, say)
        except (ArtifactError, OSError, ValueError, RuntimeError) as exc:
            print(f"tuner check: {exc}", file=sys.stderr)
            return EXIT_DRIFT
    rt, gs = res["retime"], res["gate_sample"]
    if not res["compare"]["match"]:
        code = EXIT_MISMATCH
    elif any(x and (x.get("drift") or x.get("failures")) for x in (rt, gs)):
        code = EXIT_DRIFT
    else:
        code = EXIT_OK
    res["exit"] = code
    if args.json:
        json.dump(res, sys.stdout, indent=1, default=str)
        print()
    else:
        print_result(res)
    return code
