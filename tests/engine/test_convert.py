"""colibri.convert: small Hugging Face-named safetensors checkpoints (each arch, per-expert
and fused forms, F32 and BF16 sources) converted, loaded by the engine and compared with
the float64 NumPy reference of the layer stack (h = h + moe(h)) at 1e-4 relative, as in
test_model_format; then every way a checkpoint can be wrong, by the message and exit code.
"""
from __future__ import annotations

import io
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from colibri import quant
from colibri.__main__ import main as colibri_main
from colibri.convert import (ARCHS, ConvertError, Progress, convert, default_weight_dtype,
                             parse_layers)
from colibri.model import Model
from colibri.modelfile import read_header
from colibri.safetensors import save_safetensors
from moe_data import assert_close, assert_engine, make_case
from test_model_format import engine_weights, layer_dict, reference_stack, stack_inputs

ROOT = Path(__file__).resolve().parents[2]
E, H, I, S = 4, 32, 16, 24
HF_PROJ = ("gate_proj", "up_proj", "down_proj")


def make_layers(n=2, *, shared=False, gated=True, seed=0, k=2, norm=True):
    kw = dict(S=S, gated=gated) if shared else {}
    return [layer_dict(make_case(H, I, E, k, norm=norm, seed=seed + 17 * l, **kw))
            for l in range(n)]


def hf_tensors(arch: str, form: str, layers, *, index=None, prefix="model.layers") -> dict:
    """The layers under Hugging Face names. index: checkpoint layer numbers (default 0..)."""
    t = {}
    for L, d in zip(index or range(len(layers)), layers):
        per = form == "per-expert"
        block = "block_sparse_moe" if arch == "mixtral" and per else "mlp"
        b = f"{prefix}.{L}.{block}"
        t[f"{b}.gate.weight"] = d["router"]
        if per:
            names = ("w1", "w3", "w2") if arch == "mixtral" else HF_PROJ
            for e in range(len(d["router"])):
                for key, n in zip(("gate", "up", "down"), names):
                    t[f"{b}.experts.{e}.{n}.weight"] = d[key][e]
        elif form == "fused":  # [E, 2I, H]: gate rows then up rows; down [E, H, I]
            t[f"{b}.experts.gate_up_proj"] = np.concatenate([d["gate"], d["up"]], axis=1)
            t[f"{b}.experts.down_proj"] = d["down"]
        else:  # fused-transposed: [E, H, 2I] and [E, I, H]
            t[f"{b}.experts.gate_up_proj"] = np.concatenate([d["gate"], d["up"]],
                                                            axis=1).transpose(0, 2, 1)
            t[f"{b}.experts.down_proj"] = d["down"].transpose(0, 2, 1)
        if d.get("shared_gate") is not None:
            for key, n in zip(("shared_gate", "shared_up", "shared_down"), HF_PROJ):
                t[f"{b}.shared_expert.{n}.weight"] = d[key]
            if d.get("shared_expert_gate") is not None:
                t[f"{b}.shared_expert_gate.weight"] = d["shared_expert_gate"].reshape(1, -1)
        # attention tensors a real checkpoint carries, which the converter must ignore
        t[f"{prefix}.{L}.self_attn.q_proj.weight"] = np.zeros((4, H), np.float32)
    t["model.embed_tokens.weight"] = np.zeros((3, H), np.float32)
    return t


def source_view(d: dict, src: str) -> dict:
    """A layer dict as stored in a `src` (F32 | BF16) checkpoint."""
    if src == "F32":
        return d
    return {k: quant.roundtrip(v, "bf16") if isinstance(v, np.ndarray) else v
            for k, v in d.items()}


def write_config(directory: Path, arch: str, **kw) -> Path:
    cfg = {"model_type": arch, "hidden_size": H, "num_experts_per_tok": 2,
           ARCHS[arch].experts_key: E, ARCHS[arch].inter_key: I, **kw}
    p = directory / "config.json"
    p.write_text(json.dumps(cfg))
    return p


