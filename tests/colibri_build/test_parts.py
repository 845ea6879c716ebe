"""Kernel parts (colibri_build/parts.py): one rendering per weight dtype, named by its text.

Sharing a part between tables and tuning variants is only right if a part's text holds
nothing but what its dtype's knobs decide: the domains in templates/expert_ffn.knobs.yaml
say which dtypes a knob changes, and the first test holds the template to them."""
from __future__ import annotations

import hashlib
import shutil

import pytest

from colibri_build import parts, render

TEMPLATE = "expert_ffn"


def _spec():
    return render.load_knob_spec(TEMPLATE)


def _defaults(spec, isa):
    knobs = {name: k.default for name, k in spec.knobs.items()}
    knobs["isa"] = isa
    return knobs


def _isas(spec):
    return list(spec.knobs["isa"].values)


@pytest.mark.parametrize("isa", _isas(_spec()))
def test_a_knob_changes_no_part_outside_its_domain(isa):
    """Every other value of every knob, one at a time from the defaults on this isa: the
    parts of the dtypes outside the knob's domain render to the same text (so they are
    shared); a domain that leaves a dtype out while the template uses the knob there fails."""
    spec = _spec()
    base = _defaults(spec, isa)
    if spec.violated(base):
        pytest.skip(f"the defaults break a constraint on {isa}")
    base_text = {p: parts.render_part(TEMPLATE, base, p, spec=spec).text for p in parts.PARTS}
    checked = 0
    for name, knob in spec.knobs.items():
        if name == "isa":
            continue
        outside = [p for p in parts.PARTS if p not in knob.domain.dtypes]
        for value in knob.values:
            knobs = {**base, name: value}
            if value == base[name] or spec.violated(knobs):
                continue
            for p in outside:
                text = parts.render_part(TEMPLATE, knobs, p, spec=spec).text
                assert text == base_text[p], (
                    f"{name}={value} changes the {p} part on isa {isa}, but its domain is "
                    f"{list(knob.domain.dtypes)}")
                checked += 1
    assert checked > 20  # the loop reached the knobs (a broken spec would check nothing)


def test_the_default_knobs_give_four_distinct_parts_named_by_their_text():
    spec = _spec()
    knobs = _defaults(spec, "avx512")
    seen = set()
    for p in parts.PARTS:
        part = parts.render_part(TEMPLATE, knobs, p, spec=spec)
        assert part.symbol.startswith(f"cbp_{p}_") and part.symbol not in seen
        seen.add(part.symbol)
        # the name is the hash of the text before the name went in
        digest = hashlib.sha256(part.text.replace(part.symbol, parts.PLACEHOLDER).encode()).hexdigest()
        assert part.symbol == f"cbp_{p}_{digest[:16]}"
        assert f"const cbk_part {part.symbol} =" in part.text
        assert f"part: {p}" in part.text.split("*/")[0]
    with pytest.raises(render.RenderError, match="part 'f16'"):
        parts.render_part(TEMPLATE, knobs, "f16", spec=spec)


def test_a_knob_of_one_dtype_renames_that_part_only():
    spec = _spec()
    base = _defaults(spec, "avx512")
    other = next(v for v in spec.knobs["prefetch_int4"].values if v != base["prefetch_int4"])
    a = {p: parts.render_part(TEMPLATE, base, p, spec=spec).symbol for p in parts.PARTS}
    b = {p: parts.render_part(TEMPLATE, {**base, "prefetch_int4": other}, p, spec=spec).symbol
         for p in parts.PARTS}
    assert [p for p in parts.PARTS if a[p] != b[p]] == ["int4"]


def test_the_index_names_parts_without_rendering_and_forgets_them_when_a_template_changes(tmp_path):
    tdir = tmp_path / "templates"
    shutil.copytree(render.TEMPLATES_DIR, tdir)
    spec = render.load_knob_spec(TEMPLATE, tdir)
    knobs = _defaults(spec, "portable")
    path = tmp_path / "gen" / "parts" / parts.INDEX_NAME
    idx = parts.Index(path, tdir)
    sym = idx.symbol(TEMPLATE, knobs, "int8")
    assert sym == parts.render_part(TEMPLATE, knobs, "int8", tdir).symbol
    idx.save()
    again = parts.Index(path, tdir)
    assert again.symbol(TEMPLATE, knobs, "int8") == sym and again.texts == {}  # not rendered
    assert again.text(sym).count(sym) >= 1  # rendered on demand, to the same name
    # any template file changing invalidates every name the index kept
    (tdir / "expert_ffn" / "epilogue.j2").write_text(
        (tdir / "expert_ffn" / "epilogue.j2").read_text() + "\n{# changed #}\n")
    assert parts.Index(path, tdir).known == {}


def test_the_index_refuses_a_name_its_template_no_longer_renders(tmp_path):
    tdir = tmp_path / "templates"
    shutil.copytree(render.TEMPLATES_DIR, tdir)
    knobs = _defaults(render.load_knob_spec(TEMPLATE, tdir), "portable")
    idx = parts.Index(tmp_path / parts.INDEX_NAME, tdir)
    sym = idx.symbol(TEMPLATE, knobs, "f32")
    idx.texts.clear()
    main = tdir / f"{TEMPLATE}.c.j2"
    main.write_text(main.read_text() + "/* edited mid-build */\n")
    with pytest.raises(render.RenderError, match="template changed during the build"):
        idx.text(sym)


def test_kernel_tables_list_the_default_first_and_the_shape_classes():
    tables = {"default": ["a0", "a1", "a2", "a3"], "h24_i28": ["a0", "a1", "a2", "b3"]}
    c = parts.kernel_tables_c(tables)
    assert c.count("extern const cbk_part") == 5  # a part two tables share is declared once
    assert 'cbk_kernels_default = {"default", {&a0, &a1, &a2, &a3}};' in c
    assert "{24, 28, &cbk_kernels_h24_i28}," in c and "cbk_shape_table_len = 1;" in c
    with pytest.raises(render.RenderError, match="3 parts"):
        parts.kernel_tables_c({"default": ["a0", "a1", "a2"]})
    with pytest.raises(render.RenderError, match="default table"):
        parts.kernel_tables_c({"h24_i28": ["a0", "a1", "a2", "a3"]})
