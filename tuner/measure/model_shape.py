"""`tuner run --shape-of PATH`: the shape of a model, as the tuner names it
(problems.shape_name): from a transformers checkpoint folder's config.json, or from a
Colibri model file's header.

config.json: the architectures colibri.convert knows (qwen3_moe, mixtral, olmoe,
qwen2_moe: their keys for the expert count and size, top-k and renormalisation, with
transformers' defaults for keys left out), and DeepSeek-V2/V3 (n_routed_experts,
moe_intermediate_size, n_shared_experts of that size, ungated).
"""
from __future__ import annotations

import json
from pathlib import Path

from tuner.measure import problems


class ShapeError(ValueError):
    """The path names no model whose MoE shape can be read."""


DEEPSEEK = ("deepseek_v2", "deepseek_v3")


def from_config(cfg: dict, where: str = "config.json") -> dict:
    """The MoE sizes and routing of a transformers config (a dict)."""
    from colibri.convert import ARCHS

    kind = cfg.get("model_type")

    def need(key, default=None):
        v = cfg.get(key, default)
        if not isinstance(v, int) or isinstance(v, bool) or v < 1:
            raise ShapeError(f"{where}: {key} is {v!r}, not a positive integer")
        return v

    if kind in DEEPSEEK:
        inter = need("moe_intermediate_size")
        shared = cfg.get("n_shared_experts") or 0
        return dict(H=need("hidden_size"), I=inter, E=need("n_routed_experts"),
                    k=need("num_experts_per_tok"), scoring="softmax",
                    norm=bool(cfg.get("norm_topk_prob", False)), S=int(shared) * inter, gated=False)
    arch = ARCHS.get(kind)
    if arch is None:
        known = ", ".join([*ARCHS, *DEEPSEEK])
        raise ShapeError(f"{where}: model_type {kind!r} is not a MoE architecture the tuner "
                         f"knows ({known})")
    get = lambda key: cfg.get(key, arch.config_defaults.get(key))  # noqa: E731
    dims = dict(H=need("hidden_size"), I=need(arch.inter_key), E=need(arch.experts_key),
                k=need("num_experts_per_tok", arch.config_defaults.get("num_experts_per_tok")),
                scoring=arch.scoring,
                norm=bool(get("norm_topk_prob")) if arch.norm_key else arch.norm_topk_prob,
                S=0, gated=False)
    if arch.shared_expert and cfg.get("shared_expert_intermediate_size"):
        dims.update(S=need("shared_expert_intermediate_size"), gated=True)
    if dims["k"] > dims["E"]:
        raise ShapeError(f"{where}: num_experts_per_tok {dims['k']} > {dims['E']} experts")
    return dims


def from_model_file(path: Path) -> dict:
    """The sizes and routing in a Colibri model file's header."""
    from colibri import modelfile

    try:
        h = modelfile.read_header(path)
    except (OSError, ValueError, KeyError) as exc:
        raise ShapeError(f"{path}: not a readable Colibri model file ({exc})") from None
    if h.get("dyn_p"):
        raise ShapeError(f"{path}: routes a dynamic number of experts (dyn_p {h['dyn_p']}); "
                         f"the tuner's problems route a fixed top-k")
    return dict(H=h["hidden"], I=h["inter"], E=h["n_experts"], k=h["top_k"],
                scoring="softmax_topk" if h["scoring"] == 1 else "softmax",
                norm=bool(h["norm_topk_prob"]), S=h["shared_inter"], gated=bool(h["shared_gated"]))


def dims_of(path: str | Path) -> dict:
    """The shape of the model at `path`: a checkpoint folder, its config.json, or a
    .colibri file."""
    p = Path(path)
    if p.is_dir():
        p = p / "config.json"
        if not p.is_file():
            raise ShapeError(f"{path}: a folder without a config.json (a transformers "
                             f"checkpoint folder has one)")
    if not p.is_file():
        raise ShapeError(f"{path}: no such file or folder")
    if p.suffix == ".json":
        try:
            cfg = json.loads(p.read_text())
        except (OSError, ValueError) as exc:
            raise ShapeError(f"{p}: not readable JSON ({exc})") from None
        if not isinstance(cfg, dict):
            raise ShapeError(f"{p}: not a JSON object")
        return from_config(cfg, str(p))
    return from_model_file(p)


def register(path: str | Path) -> str:
    """The tuner's name of the shape of the model at `path` (a reference shape's name when
    the sizes and routing are one's)."""
    return problems.shape_name(dims_of(path))
