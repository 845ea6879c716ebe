"""`tuner run --shape-of PATH` (tuner/measure/model_shape.py): a model's MoE shape from a
transformers config.json or a .colibri header, named as the tuner names shapes
(problems.shape_name): a reference shape's name where the sizes are one's, else spelled out."""
import json

import numpy as np
import pytest

import colibri
from tuner.cli import run_config
from tuner.measure import model_shape, problems


def _config(tmp_path, **cfg):
    d = tmp_path / cfg.get("model_type", "m")
    d.mkdir(exist_ok=True)
    (d / "config.json").write_text(json.dumps(cfg))
    return d


def test_published_configs_name_the_reference_shapes(tmp_path):
    qwen3 = _config(tmp_path, model_type="qwen3_moe", hidden_size=2048, moe_intermediate_size=768,
                    num_experts=128, num_experts_per_tok=8, norm_topk_prob=True)
    assert model_shape.register(qwen3) == "qwen3-30b-a3b"
    assert model_shape.register(qwen3 / "config.json") == "qwen3-30b-a3b"
    mixtral = _config(tmp_path, model_type="mixtral", hidden_size=4096, intermediate_size=14336,
                      num_local_experts=8, num_experts_per_tok=2)
    assert model_shape.register(mixtral) == "mixtral-8x7b"
    olmoe = _config(tmp_path, model_type="olmoe", hidden_size=2048, intermediate_size=1024,
                    num_experts=64, num_experts_per_tok=8)
    assert model_shape.register(olmoe) == "olmoe-1b-7b"
    qwen2 = _config(tmp_path, model_type="qwen2_moe", hidden_size=2048, moe_intermediate_size=1408,
                    num_experts=60, num_experts_per_tok=4, shared_expert_intermediate_size=5632)
    assert model_shape.register(qwen2) == "qwen1.5-moe-a2.7b"
    ds = _config(tmp_path, model_type="deepseek_v2", hidden_size=2048, moe_intermediate_size=1408,
                 n_routed_experts=64, num_experts_per_tok=6, n_shared_experts=2)
    assert model_shape.register(ds) == "deepseek-v2-lite"


def test_other_sizes_are_spelled_out_and_a_worker_knows_them_by_name(tmp_path):
    d = _config(tmp_path, model_type="qwen3_moe", hidden_size=1024, moe_intermediate_size=512,
                num_experts=32, num_experts_per_tok=4)
    name = model_shape.register(d)
    assert name == "h1024-i512-e32-k4"       # transformers' default: norm_topk_prob false
    p = problems.problem(f"{name}/decode/int8")
    assert (p.H, p.I, p.E, p.k, p.norm, p.S) == (1024, 512, 32, 4, False, 0)
    assert problems.path_of(problems.problem(f"{name}/{problems.path_phase(name, 'gemm')}/f32")) == "gemm"


def test_a_colibri_model_file_gives_its_shape(tmp_path):
    rng = np.random.default_rng(0)
    w = lambda *s: rng.standard_normal(s, dtype=np.float32)  # noqa: E731
    path = tmp_path / "m.colibri"
    colibri.save_model(path, [dict(router=w(6, 64), gate=w(6, 48, 64), up=w(6, 48, 64),
                                   down=w(6, 64, 48), top_k=2, shared_gate=w(16, 64),
                                   shared_up=w(16, 64), shared_down=w(64, 16),
                                   shared_expert_gate=w(64))])
    assert model_shape.register(path) == "h64-i48-e6-k2-s16g-norm"


def test_what_is_not_a_moe_model_is_refused_by_name(tmp_path):
    dense = _config(tmp_path, model_type="llama", hidden_size=4096, intermediate_size=11008)
    with pytest.raises(model_shape.ShapeError, match="model_type 'llama' is not a MoE"):
        model_shape.register(dense)
    with pytest.raises(model_shape.ShapeError, match="without a config.json"):
        model_shape.register(tmp_path / "llama" / ".." / "..")
    bad = _config(tmp_path, model_type="mixtral", hidden_size=4096, intermediate_size=-1,
                  num_local_experts=8, num_experts_per_tok=2)
    with pytest.raises(model_shape.ShapeError, match="intermediate_size is -1"):
        model_shape.register(bad)
    (tmp_path / "junk.colibri").write_bytes(b"junk")
    with pytest.raises(model_shape.ShapeError, match="not a readable Colibri model file"):
        model_shape.register(tmp_path / "junk.colibri")


def test_the_run_options_take_shapes_and_refuse_a_mix_with_problems(tmp_path):
    import argparse

    from colibri._cli import UsageError
    from tuner.__main__ import build_parser

    d = _config(tmp_path, model_type="olmoe", hidden_size=2048, intermediate_size=1024,
                num_experts=64, num_experts_per_tok=8)
    args = build_parser().parse_args(["run", "--shape", "mixtral-8x7b", "--shape-of", str(d)])
    assert run_config(args).shapes == ("mixtral-8x7b", "olmoe-1b-7b")
    args = build_parser().parse_args(["run", "--shape", "nope"])
    with pytest.raises(UsageError, match="unknown shape"):
        run_config(args)
    args = build_parser().parse_args(["run", "--shape", "tiny", "--problem", "tiny/decode/f32"])
    with pytest.raises(UsageError, match="does not go with"):
        run_config(args)
    assert isinstance(args, argparse.Namespace)
