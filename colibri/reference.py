"""The NumPy reference of the MoE layer, in float64: what the engine must compute.

Routing and expert math follow the models' reference code (Hugging Face
Qwen3-MoE / Mixtral / OLMoE / Qwen2-MoE): softmax over all experts then top-k
(optionally renormalised), or top-k logits then softmax over those k; experts
SwiGLU `down(silu(gate x) * (up x))`; shared expert scaled by sigmoid(w . x).
"""
from __future__ import annotations

import numpy as np


def softmax(z: np.ndarray, axis: int = -1) -> np.ndarray:
    z = z - np.max(z, axis=axis, keepdims=True)
    e = np.exp(z)
    return e / np.sum(e, axis=axis, keepdims=True)


def route(logits, top_k, scoring="softmax", norm_topk_prob=True, dyn_p=0.0, k_min=1, k_max=None):
    """Per token: (list of expert indices, list of weights), float64.

    Order: descending score, ties to the lower index (a stable sort)."""
    logits = np.asarray(logits, dtype=np.float64)
    out = []
    for row in logits:
        order = np.argsort(-row, kind="stable")
        p = softmax(row)
        if dyn_p > 0:
            cum = np.cumsum(p[order])
            n = int(np.searchsorted(cum, dyn_p) + 1)  # first position with cum >= p
            n = min(max(n, k_min), k_max)
            idx = order[:n]
            w = p[idx]
            if norm_topk_prob or scoring == "softmax_topk":
                w = w / w.sum()
        elif scoring == "softmax":
            idx = order[:top_k]
            w = p[idx]
            if norm_topk_prob:
                w = w / w.sum()
        elif scoring == "softmax_topk":
            idx = order[:top_k]
            w = softmax(row[idx])
        else:
            raise ValueError(f"unknown scoring {scoring!r}")
        out.append((idx, w))
    return out


def silu(z):
    return z / (1.0 + np.exp(-z))


def expert(x, gate, up, down, act=None):
    """x [n, H] float64; gate/up [I, H]; down [H, I]. act: what the kernels do to the
    activations before each matrix (int4g32: colibri.quant.quantize_activations), or None."""
    if act is None:
        return (silu(x @ gate.T) * (x @ up.T)) @ down.T
    xa = np.asarray(act(x), dtype=np.float64)
    h = silu(xa @ gate.T) * (xa @ up.T)
    return np.asarray(act(h), dtype=np.float64) @ down.T


def moe_layer(x, router, gate, up, down, *, top_k, scoring="softmax", norm_topk_prob=True,
              dyn_p=0.0, k_min=1, k_max=None, shared_gate=None, shared_up=None,
              shared_down=None, shared_expert_gate=None, act=None):
    """y = moe(x) in float64 (no residual). Weights as the engine sees them (dequantized);
    act as in expert()."""
    f = lambda a: None if a is None else np.asarray(a, dtype=np.float64)
    x = f(x)
    logits = x @ f(router).T
    y = np.zeros_like(x)
    # group by expert: each routed expert's weights are converted once
    by_expert: dict[int, list[tuple[int, float]]] = {}
    for t, (idx, w) in enumerate(route(logits, top_k, scoring, norm_topk_prob, dyn_p, k_min, k_max)):
        for e, we in zip(idx, w):
            by_expert.setdefault(int(e), []).append((t, float(we)))
    for e, pairs in sorted(by_expert.items()):
        toks = np.array([t for t, _ in pairs])
        ws = np.array([we for _, we in pairs])
        out = expert(x[toks], f(gate[e]), f(up[e]), f(down[e]), act)
        np.add.at(y, toks, ws[:, None] * out)
    if shared_gate is not None:
        s = expert(x, f(shared_gate), f(shared_up), f(shared_down), act)
        if shared_expert_gate is not None:
            s = s * (1.0 / (1.0 + np.exp(-(x @ f(shared_expert_gate)))))[:, None]
        y += s
    return y


