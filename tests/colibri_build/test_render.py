"""Template rendering, knob validation and config.h round trips."""
from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest
import yaml

from colibri_build import parts, profiles, render

KNOBS_YAML = """\
knobs:
  isa:
    values: [scalar, portable, avx2]
    default: portable
    class: block
    domain: {paths: [decode], dtypes: [f32]}
    doc: code path
  rows:
    values: [1, 2, 4]
    default: 2
    class: block
    domain: {paths: [decode], dtypes: [f32]}
  unroll:
    values: [1, 2, 4]
    default: 1
    class: block
    domain: {paths: [decode], dtypes: [f32]}
constraints:
  - rows * unroll <= 4
"""


@pytest.fixture
def tdir(tmp_path: Path) -> Path:
    (tmp_path / "k.c.j2").write_text("int rows = {{ rows }}; /* {{ isa }} x{{ unroll }} */\n")
    (tmp_path / "k.knobs.yaml").write_text(KNOBS_YAML)
    return tmp_path


def test_render_substitutes_knobs_and_writes_a_generated_header(tdir):
    text = render.render("k", {"isa": "avx2", "rows": 4, "unroll": 1}, tdir)
    first, rest = text.split("\n", 1)
    assert "GENERATED" in first and "templates/k.c.j2" in first
    assert "isa=avx2 rows=4 unroll=1" in text.split("*/")[0]
    assert rest.endswith("int rows = 4; /* avx2 x1 */\n")  # trailing newline kept


def test_undefined_name_is_an_error(tdir):
    (tdir / "bad.c.j2").write_text("int x = {{ rows }} + {{ nonexistent }};\n")
    with pytest.raises(render.RenderError, match="nonexistent"):
        render.render("bad", {"rows": 2}, tdir)


def test_template_syntax_error_names_the_line(tdir):
    (tdir / "bad.c.j2").write_text("ok\n{% if rows %}\n")
    with pytest.raises(render.RenderError, match=r"bad\.c\.j2:\d"):
        render.render("bad", {"rows": 2}, tdir)


def test_knob_spec_loads(tdir):
    spec = render.load_knob_spec("k", tdir)
    assert list(spec.knobs) == ["isa", "rows", "unroll"]
    assert spec.knobs["rows"].values == (1, 2, 4) and spec.knobs["rows"].default == 2
    assert spec.violated({"isa": "scalar", "rows": 4, "unroll": 2}) == ["rows * unroll <= 4"]
    assert render.template_names(tdir) == ["k"]


def test_resolution_order_default_profile_config(tdir):
    spec = render.load_knob_spec("k", tdir)
    assert render.resolve_knobs(spec) == {"isa": "portable", "rows": 2, "unroll": 1}
    assert render.resolve_knobs(spec, {"rows": 4})["rows"] == 4
    values = render.resolve_knobs(spec, {"rows": 4, "isa": "avx2"}, {"rows": 1, "unroll": 4})
    assert values == {"isa": "avx2", "rows": 1, "unroll": 4}


@pytest.mark.parametrize("profile_knobs,config_knobs,isas,message", [
    ({"rows": 3}, None, None, "rows=3 is not one of"),
    ({"rows": 4, "unroll": 2}, None, None, "constraint violated: rows \\* unroll <= 4"),
    ({"isa": "avx2"}, None, ["portable", "scalar"], "isa='avx2' is not a kernel isa"),
    (None, {"isa": "avx512"}, None, "isa='avx512' is not one of"),
])
def test_invalid_knob_values_are_refused(tdir, profile_knobs, config_knobs, isas, message):
    spec = render.load_knob_spec("k", tdir)
    with pytest.raises(render.KnobError, match=message):
        render.resolve_knobs(spec, profile_knobs, config_knobs, isas)


def test_unknown_knob_names_are_refused(tdir):
    specs = render.load_all_specs(tdir)
    with pytest.raises(render.KnobError, match=r"rowz"):
        render.resolve_all(specs, {"rowz": 1}, None, ["portable"], "p")
    with pytest.raises(render.KnobError, match=r"my\.h sets knobs.*unrol"):
        render.resolve_all(specs, {}, {"unrol": 2}, ["portable"], "p", "my.h")


