"""The problems the tuner times: a model shape, a phase (decode T=1 or prefill), and a
weight dtype. Data, not branches: add a shape or a phase here.

A shape is a reference model's name (SHAPES) or the name shape_name() gives any other
set of sizes, which spells them out ("h2048-i1408-e60-k4-s5632g": hidden, expert inter,
experts, top-k, a shared expert of 5632, gated; "-topk" for softmax over the top-k
logits, "-norm" for renormalised weights), so that a worker process knows it by name."""
from __future__ import annotations

import re
from dataclasses import asdict, dataclass

# Reference shapes (DESIGN.md), facts from the models' published configs.
SHAPES = {
    "qwen3-30b-a3b": dict(H=2048, I=768, E=128, k=8, scoring="softmax", norm=True),
    "mixtral-8x7b": dict(H=4096, I=14336, E=8, k=2, scoring="softmax", norm=True),
    "olmoe-1b-7b": dict(H=2048, I=1024, E=64, k=8, scoring="softmax", norm=False),
    "qwen1.5-moe-a2.7b": dict(H=2048, I=1408, E=60, k=4, scoring="softmax", norm=False,
                              S=5632, gated=True),
    "deepseek-v2-lite": dict(H=2048, I=1408, E=64, k=6, scoring="softmax", norm=False,
                             S=2816, gated=False),
    # not a model: small enough for the tuner's own tests and smoke runs
    "tiny": dict(H=256, I=128, E=16, k=4, scoring="softmax", norm=True, S=64, gated=True),
}
PHASES = {"decode": 1, "prefill": 128}
_SPELLED = re.compile(r"h(\d+)-i(\d+)-e(\d+)-k(\d+)(?:-s(\d+)(g?))?(-topk)?(-norm)?")


def shape_dims(shape: str) -> dict:
    """The sizes and routing of a shape name (a reference shape or a spelled-out one)."""
    if shape in SHAPES:
        return SHAPES[shape]
    m = _SPELLED.fullmatch(shape)
    if not m:
        raise ValueError(f"unknown shape {shape!r}; known: {', '.join(SHAPES)}, or sizes spelled "
                         f"out as h<H>-i<I>-e<E>-k<k>[-s<S>[g]][-topk][-norm]")
    H, I, E, k = (int(m.group(i)) for i in range(1, 5))
    if not (1 <= k <= E and min(H, I) >= 1):
        raise ValueError(f"shape {shape!r}: needs 1 <= k <= E and sizes >= 1")
    return dict(H=H, I=I, E=E, k=k, scoring="softmax_topk" if m.group(7) else "softmax",
                norm=bool(m.group(8)), S=int(m.group(5) or 0), gated=bool(m.group(6)))


def shape_name(dims: dict) -> str:
    """A reference shape with exactly these sizes and routing, else the spelled-out name."""
    want = dict(dims, S=dims.get("S", 0), gated=bool(dims.get("gated", False)))
    for name, s in SHAPES.items():
        if name != "tiny" and dict(s, S=s.get("S", 0), gated=s.get("gated", False)) == want:
            return name
    name = f"h{want['H']}-i{want['I']}-e{want['E']}-k{want['k']}"
    if want["S"]:
        name += f"-s{want['S']}" + ("g" if want["gated"] else "")
    name += ("-topk" if want["scoring"] == "softmax_topk" else "") + ("-norm" if want["norm"] else "")
    shape_dims(name)  # checks it
    return name
from colibri.quant import DTYPES, stored_bytes


@dataclass(frozen=True)
class Problem:
    shape: str
    phase: str
    dtype: str
    T: int
    H: int
    I: int
    E: int
    k: int
    scoring: str = "softmax"
    norm: bool = True
    S: int = 0
    gated: bool = False

    @property
    def name(self) -> str:
        return f"{self.shape}/{self.phase}/{self.dtype}"

    @property
    def part(self) -> str:
        """The kernel part that serves this dtype (colibri_build.parts.part_of): a knob
        domain's dtypes are parts."""
        from colibri_build.parts import part_of
        return part_of(self.dtype)

    def to_dict(self) -> dict:
        return asdict(self)

    @property
    def expert_bytes(self) -> int:
        """Bytes of one routed expert's three matrices in this dtype, scales included."""
        return 2 * stored_bytes(self.dtype, self.I, self.H) + stored_bytes(self.dtype, self.H, self.I)

    @property
    def shared_bytes(self) -> int:
        """Bytes of the shared expert's three matrices (0 without one)."""
        return (2 * stored_bytes(self.dtype, self.S, self.H) + stored_bytes(self.dtype, self.H, self.S)
                if self.S else 0)

    @property
    def layer_bytes(self) -> int:
        """Weight bytes of the whole layer: every expert, the shared expert, the router."""
        return self.E * self.expert_bytes + self.shared_bytes + self.E * self.H * 4

    @property
    def reread_bytes(self) -> int:
        """Weight bytes every call of the layer reads again, whichever experts it routes to:
        the shared expert and the router, where there is a shared expert (else 0: the
        router alone is too small to count; bandwidth.resident_copies)."""
        return self.shared_bytes + self.E * self.H * 4 if self.S else 0

    @property
    def decode_bytes(self) -> int:
        """Weight bytes one decode token streams: k experts, the shared expert, the router."""
        return self.k * self.expert_bytes + self.shared_bytes + self.E * self.H * 4

    @property
    def flops(self) -> int:
        """Multiply-adds x 2 of one call: T tokens x (k experts + shared) x 3 matrices."""
        return 2 * self.T * (self.k * 3 * self.I * self.H + 3 * self.S * self.H + self.E * self.H)