def topk_margin(logits, top_k, dyn_p=0.0, k_min=1, k_max=None):
    """Per token, how far the routing decision is from flipping (float64).

    Fixed k: the logit gap between the k-th and (k+1)-th expert. Dynamic: the
    smaller of |cum mass - p| around the cut and the logit gaps at the cut.
    Tests resample tokens with a tiny margin: float32 and float64 may disagree there."""
    logits = np.asarray(logits, dtype=np.float64)
    out = np.empty(len(logits))
    for i, row in enumerate(logits):
        s = np.sort(row)[::-1]
        if dyn_p > 0:
            cum = np.cumsum(np.sort(softmax(row))[::-1])
            n = min(max(int(np.searchsorted(cum, dyn_p) + 1), k_min), k_max)
            near = [abs(cum[n - 1] - dyn_p)] + ([abs(cum[n - 2] - dyn_p)] if n >= 2 else [])
            out[i] = min(near + ([s[n - 1] - s[n]] if n < len(s) else []))
        else:
            out[i] = s[top_k - 1] - s[top_k] if top_k < len(s) else np.inf
    return out


def inputs_with_margin(router, T, *, top_k, dyn_p=0.0, k_min=1, k_max=None, seed=1,
                       margin=1e-3, **_):
    """x [T, H] float32 (standard normal) whose routing decision is clear for every token.

    Where two experts' scores are within float32 rounding of each other, the engine
    (float32 logits) and this float64 reference may pick different experts; both are
    right. Such tokens are redrawn (seeded), so a check compares arithmetic, not a
    coin flip."""
    rng = np.random.default_rng(seed)
    H = router.shape[1]
    x = rng.standard_normal((T, H), dtype=np.float32)
    r64 = np.asarray(router, dtype=np.float64)
    for _ in range(200):
        m = topk_margin(x.astype(np.float64) @ r64.T, top_k, dyn_p, k_min, k_max)
        bad = m < margin
        if not bad.any():
            return x
        x[bad] = rng.standard_normal((int(bad.sum()), H), dtype=np.float32)
    raise RuntimeError("could not draw inputs with a clear routing margin")


# How far the engine may be from this reference of the same weight format (compare()).
RTOL = 1e-4             # float32 accumulation against float64
FLIP_RTOL = 5e-2        # int8/int4g32: every element within this,
FLIP_L2 = 1e-3          # the whole output within this relative L2 error,
                        # and the median element within RTOL


def compare(out, ref, dtype: str = "f32") -> tuple[bool, float, str]:
    """(ok, worst elementwise relative error, message) of the engine's out against ref.

    Elementwise error is |out - ref| / (|ref| + mean |ref| of the row): the row-mean term
    stands in for the size of the summed terms where an output cancels to near zero.
    f32 and bf16: every element within RTOL. int8 and int4g32 kernels round each matrix's
    activations to int8 steps (quant.ACTIVATION_ROUNDING), and the engine's float32 h and
    the reference's float64 h can land on either side of a step boundary; one such flip
    moves that token's whole output row by about one step times a down weight (seen up to
    8e-3), and how many tokens see one grows with the intermediate size (2 of 9 at
    Mixtral's 14336). So there: the median element within RTOL (the arithmetic is right
    where no step flipped), every element within FLIP_RTOL, and the relative L2 error
    within FLIP_L2."""
    out = np.asarray(out, np.float64)
    ref = np.asarray(ref, np.float64)
    if out.shape != ref.shape:
        return False, float("inf"), f"shape {out.shape} != {ref.shape}"
    if not np.all(np.isfinite(out)):
        return False, float("inf"), "non-finite output"
    scale = np.abs(ref) + np.mean(np.abs(ref), axis=-1, keepdims=True)
    rel = np.abs(out - ref) / np.where(scale > 0, scale, 1.0)
    worst = float(rel.max()) if rel.size else 0.0
    at = np.unravel_index(int(np.argmax(rel)), rel.shape) if rel.size else ()
    where = f"at {tuple(int(i) for i in at)}: got {out[at]!r}, want {ref[at]!r}" if rel.size else ""
    from .quant import ACTIVATION_ROUNDING

    if dtype not in ACTIVATION_ROUNDING:
        ok = worst <= RTOL
        return ok, worst, ("" if ok else f"max relative error {worst:.3g} > {RTOL:g} {where}")
    med = float(np.median(rel)) if rel.size else 0.0
    l2 = float(np.linalg.norm(out - ref) / max(np.linalg.norm(ref), 1e-300))
    problems = []
    if med > RTOL:
        problems.append(f"median relative error {med:.3g} > {RTOL:g}")
    if worst > FLIP_RTOL:
        problems.append(f"max relative error {worst:.3g} > {FLIP_RTOL:g} {where}")
    if l2 > FLIP_L2:
        problems.append(f"relative L2 error {l2:.3g} > {FLIP_L2:g}")
    return not problems, worst, "; ".join(problems)
