"""Convert the MoE layers of a Hugging Face safetensors checkpoint to a Colibri model file.

    python -m colibri convert model-00001-of-00002.safetensors model-00002-of-00002.safetensors \\
        --out qwen3.colibri --arch qwen3_moe --weight-dtype bf16

Only the MoE blocks are converted (router, routed experts, Qwen2-MoE's shared expert),
in layer order; attention, norms and dense MLP layers are not part of a Colibri model.

Tensor names (L = layer, N = expert; the part before `layers.` may be anything, e.g. `model.`):

  per-expert   L.mlp.experts.N.{gate_proj,up_proj,down_proj}.weight  [I, H], [I, H], [H, I]
               Mixtral: L.block_sparse_moe.experts.N.{w1,w3,w2}.weight (w1 gate, w3 up, w2 down)
  fused        L.mlp.experts.gate_up_proj [E, 2I, H]  rows 0..I-1 are gate, I..2I-1 up
               L.mlp.experts.down_proj    [E, H, I]
               (transformers >= 5: `gate, up = linear(x, gate_up_proj[e]).chunk(2, dim=-1)`)
  router       L.mlp.gate.weight [E, H] (Mixtral's per-expert form: L.block_sparse_moe.gate.weight)
  shared       L.mlp.shared_expert.{gate_proj,up_proj,down_proj}.weight [S, H], [S, H], [H, S]
  (qwen2_moe)  L.mlp.shared_expert_gate.weight [1, H]

The transposed fused pair, gate_up_proj [E, H, 2I] with down_proj [E, I, H], is
recognised (the two shapes together never fit both orientations) but refused: in that
layout transformers itself splits gate and up two ways (halves in Llama 4, interleaved
columns in GPT-OSS), and none of the four architectures here is stored so, so the order
would be a guess. Anything else is refused by name too.

Routing comes from the architecture (ARCHS) and, when given or found beside the first
source, the checkpoint's config.json (num_experts_per_tok, norm_topk_prob,
num_experts / num_local_experts, hidden_size and the intermediate size are checked
against the tensors). Every tensor's presence and shape is checked from the headers
before any data is read; then layers are converted one at a time from the mapped files
and streamed to the model file (memory: about one layer in float32).
"""
from __future__ import annotations

import argparse
import json
import re
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np

from . import quant
from .modelfile import ModelWriter
from .safetensors import FLOAT_DTYPES, SafetensorsError, SafetensorsFile, raw_to_float32

EXIT_OK, EXIT_FAILED, EXIT_USAGE = 0, 1, 2

HF_PROJ = ("gate_proj", "up_proj", "down_proj")


@dataclass(frozen=True)
class Arch:
    """How one Hugging Face architecture names and routes its MoE blocks."""
    name: str
    blocks: tuple[tuple[str, tuple[str, str, str]], ...]  # (block, per-expert gate/up/down names)
    top_k: int                  # the published model's value, used without a config.json
    norm_topk_prob: bool        # likewise
    experts_key: str            # config.json key of the expert count
    inter_key: str              # config.json key of the routed experts' intermediate size
    norm_key: bool = True       # False: renormalisation is fixed (Mixtral always renormalises)
    shared_expert: bool = False
    # transformers' config-class defaults, for keys a given config.json leaves out
    config_defaults: dict = field(default_factory=dict)
    scoring: str = "softmax"    # softmax over all experts, then top-k


ARCHS: dict[str, Arch] = {a.name: a for a in (
    Arch("qwen3_moe", (("mlp", HF_PROJ),), top_k=8, norm_topk_prob=True,
         experts_key="num_experts", inter_key="moe_intermediate_size",
         config_defaults={"num_experts_per_tok": 8, "norm_topk_prob": False}),
    # transformers < 5 names Mixtral's block block_sparse_moe with w1/w3/w2; >= 5 uses mlp
    Arch("mixtral", (("block_sparse_moe", ("w1", "w3", "w2")), ("mlp", HF_PROJ)), top_k=2,
         norm_topk_prob=True, norm_key=False, experts_key="num_local_experts",
         inter_key="intermediate_size", config_defaults={"num_experts_per_tok": 2}),
    Arch("olmoe", (("mlp", HF_PROJ),), top_k=8, norm_topk_prob=False,
         experts_key="num_experts", inter_key="intermediate_size",
         config_defaults={"num_experts_per_tok": 8, "norm_topk_prob": False}),
    Arch("qwen2_moe", (("mlp", HF_PROJ),), top_k=4, norm_topk_prob=False,
         experts_key="num_experts", inter_key="moe_intermediate_size", shared_expert=True,
         config_defaults={"num_experts_per_tok": 4, "norm_topk_prob": False}),
)}


