"""The run's summary (tuner/summary.py): what it says this run tuned."""
from types import SimpleNamespace

from colibri_build import shapes
from tuner import summary

QWEN3 = shapes.class_of(2048, 768)
MIXTRAL = shapes.class_of(4096, 14336)


def test_the_headline_names_only_the_classes_this_run_changed_from_the_default_build():
    # the profile already runs prefetch_f32=0 for Mixtral (a promote): the emitted knobs carry
    # it as a shape-class value, yet this run only changed gemm_min_tokens_int8
    classes = {"decode_f32": ("prefetch_f32",), "gemm_threshold_int8": ("gemm_min_tokens_int8",),
               "decode": ("rows",)}
    base = {"prefetch_f32": 8192, "gemm_min_tokens_int8": 16, "rows": 2}
    t = SimpleNamespace(classes=classes,
                        default_assignment=shapes.join(base, {MIXTRAL: {"prefetch_f32": 0}}))
    knobs = shapes.join(base, {MIXTRAL: {"prefetch_f32": 0, "gemm_min_tokens_int8": 8}})
    s = {"shape_classes": {MIXTRAL: {"shapes": ["mixtral-8x7b"]}, QWEN3: {"shapes": ["qwen3-30b-a3b"]}},
         "rows": []}
    summary._tuned(s, t, knobs)
    assert s["shape_classes"][MIXTRAL]["tuned_classes"] == ["gemm_threshold_int8"]
    assert s["shape_classes"][MIXTRAL]["knobs"] == {"prefetch_f32": 0, "gemm_min_tokens_int8": 8}
    assert s["shape_classes"][QWEN3]["tuned_classes"] == []
    line = summary.headline(s)
    assert "tuned gemm_threshold_int8," in line and "decode_f32" not in line
    assert "qwen3-30b-a3b (shape class" in line and "the defaults were kept" in line


def test_the_headline_gives_one_figure_where_the_gains_round_alike():
    s = {"shape_classes": {MIXTRAL: {"shapes": ["mixtral-8x7b"], "tuned_classes": ["prefill_f32"]}},
         "rows": [{"shape_class": MIXTRAL, "problem": "mixtral-8x7b/prefill32/f32", "speedup": s_,
                   "source": "gate"} for s_ in (1.0911, 1.0898)]}
    assert "tuned prefill_f32, 1.09x on its prefill cells (gate medians)" in summary.headline(s)
