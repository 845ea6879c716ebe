"""Random weights of a problem's shape, generated once and kept on disk as .npy files.

Every variant's worker maps the same files (np.load(mmap_mode='r')), so generating
gigabytes of weights is paid once per shape and dtype, not once per variant.
Deterministic in the seed, so a recorded result can be reproduced."""
from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from colibri import quant
from tuner.measure.problems import Problem

NAMES = ("router", "gate", "up", "down")
SHARED = ("shared_gate", "shared_up", "shared_down", "shared_expert_gate")


def _shapes(p: Problem) -> dict[str, tuple[int, ...]]:
    s = {"router": (p.E, p.H), "gate": (p.E, p.I, p.H), "up": (p.E, p.I, p.H),
         "down": (p.E, p.H, p.I)}
    if p.S:
        s.update(shared_gate=(p.S, p.H), shared_up=(p.S, p.H), shared_down=(p.H, p.S))
        if p.gated:
            s["shared_expert_gate"] = (p.H,)
    return s


def _dir(root: Path, p: Problem, seed: int) -> Path:
    return Path(root) / f"{p.shape}-seed{seed}"


def _save(path: Path, a: np.ndarray) -> None:
    tmp = path.with_suffix(".tmp.npy")
    np.save(tmp, a)
    os.replace(tmp, path)  # a killed run never leaves half a weights file


def ensure(root: str | os.PathLike, p: Problem, seed: int = 0, progress=None) -> Path:
    """Create (if missing) the f32 weights of p's shape and their encoding in p.dtype."""
    d = _dir(Path(root), p, seed)
    d.mkdir(parents=True, exist_ok=True)
    shapes = _shapes(p)
    rng = None
    for name, shape in shapes.items():
        f = d / f"{name}.f32.npy"
        if f.exists():
            continue
        if progress:
            progress(f"generating {p.shape} weights: {name} {list(shape)}")
        # one generator per tensor: regenerating one file gives the same values
        rng = np.random.default_rng([seed, list(shapes).index(name)])
        fan_in = shape[-1]
        scale = 3.0 if name == "router" else 1.0  # routers of trained models spread their logits
        a = rng.standard_normal(shape, dtype=np.float32)
        a *= np.float32(scale / np.sqrt(fan_in))
        _save(f, a)
    if p.dtype != "f32":
        for name in shapes:
            if name in ("router", "shared_expert_gate"):
                continue
            f = d / f"{name}.{p.dtype}.npy"
            if f.exists():
                continue
            if progress:
                progress(f"encoding {p.shape} {name} as {p.dtype}")
            stored, scales = quant.encode(np.load(d / f"{name}.f32.npy", mmap_mode="r"), p.dtype)
            if scales is not None:
                _save(d / f"{name}.{p.dtype}.scales.npy", scales)
            _save(f, stored)
    return d


def load(root: str | os.PathLike, p: Problem, seed: int = 0) -> dict[str, np.ndarray]:
    """The f32 weights, memory-mapped read-only."""
    d = _dir(Path(root), p, seed)
    return {n: np.load(d / f"{n}.f32.npy", mmap_mode="r") for n in _shapes(p)}


def load_encoded(root: str | os.PathLike, p: Problem, seed: int = 0) -> dict[str, tuple]:
    """name -> (stored array, scales or None) in p.dtype, memory-mapped."""
    d = _dir(Path(root), p, seed)
    out = {}
    for n in _shapes(p):
        if p.dtype == "f32" or n in ("router", "shared_expert_gate"):
            out[n] = (np.load(d / f"{n}.f32.npy", mmap_mode="r"), None)
        else:
            sc = d / f"{n}.{p.dtype}.scales.npy"
            out[n] = (np.load(d / f"{n}.{p.dtype}.npy", mmap_mode="r"),
                      np.load(sc, mmap_mode="r") if sc.exists() else None)
    return out