class ConvertError(ValueError):
    """The checkpoint cannot be converted; the message names the tensor and the file."""


# ------------------------------------------------------------------ sources

class Checkpoint:
    """The tensors of one or more safetensors files, by name (mapped, read lazily)."""

    def __init__(self, files: Sequence[Path]):
        self.files: list[SafetensorsFile] = []
        self.where: dict[str, SafetensorsFile] = {}
        try:
            for p in files:
                f = SafetensorsFile(p)
                self.files.append(f)
                for name in f.tensors:
                    if name in self.where:
                        raise ConvertError(f"tensor {name} is in both {self.where[name].path} "
                                           f"and {f.path}")
                    self.where[name] = f
        except BaseException:
            self.close()
            raise

    def close(self) -> None:
        for f in self.files:
            f.close()

    def __contains__(self, name: str) -> bool:
        return name in self.where

    def shape(self, name: str) -> tuple[int, ...]:
        return self.where[name].tensors[name].shape

    def dtype(self, name: str) -> str:
        return self.where[name].tensors[name].dtype

    def file_of(self, name: str) -> Path:
        return self.where[name].path

    def raw(self, name: str) -> np.ndarray:
        """Stored elements, a view of the mapping; refuses a dtype that is not a float."""
        f = self.where[name]
        dt = f.tensors[name].dtype
        if dt not in FLOAT_DTYPES:
            raise ConvertError(f"{f.path}: tensor {name} has dtype {dt}; the converter reads "
                               f"{', '.join(FLOAT_DTYPES)} (a quantized checkpoint needs "
                               f"dequantizing first)")
        return f.raw(name)

    def describe(self) -> str:
        n = len(self.files)
        names = ", ".join(str(f.path) for f in self.files[:3]) + (", ..." if n > 3 else "")
        return f"{n} file{'s' if n != 1 else ''} ({names})"


def resolve_sources(sources: Sequence[str | Path]) -> tuple[list[Path], Path | None]:
    """Expand SRC arguments -> (safetensors files, directory to look for config.json in).

    A SRC may be a .safetensors file, a sharded checkpoint's index (*.index.json, its
    weight_map names the shards) or a directory holding either."""
    files: list[Path] = []
    for s in sources:
        p = Path(s)
        if p.is_dir():
            idx = sorted(p.glob("*.safetensors.index.json"))
            if len(idx) > 1:
                raise ConvertError(f"{p}: several index files ({', '.join(i.name for i in idx)}); "
                                   f"name the one to use")
            if idx:
                files += _index_files(idx[0])
            else:
                found = sorted(p.glob("*.safetensors"))
                if not found:
                    raise ConvertError(f"{p}: no *.safetensors files or index in this directory")
                files += found
        elif p.name.endswith(".json"):
            files += _index_files(p)
        elif p.exists():
            files.append(p)
        else:
            raise ConvertError(f"{p}: no such file")
    seen: set[Path] = set()
    unique = [f for f in files if not (f.resolve() in seen or seen.add(f.resolve()))]
    if not unique:
        raise ConvertError("no source files given")
    first = Path(sources[0])
    return unique, first if first.is_dir() else first.parent


def _read_json(path: Path):
    """A JSON file's content; a ConvertError naming the file when it cannot be read or parsed."""
    try:
        return json.loads(path.read_text())
    except OSError as e:
        raise ConvertError(f"{path}: cannot read: {e.strerror}") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ConvertError(f"{path}: not valid JSON ({e})") from None


