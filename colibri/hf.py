"""colibri.hf: a loaded transformers causal LM's sparse-MoE blocks run on Colibri's layers.

    import colibri.hf
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.bfloat16)
    colibri.hf.patch(model, weight_dtype="bf16")   # -> how many blocks it replaced
    model.generate(...)                             # attention, cache, sampling stay transformers'

Each sparse-MoE block (Qwen3-MoE, Qwen2-MoE with its shared expert and sigmoid gate,
Mixtral, OLMoE, and any block with the same contract) is replaced by a ColibriMoeBlock:
a torch module holding a colibri.MoELayer built from the block's tensors in memory, in
`weight_dtype`. The contract (what "the same" means):

  block.gate        a router: weight [E, H], top_k; softmax over the E logits in float32,
                    the top_k probabilities, renormalised where norm_topk_prob (Mixtral:
                    always)
  block.experts     SwiGLU experts (act silu): fused gate_up_proj [E, 2I, H] (gate rows
                    first) and down_proj [E, H, I], or a list of per-expert MLPs
                    (gate_proj/up_proj/down_proj, or Mixtral's w1/w3/w2)
  block.shared_expert, block.shared_expert_gate (optional): an MLP of the same kind added
                    to every token, scaled by sigmoid(shared_expert_gate(x)) ([1, H])

Each replacement is checked before it goes in: the original block and the Colibri block
run on a few tokens with a clear routing margin (routed_tokens) and must agree (float32 models: 1e-4 relative; bf16 and
quantized: a bound of their own, see CHECK_RTOL). A block that looks like a MoE block but
breaks the contract (a sigmoid or grouped router, biases, another activation) is refused
by name with the reason, and the model is left as it was. The original expert tensors go
with the old block (nothing else holds them), so memory does not double, unless the block
hands some calls to the original (below).

With linear=True every torch.nn.Linear left (attention projections, dense MLPs, lm_head)
goes on a colibri.Linear in the same weight dtype (ColibriLinear; a bias stays torch's),
checked the same way.

Hand-off (never slower than the original): with handoff="auto" (the default) and f32 or
bf16 weights (HANDOFF_AUTO_DTYPES: quantized weights are for memory, so "auto" leaves
those on Colibri), patch() times the original and the new module of each kind (a MoE block
class; a Linear's shape) on HANDOFF_TOKENS tokens in interleaved rounds, and where the
original is faster (by HANDOFF_MARGIN) at some token count and every larger one timed,
calls of at least that many tokens go to the original module, which is then kept beside
Colibri's copy (its memory stays, and such a call computes with its weights; the module's
handoff_tokens says where it hands off, None: never). handoff=None never hands off and
keeps no original; an int, or {"moe": n, "linear": n}, sets the threshold in any dtype,
without timing. handoffs(model) lists what a patched model does.

Activations: a float32 or bf16 input is passed to the engine without a copy (bf16 rows
through colibri_layer_forward_bf16 / colibri_dense_forward_bf16, which compute in f32 and
round the output once; a Linear with a bias takes the f32 path); float16 input is converted
to float32 once per call and the output converted back. Token rows are independent: batch > 1 and padded
positions go through as the original block takes them (the block sees no mask). Only
inference: the patched blocks have no parameters and no gradient.
"""
from __future__ import annotations

import collections
import statistics
import time
from dataclasses import dataclass

import numpy as np

from . import quant
from .timing import interleaved
from .layer import MoELayer
from .linear import Linear

# relative L2 error allowed when the original and the patched block are compared on
# test tokens at patch time, by (model dtype, weight_dtype); the engine itself is
# tested to 1e-4 per element against float64 (tests/engine)
CHECK_RTOL = {"f32": 1e-4, "bf16": 3e-2, "int8": 1e-1, "int4g32": 3e-1, "int4": 3e-1}
CHECK_TOKENS = 8
# handoff="auto": the token counts at which the original and the new module are timed, the
# rounds at each, and the seconds of one call past which larger counts are not timed (they
# follow the largest timed count)
HANDOFF_TOKENS = (1, 8, 32, 128, 512)
HANDOFF_ROUNDS = 3
HANDOFF_MAX_CALL_S = 0.25
# the original must be this much faster: a near tie is not worth the memory a kept original
# holds (OLMoE's bf16 MoE block at 512 tokens tied with torch's and flipped between runs)
HANDOFF_MARGIN = 1.10
# the weight dtypes "auto" times: a quantized patch is for memory, which a kept original
# would give back (Qwen3 shape, 4 layers, all:int4 on Zen 4: prefill 2.33x with the
# hand-offs "auto" found, 2.30x without, resident memory 9.51 against 8.53 GiB)
HANDOFF_AUTO_DTYPES = ("f32", "bf16")


