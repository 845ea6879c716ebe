"""Kernel parts: the kernel template rendered once per weight dtype, each named by its text.

A kernel table (the base knobs' "default" or a tuned shape class's, kernels/kernels.h) is
four parts, one per weight dtype (PARTS, in colibri_dtype order). The template renders a
part with only what that dtype's knobs decide (the knobs whose domain names the dtype), and
the part's exported cbk_part is called cbp_<dtype>_<hash of its text>. So two tables, or two
tuning variants, whose knobs agree on a dtype render the same part, and SConstruct compiles it
once per build directory (gen/parts/<symbol>.c -> obj/parts/<symbol>.os): tuning one dtype's
knobs recompiles that dtype's part, and a variant built in an earlier batch is not compiled
again. The name is the content, so an object is never stale, whatever built it.

Rendering a part takes tens of milliseconds; an Index (gen/parts/index.json) remembers the
symbol of each (template, dtype, knob values) under a hash of every template file and of
this renderer, so a build that changes nothing renders nothing.
"""
from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

from . import render, shapes as shapes_mod
from .paths import TEMPLATES_DIR

PARTS = render.DOMAIN_DTYPES   # f32, bf16, int8, int4: the kernel parts, one per family
# weight dtypes that run in another dtype's part (kernels.h, cbk_part_of): the older int4
# format's kernels live in the int4 part, on int4's knobs
HOSTED = {"int4g32": "int4"}


# The weight dtype the tuner times a (part, path) cell on, where the part serves several
# (default: the part's own name): int4, the format the tools write, runs its own packed
# kernels on the int4 part's decode and prefill knobs, so those are timed on it; only the
# older int4g32 reaches the part's gemm path, and so the knobs that choose it (a class whose
# domain holds the gemm path is timed there on every path; isa, which changes every path,
# goes with them, timed on both formats alike). int4g32's row-layout knobs are then timed
# on no problem where a build packs int4 (FIXED_LAYOUT).
TIMED_DTYPE = {("int4", "gemm"): "int4g32"}
# Weight dtypes held in one layout wherever their part's packed layout can be built (the
# capability its layout_<part> knob needs), whatever that knob says: the knob sets the
# layout of the part's other dtypes. int4 is packed at load wherever there is an int dot.
FIXED_LAYOUT = {"int4": "interleaved"}


def part_of(dtype: str) -> str:
    """The part whose kernels serve weight dtype `dtype`."""
    return HOSTED.get(dtype, dtype)


def timed_dtype(part: str, path: str, class_paths=()) -> str:
    """The weight dtype whose problems measure `part`'s knobs on kernel path `path`, for a
    class whose domain has `class_paths` (TIMED_DTYPE)."""
    return TIMED_DTYPE.get((part, "gemm" if "gemm" in class_paths else path), part)


def hosted_dtypes(part: str) -> tuple[str, ...]:
    """The weight dtypes `part`'s kernels serve: its own, then those it hosts (HOSTED)."""
    return (part, *(d for d, p in HOSTED.items() if p == part))
PLACEHOLDER = "CBK_PART_SYMBOL"  # the template's part_symbol while its text is hashed
INDEX_NAME = "index.json"


@dataclass(frozen=True)
class Part:
    template: str
    part: str
    symbol: str   # cbp_<part>_<16 hex digits of the text's sha256>
    text: str


def own_knobs(spec: render.KnobSpec, knobs: Mapping[str, Any], part: str) -> dict:
    """The knobs whose domain names the part's dtype (what its header lists)."""
    return {k: v for k, v in knobs.items() if k in spec.knobs and part in spec.knobs[k].domain.dtypes}


def render_part(template: str, knobs: Mapping[str, Any], part: str,
                templates_dir: str | os.PathLike = TEMPLATES_DIR,
                spec: render.KnobSpec | None = None) -> Part:
    """The C source of one dtype's part of `template` with `knobs` (already validated)."""
    if part not in PARTS:
        raise render.RenderError(f"part {part!r} is not one of {', '.join(PARTS)}")
    spec = spec or render.load_knob_spec(template, templates_dir)
    text = render.render(template, knobs, templates_dir,
                         extra={"part": part, "part_symbol": PLACEHOLDER},
                         header=(f"part: {part} (the weight dtype whose kernels this file holds)",
                                 own_knobs(spec, knobs, part)))
    symbol = f"cbp_{part}_{hashlib.sha256(text.encode()).hexdigest()[:16]}"
    return Part(template, part, symbol, text.replace(PLACEHOLDER, symbol))


def source_digest(templates_dir: str | os.PathLike = TEMPLATES_DIR) -> str:
    """sha256 over every file of the templates tree and the renderer's code: what a part's
    text can depend on besides its knobs."""
    h = hashlib.sha256()
    root = Path(templates_dir)
    files = sorted(p for p in root.rglob("*") if p.is_file())
    files += [Path(render.__file__), Path(__file__)]
    for p in files:
        h.update(str(p.relative_to(root) if p.is_relative_to(root) else p.name).encode())
        h.update(p.read_bytes())
    return h.hexdigest()