def _index_files(index: Path) -> list[Path]:
    obj = _read_json(index)
    wm = obj.get("weight_map") if isinstance(obj, dict) else None
    if not isinstance(wm, dict) or not all(isinstance(v, str) for v in wm.values()):
        raise ConvertError(f"{index}: no weight_map {{tensor: file}} in this index")
    out = []
    for name in sorted(set(wm.values())):
        p = index.parent / name
        if not p.exists():
            some = next(k for k, v in wm.items() if v == name)
            raise ConvertError(f"{index}: shard {name} (holding e.g. {some}) is missing: "
                               f"expected it at {p}")
        out.append(p)
    return out


def load_config(path: Path | None, explicit: bool) -> tuple[dict | None, Path | None]:
    if path is None:
        return None, None
    if not path.exists():
        if explicit:
            raise ConvertError(f"{path}: no such config file")
        return None, None
    cfg = _read_json(path)
    if not isinstance(cfg, dict):
        raise ConvertError(f"{path}: a config.json must hold a JSON object")
    # multimodal checkpoints keep the language model's settings in text_config
    if isinstance(cfg.get("text_config"), dict):
        cfg = {**cfg, **cfg["text_config"]}
    return cfg, path


# ------------------------------------------------------------------ planning

_LAYER_RE = re.compile(r"^(?P<prefix>(?:.+\.)?layers)\.(?P<layer>\d+)\.(?P<block>[A-Za-z_]+)\."
                       r"(?P<rest>.+)$")


@dataclass
class LayerPlan:
    index: int                 # the checkpoint's layer number
    base: str                  # e.g. "model.layers.3.mlp"
    form: str                  # "per-expert" | "fused"
    names: dict[str, Any]      # router, gate/up/down (lists per expert) or gate_up/down, shared*


@dataclass
class Plan:
    arch: Arch
    layers: list[LayerPlan]
    dims: dict[str, int]       # E, H, I, S
    gated: bool
    route: dict[str, Any]      # top_k, scoring, norm_topk_prob
    skipped: list[int]         # layer numbers without an MoE block (dense MLP)
    source_dtype: str


def _want(ck: Checkpoint, name: str, shape: tuple[int, ...] | None, what: str) -> None:
    """`name` must exist (and have `shape`); else a ConvertError naming it."""
    if name not in ck:
        raise ConvertError(f"tensor {name} is missing ({what}); searched {ck.describe()}")
    if shape is not None and ck.shape(name) != shape:
        raise ConvertError(f"{ck.file_of(name)}: tensor {name} has shape {list(ck.shape(name))}, "
                           f"expected {list(shape)} ({what})")


