"""`python -m tuner promote ARTIFACT...`: defaults learned from the fleet.

Reads the manifests of tuned artifacts of one profile (tarballs from `tuner ci`, tuned
directories, or evidence files this command kept earlier) and, for each shape class they
were tuned on, each knob class: when every artifact that tuned the shape class runs that
knob class with the same values, and those differ from the profile's defaults, the values
become the profile's defaults for that shape class (the `shapes:` block of
profiles/<profile>.yaml, so that `scons profile=<profile>` builds them without tuning),
with a comment naming the evidence: hosts, the gate's ratios, dates. Where the artifacts
disagree, the profile keeps what it has, and the command says why.

Each artifact's manifest is kept, trimmed to what the decision reads (host, compiler,
template, knobs, shape classes, gate cells, class verdicts: a few KB), as
profiles/evidence/<profile>/<host-id>-<date>.json; a later `promote` reads them again.

Exit status: 0 written (or nothing to change); 1 failure; 2 usage.
"""
from __future__ import annotations

import argparse
import json
import re
import sys
import tempfile
import time
from pathlib import Path

from colibri import _cli
from colibri_build import shapes
from colibri_build.paths import PROFILES_DIR

EVIDENCE = "evidence"
MARKER = "# --- shape classes: written by `python -m tuner promote`; run it again to change them ---"
MIN_ARTIFACTS = 2


class PromoteError(RuntimeError):
    """The artifacts cannot be read or do not belong together."""


def add_command(sub) -> None:
    p = sub.add_parser("promote", help="make the knob values every tuned artifact of a profile "
                       "agrees on that profile's defaults (per shape class)",
                       description=__doc__.split("\n\n")[1].replace("\n", " "),
                       epilog="Exit status: 0 written or nothing to change; 1 failure; 2 usage.")
    p.add_argument("artifacts", nargs="+", metavar="ARTIFACT",
                   help="colibri-*.tar.gz from tuner ci, a tuned directory with its "
                   "manifest.json, or an evidence .json kept by an earlier promote")
    p.add_argument("--profile", help="promote for this profile (default: the artifacts' one)")
    p.add_argument("--min-artifacts", type=_cli.positive_int, default=MIN_ARTIFACTS, metavar="N",
                   help=f"artifacts a shape class needs before its values are promoted "
                   f"(default {MIN_ARTIFACTS})")
    p.add_argument("--profiles-dir", default=str(PROFILES_DIR), help="where the profiles are "
                   "(default: this checkout's profiles/)")
    p.add_argument("--dry-run", action="store_true", help="say what would change; write nothing")
    p.add_argument("--json", action="store_true", help="print the decision as one JSON object")
    p.set_defaults(func=main)


# ---------------------------------------------------------------- reading

def evidence(manifest: dict, source: str, created: float | None = None) -> dict:
    """The parts of a tuned manifest a promotion decides on (already evidence: as it is)."""
    if manifest.get("evidence_of"):
        return manifest
    summary = manifest.get("summary") or {}
    gate = manifest.get("gate") or {}
    cells = [{k: c.get(k) for k in ("problem", "threads", "median", "lo", "hi", "rounds",
                                    "shape_class", "owners")}
             for c in gate.get("cells") or [] if c.get("status") == "ok"]
    classes = []
    for c in summary.get("classes") or []:
        w = c.get("winner") or {}
        v = (w.get("verdict") or {}).get("overall")
        classes.append({"shape_class": c.get("shape_class"), "class": c.get("class"),
                        "adopted": bool(w) and not w.get("is_default"),
                        "knobs": {k: (w.get("knobs") or {}).get(k) for k in c.get("knobs", [])},
                        "overall": v})
    host = manifest.get("host") or {}
    when = manifest.get("created") or created or time.time()
    return {"evidence_of": source, "created": when,
            "date": time.strftime("%Y-%m-%d", time.gmtime(when)),
            "host": {k: host.get(k) for k in ("host_id", "model_name", "microarchitecture")},
            "profile": manifest.get("profile"), "compiler": manifest.get("compiler"),
            "template": (manifest.get("signature_parts") or {}).get("template"),
            "knobs": manifest.get("knobs"),
            "shape_classes": summary.get("shape_classes") or {},
            "gate_cells": cells, "classes": classes}