def check_model(path: Path, layers: list[dict], wdt: str, T: int = 5) -> None:
    """The converted file, run by the engine, matches the float64 reference."""
    held = [engine_weights(d, wdt) for d in layers]
    x = stack_inputs(held, T)
    with Model.load(path) as m:
        assert m.n_layers == len(layers) and m.hidden == H
        assert_engine(m(x), reference_stack(x, held, dtype=wdt), wdt)


def cli(args, capsys) -> tuple[int, str, str]:
    rc = colibri_main(["convert", *map(str, args)])
    out, err = capsys.readouterr()
    return rc, out, err


# ------------------------------------------------------------------ round trips

NORM = {"qwen3_moe": True, "mixtral": True, "olmoe": False, "qwen2_moe": False}


@pytest.mark.parametrize("src", ["F32", "BF16"])
@pytest.mark.parametrize("form", ["per-expert", "fused"])
@pytest.mark.parametrize("arch", list(ARCHS))
def test_round_trip(tmp_path, lib, arch, form, src):
    shared = arch == "qwen2_moe"
    layers = [source_view(d, src) for d in make_layers(2, shared=shared, norm=NORM[arch])]
    for d in layers:
        d.update(top_k=2, norm_topk_prob=NORM[arch])
    p = tmp_path / "model.safetensors"
    save_safetensors(p, hf_tensors(arch, form, layers), dtype=src)
    cfg = {"norm_topk_prob": NORM[arch]} if ARCHS[arch].norm_key else {}
    if shared:
        cfg["shared_expert_intermediate_size"] = S
    write_config(tmp_path, arch, **cfg)  # found beside the file
    out = tmp_path / "m.colibri"
    s = convert([p], out, arch=arch)
    wdt = "bf16" if src == "BF16" else "f32"  # lossless default
    assert (s["weight_dtype"], s["source_dtype"], s["forms"]) == (wdt, src, [form])
    assert (s["n_layers"], s["n_experts"], s["hidden"], s["inter"]) == (2, E, H, I)
    assert s["config"] == str(tmp_path / "config.json") and s["layers"] == [0, 1]
    h = read_header(out)
    assert (h["top_k"], h["norm_topk_prob"], h["scoring"]) == (2, int(NORM[arch]), 0)
    assert (h["shared_inter"], h["shared_gated"]) == ((S, 1) if shared else (0, 0))
    assert h["weight_dtype"] == quant.DTYPE_CODES[wdt]
    check_model(out, layers, wdt)


@pytest.mark.parametrize("wdt", ["f32", "bf16", "int8"])
def test_weight_dtypes(tmp_path, lib, wdt):
    layers = make_layers(2)
    for d in layers:
        d.update(top_k=2)
    p = tmp_path / "model.safetensors"
    save_safetensors(p, hf_tensors("qwen3_moe", "fused", layers))
    write_config(tmp_path, "qwen3_moe", norm_topk_prob=True)
    out = tmp_path / "m.colibri"
    assert convert([p], out, weight_dtype=wdt)["arch"] == "qwen3_moe"  # from model_type
    assert read_header(out)["weight_dtype"] == quant.DTYPE_CODES[wdt]
    check_model(out, layers, wdt)


def test_fused_and_per_expert_forms_give_the_same_file(tmp_path, lib):
    layers = make_layers(1)
    for d in layers:
        d.update(top_k=2)
    write_config(tmp_path, "olmoe", norm_topk_prob=True)
    outs = []
    for form in ("fused", "per-expert"):
        p = tmp_path / f"{form}.safetensors"
        save_safetensors(p, hf_tensors("olmoe", form, layers))
        outs.append(tmp_path / f"{form}.colibri")
        assert convert([p], outs[-1], arch="olmoe")["forms"] == [form]
    assert outs[0].read_bytes() == outs[1].read_bytes()
    check_model(outs[0], layers, "f32")


def test_transposed_fused_layout_is_refused_not_guessed(tmp_path, capsys):
    """[E, H, 2I] / [E, I, H]: recognised, but its gate/up order is model-specific."""
    t = hf_tensors("olmoe", "fused-transposed", make_layers(1))
    err, p = failing(tmp_path, capsys, t, "--arch", "olmoe")
    assert f"{p}: tensors model.layers.0.mlp.experts.gate_up_proj [4, 32, 32]" in err
    assert "transposed fused layout" in err and "[E, 2I, H]" in err and "not guessed" in err


