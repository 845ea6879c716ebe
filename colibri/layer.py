"""MoELayer and route(): the engine's layer and router from Python."""
from __future__ import annotations

import threading

import numpy as np

from . import quant
from ._checks import MAX_THREADS, f32_array, positive_int, unit_float
from ._lib import check, ffi, open_library

SCORINGS = {"softmax": 0, "softmax_topk": 1}
_INT_MAX = 2**31 - 1


def _nonzero_dims(**dims):
    for name, v in dims.items():
        if v < 1:
            raise ValueError(f"{name} (from the weights' shapes) must be >= 1, got {v}")
PAGE_KINDS = {0: "normal", 1: "thp", 2: "hugetlb", 3: "file"}


def _gate_vector(g, H):
    """shared_expert_gate as [H]: also as transformers stores it, a Linear(H, 1) weight [1, H]."""
    if getattr(g, "ndim", None) == 2 and tuple(g.shape) == (1, H):
        g = g[0]
    return f32_array("shared_expert_gate", g, (H,))


def _route_config(n_experts, top_k, scoring, norm_topk_prob, dyn_p, k_min, k_max):
    if not isinstance(scoring, str) or scoring not in SCORINGS:
        raise ValueError(f"scoring must be one of {sorted(SCORINGS)}, got {scoring!r}")
    top_k = positive_int("top_k", top_k)
    dyn_p = unit_float("dyn_p", 0.0 if dyn_p is None else dyn_p)
    if dyn_p > 0:
        k_max = top_k if k_max is None else positive_int("k_max", k_max)
        k_min = positive_int("k_min", k_min)
        if not 1 <= k_min <= k_max <= n_experts:
            raise ValueError(f"dynamic routing needs 0 < dyn_p <= 1 and 1 <= k_min <= k_max <= "
                             f"n_experts ({n_experts}); got dyn_p={dyn_p}, k_min={k_min}, k_max={k_max}")
    elif top_k > n_experts:
        raise ValueError(f"top_k ({top_k}) must be <= the number of experts ({n_experts})")
    cfg = ffi.new("colibri_route_config *")
    cfg.scoring = SCORINGS[scoring]
    cfg.top_k = top_k
    cfg.norm_topk_prob = 1 if norm_topk_prob else 0
    cfg.dyn_p = float(dyn_p or 0.0)
    cfg.k_min = int(k_min) if dyn_p else 0
    cfg.k_max = int(k_max) if dyn_p else 0
    return cfg


def route(logits, top_k, *, scoring="softmax", norm_topk_prob=True, dyn_p=0.0, k_min=1,
          k_max=None, lib=None):
    """Route float32 logits [T, E] -> (indices int32 [T, slots], weights float32 [T, slots]).

    slots = top_k, or k_max in dynamic mode (unused slots: index -1, weight 0). NaN logits
    are never chosen (a row of only NaN gets no expert); +Inf logits share the mass."""
    logits = f32_array("logits", logits, (None, None))
    T, E = logits.shape
    if E == 0:
        raise ValueError("logits must have at least one expert column, got shape "
                         f"{list(logits.shape)}")
    cfg = _route_config(E, top_k, scoring, norm_topk_prob, dyn_p, k_min, k_max)
    lib = open_library(lib)
    slots = lib.colibri_route_slots(cfg)
    idx = np.empty((T, slots), np.int32)
    w = np.empty((T, slots), np.float32)
    check(lib, lib.colibri_route(ffi.from_buffer("float[]", logits), T, E, cfg,
                                 ffi.from_buffer("int32_t[]", idx), ffi.from_buffer("float[]", w),
                                 ffi.NULL), "colibri_route")
    return idx, w