class UnsupportedBlock(ValueError):
    """A MoE block whose routing or experts Colibri does not compute (the message says why)."""


@dataclass
class _Weights:
    router: np.ndarray                    # [E, H] float32
    top_k: int
    norm_topk_prob: bool
    gate: list                            # per expert [I, H] torch tensors (views)
    up: list
    down: list                            # per expert [H, I]
    shared: tuple | None                  # (gate [S, H], up [S, H], down [H, S]) tensors
    shared_expert_gate: np.ndarray | None  # [H] float32


def _torch():
    try:
        import torch
    except ImportError as exc:  # pragma: no cover - the module is useless without torch
        raise ImportError("colibri.hf needs torch (and transformers for the models): "
                          "pip install torch transformers") from exc
    return torch


def _looks_like_moe(module) -> bool:
    name = type(module).__name__
    return hasattr(module, "experts") and ("Moe" in name or "MoE" in name)


def _act_name(obj) -> str | None:
    """The experts' activation as a name where it can be told (a module's class, or torch's
    silu function); None where it cannot (the patch-time check then decides)."""
    torch = _torch()
    act = getattr(obj, "act_fn", None)
    if act is None or act is torch.nn.functional.silu:
        return None if act is None else "silu"
    if not isinstance(act, torch.nn.Module):
        return None
    name = type(act).__name__.lower()
    return "silu" if name in ("siluactivation", "silu") else name


def _mlp_weights(mlp, where: str):
    """(gate [I, H], up [I, H], down [H, I]) of one SwiGLU MLP module."""
    for g, u, d in (("gate_proj", "up_proj", "down_proj"), ("w1", "w3", "w2")):
        if all(hasattr(mlp, n) for n in (g, u, d)):
            mods = [getattr(mlp, n) for n in (g, u, d)]
            if any(getattr(m, "bias", None) is not None for m in mods):
                raise UnsupportedBlock(f"{where}: its projections have biases (Colibri's experts have none)")
            act = _act_name(mlp)
            if act not in (None, "silu"):
                raise UnsupportedBlock(f"{where}: activation {act} (Colibri computes SwiGLU with silu)")
            return tuple(m.weight for m in mods)
    raise UnsupportedBlock(f"{where}: an MLP without gate/up/down projections "
                           f"({type(mlp).__name__})")


def _expert_weights(experts, E: int, H: int, where: str):
    torch = _torch()
    if isinstance(experts, torch.nn.ModuleList):
        if len(experts) != E:
            raise UnsupportedBlock(f"{where}: {len(experts)} experts for a router of {E}")
        ws = [_mlp_weights(m, f"{where} expert {i}") for i, m in enumerate(experts)]
        return [w[0] for w in ws], [w[1] for w in ws], [w[2] for w in ws]
    gu, down = getattr(experts, "gate_up_proj", None), getattr(experts, "down_proj", None)
    if not (isinstance(gu, torch.Tensor) and isinstance(down, torch.Tensor)):
        raise UnsupportedBlock(f"{where}: experts {type(experts).__name__} hold neither a fused "
                               "gate_up_proj/down_proj pair nor a list of expert MLPs")
    if any(getattr(experts, b, None) is not None for b in ("gate_up_proj_bias", "down_proj_bias")):
        raise UnsupportedBlock(f"{where}: its experts have biases (Colibri's experts have none)")
    act = _act_name(experts)
    if act not in (None, "silu"):
        raise UnsupportedBlock(f"{where}: activation {act} (Colibri computes SwiGLU with silu)")
    if gu.dim() != 3 or down.dim() != 3 or gu.shape[0] != E or down.shape[0] != E:
        raise UnsupportedBlock(f"{where}: expert tensors {list(gu.shape)}, {list(down.shape)} "
                               f"for {E} experts")
    if gu.shape[2] == H and gu.shape[1] % 2 == 0:        # [E, 2I, H]
        I = gu.shape[1] // 2
        gate, up = gu[:, :I, :], gu[:, I:, :]
    elif gu.shape[1] == H and gu.shape[2] % 2 == 0:      # [E, H, 2I]
        I = gu.shape[2] // 2
        gate, up = gu[:, :, :I].transpose(1, 2), gu[:, :, I:].transpose(1, 2)
    else:
        raise UnsupportedBlock(f"{where}: gate_up_proj {list(gu.shape)} fits no layout for hidden {H}")
    if tuple(down.shape[1:]) == (I, H):                  # [E, I, H]: transposed down
        down = down.transpose(1, 2)
    if tuple(down.shape[1:]) != (H, I):
        raise UnsupportedBlock(f"{where}: down_proj {list(down.shape)} does not match inter {I}, hidden {H}")
    return [gate[e] for e in range(E)], [up[e] for e in range(E)], [down[e] for e in range(E)]