@pytest.mark.parametrize("expr,message", [
    ("__import__('os').system('true')", "Call"),
    ("rows.__class__", "Attribute"),
    ("rows * bogus < 4", "bogus"),
    ("rows <", "not a Python expression"),
])
def test_constraints_are_sandboxed(tdir, expr, message):
    data = yaml.safe_load(KNOBS_YAML)
    data["constraints"] = [expr]
    (tdir / "k.knobs.yaml").write_text(yaml.safe_dump(data))
    with pytest.raises(render.KnobError, match=message):
        render.load_knob_spec("k", tdir)


def test_knobs_file_must_be_consistent(tdir):
    (tdir / "k.knobs.yaml").write_text("knobs:\n  rows:\n    values: [1, 2]\n    default: 4\n")
    with pytest.raises(render.KnobError, match="default 4"):
        render.load_knob_spec("k", tdir)
    (tdir / "k.knobs.yaml").unlink()
    with pytest.raises(render.KnobError, match="no knobs file"):
        render.load_knob_spec("k", tdir)


def test_search_space_cut_by_profile(tdir):
    spec = render.load_knob_spec("k", tdir)
    space = render.search_space(spec, ["avx2", "portable", "scalar"], {"rows": [1, 2]})
    assert space == {"isa": ["avx2", "portable", "scalar"], "rows": [1, 2], "unroll": [1, 2, 4]}
    assert render.search_space(spec, ["portable"])["isa"] == ["portable"]
    with pytest.raises(render.KnobError):
        render.search_space(spec, None, {"rows": [3]})


# ---------------------------------------------------------------- config.h

def test_config_h_round_trip(tmp_path):
    knobs = {"isa": "avx512", "rows": 4, "tok_block": 2, "unroll": 1, "prefetch_f32": 0}
    path = render.write_config_h(tmp_path / "sub" / "config.h", knobs, "DEADbeef0123", "sapphirerapids")
    text = path.read_text()
    assert "#define COLIBRI_KNOB_ISA avx512\n" in text
    assert "/* signature: deadbeef0123 */" in text and "GENERATED" in text
    cfg = render.read_config_h(path)
    assert cfg.knobs == knobs and isinstance(cfg.knobs["rows"], int)
    assert cfg.signature == "deadbeef0123" and cfg.profile == "sapphirerapids"
    assert stat.S_IMODE(os.stat(path).st_mode) & 0o044  # readable, not mkstemp's 0600
    assert [p.name for p in path.parent.iterdir()] == ["config.h"]  # no temp file left


def test_config_h_hand_written_and_errors():
    cfg = render.parse_config_h("#define COLIBRI_KNOB_ROWS 2\n#  define COLIBRI_KNOB_ISA scalar /* x */\n"
                                "#define OTHER 5\n")
    assert cfg.knobs == {"rows": 2, "isa": "scalar"} and cfg.signature is None and cfg.profile is None
    with pytest.raises(render.ConfigError, match="twice"):
        render.parse_config_h("#define COLIBRI_KNOB_ROWS 2\n#define COLIBRI_KNOB_ROWS 4\n")
    with pytest.raises(render.ConfigError, match="unsupported"):
        render.parse_config_h('#define COLIBRI_KNOB_ISA "avx2"\n')
    with pytest.raises(render.ConfigError):
        render.format_config_h({"isa": "has space"}, "ab", "p")
    with pytest.raises(render.ConfigError, match="hex"):
        render.format_config_h({"rows": 2}, "not-hex", "p")


# ---------------------------------------------------------------- the repository's templates

def test_every_profile_renders_every_template():
    """Each profile's default knobs are valid for, and render, the real templates."""
    specs = render.load_all_specs()
    assert specs, "templates/*.c.j2 missing"
    for name, prof in profiles.load_registry().items():
        by_template = render.resolve_all(specs, prof.knobs, None, prof.kernel_isas, name)
        for template, knobs in by_template.items():
            for part in parts.PARTS:
                text = parts.render_part(template, knobs, part).text
                assert text.startswith("/* GENERATED") and "{{" not in text, (name, template, part)
                assert parts.PLACEHOLDER not in text, (name, template, part)


def test_profile_space_overrides_are_valid():
    specs = render.load_all_specs()
    for name, prof in profiles.load_registry().items():
        for template, overrides in prof.space.items():
            assert template in specs, f"{name}: space for unknown template {template}"
            render.search_space(specs[template], prof.kernel_isas, overrides)