def problem(name: str) -> Problem:
    """'shape/phase/dtype', e.g. 'qwen3-30b-a3b/decode/f32' (phase may be 'prefill512')."""
    try:
        shape, phase, dtype = name.split("/")
    except ValueError:
        raise ValueError(f"problem {name!r} is not 'shape/phase/dtype'") from None
    s = shape_dims(shape)
    if dtype not in DTYPES:
        raise ValueError(f"unknown dtype {dtype!r}; known: {', '.join(DTYPES)}")
    base = phase.rstrip("0123456789")
    if base not in PHASES:
        raise ValueError(f"unknown phase {phase!r}; known: decode, prefill, prefillN")
    T = int(phase[len(base):]) if phase != base else PHASES[base]
    return Problem(shape=shape, phase=phase, dtype=dtype, T=T, H=s["H"], I=s["I"], E=s["E"],
                   k=s["k"], scoring=s["scoring"], norm=s["norm"], S=s.get("S", 0),
                   gated=s.get("gated", False))


# Kernel paths (the knobs file's `domain: paths`). An expert with <= 2 tokens runs the
# decode kernels (CB_DECODE_MAX_TOKENS in the template), one with at least the gemm
# threshold the gemm paths, one in between the prefill kernels. The threshold is a knob:
# gemm_min_tokens_<dtype> (16 by default) for the row layouts, pk_gemm_min_tokens_<dtype>
# (128 by default) where an int dtype is packed (layout_<dtype>=interleaved): there the
# prefill class's weight-as-vector kernels run every expert below it. A problem stands
# for the path its mean tokens per expert (T * k / E) falls on, and a path is tuned on
# the problem of the shape that gives this many tokens per expert (routing spreads them:
# some experts get fewer, some more).
DECODE_MAX_TOKENS = 2
GEMM_FROM_TOKENS = 16
PATH_TOKENS = {"prefill": 8, "gemm": 32}

DEFAULT_SHAPE = "qwen3-30b-a3b"


def gemm_from_tokens(dtype: str, knobs=None, amx: bool = False) -> float:
    """Tokens per expert from which `dtype` runs the gemm paths under `knobs` (the flat
    knob values of one shape class; None: the template's default row layouts), on a build
    whose flags give AMX tiles (`amx`) or not."""
    knobs = knobs or {}
    # packed int4 and int4g32 on AMX tiles (amx_int4_packed.j2), where they are built: from
    # both thresholds
    tiles4 = max(knobs.get("gemm_min_tokens_int4", GEMM_FROM_TOKENS), knobs.get("amx_int4_min_tokens", 24))
    if dtype == "int4":  # packed wherever there is an int dot; its only gemm path is the tiles
        return tiles4 if amx and knobs.get("amx_int4k", 1) else float("inf")
    from colibri_build.parts import part_of

    dtype = part_of(dtype)  # int4g32 runs on the int4 part's knobs
    if knobs.get(f"layout_{dtype}") == "interleaved":
        if dtype == "int4" and amx and knobs.get("amx_int4", 1):
            return min(tiles4, knobs.get("pk_gemm_min_tokens_int4", 128))
        if dtype == "int8" and amx and knobs.get("amx_int8", 1):  # its blocks as B tiles (amx_int_packed.j2)
            return knobs.get("gemm_min_tokens_int8", GEMM_FROM_TOKENS)
        # packed bf16 on AMX tiles, which read its blocks in place (amx_packed.j2), from the
        # gemm threshold; packed int experts switch to the int gemm; otherwise packed f32 and
        # bf16 have no gemm of their own: their weight-as-vector kernels serve every count
        if dtype == "bf16" and amx and knobs.get("amx_bf16", 1):
            return knobs.get("gemm_min_tokens_bf16", GEMM_FROM_TOKENS)
        return knobs.get(f"pk_gemm_min_tokens_{dtype}", float("inf") if dtype in ("f32", "bf16") else 128)
    return knobs.get(f"gemm_min_tokens_{dtype}", GEMM_FROM_TOKENS)


def path_of(p: Problem, knobs=None, amx: bool = False) -> str:
    """The kernel path problem p exercises most under `knobs` on a build with AMX tiles or
    not (gemm_from_tokens): decode, prefill or gemm."""
    per_expert = p.T * p.k / p.E
    if p.T <= DECODE_MAX_TOKENS or per_expert <= DECODE_MAX_TOKENS:
        return "decode"
    return "gemm" if per_expert >= gemm_from_tokens(p.dtype, knobs, amx) else "prefill"


def path_phase(shape: str, path: str) -> str:
    """The phase of `shape` that exercises `path`: decode, or prefillN with N tokens giving
    PATH_TOKENS[path] tokens per expert (qwen3-30b-a3b: prefill128 and prefill512)."""
    if path == "decode":
        return "decode"
    s = shape_dims(shape)
    return f"prefill{PATH_TOKENS[path] * s['E'] // s['k']}"


def covering(shape: str, cells) -> tuple[str, ...]:
    """Problem names of `shape` that cover (path, weight dtype) cells, in the cells' order."""
    return tuple(dict.fromkeys(f"{shape}/{path_phase(shape, path)}/{dtype}" for path, dtype in cells))