def block_weights(block, where: str = "block") -> _Weights:
    """The tensors and routing of a block under the module's contract; UnsupportedBlock else."""
    torch = _torch()
    router = getattr(block, "gate", None)
    w = getattr(router, "weight", None)
    if not isinstance(w, torch.Tensor) or w.dim() != 2:
        raise UnsupportedBlock(f"{where}: no router (gate) with a 2-D weight")
    if getattr(router, "bias", None) is not None or any(
            n not in ("weight",) for n, _ in router.named_parameters(recurse=True)):
        extra = [n for n, _ in router.named_parameters(recurse=True) if n != "weight"] or ["bias"]
        raise UnsupportedBlock(f"{where}: its router has parameters besides its weight ({', '.join(extra)}): "
                               "a biased or grouped router, which Colibri's softmax top-k does not compute")
    E, H = w.shape
    top_k = getattr(router, "top_k", None) or getattr(block, "top_k", None)
    if not isinstance(top_k, int) or not 1 <= top_k <= E:
        raise UnsupportedBlock(f"{where}: no top_k in 1..{E} on its router")
    norm = getattr(router, "norm_topk_prob", True)  # Mixtral's router always renormalises
    gate, up, down = _expert_weights(block.experts, E, H, where)
    shared = seg = None
    if getattr(block, "shared_expert", None) is not None:
        shared = _mlp_weights(block.shared_expert, f"{where} shared expert")
        sg = getattr(block, "shared_expert_gate", None)
        if sg is not None:
            if getattr(sg, "bias", None) is not None or tuple(sg.weight.shape) != (1, H):
                raise UnsupportedBlock(f"{where}: shared_expert_gate must be Linear({H}, 1) without bias")
            seg = sg.weight.detach().float().reshape(H).numpy().copy()
    return _Weights(router=w.detach().float().numpy().copy(), top_k=int(top_k),
                    norm_topk_prob=bool(norm), gate=gate, up=up, down=down, shared=shared,
                    shared_expert_gate=seg)


def _encode_matrix(m, weight_dtype: str, chunk: int = 4096):
    """A torch matrix [R, C] -> (stored, scales or None) in weight_dtype, converted a chunk
    of rows at a time (a float32 copy of at most `chunk` rows); bf16 into bf16 as its bits."""
    torch = _torch()
    m = m.detach()
    if weight_dtype == "bf16" and m.dtype == torch.bfloat16:
        return m.contiguous().view(torch.int16).numpy().view(np.uint16), None
    out = scales = None
    for r0 in range(0, m.shape[0], chunk):
        st, sc = quant.encode(m[r0:r0 + chunk].float().contiguous().numpy(), weight_dtype)
        if out is None:
            out = np.empty((m.shape[0], *st.shape[1:]), st.dtype)
            scales = None if sc is None else np.empty((m.shape[0], *sc.shape[1:]), sc.dtype)
        out[r0:r0 + chunk] = st
        if sc is not None:
            scales[r0:r0 + chunk] = sc
    return out, scales