class Index:
    """Part symbols by (template, part, knobs), kept in `path` (a JSON file) between builds."""

    def __init__(self, path: str | os.PathLike, templates_dir: str | os.PathLike = TEMPLATES_DIR):
        self.path = Path(path)
        self.templates_dir = templates_dir
        self.salt = source_digest(templates_dir)
        self.known: dict[str, str] = {}
        try:
            saved = json.loads(self.path.read_text())
            if saved.get("salt") == self.salt:
                self.known = dict(saved.get("parts", {}))
        except (OSError, ValueError, AttributeError):
            pass  # no index, or an unreadable one: render again
        self.args: dict[str, tuple] = {}     # symbol -> (template, knobs, part)
        self.texts: dict[str, str] = {}      # symbol -> text, for parts rendered in this process
        self._specs: dict[str, render.KnobSpec] = {}
        self._changed = False

    def _key(self, template: str, knobs: Mapping[str, Any], part: str) -> str:
        blob = json.dumps([template, part, dict(sorted(knobs.items()))], sort_keys=True, default=str)
        return hashlib.sha256(blob.encode()).hexdigest()

    def _render(self, template: str, knobs: Mapping[str, Any], part: str) -> Part:
        spec = self._specs.get(template)
        if spec is None:
            spec = self._specs[template] = render.load_knob_spec(template, self.templates_dir)
        return render_part(template, knobs, part, self.templates_dir, spec)

    def symbol(self, template: str, knobs: Mapping[str, Any], part: str) -> str:
        key = self._key(template, knobs, part)
        sym = self.known.get(key)
        if sym is None:
            p = self._render(template, knobs, part)
            sym = self.known[key] = p.symbol
            self.texts[sym] = p.text
            self._changed = True
        self.args.setdefault(sym, (template, dict(knobs), part))
        return sym

    def describe(self, symbol: str) -> str:
        """'<part>: <its own knobs>' of a part this index named in this process."""
        template, knobs, part = self.args[symbol]
        spec = self._specs.get(template) or render.load_knob_spec(template, self.templates_dir)
        return f"{part}: {render.knob_summary(own_knobs(spec, knobs, part))}"

    def text(self, symbol: str) -> str:
        """The part's C source (rendered again when the index gave its name)."""
        if symbol not in self.texts:
            template, knobs, part = self.args[symbol]
            p = self._render(template, knobs, part)
            if p.symbol != symbol:
                raise render.RenderError(
                    f"part {symbol} renders as {p.symbol} now: a template changed during the build")
            self.texts[symbol] = p.text
        return self.texts[symbol]

    def save(self) -> None:
        if self._changed:
            render.atomic_write(self.path, json.dumps({"salt": self.salt, "parts": self.known},
                                                      sort_keys=True))
            self._changed = False


def kernel_tables_c(tables: Mapping[str, list[str]]) -> str:
    """gen/kernel_tables.c: each kernel table as its parts' symbols (PARTS order), the default
    table under cbk_kernels_default, and the tuned shape classes a layer's sizes select
    (kernels/kernels.h, kernels/dispatch.c)."""
    names = sorted(n for n in tables if n != render.DEFAULT_TABLE)
    if render.DEFAULT_TABLE not in tables:
        raise render.RenderError("kernel tables without the default table")
    lines = ["/* kernel_tables.c - GENERATED by colibri_build/parts.py; do not edit. */",
             '#include "kernels.h"', ""]
    lines += [f"extern const cbk_part {s};" for s in sorted({s for v in tables.values() for s in v})]
    lines.append("")
    for name in [render.DEFAULT_TABLE, *names]:
        syms = tables[name]
        if len(syms) != len(PARTS):
            raise render.RenderError(f"kernel table {name}: {len(syms)} parts, not {len(PARTS)}")
        lines.append(f'const cbk_kernels cbk_kernels_{name} = {{"{name}", {{'
                     + ", ".join(f"&{s}" for s in syms) + "}};")
    entries = [f"    {{{h}, {i}, &cbk_kernels_{n}}}," for n in names for h, i in [shapes_mod.parse(n)]]
    lines += ["", "const cbk_shape_entry cbk_shape_table[] = {", *(entries or ["    {0, 0, 0},"]), "};",
              f"const int cbk_shape_table_len = {len(names)};", ""]
    return "\n".join(lines)


def object_path(profile_dir: str | os.PathLike, symbol: str) -> Path:
    """Where SConstruct compiles part `symbol` in a build's profile directory."""
    return Path(profile_dir) / "obj" / "parts" / f"{symbol}.os"


def read_tables(path: str | os.PathLike) -> dict[str, dict[str, str]] | None:
    """A build's kernel_tables.json ({table: {part: symbol}}, SConstruct writes it beside
    each library); None when it cannot be read."""
    try:
        data = json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None
