"""Emit the winner: build/tuned/<host-id>/{config.h, libcolibri.so, build_info.json,
kernel_tables.json, manifest.json, colibri_dump_schema}. Reads the winner from the run's summary (measured
results), never re-measures.

The library is built by `scons profile=<p> config=<that config.h>` into the build root of
the tuner's variants (build/tuner/variants/), never in place: the hand-written objects and
the kernel parts of the tuned tables are already compiled there (the gate built the same
knobs as a variant), so emitting compiles the table list and links. Its config.h is
staged in build/tuner/emit/<host-id>/.
The set is published as a whole: the files are written into a fresh hidden
generation directory beside the public one, then build/tuned/<host-id> (a symlink) is
pointed at it with one rename. A run killed at any instant leaves the previous
complete set or the new one, never a mix or a torn file.
"""
from __future__ import annotations

import ctypes
import errno
import json
import os
import shutil
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from colibri_build import hostid, render, scons
from tuner.build import isacheck
from tuner.build.signature import BuildIdentity

# HostInfo fields the manifest carries (the report's host summary reads them)
HOST_FIELDS = ("host_id", "fingerprint", "vendor", "model_name", "arch", "microarchitecture",
               "microarchitecture_source", "microarchitecture_reason", "isa", "cores", "threads",
               "sockets", "caches", "llc_total_bytes", "numa", "hugepages", "bandwidth",
               "bandwidth_reason", "compute", "compute_reason", "memory_channels", "memory_channels_reason",
               "memory_total_bytes", "compilers", "profile", "profile_reason")

ARTIFACTS = ("config.h", "libcolibri.so", "build_info.json", "kernel_tables.json", "manifest.json",
             "colibri_dump_schema")


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _write_file(dst: Path, content: str | bytes | Path) -> None:
    if isinstance(content, Path):
        shutil.copy2(content, dst)  # keeps the mode (executables stay executable)
    else:
        dst.write_bytes(content.encode() if isinstance(content, str) else content)
    fd = os.open(dst, os.O_RDONLY)
    try:
        os.fsync(fd)  # the set is on disk before the switch points at it
    finally:
        os.close(fd)


def _exchange(a: Path, b: Path) -> bool:
    """Swap two paths in one step (Linux renameat2 RENAME_EXCHANGE); False where unsupported."""
    try:
        fn = ctypes.CDLL(None, use_errno=True).renameat2
    except AttributeError:
        return False
    at_fdcwd, rename_exchange = -100, 2
    if fn(at_fdcwd, os.fsencode(a), at_fdcwd, os.fsencode(b), rename_exchange) == 0:
        return True
    err = ctypes.get_errno()
    if err in (errno.EINVAL, errno.ENOSYS, errno.ENOTSUP):
        return False
    raise OSError(err, f"renameat2({a}, {b}, RENAME_EXCHANGE): {os.strerror(err)}")


def publish(public: str | os.PathLike, files: dict[str, str | bytes | Path]) -> Path:
    """Make `public` a directory holding exactly `files` (name -> text, bytes or a file to
    copy), atomically as a set; returns the generation directory it now points at."""
    public = Path(public)
    public.parent.mkdir(parents=True, exist_ok=True)
    gen = Path(tempfile.mkdtemp(dir=public.parent, prefix=f".{public.name}."))
    try:
        os.chmod(gen, 0o755)
        for name, content in files.items():
            if "/" in name or name.startswith("."):
                raise ValueError(f"artifact name {name!r} must be a plain file name")
            _write_file(gen / name, content)
        _fsync_dir(gen)
        previous = os.readlink(public) if public.is_symlink() else None
        link = public.with_name(f".{public.name}.link-{os.getpid()}")
        if link.is_symlink() or link.exists():
            link.unlink()
        os.symlink(gen.name, link)  # relative: the build tree may move
        if public.is_dir() and not public.is_symlink():
            # a plain directory (made by an older tuner): swap it out in one step where
            # the kernel can; elsewhere there is a short window without the directory
            if not _exchange(link, public):
                os.rename(public, link.with_name(link.name + "-old"))
                os.replace(link, public)
                link = link.with_name(link.name + "-old")
            shutil.rmtree(link)
        else:
            os.replace(link, public)
        _fsync_dir(public.parent)
    except BaseException:
        shutil.rmtree(gen, ignore_errors=True)
        raise
    _prune(public, keep={gen.name, previous})
    return gen


PRUNE_AFTER_S = 300