def _encode(mats: list, weight_dtype: str):
    """Per-expert torch matrices [R, C] -> (stored [E, R, C'], scales [E, ...] or None)."""
    out = scales = None
    for e, m in enumerate(mats):
        st, sc = _encode_matrix(m, weight_dtype)
        if out is None:
            out = np.empty((len(mats), *st.shape), st.dtype)
            scales = None if sc is None else np.empty((len(mats), *sc.shape), sc.dtype)
        out[e] = st
        if sc is not None:
            scales[e] = sc
    return out, scales


def build_layer(w: _Weights, weight_dtype: str, threads=None, lib=None) -> MoELayer:
    encoded = {n: _encode(getattr(w, n), weight_dtype) for n in ("gate", "up", "down")}
    if w.shared is not None:
        for n, m in zip(("shared_gate", "shared_up", "shared_down"), w.shared):
            st, sc = _encode([m], weight_dtype)
            encoded[n] = (st[0], None if sc is None else sc[0])
    return MoELayer.from_encoded(w.router, encoded, weight_dtype=weight_dtype, top_k=w.top_k,
                                 norm_topk_prob=w.norm_topk_prob,
                                 shared_expert_gate=w.shared_expert_gate, threads=threads, lib=lib)


def _module_class():
    torch = _torch()
    _BF16, _F32 = torch.bfloat16, torch.float32

    class ColibriMoeBlock(torch.nn.Module):
        """A sparse-MoE block computed by a colibri.MoELayer (see colibri.hf)."""

        def __init__(self, layer: MoELayer, original: str):
            super().__init__()
            self.layer, self.original = layer, original
            _no_handoff(self)

        # forward runs right after the previous call streamed its weights through the caches,
        # where each torch call costs several times what it does warm (docs/whole-models.md):
        # as few as it takes (is_cpu, not device.type; the token count once)
        def forward(self, hidden_states):
            if not hidden_states.is_cpu:
                raise ValueError(f"{self.original} patched by Colibri runs on the CPU; got a tensor "
                                 f"on {hidden_states.device}")
            shape, dtype = hidden_states.shape, hidden_states.dtype
            if not shape or shape[-1] != self.layer.hidden:
                raise ValueError(f"{self.original} patched by Colibri takes [..., {self.layer.hidden}] "
                                 f"hidden states; got {tuple(shape)}")
            T = hidden_states.numel() // shape[-1]
            if self.handoff_tokens is not None and T >= self.handoff_tokens:
                out = self._handoff[0](hidden_states)
                return out[0] if isinstance(out, tuple) else out
            x = hidden_states
            bf16 = dtype is _BF16  # the engine takes bf16 rows as they are
            if not bf16 and dtype is not _F32:
                x = x.to(_F32)
            if not x.is_contiguous():
                x = x.contiguous()
            # the output in its final shape, so that no torch call follows the engine's: code
            # that runs after a call that streamed the weights runs on cold caches (a view
            # took 35 us after a Qwen3 int4 decode call; without it the module's call fell
            # from 946 to 929 us)
            out = torch.empty(shape, dtype=x.dtype)
            # by address: the checks of MoELayer.__call__ are the ones above (its own cost
            # 3x the engine's on a small layer; issue 31's per-call budget is 30 us)
            self.layer._forward_ptrs(x.data_ptr(), out.data_ptr(), T, bf16=bf16)
            return out if bf16 or dtype is _F32 else out.to(dtype)

        def extra_repr(self):
            L = self.layer
            return (f"{self.original}: {L.n_experts} experts, top {L.top_k}, hidden {L.hidden}, "
                    f"inter {L.inter}{f', shared {L.shared_inter}' if L.shared_inter else ''}, "
                    f"weights {L.weight_dtype}{_handoff_repr(self)}")

    class ColibriLinear(torch.nn.Module):
        """A torch Linear computed by a colibri.Linear (the bias, if any, added by torch)."""

        def __init__(self, lin: Linear, bias, original: str):
            super().__init__()
            self.lin, self.original = lin, original
            self.register_buffer("bias", None if bias is None else bias.detach().float().clone())
            _no_handoff(self)

        def forward(self, x):  # as few torch calls as it takes (the block's forward says why)
            if not x.is_cpu:
                raise ValueError(f"{self.original} patched by Colibri runs on the CPU; got a tensor on {x.device}")
            shape, dtype = x.shape, x.dtype
            if not shape or shape[-1] != self.lin.cols:
                raise ValueError(f"{self.original} patched by Colibri takes [..., {self.lin.cols}] "
                                 f"inputs; got {tuple(shape)}")
            T = x.numel() // shape[-1]
            if self.handoff_tokens is not None and T >= self.handoff_tokens:
                return self._handoff[0](x)
            # bf16 rows go to the engine as they are; with a bias, through f32, so that the
            # sum is rounded once
            bf16 = dtype is _BF16 and self.bias is None
            xf = x if bf16 or dtype is _F32 else x.to(_F32)
            if not xf.is_contiguous():
                xf = xf.contiguous()
            # in its final shape: no torch call after the engine's where none is needed (the
            # block's forward says why)
            out = torch.empty((*shape[:-1], self.lin.rows), dtype=xf.dtype)
            self.lin._forward_ptrs(xf.data_ptr(), out.data_ptr(), T, bf16=bf16)  # checked above
            if self.bias is not None:
                out += self.bias
            return out if bf16 or dtype is _F32 else out.to(dtype)

        def extra_repr(self):
            return (f"in_features={self.lin.cols}, out_features={self.lin.rows}, "
                    f"bias={self.bias is not None}, weights {self.lin.weight_dtype}{_handoff_repr(self)}")

    return ColibriMoeBlock, ColibriLinear