def read(path: str) -> dict:
    """The evidence of one artifact, tarball, directory or evidence file."""
    from tuner.fleet.check import ArtifactError, open_artifact

    p = Path(path)
    if p.is_file() and p.suffix == ".json":
        try:
            d = json.loads(p.read_text())
        except (OSError, ValueError) as exc:
            raise PromoteError(f"{p}: not readable JSON ({exc})") from None
        if not isinstance(d, dict) or not ("evidence_of" in d or "knobs" in d):
            raise PromoteError(f"{p}: neither a manifest nor promote's evidence")
        return evidence(d, p.name, p.stat().st_mtime)
    with tempfile.TemporaryDirectory(prefix="colibri-promote-") as scratch:
        try:
            art = open_artifact(p, Path(scratch))
        except (ArtifactError, OSError) as exc:
            raise PromoteError(str(exc)) from None
        mtime = (art.root / "manifest.json").stat().st_mtime
        return evidence(art.manifest, p.name, mtime)


# ---------------------------------------------------------------- deciding

def _measured(e: dict, sc: str, cls: str) -> bool:
    """Whether the artifact's run measured knob class cls on shape class sc."""
    return any(c.get("shape_class") == sc and c.get("class") == cls for c in e.get("classes") or [])


def decide(evs: list[dict], profile_knobs: dict, classes: dict[str, tuple], current: dict,
           min_artifacts: int = MIN_ARTIFACTS) -> dict:
    """Per shape class the artifacts tuned: the values to promote and their evidence, or why
    not. profile_knobs: the profile's base defaults (all knobs); classes: knob class -> its
    knobs; current: the profile's shape classes now."""
    out = {}
    for sc in sorted({sc for e in evs for sc in e["shape_classes"]}):
        mine = [e for e in evs if sc in e["shape_classes"]]
        names = sorted({s for e in mine for s in e["shape_classes"][sc].get("shapes", [])})
        rec = {"shapes": names, "sizes": shapes.describe(sc), "artifacts": len(mine),
               "promote": {}, "kept": {}, "unmeasured": [], "evidence": []}
        for e in mine:
            cells = [c for c in e["gate_cells"] if c.get("shape_class") == sc and c.get("median")]
            rec["evidence"].append({
                "host": e["host"]["host_id"], "date": e["date"],
                "measured": [c["class"] for c in e.get("classes") or [] if c.get("shape_class") == sc],
                "adopted": [c["class"] for c in e.get("classes") or []
                            if c.get("shape_class") == sc and c.get("adopted")],
                "ratios": [min(c["median"] for c in cells), max(c["median"] for c in cells)]
                if cells else None})
        if len(mine) < min_artifacts:
            rec["why"] = f"{len(mine)} artifact(s), fewer than the {min_artifacts} asked for"
            rec["values"] = dict(current.get(sc, {}))
            out[sc] = rec
            continue
        for cls, ks in classes.items():
            # an artifact votes on a class it measured for this shape class (a verdict), not
            # on values it only carried from the profile
            voters = [e for e in mine if _measured(e, sc, cls)]
            if not voters:
                if any(k in current.get(sc, {}) for k in ks):
                    rec["unmeasured"].append(cls)
                continue
            vals = [tuple(shapes.for_class(e["knobs"], sc).get(k) for k in ks) for e in voters]
            base = tuple(profile_knobs.get(k) for k in ks)
            if len(voters) < min_artifacts:
                rec["kept"][cls] = (f"measured by {len(voters)} artifact(s), fewer than the "
                                    f"{min_artifacts} asked for")
            elif len(set(vals)) == 1 and vals[0] != base and None not in vals[0]:
                rec["promote"][cls] = {k: v for k, v in zip(ks, vals[0]) if profile_knobs.get(k) != v}
            elif len(set(vals)) > 1:
                seen = {}
                for e, v in zip(voters, vals):
                    seen.setdefault(v, []).append(e["host"]["host_id"])
                rec["kept"][cls] = "the artifacts disagree: " + "; ".join(
                    f"{','.join(f'{k}={x}' for k, x in zip(ks, v))} on {len(h)} ({', '.join(sorted(set(h)))})"
                    for v, h in seen.items())
        values = {k: v for d in rec["promote"].values() for k, v in d.items()}
        # a class the artifacts disagree on, or did not measure, keeps what the profile has
        for cls in [*rec["kept"], *rec["unmeasured"]]:
            values.update({k: v for k, v in current.get(sc, {}).items() if k in classes[cls]})
        rec["values"] = values
        out[sc] = rec
    return out


