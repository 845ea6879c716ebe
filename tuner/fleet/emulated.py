"""`python -m tuner ci --profile P --emulated --out DIR`: the artifact of a machine we do not
have, for a profile of another architecture (an Arm server, say).

Nothing here can time that machine's kernels, so nothing is tuned and nothing is timed:

1. config.h holds the profile's default knobs (signed as the tuner signs one, with the
   host part "emulated");
2. the library is cross-built from it (`scons profile=P config=config.h`);
3. it is verified under qemu-user: tuner verify's kernel check against the NumPy
   reference (every dtype; decode, prefill and gemm token counts) and the C API test;
4. its disassembly must show the instructions of the profile's ISA level
   (tuner/build/isacheck.py: fmla on .4s, sdot on a dotprod profile, smmla and bfmmla
   on an i8mm/bf16 one).

Only when all of that passes is DIR/colibri-<profile>-emulated.tar.gz written, holding
config.h, libcolibri.so, build_info.json, colibri.h, manifest.json, report.md and
report.html under colibri-<profile>-emulated/. Its manifest says "emulated, not timed"
(`status`) and its report says "verified under qemu-user, not timed" first. There is no
results store: nothing was measured.
"""
from __future__ import annotations

import datetime
import html
import json
import tempfile
from pathlib import Path

from colibri_build import cpuinfo, paths, profiles, render
from colibri_build.paths import HEADER
from tuner.build import isacheck
from tuner.build.signature import BuildIdentity
from tuner.fleet import verify
from tuner.fleet.tarball import pack

STATUS = "emulated, not timed"
KERNEL = "expert_ffn"


class EmulatedError(RuntimeError):
    """The profile cannot be emulated here, or a build or check failed (nothing packed)."""


def artifact_name(profile: str) -> str:
    return f"colibri-{profile}-emulated"


def default_knobs(prof: profiles.Profile) -> dict:
    """The profile's knob values over the templates' defaults, validated."""
    specs = render.load_all_specs()
    per = render.resolve_all(specs, prof.knobs, None, prof.kernel_isas, prof.name)
    return {k: v for knobs in per.values() for k, v in sorted(knobs.items())}


def _table(rows: list[verify.Row]) -> list[str]:
    out = ["| check | dtype | tokens | error | result |", "| --- | --- | --- | --- | --- |"]
    for r in rows:
        api = r.case == "C API test"
        out.append(f"| {r.case} | {r.dtype} | {'' if api else r.tokens} | {'' if api else f'{r.error:.2e}'} "
                   f"| {'ok' if r.ok else 'FAIL'}{' (' + r.message + ')' if r.message and (api or not r.ok) else ''} |")
    return out


def report_md(manifest: dict, rows: list[verify.Row]) -> str:
    m, isa = manifest, manifest["isa_check"]
    lines = [f"# Colibri for {m['profile']}: {STATUS}", "",
             f"**Verified under qemu-user, not timed.** This library was cross-built on "
             f"{m['built_on']['model_name'] or 'a ' + m['built_on']['arch'] + ' host'} for a machine "
             "this run did not have. Its kernels were checked for correctness under emulation; "
             "no speed was measured and no knob was tuned: config.h holds the profile's defaults. "
             f"Run `python -m tuner ci --profile {m['profile']}` on such a machine to tune and time it.",
             "", "| | |", "| --- | --- |",
             f"| profile | {m['profile']}: {m['description']} |",
             f"| architecture | {m['arch']} |",
             f"| compiler | {m['compiler']['family']} {m['compiler']['version']} ({m['compiler']['path']}) |",
             f"| flags | {' '.join(m['cflags'])} |",
             f"| knobs | {', '.join(f'{k}={v}' for k, v in m['knobs'].items())} |",
             f"| ISA check | {'ok' if isa['ok'] else 'FAILED'}: {isa['message']} |",
             f"| created | {m['created']} |", "",
             f"## Kernel check under {m['emulator']}", "",
             f"{sum(r.ok for r in rows)} passed, {sum(not r.ok for r in rows)} failed "
             "(error: the worst relative error against the float64 NumPy reference of the same "
             "weight format; the tests' tolerances).", "", *_table(rows), ""]
    return "\n".join(lines)


