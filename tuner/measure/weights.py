"""Random weights of a problem's shape, generated once and kept on disk.

The f32 weights are .npy files (the reference reads them memory-mapped); each weight dtype
the tuner times is a model file (FORMAT.md) encoded from them, which every library a
measurement compares loads in place: they all read the same pages of the page cache, so
where the weights sit in memory cannot favour one of them (two copies of the same layer,
allocated one after the other, timed 1.06-1.09x apart). Generating gigabytes of weights is
paid once per shape, not once per variant. Deterministic in the seed, so a recorded result
can be reproduced."""
from __future__ import annotations

import os
from pathlib import Path

import numpy as np

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
    with open(tmp, "wb") as f:
        np.save(f, a)
        f.flush()
        os.fsync(f.fileno())  # written back now, not during the timings that follow
    os.replace(tmp, path)  # a killed run never leaves half a weights file


# Rows are windows of one pool of normal samples at random offsets: each row is its own
# sequence of N(0, 1) values, and generating gigabytes costs a copy, not a sample each.
POOL_SAMPLES = 1 << 22


def _generate(shape: tuple[int, ...], seed: int, index: int) -> np.ndarray:
    """Normal N(0, 1) float32 values of `shape`, deterministic in (seed, index)."""
    rng = np.random.default_rng([seed, index])
    cols = shape[-1]
    rows = int(np.prod(shape[:-1])) if len(shape) > 1 else 1
    if rows * cols <= POOL_SAMPLES:
        return rng.standard_normal(shape, dtype=np.float32)
    pool = rng.standard_normal(POOL_SAMPLES + cols, dtype=np.float32)
    windows = np.lib.stride_tricks.sliding_window_view(pool, cols)
    starts = rng.integers(0, POOL_SAMPLES, size=rows)
    return windows[starts].reshape(shape)  # advanced indexing gathers the rows only


def ensure_f32(root: str | os.PathLike, p: Problem, seed: int = 0, progress=None) -> Path:
    """Create (if missing) the f32 weights of p's shape; their directory."""
    from concurrent.futures import ThreadPoolExecutor

    d = _dir(Path(root), p, seed)
    d.mkdir(parents=True, exist_ok=True)
    todo = [(index, name, shape) for index, (name, shape) in enumerate(_shapes(p).items())
            if not (d / f"{name}.f32.npy").exists()]

    def make(item):
        index, name, shape = item
        if progress:
            progress(f"generating {p.shape} weights: {name} {list(shape)}")
        a = _generate(shape, seed, index)  # one stream per tensor: regenerating one file gives the same values
        scale = 3.0 if name == "router" else 1.0  # routers of trained models spread their logits
        a *= np.float32(scale / np.sqrt(shape[-1]))
        _save(d / f"{name}.f32.npy", a)

    # side by side, one thread per CPU: the row gathers and the writes release the GIL
    with ThreadPoolExecutor(max_workers=max(1, min(len(todo), os.cpu_count() or 1))) as pool:
        list(pool.map(make, todo))
    return d


def model_path(root: str | os.PathLike, p: Problem, seed: int = 0, copies: int = 1) -> Path:
    return _dir(Path(root), p, seed) / f"{p.dtype}-x{copies}.colibri"


def ensure_model(root: str | os.PathLike, p: Problem, seed: int = 0, copies: int = 1,
                 progress=None) -> Path:
    """A model file of `copies` layers of p's shape in p.dtype, each with its own copy of
    the weights (so that together they stream from memory, as a model's layers do), made
    from the f32 weights if missing; its path."""
    from colibri.modelfile import ModelWriter

    path = model_path(root, p, seed, copies)
    if path.exists() and _holds(path, p.dtype):
        return path
    ensure_f32(root, p, seed, progress)
    if progress:
        progress(f"writing {p.shape} as a {p.dtype} model file"
                 + (f" ({copies} copies of the layer)" if copies > 1 else ""))
    w = load(root, p, seed)
    layer = dict(router=w["router"], gate=w["gate"], up=w["up"], down=w["down"], top_k=p.k,
                 scoring=p.scoring, norm_topk_prob=p.norm)
    layer.update({n: w[n] for n in SHARED if n in w})
    with ModelWriter(path, weight_dtype=p.dtype, share=False, expect=(copies, p.E)) as mw:
        mw.add_layer(layer)
        for _ in range(copies - 1):
            mw.repeat_layer(0)  # the same bytes again, not encoded again
    return path


def _holds(path: Path, dtype: str) -> bool:
    """Whether the model file at path is whole and in weight dtype `dtype` (a file written
    before `int4` named the 4.5-bit format holds the older one, now `int4g32`)."""
    from colibri import quant
    from colibri.modelfile import read_header

    try:
        h = read_header(path)
    except (OSError, ValueError):
        return False
    return h["header_crc_ok"] and h["weight_dtype"] == quant.DTYPE_CODES[dtype]


def load(root: str | os.PathLike, p: Problem, seed: int = 0) -> dict[str, np.ndarray]:
    """The f32 weights, memory-mapped read-only."""
    d = _dir(Path(root), p, seed)
    return {n: np.load(d / f"{n}.f32.npy", mmap_mode="r") for n in _shapes(p)}