def plan(ck: Checkpoint, arch: Arch, config: dict | None, layers: set[int] | None) -> Plan:
    """Find and check every tensor the conversion needs, from the headers alone."""
    blocks = dict(arch.blocks)
    by_layer: dict[tuple[str, int], dict[str, set[str]]] = {}
    other_blocks: set[str] = set()
    for name in ck.where:
        m = _LAYER_RE.match(name)
        if not m:
            continue
        if m["block"] not in blocks:
            if ".experts." in name or m["rest"] == "gate.weight":
                other_blocks.add(m["block"])
            continue
        by_layer.setdefault((m["prefix"], int(m["layer"])), {}).setdefault(m["block"], set()).add(
            m["rest"])
    moe = {k: v for k, v in by_layer.items()
           if any("gate.weight" in rests or any(r.startswith("experts.") for r in rests)
                  for rests in v.values())}
    if not moe:
        hint = ""
        if other_blocks:
            hint = (f"; the checkpoint has MoE-like blocks named {sorted(other_blocks)}, "
                    f"which --arch {arch.name} does not use (another --arch?)")
        example = f"model.layers.0.{arch.blocks[0][0]}.gate.weight"
        raise ConvertError(f"no MoE layers for --arch {arch.name} in {ck.describe()}: expected "
                           f"tensors like {example}{hint}")
    prefixes = sorted({p for p, _ in moe})
    if len(prefixes) > 1:
        raise ConvertError(f"MoE layers under several prefixes {prefixes} in {ck.describe()}; "
                           f"convert one model at a time")
    prefix = prefixes[0]
    all_layers = sorted({l for p, l in by_layer if p == prefix})
    found = sorted(l for _, l in moe)
    if layers is not None:
        missing = sorted(layers - set(found))
        if missing:
            raise ConvertError(f"--layers asks for {missing}, which have no MoE block "
                               f"(MoE layers here: {_ranges(found)})")
        found = [l for l in found if l in layers]

    plans: list[LayerPlan] = []
    dims: dict[str, int] = {}
    gated_any: set[bool] = set()
    for L in found:
        present = moe[(prefix, L)]
        if len(present) > 1:
            raise ConvertError(f"layer {L} has MoE tensors under both {prefix}.{L}."
                               f"{' and '.join(sorted(present))}; expected one block")
        block = next(iter(present))
        lp = _plan_layer(ck, arch, f"{prefix}.{L}.{block}", L, blocks[block], present[block],
                         dims)
        gated_any.add("shared_expert_gate" in lp.names)
        plans.append(lp)
    if len(gated_any) > 1:
        raise ConvertError("some layers have mlp.shared_expert_gate.weight and some do not; all "
                           "layers must agree")
    E, H, I, S = dims["E"], dims["H"], dims["I"], dims.get("S", 0)

    route = {"top_k": arch.top_k, "norm_topk_prob": arch.norm_topk_prob, "scoring": arch.scoring}
    if config is not None:
        _check_config(config, arch, E, H, I, S)
        route["top_k"] = config.get("num_experts_per_tok",
                                    arch.config_defaults.get("num_experts_per_tok", arch.top_k))
        if arch.norm_key:
            route["norm_topk_prob"] = bool(config.get(
                "norm_topk_prob", arch.config_defaults.get("norm_topk_prob", arch.norm_topk_prob)))
    k = route["top_k"]
    if isinstance(k, bool) or not isinstance(k, int) or not 1 <= k <= E:
        raise ConvertError(f"top_k = {k!r} (num_experts_per_tok) must be an integer in 1 .. {E} "
                           f"(the router has {E} experts)")
    first = plans[0]
    some = first.names["gate"][0] if first.form == "per-expert" else first.names["gate_up"]
    skipped = [l for l in all_layers
               if l not in {p.index for p in plans} and (layers is None or l in layers)]
    return Plan(arch, plans, {"E": E, "H": H, "I": I, "S": S}, gated_any == {True}, route,
                skipped, ck.dtype(some))


