"""Model: a Colibri model file (FORMAT.md) loaded by the C engine.

    with Model.load("moe.colibri") as model:
        y = model(x)          # x float32 [T, hidden]; each layer: h = h + moe(h)

The engine maps the file read-only and validates it completely (layout, ranges,
overflow, every referenced tensor's CRC-32) before the first call; a defect
raises ModelFormatError with the engine's message, which names the field and
its byte offset.
"""
from __future__ import annotations

import os
import threading

import numpy as np

from . import storage_settings
from ._lib import ColibriError, check, ffi, last_error, open_library
from .layer import PAGE_KINDS
from .storage_settings import POLICIES

_INT_MAX = 2**31 - 1
FORMAT_ERROR = 3  # COLIBRI_ERR_FORMAT


class ModelFormatError(ColibriError):
    """The model file is malformed; the message names the field and its byte offset."""


def _open(lib):
    if lib is None or isinstance(lib, (str, bytes, os.PathLike)):
        return open_library(lib)
    return lib  # an already opened cffi library


class Model:
    """A loaded model file. Use Model.load(path)."""

    def __init__(self, handle, lib, path: str):
        # Private: Model.load() is the constructor users call.
        self._handle = handle
        self._lib = lib
        self._path = path
        self._lock = threading.Lock()
        self._n_layers = int(lib.colibri_model_n_layers(handle))
        self._hidden = int(lib.colibri_model_hidden(handle))

    @classmethod
    def load(cls, path, lib=None, *, check_crc: bool = True,
             memory_budget: int | None = None, io_threads: int = 0, read_depth: int = 0,
             direct_io: int = 0, policy: str | None = None) -> "Model":
        """Map and validate `path`. lib: a library path or an opened library (default:
        colibri._lib.open_library()). check_crc=False leaves the payloads' CRC-32 unchecked
        (a pass over the whole file): only for files the caller wrote and whose outputs it
        checks; a library that predates the option checks them anyway.

        memory_budget: bytes of weights to hold (None: all of them). The routers and shared
        experts stay resident; the routed experts take turns in a cache of the rest, read
        from the file when a call needs them, their CRC-32 checked on first read (a corrupt
        one then fails that call with ModelFormatError). Outputs are the same bits as
        without a budget. stats() counts the cache's hits, misses and reads.

        With a budget, io_threads threads read the missing experts while the call computes
        the resident ones (0: the build's default; -1: none, the call's threads read before
        computing), through read_depth staging buffers of one tensor each, paid from the
        budget (0: the build's default), past the page cache (O_DIRECT) where direct_io is 1
        (-1: through it; 0: the build's default); a miss replaces the cached expert that
        policy names, "lru" (the least recently used) or "lfu" (the least often used,
        the counts halving about every 1024 calls per layer; None: the build's default, LRU). Where `python -m tuner storage` tuned these
        for this host (colibri.storage_settings), its values replace the build's defaults.

        Raises FileNotFoundError, ModelFormatError, ColibriError (a budget too small for
        the resident parts and one expert among them)."""
        fspath = os.fspath(path)
        if isinstance(fspath, bytes):
            fspath = os.fsdecode(fspath)
        if not os.path.exists(fspath):
            raise FileNotFoundError(f"no model file at {fspath}")
        if memory_budget is not None and (isinstance(memory_budget, bool)
                                          or not isinstance(memory_budget, (int, np.integer))):
            raise TypeError(f"memory_budget must be an int of bytes or None, got {type(memory_budget).__name__}")
        if memory_budget is not None and memory_budget <= 0:
            raise ValueError(f"memory_budget must be > 0 bytes (None: no budget), got {memory_budget}")
        if policy is not None and policy not in POLICIES:
            raise ValueError(f"policy must be one of {', '.join(map(repr, POLICIES))} or None, got {policy!r}")
        for name, v, lo, hi in (("io_threads", io_threads, -1, 256), ("read_depth", read_depth, 0, 4096),
                                ("direct_io", direct_io, -1, 1)):
            if isinstance(v, bool) or not isinstance(v, (int, np.integer)):
                raise TypeError(f"{name} must be an int, got {type(v).__name__}")
            if not lo <= v <= hi:
                raise ValueError(f"{name} must be in [{lo}, {hi}], got {v}")
        lib = _open(lib)
        if memory_budget is not None and not hasattr(lib, "colibri_model_stats"):
            raise ColibriError(f"the library {lib} predates memory budgets: rebuild it")
        if (not check_crc or memory_budget) and hasattr(lib, "colibri_load_model_with"):
            reads = {"io_threads": int(io_threads), "read_depth": int(read_depth), "direct_io": int(direct_io),
                     "policy": POLICIES.index(policy) + 1 if policy else 0}
            if memory_budget:
                reads = storage_settings.fill(reads)
            opts = ffi.new("colibri_load_options *", {"skip_crc": int(not check_crc),
                                                      "memory_budget": int(memory_budget or 0), **reads})
            handle = lib.colibri_load_model_with(os.fsencode(fspath), opts)
        else:
            handle = lib.colibri_load_model(os.fsencode(fspath))
        if handle == ffi.NULL:
            msg = last_error(lib)
            # The loader's own I/O and argument errors start with its name; everything
            # else is a format defect reported as "<field> (byte N): ...".
            if msg.startswith(("colibri_load_model:", "memory_budget:")):
                raise ColibriError(f"{fspath}: {msg}")
            raise ModelFormatError(f"{fspath}: {msg}")
        return cls(handle, lib, fspath)

    # ---- facts
    @property
    def path(self) -> str:
        return self._path

    @property
    def n_layers(self) -> int:
        return self._n_layers

    @property
    def hidden(self) -> int:
        return self._hidden

    @property
    def closed(self) -> bool:
        return self._handle is None

    def _layer(self, index: int):
        handle = self._live()
        if isinstance(index, bool) or not isinstance(index, (int, np.integer)):
            raise TypeError(f"index must be an int, got {type(index).__name__}")
        if not 0 <= index < self._n_layers:
            raise IndexError(f"layer index {index} out of range [0, {self._n_layers})")
        return self._lib.colibri_model_layer(handle, int(index))

    def layer_weight_bytes(self, index: int) -> int:
        """Bytes of weights layer `index` streams (shared tensors counted in every layer)."""
        return int(self._lib.colibri_layer_weight_bytes(self._layer(index)))

    def layer_page_kind(self, index: int) -> str:
        """Where layer `index`'s expert weights live: "file" (read in place from the mapped
        file) or the pages of the pool they were packed into at load ("normal", "thp",
        "hugetlb"): the library's kernels read int8 in a packed layout (layout_int8)."""
        return PAGE_KINDS.get(self._lib.colibri_layer_page_kind(self._layer(index)), "unknown")

    def layer_kernels(self, index: int) -> str:
        """The kernel table layer `index` runs: "default" or its tuned shape class."""
        return ffi.string(self._lib.colibri_layer_kernels(self._layer(index))).decode()

    # ---- running
    def _live(self):
        if self._handle is None:
            raise ValueError("the model is closed")
        return self._handle

    def __call__(self, x: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
        """Run the layer stack on x float32 [T, hidden] (C-contiguous). Returns [T, hidden]
        (in `out` when given; out may be x itself)."""
        if not isinstance(x, np.ndarray):
            raise TypeError(f"x must be a numpy.ndarray of float32, got {type(x).__name__}")
        if x.dtype != np.float32:
            raise TypeError(f"x must have dtype float32, got {x.dtype}")
        if x.ndim != 2 or x.shape[1] != self._hidden:
            raise ValueError(f"x must have shape [T, {self._hidden}], got {list(x.shape)}")
        if not x.flags.c_contiguous:
            raise ValueError("x must be C-contiguous (use numpy.ascontiguousarray)")
        T = x.shape[0]
        if T > _INT_MAX:
            raise ValueError(f"T = {T} tokens is more than the engine takes ({_INT_MAX})")
        if out is None:
            out = np.empty_like(x)
        else:
            if not isinstance(out, np.ndarray) or out.dtype != np.float32:
                raise TypeError("out must be a float32 numpy.ndarray")
            if out.shape != x.shape or not out.flags.c_contiguous or not out.flags.writeable:
                raise ValueError(f"out must be a writeable C-contiguous array of shape {list(x.shape)}")
        if T == 0:
            return out
        with self._lock:  # close() must not free the model under a running call
            handle = self._live()
            st = self._lib.colibri_infer(handle, ffi.from_buffer("float[]", x),
                                         ffi.from_buffer("float[]", out, require_writable=True), T)
            if st == FORMAT_ERROR:  # a budgeted model's expert, corrupt on its first read
                raise ModelFormatError(f"{self._path}: {last_error(self._lib)}")
            check(self._lib, st, "colibri_infer")
        return out

    def stats(self) -> dict:
        """The weights held and the expert cache's traffic since load: hits, misses,
        evictions, bytes_read, stall_seconds (calls waiting for missing experts: reading,
        checking, packing) and wait_seconds (the part spent waiting for the disk),
        resident_bytes, budget_bytes (0: no budget), cache_slots (experts the cache holds at
        once; 0: no cache), staging_bytes (the read buffers, inside the budget), io_threads
        (reading threads running), direct_io (1: the reads go past the page cache), policy
        ("lru" or "lfu"; None: no cache)."""
        with self._lock:
            st = ffi.new("colibri_memory_stats *")
            check(self._lib, self._lib.colibri_model_stats(self._live(), st), "colibri_model_stats")
            out = {k: (float(getattr(st, k)) if k.endswith("_seconds") else int(getattr(st, k)))
                   for k in ("hits", "misses", "evictions", "bytes_read", "stall_seconds", "wait_seconds",
                             "resident_bytes", "budget_bytes", "cache_slots", "staging_bytes", "io_threads",
                             "direct_io")}
            out["policy"] = POLICIES[st.policy - 1] if 1 <= st.policy <= len(POLICIES) else None
            return out

    # ---- lifetime
    def close(self) -> None:
        with self._lock:
            handle, self._handle = self._handle, None
            if handle is not None:
                self._lib.colibri_free_model(handle)

    def __enter__(self) -> "Model":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __del__(self):
        try:
            if getattr(self, "_handle", None) is not None:
                self._lib.colibri_free_model(self._handle)
                self._handle = None
        except Exception:  # pragma: no cover - interpreter shutdown
            pass

    def __repr__(self) -> str:
        state = "closed" if self.closed else f"{self._n_layers} layers, hidden {self._hidden}"
        return f"Model({self._path!r}, {state})"
