"""The problems the tuner times: a reference model shape, a phase (decode T=1 or
prefill), and a weight dtype. Data, not branches: add a shape or a phase here."""
from __future__ import annotations

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
    if shape not in SHAPES:
        raise ValueError(f"unknown shape {shape!r}; known: {', '.join(SHAPES)}")
    if dtype not in DTYPES:
        raise ValueError(f"unknown dtype {dtype!r}; known: {', '.join(DTYPES)}")
    base = phase.rstrip("0123456789")
    if base not in PHASES:
        raise ValueError(f"unknown phase {phase!r}; known: decode, prefill, prefillN")
    T = int(phase[len(base):]) if phase != base else PHASES[base]
    s = SHAPES[shape]
    return Problem(shape=shape, phase=phase, dtype=dtype, T=T, H=s["H"], I=s["I"], E=s["E"],
                   k=s["k"], scoring=s["scoring"], norm=s["norm"], S=s.get("S", 0),
                   gated=s.get("gated", False))


# Kernel paths (the knobs file's `domain: paths`). An expert with <= 2 tokens runs the
# decode kernels (CB_DECODE_MAX_TOKENS in the template), one with gemm_min_tokens (16 by
# default) or more the gemm paths, one in between the prefill dot kernels. A problem
# stands for the path its mean tokens per expert (T * k / E) falls on, and a path is
# tuned on the problem of the shape that gives this many tokens per expert (routing
# spreads them: some experts get fewer, some more).
DECODE_MAX_TOKENS = 2
GEMM_FROM_TOKENS = 16
PATH_TOKENS = {"prefill": 8, "gemm": 32}

DEFAULT_SHAPE = "qwen3-30b-a3b"


def path_of(p: Problem) -> str:
    """The kernel path problem p exercises most: decode, prefill or gemm."""
    per_expert = p.T * p.k / p.E
    if p.T <= DECODE_MAX_TOKENS or per_expert <= DECODE_MAX_TOKENS:
        return "decode"
    return "gemm" if per_expert >= GEMM_FROM_TOKENS else "prefill"


def path_phase(shape: str, path: str) -> str:
    """The phase of `shape` that exercises `path`: decode, or prefillN with N tokens giving
    PATH_TOKENS[path] tokens per expert (qwen3-30b-a3b: prefill128 and prefill512)."""
    if path == "decode":
        return "decode"
    s = SHAPES[shape]
    return f"prefill{PATH_TOKENS[path] * s['E'] // s['k']}"


def covering(shape: str, cells) -> tuple[str, ...]:
    """Problem names of `shape` that cover (path, dtype) cells, in the cells' order."""
    return tuple(dict.fromkeys(f"{shape}/{path_phase(shape, path)}/{dtype}" for path, dtype in cells))
