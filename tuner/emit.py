"""Emit the winner: build/tuned/<host-id>/{config.h, libcolibri.so, build_info.json,
manifest.json}. Reads the winner from the run's summary (measured results), never
re-measures. The library is built by `scons profile=<p> config=<that config.h>`;
every file is written to a temp name and renamed, so a killed run never leaves a
half-written artifact."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

from colibri._lib import ROOT

from . import hostmatch, isacheck, render

# HostInfo fields the manifest carries (the report's host summary reads them)
HOST_FIELDS = ("host_id", "fingerprint", "vendor", "model_name", "arch", "microarchitecture",
               "microarchitecture_source", "microarchitecture_reason", "isa", "cores", "threads",
               "sockets", "caches", "llc_total_bytes", "numa", "hugepages", "bandwidth",
               "bandwidth_reason", "memory_channels", "memory_channels_reason",
               "memory_total_bytes", "compilers", "profile", "profile_reason")


def _atomic_copy(src: Path, dst: Path) -> None:
    tmp = dst.with_name(f".{dst.name}.tmp{os.getpid()}")
    shutil.copy2(src, tmp)
    os.replace(tmp, dst)


def emit(t, knobs: dict, summary: dict) -> dict:
    from .run import signature_of_config

    out = hostmatch.tuned_dir(t.cfg.build_dir)
    out.mkdir(parents=True, exist_ok=True)
    sig = signature_of_config(knobs, t)
    config = render.write_config_h(out / "config.h", knobs, signature=sig, profile=t.profile_name)
    stage = out / "_build"
    cmd = [sys.executable, "-m", "SCons", "-Q", f"profile={t.profile_name}",
           f"config={config}", f"build_dir={stage}"]
    t.say(f"emitting: {' '.join(cmd[2:])}")
    res = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    if res.returncode != 0:
        raise RuntimeError(f"building the tuned library failed:\n{res.stdout[-3000:]}{res.stderr[-3000:]}")
    built = stage / t.profile_name
    _atomic_copy(built / "libcolibri.so", out / "libcolibri.so")
    _atomic_copy(built / "build_info.json", out / "build_info.json")
    if (built / "colibri_dump_schema").exists():
        _atomic_copy(built / "colibri_dump_schema", out / "colibri_dump_schema")
    # the library must use the vector registers its isa knob and profile promise; the
    # verdict goes into the manifest, and `tuner run` fails when it is False
    check = isacheck.check_library(out / "libcolibri.so", isa=knobs.get("isa")).to_dict()
    manifest = {
        "generated_by": "python -m tuner run (do not edit)",
        "signature": sig,
        "host": {k: t.host.get(k) for k in HOST_FIELDS},
        "profile": t.profile_name,
        "compiler": summary["compiler"], "cflags": summary["cflags"],
        "ldflags": summary["ldflags"], "notes": summary["notes"],
        "knobs": knobs,
        # what `tuner check` compares with another host (tuner.signature.signature_payload)
        "signature_parts": signature_parts(knobs, t),
        # how the figures were measured, so that `tuner check` re-times alike
        "measure": {k: summary.get(k) for k in ("threads", "seed", "min_seconds")},
        "isa_check": check,
        "summary": {k: summary[k] for k in ("strategy", "space_size", "evaluations", "rows",
                                            "winner", "classes", "default", "failed",
                                            "read_bandwidth_gbps", "store")},
    }
    render.atomic_write(out / "manifest.json", json.dumps(manifest, indent=1, sort_keys=True,
                                                          default=str) + "\n")
    return {"dir": str(out), "config_h": str(config), "library": str(out / "libcolibri.so"),
            "manifest": str(out / "manifest.json"), "isa_check": check}


def signature_parts(knobs: dict, t) -> dict:
    """The config.h signature's parts, with the microarchitecture and profile beside them."""
    from .signature import signature_payload

    parts = signature_payload(host_fingerprint=t.host["fingerprint"],
                              compiler=t.resolved.compiler.family,
                              compiler_version=t.resolved.version,
                              flags=list(t.resolved.cflags) + list(t.resolved.ldflags),
                              template_source=t.template_text, knobs=knobs, problem={})
    parts["microarchitecture"] = t.host.get("microarchitecture")
    parts["profile"] = t.profile_name
    return parts