def _plan_layer(ck: Checkpoint, arch: Arch, base: str, L: int, proj: tuple[str, str, str],
                rests: set[str], dims: dict[str, int]) -> LayerPlan:
    router = f"{base}.gate.weight"
    _want(ck, router, None, f"the router of layer {L}, [E, H]")
    rs = ck.shape(router)
    if len(rs) != 2 or 0 in rs:
        raise ConvertError(f"{ck.file_of(router)}: tensor {router} has shape {list(rs)}, expected "
                           f"[E, H] (the router)")
    if "E" in dims and rs != (dims["E"], dims["H"]):
        raise ConvertError(f"{ck.file_of(router)}: tensor {router} has shape {list(rs)}, expected "
                           f"[{dims['E']}, {dims['H']}] like the layers before it")
    E, H = rs
    dims.setdefault("E", E)
    dims.setdefault("H", H)
    names: dict[str, Any] = {"router": router}
    fused = {"experts.gate_up_proj", "experts.down_proj"} & rests
    per = {r for r in rests if re.match(r"experts\.\d+\.", r)}
    if fused and per:
        raise ConvertError(f"layer {L} has both fused ({base}.experts.gate_up_proj) and per-expert "
                           f"({base}.experts.N...) expert tensors; expected one form")
    if fused:
        gu, dn = f"{base}.experts.gate_up_proj", f"{base}.experts.down_proj"
        _want(ck, gu, None, f"the fused gate and up projections of layer {L}, [E, 2I, H]")
        _want(ck, dn, None, f"the fused down projections of layer {L}, [E, H, I]")
        a, b = ck.shape(gu), ck.shape(dn)
        if len(a) == 3 and a[0] == E and a[2] == H and a[1] % 2 == 0 and a[1] and \
                b == (E, H, a[1] // 2):
            form, I = "fused", a[1] // 2
        elif len(a) == 3 and a[0] == E and a[1] == H and a[2] % 2 == 0 and a[2] and \
                b == (E, a[2] // 2, H):
            raise ConvertError(
                f"{ck.file_of(gu)}: tensors {gu} {list(a)} and {dn} {list(b)} are in the transposed "
                f"fused layout [E, H, 2I] and [E, I, H]; transformers stores --arch {arch.name} as "
                f"[E, 2I, H] (gate rows, then up rows) and [E, H, I]. The gate/up order of the "
                f"transposed layout differs between models (halves in Llama 4, interleaved in "
                f"GPT-OSS), so it is not guessed: transpose the tensors to that layout first")
        else:
            raise ConvertError(
                f"{ck.file_of(gu)}: tensors {gu} {list(a)} and {dn} {list(b)} do not fit the fused "
                f"layout [E, 2I, H] and [E, H, I] (nor its transpose [E, H, 2I] and [E, I, H]) "
                f"with E={E}, H={H} from {router}")
        names.update(gate_up=gu, down=dn)
    else:
        form = "per-expert"
        idx = sorted({int(r.split(".")[1]) for r in per})
        extra = [e for e in idx if e >= E]
        if extra:
            raise ConvertError(f"layer {L} has expert {extra[0]} ({base}.experts.{extra[0]}...) but "
                               f"its router {router} has only {E} rows")
        g0 = f"{base}.experts.0.{proj[0]}.weight"
        _want(ck, g0, None, f"expert 0's gate projection of layer {L}, [I, H]")
        gs = ck.shape(g0)
        if len(gs) != 2 or gs[1] != H or gs[0] == 0:
            raise ConvertError(f"{ck.file_of(g0)}: tensor {g0} has shape {list(gs)}, expected "
                               f"[I, {H}] (H={H} from {router})")
        I = gs[0]
        if "I" in dims:
            I = dims["I"]
        shapes = ((I, H), (I, H), (H, I))
        lists: tuple[list[str], list[str], list[str]] = ([], [], [])
        for e in range(E):
            for j, (p, shp, lst) in enumerate(zip(proj, shapes, lists)):
                n = f"{base}.experts.{e}.{p}.weight"
                _want(ck, n, shp, f"expert {e}'s {('gate', 'up', 'down')[j]} projection of "
                                  f"layer {L}, [{'I, H' if j < 2 else 'H, I'}] with I={I}, H={H}")
                lst.append(n)
        names.update(gate=lists[0], up=lists[1], down=lists[2])
    if "I" in dims and I != dims["I"]:
        raise ConvertError(f"layer {L}'s experts have I={I}, but the layers before have "
                           f"I={dims['I']} ({base})")
    dims.setdefault("I", I)
    _plan_shared(ck, arch, base, L, rests, names, dims)
    return LayerPlan(L, base, form, names)


def _plan_shared(ck: Checkpoint, arch: Arch, base: str, L: int, rests: set[str],
                 names: dict[str, Any], dims: dict[str, int]) -> None:
    H = dims["H"]
    have = [r for r in rests if r.startswith("shared_expert")]
    if not have:
        if dims.get("S"):
            raise ConvertError(f"tensor {base}.shared_expert.gate_proj.weight is missing (layer "
                               f"{L}; the layers before have a shared expert); searched "
                               f"{ck.describe()}")
        dims["S"] = 0
        return
    if not arch.shared_expert:
        raise ConvertError(f"layer {L} has a shared expert ({base}.{sorted(have)[0]}), which "
                           f"--arch {arch.name} does not have (qwen2_moe does)")
    sg = f"{base}.shared_expert.gate_proj.weight"
    _want(ck, sg, None, f"the shared expert's gate projection of layer {L}, [S, H]")
    s = ck.shape(sg)
    if len(s) != 2 or s[1] != H or s[0] == 0:
        raise ConvertError(f"{ck.file_of(sg)}: tensor {sg} has shape {list(s)}, expected [S, {H}]")
    S = s[0]
    if dims.get("S", S) != S:
        raise ConvertError(f"{ck.file_of(sg)}: tensor {sg} has S={S}, but the layers before have "
                           f"S={dims['S']}")
    dims["S"] = S
    for key, p, shp in (("shared_gate", "gate_proj", (S, H)), ("shared_up", "up_proj", (S, H)),
                        ("shared_down", "down_proj", (H, S))):
        n = f"{base}.shared_expert.{p}.weight"
        _want(ck, n, shp, f"the shared expert's {p} of layer {L}, "
                          f"[{'S, H' if p != 'down_proj' else 'H, S'}] with S={S}, H={H}")
        names[key] = n
    seg = f"{base}.shared_expert_gate.weight"
    if seg in ck:
        if ck.shape(seg) not in ((1, H), (H,)):
            raise ConvertError(f"{ck.file_of(seg)}: tensor {seg} has shape {list(ck.shape(seg))}, "
                               f"expected [1, {H}]")
        names["shared_expert_gate"] = seg


def _check_config(cfg: dict, arch: Arch, E: int, H: int, I: int, S: int) -> None:
    mt = cfg.get("model_type")
    if isinstance(mt, str) and mt in ARCHS and mt != arch.name:
        raise ConvertError(f"config.json says model_type {mt!r}, but --arch is {arch.name!r}")
    checks = [(arch.experts_key, E, "experts (router rows)"), ("hidden_size", H, "hidden size"),
              (arch.inter_key, I, "expert intermediate size")]
    if S:
        checks.append(("shared_expert_intermediate_size", S, "shared expert size"))
    for key, got, what in checks:
        v = cfg.get(key)
        if v is not None and v != got:
            raise ConvertError(f"config.json has {key} = {v!r}, but the tensors give {got} "
                               f"({what}): is it this checkpoint's config?")


def _ranges(xs: Sequence[int]) -> str:
    out, xs = [], sorted(xs)
    i = 0
    while i < len(xs):
        j = i
        while j + 1 < len(xs) and xs[j + 1] == xs[j] + 1:
            j += 1
        out.append(str(xs[i]) if i == j else f"{xs[i]}-{xs[j]}")
        i = j + 1
    return ",".join(out)


def parse_layers(spec: str) -> set[int]:
    """"0-3,7" -> {0, 1, 2, 3, 7}."""
    out: set[int] = set()
    for part in spec.split(","):
        a, sep, b = part.strip().partition("-")
        if not a.isdigit() or (sep and not b.isdigit()):
            raise ValueError(f"bad layer range {part!r}: expected N or N-M, comma separated")
        lo, hi = int(a), int(b) if sep else int(a)
        if hi < lo:
            raise ValueError(f"bad layer range {part!r}: {hi} < {lo}")
        out.update(range(lo, hi + 1))
    return out


# ------------------------------------------------------------------ converting

def _f32(ck: Checkpoint, name: str, index=None) -> np.ndarray:
    raw = ck.raw(name)
    if index is not None:
        raw = raw[index]  # slice before converting: only the part needed is widened
    return raw_to_float32(raw, ck.dtype(name))


def load_layer(ck: Checkpoint, p: LayerPlan, I: int) -> dict[str, np.ndarray]:
    """The float32 weights of one layer, in save_model's layout."""
    n = p.names
    out: dict[str, np.ndarray] = {"router": _f32(ck, n["router"])}
    if p.form == "per-expert":
        for key in ("gate", "up", "down"):
            first = _f32(ck, n[key][0])
            a = np.empty((len(n[key]),) + first.shape, np.float32)
            a[0] = first
            for e in range(1, len(n[key])):
                a[e] = _f32(ck, n[key][e])
            out[key] = a
    else:  # fused: [E, 2I, H], gate rows then up rows; [E, H, I]
        out["gate"] = _f32(ck, n["gate_up"], np.s_[:, :I, :])
        out["up"] = _f32(ck, n["gate_up"], np.s_[:, I:, :])
        out["down"] = _f32(ck, n["down"])
    for key in ("shared_gate", "shared_up", "shared_down"):
        if key in n:
            out[key] = _f32(ck, n[key])
    if "shared_expert_gate" in n:
        out["shared_expert_gate"] = _f32(ck, n["shared_expert_gate"]).reshape(-1)
    return out


class Progress:
    """One line per layer on a stream; a bar redrawn in place when the stream is a terminal."""

    def __init__(self, total: int, stream=None, enabled: bool = True):
        self.total, self.stream, self.enabled = total, stream or sys.stderr, enabled
        self.tty = enabled and hasattr(self.stream, "isatty") and self.stream.isatty()
        self.t0 = time.monotonic()

    def update(self, done: int, label: str) -> None:
        if not self.enabled:
            return
        el = time.monotonic() - self.t0
        if self.tty:
            width = 30
            fill = width * done // max(self.total, 1)
            eta = el / done * (self.total - done) if done else 0.0
            self.stream.write(f"\r\033[K[{'#' * fill}{'.' * (width - fill)}] {done}/{self.total} "
                              f"layers  {label}  {el:.0f} s, {eta:.0f} s left")
        else:
            self.stream.write(f"convert: layer {done}/{self.total} {label} ({el:.1f} s)\n")
        self.stream.flush()

    def finish(self) -> None:
        if self.tty:
            self.stream.write("\n")
            self.stream.flush()


def default_weight_dtype(source_dtype: str) -> str:
    """Lossless by default: a BF16 checkpoint stays bf16, anything else becomes f32."""
    return "bf16" if source_dtype == "BF16" else "f32"


def convert(sources: Sequence[str | Path], out: str | Path, *, arch: str | None = None,
            weight_dtype: str | None = None, config: str | Path | None = None,
            layers: set[int] | None = None,
            progress: Callable[[int, int, str], None] | None = None,
            ) -> dict[str, Any]:
    """Convert a checkpoint's MoE layers to a Colibri model file at `out`.

    arch: a key of ARCHS (default: config.json's model_type). weight_dtype: one of
    quant.DTYPES (default: bf16 for a BF16 checkpoint, else f32). config: a config.json
    (default: config.json beside the first source, if there is one). layers: checkpoint
    layer numbers to convert (default: every MoE layer). progress(done, total, label) is
    called after each layer. Returns a summary dict. Raises ConvertError (or SafetensorsError,
    both ValueError) for a checkpoint it cannot convert, OSError for I/O."""
    files, cfg_dir = resolve_sources(sources)
    cfg, cfg_path = load_config(Path(config) if config is not None else cfg_dir / "config.json",
                                explicit=config is not None)
    if arch is None:
        mt = (cfg or {}).get("model_type")
        if mt not in ARCHS:
            raise ConvertError(f"--arch is needed (one of {', '.join(ARCHS)})" + (
                f": config.json's model_type {mt!r} is not one of them" if mt else ""))
        arch = mt
    if arch not in ARCHS:
        raise ConvertError(f"unknown --arch {arch!r}; expected one of {', '.join(ARCHS)}")
    if weight_dtype is not None and weight_dtype not in quant.DTYPES:
        raise ConvertError(f"unknown --weight-dtype {weight_dtype!r}; expected one of "
                           f"{', '.join(quant.DTYPES)}")
    t0 = time.monotonic()
    ck = Checkpoint(files)
    try:
        pl = plan(ck, ARCHS[arch], cfg, layers)
        wdt = weight_dtype or default_weight_dtype(pl.source_dtype)
        I = pl.dims["I"]
        # expect=: payloads go straight into the output, a large model is written once
        with ModelWriter(out, weight_dtype=wdt,
                         expect=(len(pl.layers), pl.dims["E"])) as writer:
            for i, lp in enumerate(pl.layers):
                d = load_layer(ck, lp, I)
                d.update(pl.route)
                try:
                    writer.add_layer(d)
                except (TypeError, ValueError) as e:
                    raise ConvertError(f"layer {lp.index} ({lp.base}): {e}") from None
                del d
                if progress is not None:
                    progress(i + 1, len(pl.layers), f"{lp.base} ({lp.form})")
        info = writer.info
    finally:
        ck.close()
    dims = pl.dims
    return {
        "out": str(out), "arch": arch, "weight_dtype": wdt, "source_dtype": pl.source_dtype,
        "sources": [str(f) for f in files], "config": str(cfg_path) if cfg_path else None,
        "layers": [p.index for p in pl.layers], "forms": sorted({p.form for p in pl.layers}),
        "skipped_layers": pl.skipped, "n_layers": len(pl.layers), "hidden": dims["H"],
        "inter": dims["I"], "n_experts": dims["E"], "shared_inter": dims["S"],
        "shared_gated": pl.gated, **pl.route, "file_size": info["file_size"],
        "n_tensors": info["n_tensors"], "seconds": round(time.monotonic() - t0, 3),
    }


# ------------------------------------------------------------------ command line

DESCRIPTION = ("Convert the MoE layers (router, experts, shared expert) of a Hugging Face "
               "safetensors checkpoint to a Colibri model file. Tensors are found by their "
               "Hugging Face names, per expert (mlp.experts.N.gate_proj.weight; Mixtral's "
               "block_sparse_moe.experts.N.w1.weight) or fused (mlp.experts.gate_up_proj); "
               "routing comes from --arch and the checkpoint's config.json.")
EPILOG = (f"Exit status: {EXIT_OK} the model file was written; {EXIT_FAILED} the checkpoint "
          f"could not be converted (the missing or mis-shaped tensor and its file on stderr; "
          f"nothing is written); {EXIT_USAGE} usage error.")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("sources", nargs="+", metavar="SRC",
                   help="a .safetensors file, a sharded checkpoint's *.safetensors.index.json, or "
                        "a directory holding them (repeatable: the shards of one checkpoint)")
    p.add_argument("--out", required=True, metavar="MODEL.colibri",
                   help="the model file to write (replaced atomically)")
    p.add_argument("--arch", choices=list(ARCHS),
                   help="the checkpoint's architecture (default: config.json's model_type)")
    p.add_argument("--weight-dtype", choices=list(quant.DTYPES),
                   help="storage of the expert weights (default: bf16 for a BF16 checkpoint, "
                        "else f32: lossless; int4 is the 4.5-bit format, int4g32 the older 5-bit one)")
    p.add_argument("--config", metavar="config.json",
                   help="the checkpoint's Hugging Face config (default: config.json beside the "
                        "first SRC, if any)")
    p.add_argument("--layers", metavar="N-M,...",
                   help="convert only these checkpoint layers (default: every MoE layer)")
    p.add_argument("--json", action="store_true", help="print the summary as JSON on stdout")
    p.add_argument("--quiet", action="store_true", help="no progress on stderr")


def run(args: argparse.Namespace) -> int:
    try:
        layers = parse_layers(args.layers) if args.layers else None
    except ValueError as e:
        print(f"colibri convert: --layers: {e}", file=sys.stderr)
        return EXIT_USAGE
    bar: Progress | None = None

    def progress(done: int, total: int, label: str) -> None:
        nonlocal bar
        if bar is None:
            bar = Progress(total, enabled=not args.quiet)
        bar.update(done, label)

    try:
        summary = convert(args.sources, args.out, arch=args.arch, weight_dtype=args.weight_dtype,
                          config=args.config, layers=layers, progress=progress)
    except (ConvertError, SafetensorsError) as e:
        msg = str(e)
    except OSError as e:
        msg = f"{e.filename or args.out}: {e.strerror or e}"
    else:
        msg = None
    if bar is not None:
        bar.finish()
    if msg is not None:
        print(f"colibri convert: {msg}", file=sys.stderr)
        return EXIT_FAILED
    if args.json:
        json.dump(summary, sys.stdout, indent=1)
        print()
        return EXIT_OK
    s = summary
    norm = "renormalised" if s["norm_topk_prob"] else "not renormalised"
    shared = (f", shared expert S={s['shared_inter']}"
              f"{' (sigmoid-gated)' if s['shared_gated'] else ''}" if s["shared_inter"] else "")
    print(f"wrote {s['out']}: {s['n_layers']} MoE layers ({_ranges(s['layers'])}), "
          f"E={s['n_experts']} H={s['hidden']} I={s['inter']}{shared}, top-{s['top_k']} "
          f"{s['scoring']} {norm}, {s['source_dtype']} -> {s['weight_dtype']}, "
          f"{s['file_size'] / 1e6:.1f} MB in {s['seconds']:.1f} s")
    if s["skipped_layers"]:
        print(f"skipped layers without an MoE block: {_ranges(s['skipped_layers'])}")
    return EXIT_OK