def report_html(md: str) -> str:
    """report.md as a plain page (headings, paragraphs, tables): readable without tooling."""
    body, table = [], False
    for line in md.splitlines():
        if line.startswith("|"):
            cells = [c.strip() for c in line.strip("|").split("|")]
            if set("".join(cells)) <= set("- "):
                continue
            if not table:
                body.append("<table>")
                table = True
            body.append("<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in cells) + "</tr>")
            continue
        if table:
            body.append("</table>")
            table = False
        if line.startswith("## "):
            body.append(f"<h2>{html.escape(line[3:])}</h2>")
        elif line.startswith("# "):
            body.append(f"<h1>{html.escape(line[2:])}</h1>")
        elif line.strip():
            text = html.escape(line)
            if text.startswith("**") and "**" in text[2:]:
                head, rest = text[2:].split("**", 1)
                text = f"<strong>{head}</strong>{rest}"
            body.append(f"<p>{text}</p>")
    if table:
        body.append("</table>")
    return ("<!doctype html><html><head><meta charset=\"utf-8\"><title>Colibri: "
            f"{STATUS}</title><style>body{{font-family:sans-serif;max-width:60em;margin:2em auto}}"
            "td{border:1px solid #ccc;padding:2px 6px}table{border-collapse:collapse}</style>"
            "</head><body>\n" + "\n".join(body) + "\n</body></html>\n")


def build_artifact(profile_name: str, out_dir: Path, *, build_dir: Path | None = None, say=print) -> dict:
    """Config, cross-build, verification, ISA check and tarball (see the module's doc)."""
    prof = profiles.get_profile(profile_name)
    host = cpuinfo.host_cpu()
    if prof.arch in ("any", host.arch):
        raise EmulatedError(f"{profile_name} is for this host's architecture ({host.arch}): tune "
                            f"and time it with `python -m tuner ci --profile {profile_name}` instead")
    runner = verify._runner(prof)  # names a missing emulator or C library before building
    try:
        resolved = profiles.resolve(prof, "gcc")
    except profiles.ResolveError as exc:
        raise EmulatedError(str(exc)) from None
    knobs = default_knobs(prof)
    sig = BuildIdentity.of(f"emulated:{profile_name}", resolved, render.source_text(KERNEL)).config(knobs)
    bdir = Path(build_dir) if build_dir else paths.build_dir_default() / "tuner" / "emulated"
    out_dir.mkdir(parents=True, exist_ok=True)
    name = artifact_name(profile_name)
    with tempfile.TemporaryDirectory(prefix=".stage-", dir=out_dir) as stage:
        stage = Path(stage)
        config = render.write_config_h(stage / "config.h", knobs, signature=sig, profile=profile_name)
        say(f"cross-building {profile_name} with its default knobs and checking it under {runner[0]}")
        rows = verify.verify(profile_name, build_dir=bdir, config=config)
        lib = bdir / profile_name / "libcolibri.so"
        bad = [r for r in rows if not r.ok]
        if bad:
            raise EmulatedError(f"{len(bad)} of {len(rows)} checks failed under {runner[0]}, nothing "
                                "packed:\n" + "\n".join(_table(bad)[2:]))
        say("checking the library's instructions against the profile's ISA level")
        isa = isacheck.check_library(lib)
        if isa.ok is not True:
            raise EmulatedError(f"ISA CHECK {'FAILED' if isa.ok is False else 'NOT RUN'}: {isa.message}")
        manifest = {
            "kind": "emulated", "status": STATUS,
            "note": "verified under qemu-user, not timed: cross-built with the profile's default "
                    "knobs, nothing tuned or measured",
            "profile": profile_name, "description": prof.description, "arch": prof.arch,
            "compiler": {"family": resolved.compiler.family, "version": resolved.version,
                         "path": str(resolved.compiler.path)},
            "cflags": list(resolved.cflags), "ldflags": list(resolved.ldflags),
            "knobs": knobs, "signature": sig, "emulator": runner[0],
            "verify": [{"check": r.case, "dtype": r.dtype, "tokens": r.tokens, "error": r.error,
                        "ok": r.ok, "message": r.message} for r in rows],
            "isa_check": isa.to_dict(),
            "built_on": {"arch": host.arch, "model_name": getattr(host, "model_name", "") or ""},
            "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        }
        (stage / "manifest.json").write_text(json.dumps(manifest, indent=1, default=str) + "\n")
        md = report_md(manifest, rows)
        (stage / "report.md").write_text(md)
        (stage / "report.html").write_text(report_html(md))
        files = {"config.h": config, "libcolibri.so": lib, "build_info.json": lib.with_name("build_info.json"),
                 "colibri.h": HEADER, "manifest.json": stage / "manifest.json",
                 "report.md": stage / "report.md", "report.html": stage / "report.html"}
        tarball = pack(out_dir, name, files)
    return {"tarball": str(tarball), "name": name, "members": [f"{name}/{m}" for m in files],
            "status": STATUS, "profile": profile_name, "checks": len(rows), "isa_check": isa.message}