def _no_handoff(mod) -> None:
    mod.handoff_tokens = None
    # in a tuple, so that torch does not register the original as a submodule (the model's
    # named_modules, parameters and state_dict stay those of the patched model)
    mod._handoff = ()


def _set_handoff(mod, original, tokens) -> None:
    """Calls of mod with at least `tokens` tokens go to `original` (None: none, and the
    original is not kept)."""
    mod.handoff_tokens = tokens
    mod._handoff = () if tokens is None else (original,)


def _handoff_repr(mod) -> str:
    return "" if mod.handoff_tokens is None else f", calls of >= {mod.handoff_tokens} tokens to the original"


def measure_handoff(original, new, width: int, model_dtype, tokens=HANDOFF_TOKENS,
                    rounds: int = HANDOFF_ROUNDS) -> tuple[int | None, dict]:
    """The token count from which `original` is faster than `new` by HANDOFF_MARGIN (both
    torch modules taking [1, n, width] in model_dtype) at every count of `tokens` timed, or
    None; and the medians
    timed, {n: (original s, new s)}. Interleaved rounds (colibri.timing); each round calls a
    module about 20 ms' worth of times. Counts past one where a call took HANDOFF_MAX_CALL_S
    are not timed."""
    torch = _torch()
    g = torch.Generator().manual_seed(0)
    seen = {}
    for n in tokens:
        x = torch.randn(1, n, width, generator=g).to(model_dtype)

        def call(m):
            def f():
                with torch.no_grad():
                    m(x)
            return f
        fns = {"original": call(original), "colibri": call(new)}
        t0 = time.perf_counter()
        for f in fns.values():
            f()
        first = (time.perf_counter() - t0) / 2
        per = interleaved(fns, rounds, calls=max(1, min(50, int(0.02 / max(first, 1e-6)))))
        seen[n] = (statistics.median(per["original"]), statistics.median(per["colibri"]))
        if max(seen[n]) > HANDOFF_MAX_CALL_S:
            break
    threshold = None
    for n in reversed(list(seen)):
        if seen[n][0] * HANDOFF_MARGIN >= seen[n][1]:
            break
        threshold = n
    return threshold, seen


def _handoff_rule(handoff, kind: str):
    """'auto', or the fixed threshold (None: never) of `kind` ('moe', 'linear')."""
    if handoff == "auto" or handoff is None:
        return handoff
    if isinstance(handoff, dict):
        return handoff.get(kind)
    return handoff


def _check_handoff(handoff) -> None:
    ok_int = lambda v: v is None or (isinstance(v, int) and not isinstance(v, bool) and v >= 1)  # noqa: E731
    if handoff == "auto" or ok_int(handoff):
        return
    if isinstance(handoff, dict) and set(handoff) <= {"moe", "linear"} and all(map(ok_int, handoff.values())):
        return
    raise ValueError("handoff must be 'auto', None, a token count >= 1, or {'moe': n, 'linear': n} "
                     f"(n a token count or None); got {handoff!r}")


