"""Golden outputs of the kernel template: rendering a fixed knob set must give exactly
the checked-in source, so a template edit shows up as a reviewable diff of real C.

After an intended template change: COLIBRI_UPDATE_GOLDEN=1 pytest tests/test_render_golden.py
and review the diff of tests/fixtures/golden/."""
import os
from pathlib import Path

import pytest

from tuner import render

GOLDEN = Path(__file__).resolve().parent / "fixtures" / "golden"
CASES = {
    "avx512": dict(isa="avx512", rows=4, tok_block=2, unroll=1, prefetch_f32=8192, prefetch_bf16=8192, prefetch_int8=16384,
                   prefetch_int4=2048, prefill_rows=2,
                   prefill_tok_block=4, prefill_unroll=1, prefill_prefetch=0),
    "avx2": dict(isa="avx2", rows=2, tok_block=1, unroll=2, prefetch_f32=0, prefetch_bf16=0, prefetch_int8=4096,
                 prefetch_int4=1024, prefill_rows=4,
                 prefill_tok_block=2, prefill_unroll=2, prefill_prefetch=256),
    "portable": dict(isa="portable", rows=1, tok_block=2, unroll=4, prefetch_f32=2048, prefetch_bf16=2048, prefill_rows=1,
                     prefill_tok_block=4, prefill_unroll=4, prefill_prefetch=2048),
    "scalar": dict(isa="scalar", rows=2, tok_block=2, unroll=1, prefetch_f32=0, prefetch_bf16=0, prefill_rows=2,
                   prefill_tok_block=1, prefill_unroll=1, prefill_prefetch=0),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_rendered_kernel_matches_golden(name):
    spec = render.load_knob_spec("expert_ffn", render.ROOT / "templates")
    knobs = render.resolve_knobs(spec, CASES[name])
    text = render.render("expert_ffn", knobs, render.ROOT / "templates")
    path = GOLDEN / f"expert_ffn-{name}.c"
    if os.environ.get("COLIBRI_UPDATE_GOLDEN"):
        path.write_text(text)
    assert path.exists(), f"{path} missing: run with COLIBRI_UPDATE_GOLDEN=1 to create it"
    assert text == path.read_text(), (
        f"rendering differs from {path.name}; if the template change is intended, "
        f"regenerate with COLIBRI_UPDATE_GOLDEN=1 and review the diff")
