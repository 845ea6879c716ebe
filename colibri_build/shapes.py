"""Shape classes: where a tuned knob value holds.

A knob value that wins on one model's expert matrices can lose on another's (decode knobs
tuned on Qwen3's 2048 x 768 experts made Mixtral's 4096 x 14336 ones 25-28% slower). So
a tuned library carries its tuned values per *shape class*, and a layer runs them only
when its shapes fall in a class they were measured on; elsewhere it runs the base knobs
(the profile's defaults). docs/shape-classes.md explains the choice.

A shape class is a cell of a half-octave grid over the two sizes of an expert's matrices:
the hidden size H (gate/up row length, down row count) and the expert inter size I (down
row length, gate/up row count). bin(n) = round(2 log2 n); the class of (H, I) is named
"h<bin H>_i<bin I>": Qwen3-30B-A3B (2048 x 768) is h22_i19, OLMoE (2048 x 1024) h22_i20,
Mixtral (4096 x 14336) h24_i28. kernels/dispatch.c computes the same bins in C.

A knob assignment (what the tuner builds and config.h stores) may hold, besides the knobs,
the entry SHAPES_KEY: {class: {knob: value}}, the values that differ from the base knobs
for layers of that class.
"""
from __future__ import annotations

import math
import re
from typing import Any, Mapping

SHAPES_KEY = "shapes"
_NAME = re.compile(r"h(\d+)_i(\d+)")


def bin_of(n: int) -> int:
    """round(2 log2 n): the half-octave bin of a matrix dimension (n >= 1)."""
    if int(n) < 1:
        raise ValueError(f"a matrix dimension must be >= 1, got {n}")
    return round(2 * math.log2(int(n)))


def class_of(hidden: int, inter: int) -> str:
    """The shape class of experts with hidden size `hidden` and inter size `inter`."""
    return f"h{bin_of(hidden)}_i{bin_of(inter)}"


def parse(name: str) -> tuple[int, int]:
    """(hidden bin, inter bin) of a class name; ValueError for anything else."""
    m = _NAME.fullmatch(str(name))
    if not m:
        raise ValueError(f"{name!r} is not a shape class name (h<bin>_i<bin>, e.g. h22_i19)")
    return int(m.group(1)), int(m.group(2))


def bin_range(b: int) -> tuple[int, int]:
    """The integers n with bin_of(n) == b, as (lowest, highest)."""
    lo = max(1, math.floor(2 ** ((b - 0.5) / 2)))
    while bin_of(lo) < b:
        lo += 1
    hi = max(lo, math.floor(2 ** ((b + 0.5) / 2)))
    while bin_of(hi) > b:
        hi -= 1
    return lo, hi


def describe(name: str) -> str:
    """'H 1723-2435, I 609-861' for h22_i19."""
    hb, ib = parse(name)
    (h0, h1), (i0, i1) = bin_range(hb), bin_range(ib)
    return f"H {h0}-{h1}, I {i0}-{i1}"


def split(knobs: Mapping[str, Any]) -> tuple[dict, dict]:
    """(base knobs, {class: overrides}) of a knob assignment."""
    base = {k: v for k, v in knobs.items() if k != SHAPES_KEY}
    shapes = knobs.get(SHAPES_KEY) or {}
    if not isinstance(shapes, Mapping):
        raise ValueError(f"{SHAPES_KEY!r} must map shape classes to knob values")
    for name, over in shapes.items():
        parse(name)
        if not isinstance(over, Mapping):
            raise ValueError(f"shape class {name}: its knob values must be a mapping")
    return base, {str(n): dict(o) for n, o in sorted(shapes.items())}


def join(base: Mapping[str, Any], shapes: Mapping[str, Mapping[str, Any]] | None) -> dict:
    """The knob assignment of base knobs plus per-class overrides; a class whose values
    equal the base's is left out, and no classes leaves no SHAPES_KEY entry."""
    out = dict(base)
    kept = {}
    for name, over in sorted((shapes or {}).items()):
        parse(name)
        diff = {k: v for k, v in over.items() if base.get(k) != v}
        if diff:
            kept[name] = diff
    if kept:
        out[SHAPES_KEY] = kept
    return out


def for_class(knobs: Mapping[str, Any], name: str) -> dict:
    """The knobs a layer of class `name` runs under this assignment."""
    base, shapes = split(knobs)
    return {**base, **shapes.get(name, {})}