def handoffs(model) -> dict:
    """{module name: handoff_tokens} of every Colibri module of a patched model (None: all
    its calls run on Colibri)."""
    kinds = (colibri_block_class(), colibri_linear_class())
    return {n: m.handoff_tokens for n, m in model.named_modules() if isinstance(m, kinds)}


def handoff_summary(handoffs: dict) -> str:
    """'hand-off: none', or how many modules hand calls of >= n tokens to the original."""
    by = collections.Counter(v for v in handoffs.values() if v is not None)
    if not by:
        return "hand-off: none"
    return "hand-off: " + ", ".join(f"{c} module(s) from {n} tokens" for n, c in sorted(by.items()))


_CLASSES = None


def colibri_block_class():
    global _CLASSES
    if _CLASSES is None:
        _CLASSES = _module_class()
    return _CLASSES[0]


def colibri_linear_class():
    colibri_block_class()
    return _CLASSES[1]


def routed_tokens(router: np.ndarray, top_k: int, n: int, seed: int = 0) -> np.ndarray:
    """n tokens [n, H] whose router logits put top_k random experts clearly above the rest:
    x = sum over the chosen rows w_i of 4 w_i / |w_i|^2 (+ noise), kept only where the gap
    between the top_k-th and the next logit is at least 1/16 of the largest logit, far above
    bf16's rounding of logits (2^-8). A bf16 model's block rounds its logits to bf16 where
    Colibri routes in float32, so on near-tied random tokens the two pick different experts
    without either being wrong (random-init routers tie often); these tokens cannot tie."""
    rng = np.random.default_rng(seed)
    E, H = router.shape
    r = router.astype(np.float64)
    sq = np.maximum((r * r).sum(axis=1), 1e-30)
    out = []
    for _ in range(200 * n):
        chosen = rng.choice(E, size=top_k, replace=False)
        x = (4.0 * r[chosen] / sq[chosen, None]).sum(axis=0)
        x += rng.standard_normal(H) * (0.01 * np.abs(x).mean())
        logits = np.sort(r @ x)[::-1]
        if top_k == E or logits[top_k - 1] - logits[top_k] >= abs(logits[0]) / 16:
            out.append(x)
            if len(out) == n:
                break
    if len(out) < n:  # a router whose rows no token separates: random tokens after all
        out += list(rng.standard_normal((n - len(out), H)))
    return np.asarray(out, dtype=np.float32)


def _check(block, new, H: int, where: str, model_dtype, weight_dtype: str, tokens=None) -> None:
    """The original and the new module on CHECK_TOKENS tokens of width H (`tokens`, else
    random); UnsupportedBlock if apart."""
    torch = _torch()
    g = torch.Generator().manual_seed(0)
    x = (torch.randn(1, CHECK_TOKENS, H, generator=g) if tokens is None
         else torch.from_numpy(tokens)[None]).to(model_dtype)
    with torch.no_grad():
        want = block(x)
        want = want[0] if isinstance(want, tuple) else want
        got = new(x)
    want, got = want.float(), got.float()
    err = float(torch.linalg.norm(got - want) / max(float(torch.linalg.norm(want)), 1e-30))
    tol = CHECK_RTOL["f32" if model_dtype == torch.float32 and weight_dtype == "f32" else
                     weight_dtype if weight_dtype != "f32" else "bf16"]
    if not err <= tol:
        raise UnsupportedBlock(f"{where} ({type(block).__name__}): Colibri's layer differs from the "
                               f"block by {err:.3g} (relative L2, allowed {tol:g}) on test tokens: "
                               "its routing or experts are not the softmax top-k SwiGLU contract")