# ---------------------------------------------------------------- writing

def _flow(d: dict) -> str:
    return "{" + ", ".join(f"{k}: {v}" for k, v in sorted(d.items())) + "}"


NOT_AGAIN = "#   not promoted again: "
UNMEASURED = " (by an earlier promote; these artifacts did not measure it)"


def previous_comments(text: str) -> dict[str, list[str]]:
    """Per shape class, the comment lines a promote wrote for it in a profile's text (its
    header line and the evidence under it)."""
    out, sc = {}, None
    for line in (text.split(MARKER, 1)[1] if MARKER in text else "").splitlines():
        m = re.match(r"# (\S+) \(", line)
        if m:
            sc = m.group(1)
            out[sc] = [line]
        elif sc and line.startswith("#   "):
            if not line.startswith(NOT_AGAIN):
                out[sc].append(line)
        else:
            sc = None
    return out


def shapes_block(decision: dict, current: dict, previous: dict | None = None) -> str:
    """The `shapes:` block of the profile: the decision's classes, and the profile's other
    classes as they were. A class whose values stay as they were (another class, or too few
    artifacts this time) keeps its earlier evidence lines (`previous`, previous_comments)."""
    previous = previous or {}
    lines = [MARKER]
    values = dict(current)
    for sc in sorted(set(current) | set(decision)):
        rec = decision.get(sc)
        if rec is None:
            lines += previous.get(sc, [])
            continue
        if rec.get("why") and previous.get(sc) and rec["values"] == current.get(sc):
            lines += previous[sc] + [NOT_AGAIN + rec["why"]]
            continue
        lines.append(f"# {sc} ({rec['sizes']}; {', '.join(rec['shapes'])}), "
                     f"{rec['artifacts']} artifact(s):")
        for ev in rec["evidence"]:
            r = ev["ratios"]
            lines.append(f"#   {ev['host']} {ev['date']}: measured {', '.join(ev['measured']) or 'nothing'}; "
                         f"adopted {', '.join(ev['adopted']) or 'nothing'}"
                         + (f", gate {r[0]:.2f}-{r[1]:.2f}x" if r else ""))
        if rec.get("why"):
            lines.append(f"#   not promoted: {rec['why']}")
        for cls, why in rec["kept"].items():
            lines.append(f"#   {cls} kept: {why}")
        for cls, vals in rec["promote"].items():
            lines.append(f"#   {cls} promoted: {', '.join(f'{k}={v}' for k, v in vals.items())}")
        for cls in rec.get("unmeasured", []):
            earlier = [ln for ln in previous.get(sc, []) if ln.startswith(f"#   {cls} promoted: ")]
            lines += [ln.split(UNMEASURED)[0] + UNMEASURED for ln in earlier] or \
                [f"#   {cls} kept as it was{UNMEASURED}"]
        if rec["values"]:
            values[sc] = rec["values"]
        else:
            values.pop(sc, None)
    if not values:
        return "\n".join(lines) + "\n"
    lines.append("shapes:")
    lines += [f"  {sc}: {_flow(v)}" for sc, v in sorted(values.items())]
    return "\n".join(lines) + "\n"