def test_gated_and_ungated_shared_expert(tmp_path, lib):
    layers = make_layers(2, shared=True, gated=False)
    for d in layers:
        d.update(top_k=2, norm_topk_prob=False)
    p = tmp_path / "model.safetensors"
    save_safetensors(p, hf_tensors("qwen2_moe", "per-expert", layers))
    out = tmp_path / "m.colibri"
    s = convert([p], out, arch="qwen2_moe", config=write_config(tmp_path, "qwen2_moe"))
    assert (s["shared_inter"], s["shared_gated"]) == (S, False)
    check_model(out, layers, "f32")


def test_arch_defaults_without_config(tmp_path, lib):
    """No config.json: the published model's routing (Mixtral: top-2, renormalised)."""
    layers = make_layers(2, k=2, norm=True)
    p = tmp_path / "model.safetensors"
    save_safetensors(p, hf_tensors("mixtral", "per-expert", layers), dtype="BF16")
    out = tmp_path / "m.colibri"
    s = convert([p], out, arch="mixtral")
    assert s["config"] is None and (s["top_k"], s["norm_topk_prob"]) == (2, True)
    check_model(out, [source_view(d, "BF16") for d in layers], "bf16")


def test_config_key_missing_takes_transformers_default(tmp_path, lib):
    """A config.json without norm_topk_prob means what transformers assumes: False for
    qwen3_moe, although the published Qwen3-30B-A3B (used without a config) sets True."""
    layers = make_layers(1)
    p = tmp_path / "model.safetensors"
    save_safetensors(p, hf_tensors("qwen3_moe", "fused", layers))
    s = convert([p], tmp_path / "m.colibri", arch="qwen3_moe",
                config=write_config(tmp_path, "qwen3_moe"))
    assert (s["top_k"], s["norm_topk_prob"]) == (2, False)
    assert ARCHS["qwen3_moe"].norm_topk_prob is True


def test_sharded_checkpoint_files_index_and_directory(tmp_path, lib, capsys):
    layers = make_layers(3)
    for d in layers:
        d.update(top_k=2, norm_topk_prob=True)
    t = hf_tensors("qwen3_moe", "per-expert", layers)
    shards = {}
    for name, a in t.items():  # one shard per layer, the rest in a fourth
        L = name.split(".")[2] if name.startswith("model.layers.") else "x"
        shards.setdefault(f"model-{L}.safetensors", {})[name] = a
    d = tmp_path / "ckpt"
    d.mkdir()
    for fn, part in shards.items():
        save_safetensors(d / fn, part, dtype="BF16")
    (d / "model.safetensors.index.json").write_text(json.dumps(
        {"metadata": {}, "weight_map": {n: fn for fn, part in shards.items() for n in part}}))
    write_config(d, "qwen3_moe", norm_topk_prob=True)
    want = [source_view(x, "BF16") for x in layers]
    outs = []
    for srcs in ([d / fn for fn in sorted(shards)], [d / "model.safetensors.index.json"], [d]):
        out = tmp_path / f"m{len(outs)}.colibri"
        rc, stdout, err = cli([*srcs, "--out", out, "--json"], capsys)
        assert rc == 0, err
        s = json.loads(stdout)
        assert s["n_layers"] == 3 and len(s["sources"]) == 4 and s["config"] == str(d / "config.json")
        assert err.count("convert: layer ") == 3  # a progress line per layer (not a TTY)
        outs.append(out)
    assert outs[0].read_bytes() == outs[1].read_bytes() == outs[2].read_bytes()
    check_model(outs[0], want, "bf16")


