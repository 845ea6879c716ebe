"""Knob domains are data (templates/expert_ffn.knobs.yaml): every knob declares its class and
the kernel paths and dtypes its code changes, and each class is tuned on problems that
cover its whole domain."""
from pathlib import Path

import pytest

from colibri_build import isas, render
from tuner import run
from tuner.measure import problems

ROOT = Path(__file__).resolve().parents[2]
SPEC = render.load_knob_spec("expert_ffn", ROOT / "templates")


def test_every_knob_has_a_class_and_a_domain():
    for name, k in SPEC.knobs.items():
        assert k.cls, name
        assert k.domain is not None and k.domain.paths and k.domain.dtypes, name
        assert set(k.domain.paths) <= set(render.PATHS), name
        assert set(k.domain.dtypes) <= set(render.DOMAIN_DTYPES), name
        assert set(k.domain.needs) <= set(SPEC.capabilities), name


def test_a_knob_changes_code_only_for_the_isas_whose_records_have_what_it_needs():
    # derived from templates/isas.yaml: the packed layout is x86's, the 2x2 multiplies Arm's
    assert SPEC.knobs["isa"].values == tuple(isas.records())
    assert set(SPEC.knobs["layout_int8"].domain.isas) == {"avx2", "avx512"}
    assert SPEC.knobs["gemm_mmla_int8"].domain.isas == ("neon",)
    assert set(SPEC.knobs["igemm_rows"].domain.isas) == {"avx2", "avx512", "neon"}
    assert SPEC.knobs["rows"].domain.isas == ()  # needs nothing: every isa
    for k in SPEC.knobs.values():
        for isa in k.domain.isas:
            assert all(isas.records()[isa].has(c) for c in k.domain.needs), k.name


def test_a_knobs_file_may_not_list_isas_itself(tmp_path):
    (tmp_path / "t.knobs.yaml").write_text(
        "knobs:\n  a:\n    values: [1, 2]\n    default: 1\n    class: c\n"
        "    domain: {paths: [decode], dtypes: [f32], isas: [avx512]}\n")
    with pytest.raises(render.KnobError, match="derived from 'needs'"):
        render.load_knob_spec("t", tmp_path)


def test_the_default_problems_cover_every_class_domain():
    default = [problems.problem(n) for n in run.default_problems(SPEC)]
    for cls in SPEC.classes():
        have = {(problems.path_of(p), p.part) for p in default if run.in_class(SPEC, p, cls)}
        assert have == set(SPEC.class_domain(cls).cells()), cls


@pytest.mark.parametrize("shape", sorted(problems.SHAPES))
def test_each_path_maps_to_a_problem_on_that_path(shape):
    for path in render.PATHS:
        p = problems.problem(f"{shape}/{problems.path_phase(shape, path)}/f32")
        assert problems.path_of(p) == path, (shape, path, p.T)


def test_knobs_that_serve_kernels_with_different_best_values_are_split():
    # float prefetch per dtype, and AMX per dtype: one dtype's tuning never sets the other's
    for a, b in (("prefetch_f32", "prefetch_bf16"), ("amx_f32", "amx_bf16")):
        assert SPEC.knobs[a].domain.dtypes == (a.rsplit("_", 1)[1],)
        assert SPEC.knobs[b].domain.dtypes == (b.rsplit("_", 1)[1],)
    assert SPEC.knobs["prefetch_f32"].cls != SPEC.knobs["prefetch_bf16"].cls
    assert "prefetch" not in SPEC.knobs and "amx" not in SPEC.knobs
    # the gemm threshold per dtype, each its own class (where the gemm starts to beat the
    # prefill dot kernels differs by dtype: one shared knob kept a tie for all of them)
    thresholds = [f"gemm_min_tokens_{dt}" for dt in ("f32", "bf16", "int8", "int4")]
    assert "gemm_min_tokens" not in SPEC.knobs
    for name in thresholds:
        assert SPEC.knobs[name].domain.dtypes == (name.rsplit("_", 1)[1],)
    assert len({SPEC.knobs[name].cls for name in thresholds}) == 4


def test_a_class_domain_is_the_union_of_its_knobs():
    dom = SPEC.class_domain("decode")
    assert set(dom.dtypes) == {"f32", "bf16", "int8", "int4"} and dom.paths == ("decode",)
    assert SPEC.class_domain("gemm_threshold_bf16").paths == ("prefill", "gemm")


def _spec_with(tmp_path, knob_yaml: str):
    d = tmp_path / "templates"
    d.mkdir(parents=True)
    (d / "k.c.j2").write_text("/* */\n")
    (d / "k.knobs.yaml").write_text("knobs:\n" + knob_yaml)
    return lambda: render.load_knob_spec("k", d)