def _prune(public: Path, keep: set) -> None:
    """Remove generations other than the current and the previous one (a process that
    resolved the old link a moment ago may still be reading it), and the debris of
    emits killed halfway; anything younger than PRUNE_AFTER_S may be another emit's
    work in progress and is left for a later emit."""
    now = time.time()
    for p in public.parent.glob(f".{public.name}.*"):
        if p.name in keep:
            continue
        try:
            if now - p.lstat().st_mtime < PRUNE_AFTER_S:
                continue
            if p.is_symlink() or p.is_file():
                p.unlink()
            else:
                shutil.rmtree(p)
        except OSError:
            pass  # another emit's; it cleans up after itself


@dataclass(frozen=True)
class Target:
    """What emit needs to know about the run: where builds go, the profile, the probed
    host (its HOST_FIELDS), the build identity that signs the config.h, and a printer."""
    build_dir: Path
    profile_name: str
    host: dict
    identity: BuildIdentity
    say: Callable[[str], None] = print


def emit(t: Target, knobs: dict, summary: dict) -> dict:
    public = hostid.tuned_dir(t.build_dir)
    sig = t.identity.config(knobs)
    stage = Path(t.build_dir) / "tuner" / "emit" / public.name
    config = render.write_config_h(stage / "config.h", knobs, signature=sig, profile=t.profile_name)
    root = Path(t.build_dir) / "tuner" / "variants"  # tuner.context's work / "variants"
    args = [f"profile={t.profile_name}", f"config={config}", f"build_dir={root}"]
    t.say(f"emitting: scons {' '.join(args)}")
    res = scons.run(*args)
    if res.returncode != 0:
        raise RuntimeError(f"building the tuned library failed:\n{res.stdout[-3000:]}{res.stderr[-3000:]}")
    built = root / t.profile_name
    info = json.loads((built / "build_info.json").read_text())
    if info.get("config"):
        info["config"]["path"] = str(public / "config.h")  # where it is published
    files: dict[str, str | bytes | Path] = {
        "config.h": config.read_text(), "libcolibri.so": built / "libcolibri.so",
        "build_info.json": json.dumps(info, indent=1, sort_keys=True) + "\n"}
    # kernel_tables.json names the part each table runs: the bench compares them
    for name in ("colibri_dump_schema", "kernel_tables.json"):
        if (built / name).exists():
            files[name] = built / name
    # the library must use the vector registers its isa knob and profile promise; the
    # verdict goes into the manifest, and `tuner run` fails when it is False
    check = isacheck.check_library(built / "libcolibri.so", isa=knobs.get("isa")).to_dict()
    manifest = {
        "generated_by": "python -m tuner run (do not edit)",
        "created": time.time(),
        "signature": sig,
        "host": {k: t.host.get(k) for k in HOST_FIELDS},
        "profile": t.profile_name,
        "compiler": summary["compiler"], "cflags": summary["cflags"],
        "ldflags": summary["ldflags"], "notes": summary["notes"],
        "knobs": knobs,
        # what `tuner check` compares with another host (tuner.build.signature.signature_payload)
        "signature_parts": signature_parts(knobs, t),
        # how the figures were measured, so that `tuner check` re-times alike
        "measure": {k: summary.get(k) for k in ("threads", "seed", "min_seconds")},
        "isa_check": check,
        # the acceptance gate: every validation cell's ratio and interval, reverted classes
        "gate": summary.get("gate"),
        # the tuned shape classes: their shapes, the knobs they run besides the defaults
        "shape_classes": summary.get("shape_classes") or {},
        "headline": summary.get("headline"),
        "summary": {k: summary.get(k) for k in ("strategy", "space_size", "evaluations", "rows",
                                                "winner", "classes", "skipped_classes", "default",
                                                "failed", "read_bandwidth_gbps", "store",
                                                "shape_classes", "headline")},
    }
    files["manifest.json"] = json.dumps(manifest, indent=1, sort_keys=True, default=str) + "\n"
    publish(public, files)
    return {"dir": str(public), "config_h": str(public / "config.h"),
            "library": str(public / "libcolibri.so"), "manifest": str(public / "manifest.json"),
            "isa_check": check}


def signature_parts(knobs: dict, t: Target) -> dict:
    """The config.h signature's parts, with the microarchitecture and profile beside them."""
    parts = t.identity.payload(knobs)
    parts["microarchitecture"] = t.host.get("microarchitecture")
    parts["profile"] = t.profile_name
    return parts