def test_dense_layers_are_skipped_and_layers_selectable(tmp_path, lib, capsys):
    layers = make_layers(2)
    for d in layers:
        d.update(top_k=2, norm_topk_prob=True)
    t = hf_tensors("qwen3_moe", "fused", layers, index=[0, 2])
    for n, shp in zip(HF_PROJ, ((I, H), (I, H), (H, I))):  # layer 1: a dense MLP
        t[f"model.layers.1.mlp.{n}.weight"] = np.ones(shp, np.float32)
    p = tmp_path / "model.safetensors"
    save_safetensors(p, t)
    cfg = write_config(tmp_path, "qwen3_moe", norm_topk_prob=True)
    rc, out, err = cli([p, "--out", tmp_path / "a.colibri"], capsys)
    assert rc == 0, err
    assert "2 MoE layers (0,2)" in out and "skipped layers without an MoE block: 1" in out
    check_model(tmp_path / "a.colibri", layers, "f32")
    s = convert([p], tmp_path / "b.colibri", config=cfg, layers={2})
    assert s["layers"] == [2] and s["skipped_layers"] == []
    check_model(tmp_path / "b.colibri", layers[1:], "f32")


def test_parse_layers():
    assert parse_layers("0-3,7") == {0, 1, 2, 3, 7}
    assert parse_layers(" 5 ") == {5}
    for bad in ("", "a", "3-1", "1-", "-2"):
        with pytest.raises(ValueError):
            parse_layers(bad)


def test_default_weight_dtype_is_lossless():
    assert [default_weight_dtype(d) for d in ("BF16", "F32", "F16", "F64")] == \
        ["bf16", "f32", "f32", "f32"]


def test_progress_bar_on_a_terminal_and_lines_elsewhere():
    class Tty(io.StringIO):
        def isatty(self):
            return True

    tty, plain = Tty(), io.StringIO()
    for stream in (tty, plain):
        p = Progress(4, stream)
        p.update(1, "model.layers.0.mlp")
        p.update(4, "model.layers.3.mlp")
        p.finish()
    assert tty.getvalue().count("\r") == 2 and "[" + "#" * 30 + "] 4/4 layers" in tty.getvalue()
    assert tty.getvalue().endswith("\n")
    lines = plain.getvalue().splitlines()
    assert len(lines) == 2 and lines[1].startswith("convert: layer 4/4 model.layers.3.mlp")
    quiet = io.StringIO()
    Progress(2, quiet, enabled=False).update(1, "x")
    assert quiet.getvalue() == ""


# ------------------------------------------------------------------ errors

@pytest.fixture
def ckpt(tmp_path):
    """A valid 2-layer qwen3_moe per-expert checkpoint's tensors and its config."""
    layers = make_layers(2)
    write_config(tmp_path, "qwen3_moe", norm_topk_prob=True)
    return hf_tensors("qwen3_moe", "per-expert", layers)


def failing(tmp_path, capsys, tensors, *extra, name="model.safetensors", code=1):
    p = tmp_path / name
    if tensors is not None:
        save_safetensors(p, tensors)
    out = tmp_path / "m.colibri"
    rc, stdout, err = cli([p, "--out", out, *extra], capsys)
    assert rc == code, err
    assert not out.exists() and stdout == ""
    assert "Traceback" not in err and err.startswith("colibri convert: ")
    assert not [f for f in tmp_path.iterdir() if f.name.endswith(".tmp")]  # no debris
    return err, p


def test_missing_expert_tensor(tmp_path, capsys, ckpt):
    gone = "model.layers.1.mlp.experts.2.up_proj.weight"
    del ckpt[gone]
    err, p = failing(tmp_path, capsys, ckpt)
    assert f"tensor {gone} is missing (expert 2's up projection of layer 1" in err
    assert str(p) in err


def test_misshaped_expert_tensor(tmp_path, capsys, ckpt):
    bad = "model.layers.0.mlp.experts.1.down_proj.weight"
    ckpt[bad] = ckpt[bad].T.copy()
    err, p = failing(tmp_path, capsys, ckpt)
    assert f"{p}: tensor {bad} has shape [{I}, {H}], expected [{H}, {I}]" in err


def test_misshaped_fused_tensor(tmp_path, capsys):
    t = hf_tensors("qwen3_moe", "fused", make_layers(1))
    t["model.layers.0.mlp.experts.gate_up_proj"] = np.zeros((E, 2 * I + 2, H), np.float32)
    err, _ = failing(tmp_path, capsys, t, "--arch", "qwen3_moe")
    assert "model.layers.0.mlp.experts.gate_up_proj [4, 34, 32]" in err
    assert "model.layers.0.mlp.experts.down_proj [4, 32, 16]" in err and "[E, 2I, H]" in err