def test_a_knob_without_domain_or_class_is_refused(tmp_path):
    load = _spec_with(tmp_path, "  a:\n    values: [1, 2]\n    default: 1\n    class: c\n")
    with pytest.raises(render.KnobError, match="needs a 'domain'"):
        load()
    load = _spec_with(tmp_path / "x", "  a:\n    values: [1, 2]\n    default: 1\n"
                      "    domain: {paths: [decode], dtypes: [f32]}\n")
    with pytest.raises(render.KnobError, match="needs a 'class'"):
        load()


def test_a_domain_naming_an_unknown_path_dtype_or_capability_is_refused(tmp_path):
    for i, dom in enumerate(("{paths: [warp], dtypes: [f32]}", "{paths: [decode], dtypes: [fp8]}",
                             "{paths: [decode], dtypes: [f32], needs: [sve]}")):
        load = _spec_with(tmp_path / str(i), "  a:\n    values: [1, 2]\n    default: 1\n"
                          f"    class: c\n    domain: {dom}\n")
        with pytest.raises(render.KnobError, match="unknown"):
            load()


def test_quick_values_must_be_values_of_the_knob(tmp_path):
    load = _spec_with(tmp_path, "  a:\n    values: [1, 2]\n    default: 1\n    quick: [3]\n"
                      "    class: c\n    domain: {paths: [decode], dtypes: [f32]}\n")
    with pytest.raises(render.KnobError, match="quick"):
        load()


def test_a_packed_int_dtype_runs_the_prefill_kernels_up_to_its_own_gemm_threshold():
    # qwen3 prefill512 gives 32 tokens per expert: the gemm paths in the row layouts (from
    # gemm_min_tokens, 16), the prefill class's weight-as-vector kernels where int4g32 is packed
    # (up to pk_gemm_min_tokens, 128), so its prefill knobs are measured and gated there
    p = problems.problem("qwen3-30b-a3b/prefill512/int4g32")
    packed = {"layout_int4": "interleaved", "pk_gemm_min_tokens_int4": 128, "gemm_min_tokens_int4": 16}
    assert problems.path_of(p) == "gemm"
    assert problems.path_of(p, {**packed, "layout_int4": "rows"}) == "gemm"
    assert problems.path_of(p, packed) == "prefill"
    assert problems.path_of(p, {**packed, "pk_gemm_min_tokens_int4": 32}) == "gemm"
    # packed on a build with AMX tiles: from amx_int4_min_tokens (24), unless amx_int4 is off
    assert problems.path_of(p, packed, amx=True) == "gemm"
    assert problems.path_of(p, {**packed, "amx_int4": 0}, amx=True) == "prefill"
    assert problems.path_of(p, {**packed, "amx_int4_min_tokens": 48}, amx=True) == "prefill"
    assert run.in_class(SPEC, p, "prefill_int4", packed)
    assert not run.in_class(SPEC, p, "prefill_int4", {**packed, "layout_int4": "rows"})
    assert not run.in_class(SPEC, p, "igemm", packed)
    # int4's only gemm is the AMX tiles: without them every prefill runs its packed kernels;
    # with them from both thresholds (32 tokens an expert here)
    p4 = problems.problem("qwen3-30b-a3b/prefill512/int4")
    assert problems.path_of(p4) == "prefill"
    assert problems.path_of(p4, amx=True) == "gemm"
    assert problems.path_of(p4, {"amx_int4k": 0}, amx=True) == "prefill"
    assert problems.path_of(p4, {"amx_int4_min_tokens": 48}, amx=True) == "prefill"


def test_packed_bf16_runs_its_prefill_kernels_at_every_token_count():
    # mixtral prefill2048 gives 512 tokens per expert: the gemm in the row layout, the
    # weight-as-vector kernels (the prefill class's blocks) where bf16 is packed
    p = problems.problem("mixtral-8x7b/prefill2048/bf16")
    assert problems.path_of(p, {"layout_bf16": "rows"}) == "gemm"
    assert problems.path_of(p, {"layout_bf16": "interleaved"}) == "prefill"
    assert run.in_class(SPEC, p, "prefill", {"layout_bf16": "interleaved"})


def test_a_domain_layout_must_be_a_value_of_its_dtypes_layout_knob(tmp_path):
    layout = "  layout_f32:\n    values: [rows, interleaved]\n    default: rows\n    class: l\n" \
             "    domain: {paths: [decode], dtypes: [f32]}\n"
    load = _spec_with(tmp_path, layout + "  a:\n    values: [1, 2]\n    default: 1\n    class: c\n"
                      "    domain: {paths: [decode], dtypes: [f32], layout: tiled}\n")
    with pytest.raises(render.KnobError, match="layout"):
        load()
    ok = _spec_with(tmp_path / "ok", layout + "  a:\n    values: [1, 2]\n    default: 1\n    class: c\n"
                    "    domain: {paths: [decode], dtypes: [f32], layout: rows}\n")
    assert ok().knobs["a"].domain.layout == "rows"


