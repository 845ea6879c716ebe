"""Build kernel variants through SCons, in batches.

One `scons variants=batch.json -k -jN` run per batch: the hand-written objects are
compiled once per profile and shared, and so is each kernel part (one weight dtype's
kernels, named by its rendered text: colibri_build/parts.py), so a variant compiles only
the parts no earlier variant of the run had; SCons runs N compiles in parallel, and a
variant already built is rebuilt only when its sources changed. A variant that fails to compile is recorded with the
compiler's own message and the rest of the batch goes on (-k).
"""
from __future__ import annotations

import hashlib
import json
import os
import re
from dataclasses import dataclass
from pathlib import Path

from colibri_build import parts, render, scons
from tuner.build.signature import variant_id


@dataclass(frozen=True)
class Built:
    knobs: dict
    vid: str
    lib: Path | None   # None: did not build
    error: str = ""     # the compiler's (or renderer's) message when lib is None


class BuildFailed(RuntimeError):
    """The batch failed as a whole (profile, compiler or shared sources): not a variant's fault."""


def dir_id(vid: str) -> str:
    """A file-system and SCons-safe name for a variant (its id holds '=' and ',')."""
    return hashlib.sha1(vid.encode()).hexdigest()[:16]


def variant_dir(build_dir: Path, profile: str, vid: str) -> Path:
    return Path(build_dir) / profile / "variants" / dir_id(vid)


def kernel_code(build_dir: Path, profile: str, vid: str, table: str | None = None) -> dict | None:
    """The machine code of one kernel table of a variant's build (its base knobs' for table
    None), function by function and keyed "<part>:<symbol>" (codehash.function_hashes of
    each part's object, which SConstruct lists in the variant's kernel_tables.json); None
    when something cannot be read."""
    from tuner.build import codehash

    tables = parts.read_tables(variant_dir(build_dir, profile, vid) / "kernel_tables.json")
    syms = (tables or {}).get(table or render.DEFAULT_TABLE)
    if not isinstance(syms, dict) or not syms:
        return None
    out = {}
    for part, sym in sorted(syms.items()):
        fns = codehash.function_hashes(parts.object_path(Path(build_dir) / profile, sym))
        if fns is None:
            return None
        out.update({f"{part}:{name}": h for name, h in fns.items()})
    return out


def _messages_for(output: str, did: str) -> str:
    """Lines of the build output that concern one variant: those naming its directory, and
    the compiler's messages about the parts it uses (SConstruct's "variant <did> parts: ..."
    line names them; a part may have been first declared for another variant)."""
    head = f"variant {did} parts: "
    tags = [f"variants/{did}/"]
    for ln in output.splitlines():
        if head in ln:
            tags += [f"parts/{sym}." for sym in ln.split(head, 1)[1].split()]
    lines = [ln for ln in output.splitlines()
             if (any(t in ln for t in tags) or f"variant {did} " in ln) and head not in ln
             and not ln.startswith(("/usr/bin/", "gcc ", "cc ", "clang ", "render "))]
    return "\n".join(lines[-20:])


def build_batch(profile: str, points: list[dict], build_dir: str | os.PathLike, *,
                jobs: int | None = None, cc: str = "gcc", timeout_s: float = 1800) -> list[Built]:
    """Build every point (a knob assignment); returns one Built per point, in order."""
    build_dir = Path(build_dir).resolve()
    ids = [variant_id(p) for p in points]
    # Every point goes to SCons, built before or not: it rebuilds exactly what changed
    # (the engine's sources included), where a library on disk may be from older code.
    todo = {dir_id(vid): p for vid, p in zip(ids, points)}
    output = ""
    if todo:
        build_dir.mkdir(parents=True, exist_ok=True)
        batch = build_dir / f"variants-{profile}.json"
        tmp = batch.with_suffix(".tmp")
        tmp.write_text(json.dumps(todo, sort_keys=True, indent=1))
        os.replace(tmp, batch)
        # each library, and the list of its parts (kernel_code reads it)
        targets = [str(build_dir / profile / "variants" / did / name) for did in todo
                   for name in ("libcolibri.so", "kernel_tables.json")]
        res = scons.run("-k", f"-j{jobs or os.cpu_count() or 1}", f"profile={profile}",
                        f"build_dir={build_dir}", f"variants={batch}", f"cc={cc}", *targets,
                        timeout=timeout_s)
        output = res.stdout + res.stderr
    out = []
    for vid, p in zip(ids, points):
        lib = variant_dir(build_dir, profile, vid) / "libcolibri.so"
        msg = _messages_for(output, dir_id(vid))
        # a failed rebuild leaves the previous library on disk: the error decides
        if lib.exists() and "error" not in msg.lower():
            out.append(Built(p, vid, lib))
            continue
        if not msg:
            # no message names this variant: the shared part of the build failed
            tail = "\n".join(output.strip().splitlines()[-15:])
            raise BuildFailed(f"the variant build failed outside any variant:\n{tail}")
        out.append(Built(p, vid, None, msg))
    return out
