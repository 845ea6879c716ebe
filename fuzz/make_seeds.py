"""Writes the fuzzer's seed corpus, fuzz/corpus/seed/: small valid model files.

    python fuzz/make_seeds.py [OUT_DIR]

Tiny shapes (H 8, I 4, E 4) so each file is a few KB and the fuzzer's mutations
land in the structure rather than in weights; between them the seeds cover every
weight dtype, a gated and an ungated shared expert, fixed and dynamic routing,
both scorings, several layers, tensors shared across layers and a larger alignment.
Deterministic: the same bytes on every run (fixed seeds, no timestamps), so the
committed corpus can be checked against this script (tests/engine/test_fuzz.py).
"""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from colibri.modelfile import save_model  # noqa: E402

SEED_DIR = Path(__file__).resolve().parent / "corpus" / "seed"
H, I, E, S = 8, 4, 4, 6


def layer(seed: int, *, shared: bool = False, gated: bool = False, **route) -> dict:
    rng = np.random.default_rng(seed)
    f = lambda *shape: rng.standard_normal(shape).astype(np.float32)  # noqa: E731
    d = dict(router=f(E, H), gate=f(E, I, H), up=f(E, I, H), down=f(E, H, I))
    if shared:
        d.update(shared_gate=f(S, H), shared_up=f(S, H), shared_down=f(H, S))
        if gated:
            d["shared_expert_gate"] = f(H)
    d.update(route or dict(top_k=2))
    return d


def seeds() -> dict[str, tuple[list[dict], dict]]:
    """file name -> (layers, save_model keywords)."""
    out = {}
    for dtype in ("f32", "bf16", "int8", "int4g32", "int4"):
        out[f"one_layer_{dtype}"] = ([layer(1)], dict(weight_dtype=dtype))
        out[f"shared_gated_{dtype}"] = ([layer(2, shared=True, gated=True)],
                                        dict(weight_dtype=dtype))
    out["shared_ungated_int8"] = ([layer(3, shared=True)], dict(weight_dtype="int8"))
    out["three_layers_bf16"] = ([layer(10 + l) for l in range(3)], dict(weight_dtype="bf16"))
    # One layer dict written twice: the writer stores its tensors once, named by both layers.
    same = layer(20, shared=True, gated=True)
    out["shared_tensors_f32"] = ([same, same], dict(weight_dtype="f32"))
    out["dynamic_softmax_f32"] = ([layer(30, dyn_p=0.6, k_min=1, k_max=3)],
                                  dict(weight_dtype="f32"))
    out["softmax_topk_int8"] = ([layer(31, top_k=3, scoring="softmax_topk",
                                       norm_topk_prob=False)], dict(weight_dtype="int8"))
    out["align256_bf16"] = ([layer(40), layer(41)], dict(weight_dtype="bf16", alignment=256))
    return out


def write(out_dir: Path = SEED_DIR) -> list[Path]:
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = []
    for name, (layers, kw) in sorted(seeds().items()):
        path = out_dir / f"{name}.colibri"
        save_model(path, layers, **kw)
        paths.append(path)
    return paths


if __name__ == "__main__":
    for p in write(Path(sys.argv[1]) if len(sys.argv) > 1 else SEED_DIR):
        print(f"{p.stat().st_size:7d}  {p}")