def patch(model, *, weight_dtype: str = "f32", linear: bool = False, threads=None, lib=None,
          check: bool = True, handoff="auto") -> int:
    """Replace every sparse-MoE block of `model` (a torch module, e.g. a transformers causal
    LM) by a ColibriMoeBlock in `weight_dtype`, and with `linear` every torch.nn.Linear
    left (attention projections, dense MLPs, lm_head) by a ColibriLinear in the same dtype;
    returns how many modules it replaced. Raises UnsupportedBlock naming the first block that
    breaks the contract (module doc), leaving the model as it was. `check`: compare each
    new module with the original first. `handoff`: which calls go to the original module
    (module doc: "auto" times both; None never; a token count, or {"moe": n, "linear": n})."""
    torch = _torch()
    if weight_dtype not in quant.DTYPES:
        raise ValueError(f"weight_dtype must be one of {quant.DTYPES}, got {weight_dtype!r}")
    _check_handoff(handoff)
    if handoff == "auto" and weight_dtype not in HANDOFF_AUTO_DTYPES:
        handoff = None
    Block = colibri_block_class()
    # names only: a held reference would keep a replaced block's tensors alive
    targets = [(name, type(mod)) for name, mod in model.named_modules()
               if name and _looks_like_moe(mod) and not isinstance(mod, Block)]
    for name, _ in targets:  # the contract of every block, before anything is built
        block_weights(model.get_submodule(name), name)
    p = next(model.parameters(), None)
    model_dtype = p.dtype if p is not None else torch.float32

    def make(name, block):
        w = block_weights(block, name)
        new = Block(build_layer(w, weight_dtype, threads=threads, lib=lib), type(block).__name__)
        tokens = routed_tokens(w.router, w.top_k, CHECK_TOKENS) if check else None
        del w
        if check:
            _check(block, new, new.layer.hidden, name, model_dtype, weight_dtype, tokens)
        return new

    # the first block of each class is built and checked before any is swapped in: a
    # refused class leaves the model as it was
    first, threshold = {}, {}
    rule = _handoff_rule(handoff, "moe")
    for name, cls in targets:
        if cls not in first:
            block = model.get_submodule(name)
            first[cls] = (name, make(name, block))
            threshold[cls] = (measure_handoff(block, first[cls][1], first[cls][1].layer.hidden, model_dtype)[0]
                              if rule == "auto" else rule)
            del block
    done = 0
    for name, cls in targets:
        kept = first.pop(cls) if first.get(cls, ("",))[0] == name else None
        block = model.get_submodule(name)
        try:
            new = kept[1] if kept else make(name, block)
        except UnsupportedBlock as exc:
            raise UnsupportedBlock(f"{exc} ({done} blocks before it were replaced)") from None
        _set_handoff(new, block, threshold[cls])
        parent_name, _, attr = name.rpartition(".")
        parent = model.get_submodule(parent_name) if parent_name else model
        setattr(parent, attr, new)  # without a hand-off the old block, and its expert tensors, go with it
        del new, kept, block
        done += 1
    if linear:
        done += _patch_linears(model, weight_dtype, threads, lib, check, model_dtype, _handoff_rule(handoff, "linear"))
    return done


def _patch_linears(model, weight_dtype, threads, lib, check, model_dtype, rule) -> int:
    """Every torch.nn.Linear left (attention projections, dense MLPs, lm_head) on a
    colibri.Linear; each checked against the original, then swapped in (its hand-off, with
    rule 'auto', timed on the first Linear of each shape)."""
    torch = _torch()
    Lin = colibri_linear_class()
    names = [n for n, m in model.named_modules() if n and type(m) is torch.nn.Linear]
    threshold = {}
    for name in names:
        mod = model.get_submodule(name)
        st, sc = _encode_matrix(mod.weight, weight_dtype)
        new = Lin(Linear.from_encoded(st, sc, mod.in_features, weight_dtype=weight_dtype, threads=threads,
                                      lib=lib), mod.bias, f"{type(mod).__name__} {name}")
        del st, sc
        if check:
            _check(mod, new, mod.in_features, name, model_dtype, weight_dtype)
        key = (mod.in_features, mod.out_features, mod.bias is not None)
        if key not in threshold:
            threshold[key] = measure_handoff(mod, new, mod.in_features, model_dtype)[0] if rule == "auto" else rule
        _set_handoff(new, mod, threshold[key])
        parent_name, _, attr = name.rpartition(".")
        setattr(model.get_submodule(parent_name) if parent_name else model, attr, new)
        del mod, new
    return len(names)
