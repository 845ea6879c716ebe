"""tuner/build/variants.py: a batch compiles each distinct rendering once, and a variant's
compiler messages are found through the renderings it shares."""
import os

from colibri_build import shapes
from tuner.build import variants


def test_variants_share_identical_renderings_and_differ_where_their_knobs_do(tmp_path):
    # two variants that differ only in one shape class's knobs: the default table and the
    # other class are one compilation each, linked into both
    base = {"rows": 2}
    a = shapes.join(base, {"h22_i19": {"rows": 1}, "h24_i28": {"prefetch_f32": 2048}})
    b = shapes.join(base, {"h22_i19": {"rows": 1, "prefetch_f32": 512}, "h24_i28": {"prefetch_f32": 2048}})
    built = variants.build_batch("generic", [a, b], tmp_path)
    assert all(x.lib is not None for x in built), [x.error for x in built]

    def obj(v, table):
        return variants.kernel_object(tmp_path, "generic", v.vid, table=table)

    va, vb = built
    for table in (None, "h24_i28"):
        assert os.stat(obj(va, table)).st_ino == os.stat(obj(vb, table)).st_ino, table
    assert os.stat(obj(va, "h22_i19")).st_ino != os.stat(obj(vb, "h22_i19")).st_ino
    assert obj(va, "h22_i19").read_bytes() != obj(vb, "h22_i19").read_bytes()


def test_a_variants_messages_include_those_of_the_renderings_it_shares():
    out = "\n".join([
        "colibri: variant bbb shares /b/zen4/obj/variants/aaa/expert_ffn_h24_i28.os",
        "/b/zen4/gen/variants/aaa/expert_ffn_h24_i28.c:12:3: error: boom",
        "/b/zen4/gen/variants/aaa/expert_ffn.c:9:1: error: aaa's own",
        "/b/zen4/gen/variants/bbb/expert_ffn.c:1:1: warning: bbb's own",
        "/b/zen4/gen/variants/ccc/expert_ffn.c:1:1: error: another variant's",
    ])
    assert variants._messages_for(out, "bbb").splitlines() == [
        "/b/zen4/gen/variants/aaa/expert_ffn_h24_i28.c:12:3: error: boom",
        "/b/zen4/gen/variants/bbb/expert_ffn.c:1:1: warning: bbb's own"]
    assert "boom" in variants._messages_for(out, "aaa")
    assert variants._messages_for(out, "ccc") == "/b/zen4/gen/variants/ccc/expert_ffn.c:1:1: error: another variant's"
