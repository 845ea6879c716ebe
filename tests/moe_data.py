"""Random MoE layers and inputs for the tests, with routing kept away from ties
(see colibri.reference.inputs_with_margin)."""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from colibri import quant, reference

MARGIN = 1e-3  # minimum float64 logit gap (or mass gap, dynamic mode) at the routing cut

# Reference shapes (DESIGN.md): hidden, expert inter, experts, top-k, shared, routing
REFERENCE_SHAPES = {
    "qwen3-30b-a3b": dict(H=2048, I=768, E=128, k=8, norm=True),
    "mixtral-8x7b": dict(H=4096, I=14336, E=8, k=2, norm=True),
    "olmoe-1b-7b": dict(H=2048, I=1024, E=64, k=8, norm=False),
    "qwen1.5-moe-a2.7b": dict(H=2048, I=1408, E=60, k=4, norm=False, S=5632, gated=True),
    "deepseek-v2-lite": dict(H=2048, I=1408, E=64, k=6, norm=False, S=2816, gated=False),
}


@dataclass
class Case:
    router: np.ndarray
    gate: np.ndarray
    up: np.ndarray
    down: np.ndarray
    route: dict = field(default_factory=dict)
    shared: dict = field(default_factory=dict)

    @property
    def hidden(self):
        return self.router.shape[1]

    def layer_kwargs(self):
        return dict(self.route, **self.shared)

    def reference(self, x, dtype="f32"):
        """float64 moe(x) with the weights as the engine holds them in `dtype`."""
        rt = lambda a: None if a is None else quant.roundtrip(a, dtype)
        sh = {k: (v if k == "shared_expert_gate" else rt(v)) for k, v in self.shared.items()}
        act = quant.ACTIVATION_ROUNDING.get(dtype)
        return reference.moe_layer(x, self.router, quant.PerExpert(self.gate, dtype),
                                   quant.PerExpert(self.up, dtype), quant.PerExpert(self.down, dtype),
                                   **self.route, **sh, act=act)

    def inputs(self, T, seed=1):
        """x [T, H] float32 whose routing has a clear margin for every token."""
        return reference.inputs_with_margin(self.router, T, seed=seed, margin=MARGIN, **self.route)


def make_case(H, I, E, k, *, S=0, gated=False, scoring="softmax", norm=True, dyn_p=0.0,
              k_min=1, k_max=None, seed=0) -> Case:
    rng = np.random.default_rng(seed)

    def w(*shape, fan_in):
        a = rng.standard_normal(shape, dtype=np.float32)
        a *= np.float32(1.0 / np.sqrt(fan_in))
        return a

    # router scaled up so logits spread like a trained router's (std ~ 3)
    router = w(E, H, fan_in=H) * np.float32(3.0)
    case = Case(router, w(E, I, H, fan_in=H), w(E, I, H, fan_in=H), w(E, H, I, fan_in=I))
    case.route = dict(top_k=k, scoring=scoring, norm_topk_prob=norm)
    if dyn_p:
        case.route.update(dyn_p=dyn_p, k_min=k_min, k_max=k_max)
    if S:
        case.shared = dict(shared_gate=w(S, H, fan_in=H), shared_up=w(S, H, fan_in=H),
                           shared_down=w(H, S, fan_in=S))
        if gated:
            case.shared["shared_expert_gate"] = w(H, fan_in=H)
    return case


def assert_engine(out, ref, dtype="f32"):
    """The engine's output against the reference of the same format (reference.compare)."""
    ok, _, msg = reference.compare(out, ref, dtype)
    assert ok, f"{dtype}: {msg}"


def assert_close(out, ref, rtol=1e-4):
    """|out - ref| <= rtol * (|ref| + mean |ref| of its row), elementwise.

    The row-mean term stands in for the magnitude of the summed terms where an
    output happens to cancel to near zero."""
    out = np.asarray(out, np.float64)
    ref = np.asarray(ref, np.float64)
    assert out.shape == ref.shape
    assert np.all(np.isfinite(out)), "non-finite output"
    scale = np.abs(ref) + np.mean(np.abs(ref), axis=-1, keepdims=True)
    err = np.abs(out - ref)
    worst = np.unravel_index(np.argmax(err / scale), err.shape)
    assert np.all(err <= rtol * scale), (
        f"max relative error {float((err / scale)[worst]):.3g} at {worst} exceeds {rtol:g}: "
        f"got {out[worst]!r}, want {ref[worst]!r}")


def write_repeated_model(path, *, H=512, I=256, E=32, k=4, layers=6, seed=7, weight_dtype="int8"):
    """A model file of one random layer stored `layers` times (each copy its own bytes, as a
    model's layers are): a file of a chosen size for runs under a memory limit; its path."""
    from colibri.modelfile import ModelWriter

    case = make_case(H=H, I=I, E=E, k=k, seed=seed)
    with ModelWriter(path, weight_dtype=weight_dtype, share=False) as w:
        w.add_layer(dict(router=case.router, gate=case.gate, up=case.up, down=case.down, **case.layer_kwargs()))
        for _ in range(layers - 1):
            w.repeat_layer(0)
    return path