class MoELayer:
    """One Mixture-of-Experts layer held by the C engine.

    router [E, H], gate/up [E, I, H], down [E, H, I]: float32 arrays, converted to
    `weight_dtype` ("f32", "bf16", "int8", "int4", "int4g32") and copied into one arena. Optional shared
    expert: shared_gate/up [S, H], shared_down [H, S], gated by sigmoid(shared_expert_gate . x)
    when shared_expert_gate [H] (or transformers' [1, H]) is given. Calling the layer on float32 x [T, H] returns
    moe(x) [T, H] (no residual). close() (or leaving a `with` block) frees the engine's copy
    at once; using the layer after it raises ValueError. Calls on one layer from several
    Python threads run one at a time (close() must not free it under a call). hugepages
    (default True) puts an arena of 2 MiB or more on huge pages where the host gives them
    (hugetlb, else transparent huge pages); page_kind says what it got."""

    def __init__(self, router, gate, up, down, *, top_k, scoring="softmax", norm_topk_prob=True,
                 shared_gate=None, shared_up=None, shared_down=None, shared_expert_gate=None,
                 weight_dtype="f32", threads=None, lib=None, dyn_p=0.0, k_min=1, k_max=None,
                 hugepages=True, numa_node=None):
        if weight_dtype not in quant.DTYPES:
            raise ValueError(f"weight_dtype must be one of {quant.DTYPES}, got {weight_dtype!r}")
        router = f32_array("router", router, (None, None))
        E, H = router.shape
        gate = f32_array("gate", gate, (E, None, H))
        I = gate.shape[1]
        _nonzero_dims(E=E, H=H, I=I)
        up = f32_array("up", up, (E, I, H))
        down = f32_array("down", down, (E, H, I))
        shared = [shared_gate, shared_up, shared_down]
        if any(a is not None for a in shared) and any(a is None for a in shared):
            raise ValueError("shared_gate, shared_up and shared_down go together")
        S = 0
        if shared_gate is not None:
            shared_gate = f32_array("shared_gate", shared_gate, (None, H))
            S = shared_gate.shape[0]
            shared_up = f32_array("shared_up", shared_up, (S, H))
            shared_down = f32_array("shared_down", shared_down, (H, S))
        if shared_expert_gate is not None:
            if S == 0:
                raise ValueError("shared_expert_gate needs a shared expert")
            shared_expert_gate = _gate_vector(shared_expert_gate, H)
        mats = {"gate": gate, "up": up, "down": down}
        if S:
            mats.update(shared_gate=shared_gate, shared_up=shared_up, shared_down=shared_down)
        encoded = {n: quant.encode(a, weight_dtype) for n, a in mats.items()}
        self._create(router, encoded, shared_expert_gate, weight_dtype, top_k=top_k,
                     scoring=scoring, norm_topk_prob=norm_topk_prob, dyn_p=dyn_p, k_min=k_min,
                     k_max=k_max, threads=threads, lib=lib, hugepages=hugepages,
                     numa_node=numa_node)

    @classmethod
    def from_encoded(cls, router, encoded, *, weight_dtype, shared_expert_gate=None, **kw):
        """A layer from weights already in `weight_dtype`: encoded maps gate, up, down (and
        shared_gate/up/down) to (stored array, int8/int4g32 scales or None) as colibri.quant.encode
        returns them. Used by the tuner, whose weights are encoded once on disk."""
        if weight_dtype not in quant.DTYPES:
            raise ValueError(f"weight_dtype must be one of {quant.DTYPES}, got {weight_dtype!r}")
        router = f32_array("router", router, (None, None))
        E, H = router.shape
        want = quant.STORED_DTYPES[weight_dtype]
        if not isinstance(encoded, dict) or any(n not in encoded for n in ("gate", "up", "down")):
            raise ValueError("encoded must be a dict with at least 'gate', 'up' and 'down'")
        for n, v in encoded.items():
            if not (isinstance(v, tuple) and len(v) == 2):
                raise TypeError(f"encoded[{n!r}] must be a (stored array, scales or None) pair")
            if not isinstance(v[0], np.ndarray):
                raise TypeError(f"{n} must be a numpy.ndarray, got {type(v[0]).__name__}")
        if encoded["gate"][0].ndim != 3:
            raise ValueError(f"gate must be 3-D [E, I, H], got shape {list(encoded['gate'][0].shape)}")
        I = encoded["gate"][0].shape[1]
        if "shared_gate" in encoded and encoded["shared_gate"][0].ndim != 2:
            raise ValueError("shared_gate must be 2-D [S, H]")
        S = encoded["shared_gate"][0].shape[0] if "shared_gate" in encoded else 0
        _nonzero_dims(E=E, H=H, I=I)
        shapes = {"gate": (E, I, H), "up": (E, I, H), "down": (E, H, I), "shared_gate": (S, H),
                  "shared_up": (S, H), "shared_down": (H, S)}
        for n, (stored, scales) in encoded.items():
            if n not in shapes:
                raise ValueError(f"unknown weight {n!r}")
            cols = shapes[n][-1]
            shapes[n] = shapes[n][:-1] + (quant.stored_width(weight_dtype, cols),)  # int4g32/int4: bytes
            if not isinstance(stored, np.ndarray) or stored.dtype != want:
                raise TypeError(f"{n} must be a {np.dtype(want).name} array for {weight_dtype}")
            if stored.shape != shapes[n] or not stored.flags.c_contiguous:
                raise ValueError(f"{n} must be C-contiguous with shape {list(shapes[n])}")
            want_scales = quant.scales_shape(weight_dtype, shapes[n][:-1], cols)
            if want_scales is not None:
                f32_array(f"{n} scales", scales, want_scales)
            elif scales is not None:
                raise TypeError(f"{n}: {weight_dtype} weights have no scales (got an array)")
        if shared_expert_gate is not None:
            shared_expert_gate = _gate_vector(shared_expert_gate, H)
        self = cls.__new__(cls)
        self._create(router, encoded, shared_expert_gate, weight_dtype, **kw)
        return self

    def _create(self, router, encoded, shared_expert_gate, weight_dtype, *, top_k,
                scoring="softmax", norm_topk_prob=True, dyn_p=0.0, k_min=1, k_max=None,
                threads=None, lib=None, hugepages=True, numa_node=None):
        E, H = router.shape
        I = encoded["gate"][0].shape[1]
        S = encoded["shared_gate"][0].shape[0] if "shared_gate" in encoded else 0
        self._ptr = None  # until the engine holds the layer: close() and __del__ are safe
        self._lock = threading.Lock()
        self.threads = 0 if threads is None else positive_int("threads", threads,
                                                               maximum=MAX_THREADS)
        if numa_node is not None and (isinstance(numa_node, bool)
                                      or not isinstance(numa_node, (int, np.integer))):
            raise TypeError(f"numa_node must be an int or None, got {type(numa_node).__name__}")
        if numa_node is not None and not 0 <= numa_node < 1024:
            raise ValueError(f"numa_node must be in [0, 1024) or None, got {numa_node}")
        self.hidden, self.inter, self.n_experts, self.shared_inter = H, I, E, S
        self.top_k, self.weight_dtype = top_k, weight_dtype
        self._lib = lib = open_library(lib)

        d = ffi.new("colibri_layer_desc *")
        d.hidden, d.inter, d.n_experts, d.shared_inter = H, I, E, S
        d.route = _route_config(E, top_k, scoring, norm_topk_prob, dyn_p, k_min, k_max)[0]
        d.weight_dtype = quant.DTYPE_CODES[weight_dtype]
        d.hugepages = 1 if hugepages else 0
        d.numa_node = -1 if numa_node is None else int(numa_node)
        d.router = ffi.from_buffer("float[]", router)
        for n, (stored, scales) in encoded.items():  # C copies: the arrays outlive the call
            setattr(d, n, ffi.from_buffer(stored))
            if scales is not None:
                setattr(d, f"{n}_scales", ffi.from_buffer("float[]", scales))
        if shared_expert_gate is not None:
            d.shared_expert_gate = ffi.from_buffer("float[]", shared_expert_gate)
        ptr = lib.colibri_layer_create(d)
        if ptr == ffi.NULL:
            check(lib, 1, "colibri_layer_create")
        self._ptr = ffi.gc(ptr, lib.colibri_layer_free)

    def _live(self):
        if self._ptr is None:
            raise ValueError("the layer is closed")
        return self._ptr

    @property
    def closed(self) -> bool:
        return self._ptr is None

    @property
    def page_kind(self) -> str:
        return PAGE_KINDS.get(self._lib.colibri_layer_page_kind(self._live()), "unknown")

    @property
    def weight_bytes(self) -> int:
        return int(self._lib.colibri_layer_weight_bytes(self._live()))

    @property
    def kernels(self) -> str:
        """The kernel table this layer runs: "default", or the tuned shape class its
        sizes fall in (docs/shape-classes.md)."""
        return ffi.string(self._lib.colibri_layer_kernels(self._live())).decode()

    def __call__(self, x, out=None):
        """moe(x) for float32 x [T, H]. A token (row) holding NaN or Inf gets a NaN row; the
        other rows are unaffected."""
        x = f32_array("x", x, (None, self.hidden))
        if out is None:
            out = np.empty_like(x)
        else:
            out = f32_array("out", out, x.shape, writeable=True)
            if np.shares_memory(x, out):
                raise ValueError("out must not overlap x")
        T = x.shape[0]
        if T > _INT_MAX:
            raise ValueError(f"T = {T} tokens is more than the engine takes ({_INT_MAX})")
        with self._lock:  # close() must not free the layer under a running call
            ptr = self._live()
            if T == 0:
                return out
            check(self._lib, self._lib.colibri_layer_forward(
                ptr, ffi.from_buffer("float[]", x),
                ffi.from_buffer("float[]", out, require_writable=True), T, self.threads),
                "colibri_layer_forward")
        return out

    def _forward_ptrs(self, x_addr: int, out_addr: int, T: int, bf16: bool = False) -> None:
        """moe(x) into out for T tokens, x and out given by address: float32 [T, hidden],
        C-contiguous, not overlapping; with bf16=True bf16 rows (uint16 bits) in and out,
        which may be the same buffer (colibri_layer_forward_bf16). For a caller that holds
        tensors it has checked, such as colibri.hf's module (torch's data_ptr()): none of
        __call__'s checks, which cost more than the engine on a small layer."""
        if not 0 <= T <= _INT_MAX:
            raise ValueError(f"T = {T} tokens is outside what the engine takes (0..{_INT_MAX})")
        with self._lock:
            ptr = self._live()
            if T and bf16:
                check(self._lib, self._lib.colibri_layer_forward_bf16(
                    ptr, ffi.cast("uint16_t *", x_addr), ffi.cast("uint16_t *", out_addr), T, self.threads),
                    "colibri_layer_forward_bf16")
            elif T:
                check(self._lib, self._lib.colibri_layer_forward(
                    ptr, ffi.cast("float *", x_addr), ffi.cast("float *", out_addr), T, self.threads),
                    "colibri_layer_forward")

    # ---- lifetime: the engine's copy of the weights goes at close() (or garbage collection)
    def close(self) -> None:
        with self._lock:
            ptr, self._ptr = self._ptr, None
            if ptr is not None:
                ffi.release(ptr)  # runs colibri_layer_free now, once

    def __enter__(self) -> "MoELayer":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