def test_missing_fused_down(tmp_path, capsys):
    t = hf_tensors("qwen3_moe", "fused", make_layers(1))
    del t["model.layers.0.mlp.experts.down_proj"]
    err, _ = failing(tmp_path, capsys, t, "--arch", "qwen3_moe")
    assert "tensor model.layers.0.mlp.experts.down_proj is missing" in err


def test_missing_router(tmp_path, capsys, ckpt):
    del ckpt["model.layers.1.mlp.gate.weight"]
    err, _ = failing(tmp_path, capsys, ckpt)
    assert "tensor model.layers.1.mlp.gate.weight is missing (the router of layer 1" in err


def test_router_shape_differs_between_layers(tmp_path, capsys, ckpt):
    ckpt["model.layers.1.mlp.gate.weight"] = np.zeros((E, H + 1), np.float32)
    err, _ = failing(tmp_path, capsys, ckpt)
    assert "model.layers.1.mlp.gate.weight has shape [4, 33], expected [4, 32]" in err


def test_extra_expert(tmp_path, capsys, ckpt):
    for n in HF_PROJ:
        ckpt[f"model.layers.0.mlp.experts.4.{n}.weight"] = ckpt[f"model.layers.0.mlp.experts.0.{n}.weight"]
    err, _ = failing(tmp_path, capsys, ckpt)
    assert "layer 0 has expert 4" in err and "only 4 rows" in err


def test_truncated_checkpoint(tmp_path, capsys, ckpt):
    p = tmp_path / "model.safetensors"
    save_safetensors(p, ckpt)
    p.write_bytes(p.read_bytes()[:-100])
    err, _ = failing(tmp_path, capsys, None)
    assert str(p) in err and "end past the data section" in err


def test_wrong_arch_says_what_it_found(tmp_path, capsys):
    t = hf_tensors("mixtral", "per-expert", make_layers(1))
    err, _ = failing(tmp_path, capsys, t, "--arch", "olmoe")
    assert "no MoE layers for --arch olmoe" in err and "block_sparse_moe" in err


def test_shared_expert_needs_qwen2_moe(tmp_path, capsys):
    t = hf_tensors("qwen3_moe", "fused", make_layers(1, shared=True))
    err, _ = failing(tmp_path, capsys, t, "--arch", "qwen3_moe")
    assert "has a shared expert (model.layers.0.mlp.shared_expert" in err and "qwen2_moe" in err


def test_shared_expert_part_missing(tmp_path, capsys):
    t = hf_tensors("qwen2_moe", "fused", make_layers(2, shared=True))
    del t["model.layers.1.mlp.shared_expert.down_proj.weight"]
    write_config(tmp_path, "qwen2_moe")
    err, _ = failing(tmp_path, capsys, t)
    assert "tensor model.layers.1.mlp.shared_expert.down_proj.weight is missing" in err


def test_both_forms_in_one_layer(tmp_path, capsys, ckpt):
    layers = make_layers(1)
    ckpt.update({k: v for k, v in hf_tensors("qwen3_moe", "fused", layers).items()
                 if "experts.gate_up_proj" in k or "experts.down_proj" in k})
    err, _ = failing(tmp_path, capsys, ckpt)
    assert "both fused" in err and "per-expert" in err


def test_config_disagrees_with_tensors(tmp_path, capsys, ckpt):
    write_config(tmp_path, "qwen3_moe", num_experts=8)
    err, _ = failing(tmp_path, capsys, ckpt)
    assert "config.json has num_experts = 8, but the tensors give 4" in err
    write_config(tmp_path, "mixtral")
    err, _ = failing(tmp_path, capsys, ckpt, "--arch", "qwen3_moe")
    assert "model_type 'mixtral', but --arch is 'qwen3_moe'" in err


def test_top_k_larger_than_experts(tmp_path, capsys, ckpt):
    (tmp_path / "config.json").unlink()  # qwen3_moe's default top-8 with 4 experts
    err, _ = failing(tmp_path, capsys, ckpt, "--arch", "qwen3_moe")
    assert "top_k = 8 (num_experts_per_tok) must be an integer in 1 .. 4" in err