def test_knobs_of_one_layouts_kernels_are_not_tuned_where_their_dtypes_are_held_in_another():
    """A packed int4 build runs no row-layout int4 kernels: rows_int4 and prefetch_int4 cannot
    change what runs (a 'gain' measured for them is noise), and vec_prefetch_int4 none in rows.
    A packed layout the flags cannot build (no int dot) holds the rows."""
    from tuner.context import Tuner

    t = Tuner.__new__(Tuner)
    t.spec, t.profile_name = SPEC, "test"
    t.macros = frozenset({"__AVX512F__", "__AVX512VNNI__", "__AVX2__"})
    base = {k.name: k.default for k in SPEC.knobs.values()}
    base.update(isa="avx512", layout_int4="interleaved")
    for name in ("rows_int4", "prefetch_int4"):
        why = t._domain_excludes(SPEC.knobs[name].domain, base)
        assert why and "rows layout" in why and "int4 interleaved" in why, name
    assert t._domain_excludes(SPEC.knobs["vec_prefetch_int4"].domain, base) is None
    # rows serves f32, bf16 and int8 too: excluded only once all of them are packed
    assert t._domain_excludes(SPEC.knobs["rows"].domain, base) is None
    rows = dict(base, layout_int4="rows")
    assert t._domain_excludes(SPEC.knobs["rows_int4"].domain, rows) is None  # int4g32's rows
    # int4 is packed wherever there is an int dot, whatever layout_int4 says
    # (parts.FIXED_LAYOUT), and decode is timed on int4 (parts.timed_dtype): the packed
    # decode knob reaches it; the row knobs reach no dtype decode is timed on
    assert t._domain_excludes(SPEC.knobs["vec_prefetch_int4"].domain, rows) is None
    t.__class__ = type("Split", (Tuner,), {"classes": {"packed": ("vec_prefetch_int4",),
                                                         "row": ("rows_int4", "prefetch_int4")}})
    assert t.live_cells("packed", rows) == {("decode", "int4")}
    assert t.live_cells("row", rows) == set()
    t.macros = frozenset({"__AVX512F__"})  # no VNNI: layout_int4 cannot pack here
    assert t._domain_excludes(SPEC.knobs["rows_int4"].domain, base) is None
    assert t.live_cells("row", base) == {("decode", "int4")}
    assert "interleaved layout" in t._domain_excludes(SPEC.knobs["vec_prefetch_int4"].domain, base)


def test_the_int4_part_is_timed_on_int4_but_where_its_knobs_reach_the_gemm():
    # int4, the format the tools write, runs its own kernels on the part's decode and prefill
    # knobs; only int4g32 reaches the part's gemm, and so the knobs choosing it
    from tuner.context import default_problems, timed_dtype

    assert timed_dtype(SPEC, "decode_int4", "decode", "int4") == "int4"
    assert timed_dtype(SPEC, "prefill", "prefill", "int4") == "int4"
    assert timed_dtype(SPEC, "gemm_threshold_int4", "prefill", "int4") == "int4g32"
    assert timed_dtype(SPEC, "igemm", "gemm", "int4") == "int4g32"
    assert timed_dtype(SPEC, "gemm_threshold_int8", "prefill", "int8") == "int8"
    names = default_problems(SPEC)
    assert {"qwen3-30b-a3b/decode/int4", "qwen3-30b-a3b/prefill128/int4", "qwen3-30b-a3b/prefill128/int4g32",
            "qwen3-30b-a3b/prefill512/int4g32"} <= set(names)
    assert "qwen3-30b-a3b/prefill512/int4" not in names  # int4 has no gemm path to tune


def test_a_class_is_timed_on_its_dtype_where_the_run_covers_the_cell_in_it():
    from tuner.context import timed_problems

    cell = lambda p: (problems.path_of(p), p.part)  # noqa: E731
    both = [problems.problem(f"qwen3-30b-a3b/prefill128/{d}") for d in ("int4g32", "int4", "int8")]
    assert [p.dtype for p in timed_problems(SPEC, "prefill", both, cell)] == ["int4", "int8"]
    assert [p.dtype for p in timed_problems(SPEC, "gemm_threshold_int4", both, cell)] == ["int4g32", "int8"]
    # a user who names int4g32 alone has it timed
    assert [p.dtype for p in timed_problems(SPEC, "prefill", both[:1], cell)] == ["int4g32"]