def write_profile(path: Path, block: str) -> None:
    """Replace the profile's promoted block (the marker line to the end) with `block`."""
    from colibri_build.render import atomic_write

    text = path.read_text()
    head = text.split(MARKER)[0].rstrip("\n")
    if "\nshapes:" in "\n" + head:
        raise PromoteError(f"{path} has a shapes: block of its own above the promoted one; "
                           f"move it into the promoted block or remove it")
    atomic_write(path, head + "\n" + block)


# ---------------------------------------------------------------- command

def main(args: argparse.Namespace) -> int:
    from colibri_build import profiles, render

    from tuner.context import KERNEL

    try:
        evs = [read(a) for a in args.artifacts]
    except PromoteError as exc:
        print(f"tuner promote: {exc}", file=sys.stderr)
        return 1
    names = sorted({e["profile"] for e in evs})
    prof_name = args.profile or (names[0] if len(names) == 1 else None)
    if prof_name is None:
        print(f"tuner promote: the artifacts are of profiles {', '.join(map(str, names))}; "
              f"name one with --profile", file=sys.stderr)
        return 2
    skipped = [e["evidence_of"] for e in evs if e["profile"] != prof_name]
    evs = [e for e in evs if e["profile"] == prof_name]
    pdir = Path(args.profiles_dir)
    try:
        prof = profiles.load_registry(pdir)[prof_name]
    except (KeyError, profiles.ProfileError) as exc:
        print(f"tuner promote: profile {prof_name}: {exc}", file=sys.stderr)
        return 1
    spec = render.load_knob_spec(KERNEL)
    base = render.resolve_knobs(spec, prof.knobs, None, prof.kernel_isas)
    decision = decide(evs, base, spec.classes(), prof.shapes, args.min_artifacts)
    block = shapes_block(decision, prof.shapes, previous_comments(Path(prof.path).read_text()))
    res = {"profile": prof_name, "skipped": skipped, "decision": decision, "block": block,
           "written": None}
    if not args.dry_run and evs:
        path = Path(prof.path)
        try:
            write_profile(path, block)
            profiles.load_registry(pdir)  # the profile still loads, or nothing is kept
        except (PromoteError, profiles.ProfileError) as exc:
            print(f"tuner promote: {exc}", file=sys.stderr)
            return 1
        edir = pdir / EVIDENCE / prof_name
        edir.mkdir(parents=True, exist_ok=True)
        for e in evs:
            name = f"{e['host']['host_id']}-{time.strftime('%Y%m%dT%H%M%S', time.gmtime(e['created']))}.json"
            render.atomic_write(edir / name, json.dumps(e, indent=1, sort_keys=True, default=str) + "\n")
        res["written"] = {"profile": str(path), "evidence": str(edir)}
    if args.json:
        json.dump(res, sys.stdout, indent=1, default=str)
        print()
        return 0
    for s in skipped:
        print(f"skipped {s}: another profile")
    for sc, rec in decision.items():
        print(f"{sc} ({rec['sizes']}; {', '.join(rec['shapes'])}): {rec['artifacts']} artifact(s)")
        if rec.get("why"):
            print(f"  not promoted: {rec['why']}")
        for cls, vals in rec["promote"].items():
            print(f"  promote {cls}: {', '.join(f'{k}={v}' for k, v in vals.items())}")
        for cls, why in rec["kept"].items():
            print(f"  keep {cls}: {why}")
        for cls in rec.get("unmeasured", []):
            print(f"  keep {cls}: these artifacts did not measure it")
        if not rec["promote"] and not rec["kept"] and not rec["unmeasured"] and not rec.get("why"):
            print("  every artifact kept the defaults: nothing to promote")
    if res["written"]:
        print(f"written: {res['written']['profile']} (evidence in {res['written']['evidence']})")
    elif args.dry_run:
        print("--dry-run: nothing written; the block would be:\n" + block)
    return 0