def test_arch_needed_without_config(tmp_path, capsys, ckpt):
    (tmp_path / "config.json").unlink()
    err, _ = failing(tmp_path, capsys, ckpt)
    assert "--arch is needed" in err


def test_quantized_tensor_refused(tmp_path, capsys, ckpt):
    ckpt["model.layers.0.mlp.experts.0.gate_proj.weight"] = np.zeros((I, H), np.int8)
    err, p = failing(tmp_path, capsys, ckpt)
    assert f"{p}: tensor model.layers.0.mlp.experts.0.gate_proj.weight has dtype I8" in err


def test_duplicate_tensor_across_files(tmp_path, capsys, ckpt):
    save_safetensors(tmp_path / "a.safetensors", ckpt)
    save_safetensors(tmp_path / "b.safetensors", {"model.layers.0.mlp.gate.weight":
                                                  ckpt["model.layers.0.mlp.gate.weight"]})
    rc, _, err = cli([tmp_path / "a.safetensors", tmp_path / "b.safetensors", "--out",
                      tmp_path / "m.colibri"], capsys)
    assert rc == 1 and "model.layers.0.mlp.gate.weight is in both" in err


def test_index_with_missing_shard(tmp_path, capsys):
    idx = tmp_path / "model.safetensors.index.json"
    idx.write_text(json.dumps({"weight_map": {"model.layers.0.mlp.gate.weight": "s1.safetensors"}}))
    rc, _, err = cli([idx, "--out", tmp_path / "m.colibri"], capsys)
    assert rc == 1 and "shard s1.safetensors" in err and "is missing" in err


def test_missing_source_and_bad_config(tmp_path, capsys, ckpt):
    rc, _, err = cli([tmp_path / "nope.safetensors", "--out", tmp_path / "m.colibri"], capsys)
    assert rc == 1 and "nope.safetensors: no such file" in err
    (tmp_path / "config.json").write_text("{oops")
    err, _ = failing(tmp_path, capsys, ckpt)
    assert "config.json: not valid JSON" in err


def test_unwritable_output(tmp_path, capsys, ckpt):
    p = tmp_path / "model.safetensors"
    save_safetensors(p, ckpt)
    rc, _, err = cli([p, "--out", tmp_path / "no" / "such" / "dir" / "m.colibri"], capsys)
    assert rc == 1 and "Traceback" not in err and "No such file or directory" in err


def test_layers_selection_errors(tmp_path, capsys, ckpt):
    err, _ = failing(tmp_path, capsys, ckpt, "--layers", "x-1", code=2)
    assert "--layers: bad layer range 'x-1'" in err
    err, _ = failing(tmp_path, capsys, ckpt, "--layers", "5")
    assert "--layers asks for [5], which have no MoE block (MoE layers here: 0-1)" in err


def test_usage_errors_exit_2(tmp_path):
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    for args in (["convert"], ["convert", "x.safetensors"],
                 ["convert", "x.safetensors", "--out", "m", "--arch", "llama"],
                 ["convert", "x.safetensors", "--out", "m", "--weight-dtype", "f8"]):
        r = subprocess.run([sys.executable, "-m", "colibri", *args], capture_output=True,
                           text=True, cwd=tmp_path, env=env, timeout=120)
        assert r.returncode == 2 and "error:" in r.stderr, (args, r.stderr)
        assert len(r.stderr.strip().splitlines()) == 1 and "Traceback" not in r.stderr


def test_weight_dtype_choices_follow_the_binding():
    from colibri.__main__ import build_parser

    sub = next(a for a in build_parser()._actions if a.dest == "command")
    conv = sub.choices["convert"]
    wd = next(a for a in conv._actions if a.dest == "weight_dtype")
    assert list(wd.choices) == list(quant.DTYPES)


def test_api_errors_are_value_errors(tmp_path):
    with pytest.raises(ConvertError, match="unknown --arch 'gpt'"):
        p = tmp_path / "m.safetensors"
        save_safetensors(p, hf_tensors("olmoe", "fused", make_layers(1)))
        convert([p], tmp_path / "m.colibri", arch="gpt")
    assert issubclass(ConvertError, ValueError)
