"""colibri.modelfile.ModelWriter: the layer-at-a-time writer behind save_model and the
checkpoint converter. Same bytes as save_model; with expect= the payloads are written
in place (tables reserved up front) and the file still loads and computes the same."""
from __future__ import annotations

import numpy as np
import pytest

from colibri.model import Model
from colibri.modelfile import ModelWriter, read_header, read_layers, save_model
from moe_data import assert_close
from test_model_format import engine_weights, layer_dict, reference_stack, stack_cases, stack_inputs

H, I, E = 48, 24, 4


def layers(n=3, **kw):
    return [layer_dict(c) for c in stack_cases(n, H=H, I=I, E=E, k=2, seed=5, **kw)]


def leftovers(d):
    return sorted(p.name for p in d.iterdir() if p.name.endswith(".tmp"))


@pytest.mark.parametrize("dtype", ["f32", "int8"])
def test_streamed_file_is_save_models_file(tmp_path, dtype):
    ls = layers(3, S=16, gated=True)
    save_model(tmp_path / "a.colibri", ls, weight_dtype=dtype)
    with ModelWriter(tmp_path / "b.colibri", weight_dtype=dtype) as w:
        for d in ls:
            w.add_layer(d)
        assert w.n_layers == 3
    assert (tmp_path / "a.colibri").read_bytes() == (tmp_path / "b.colibri").read_bytes()
    assert w.info["file_size"] == (tmp_path / "b.colibri").stat().st_size
    assert leftovers(tmp_path) == []


def test_in_place_writing_with_expect(tmp_path, lib):
    ls = layers(2)
    ls.append(dict(ls[0]))  # layer 2 repeats layer 0: shared tensors, fewer than reserved
    p = tmp_path / "m.colibri"
    with ModelWriter(p, weight_dtype="bf16", expect=(4, E)) as w:  # room for one more layer
        for d in ls:
            w.add_layer(d)
    h = read_header(p)
    plain = save_model(tmp_path / "plain.colibri", ls, weight_dtype="bf16")
    assert h["n_layers"] == 3 and h["n_tensors"] == plain["n_tensors"] == 2 * (1 + 3 * E)
    assert h["data_offset"] > read_header(tmp_path / "plain.colibri")["data_offset"]
    assert h["file_size"] - h["data_offset"] == plain["file_size"] - \
        read_header(tmp_path / "plain.colibri")["data_offset"]  # same payloads, only moved
    for a, b in zip(read_layers(p), read_layers(tmp_path / "plain.colibri")):
        np.testing.assert_array_equal(a["gate"], b["gate"])
    held = [engine_weights(d, "bf16") for d in ls]
    x = stack_inputs(held, 4)
    with Model.load(p) as m:
        assert_close(m(x), reference_stack(x, held))
    assert leftovers(tmp_path) == []


def test_expect_is_enforced(tmp_path):
    ls = layers(2)
    w = ModelWriter(tmp_path / "m.colibri", expect=(1, E))
    w.add_layer(ls[0])
    with pytest.raises(ValueError, match="expected 1 layers"):
        w.add_layer(ls[1])
    w.abort()
    w = ModelWriter(tmp_path / "m.colibri", expect=(2, E + 1))
    with pytest.raises(ValueError, match=f"has {E} experts, but ModelWriter expected {E + 1}"):
        w.add_layer(ls[0])
    w.abort()
    with pytest.raises(ValueError, match="expect n_layers"):
        ModelWriter(tmp_path / "m.colibri", expect=(0, E))
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("expect", [None, (2, E)])
def test_failure_leaves_nothing(tmp_path, expect):
    p = tmp_path / "m.colibri"
    p.write_bytes(b"old")
    with pytest.raises(ValueError, match="layers\\[1\\] has hidden"):
        with ModelWriter(p, expect=expect) as w:
            w.add_layer(layers(1)[0])
            other = layer_dict(stack_cases(1, H=H + 8, I=I, E=E, k=2)[0])
            w.add_layer(other)
    assert p.read_bytes() == b"old" and leftovers(tmp_path) == []
    with pytest.raises(ValueError, match="no layers were added"):
        ModelWriter(p, expect=expect).close()
    assert p.read_bytes() == b"old" and leftovers(tmp_path) == []


def test_closed_writer_refuses_layers(tmp_path):
    w = ModelWriter(tmp_path / "m.colibri")
    w.add_layer(layers(1)[0])
    info = w.close()
    assert w.close() is info  # idempotent
    with pytest.raises(ValueError, match="is closed"):
        w.add_layer(layers(1)[0])


@pytest.mark.parametrize("share", [False, True])
@pytest.mark.parametrize("expect", [None, (3, E)])
def test_repeat_layer_is_adding_the_same_layer_again(tmp_path, share, expect):
    # the tuner writes copies of one quantized layer this way: same file, encoded once
    d = layers(1, S=16, gated=True)[0]
    with ModelWriter(tmp_path / "a.colibri", weight_dtype="int4g32", share=share, expect=expect) as w:
        for _ in range(3):
            w.add_layer(d)
    with ModelWriter(tmp_path / "b.colibri", weight_dtype="int4g32", share=share, expect=expect) as w:
        w.add_layer(d)
        w.repeat_layer(0)
        w.repeat_layer(1)
        assert w.n_layers == 3
        with pytest.raises(ValueError, match="holds 3 layer"):
            w.repeat_layer(3)
        if expect:
            with pytest.raises(ValueError, match="expected 3 layers"):
                w.repeat_layer(0)
    assert (tmp_path / "a.colibri").read_bytes() == (tmp_path / "b.colibri").read_bytes()
    assert leftovers(tmp_path) == []
