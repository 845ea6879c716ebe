"""tuner/build/variants.py: a batch compiles each distinct kernel part once, a variant's
machine code is read through its parts, and a variant's compiler messages are found
through the parts it uses."""
from colibri_build import parts, shapes
from tuner.build import variants


def test_variants_share_identical_parts_and_differ_where_their_knobs_do(tmp_path):
    # two variants that differ only in one shape class's f32 knob: every other part of every
    # table is one object, used by both
    base = {"rows": 2}
    a = shapes.join(base, {"h22_i19": {"rows": 1}, "h24_i28": {"prefetch_f32": 2048}})
    b = shapes.join(base, {"h22_i19": {"rows": 1, "prefetch_f32": 512}, "h24_i28": {"prefetch_f32": 2048}})
    built = variants.build_batch("generic", [a, b], tmp_path)
    assert all(x.lib is not None for x in built), [x.error for x in built]
    ta, tb = (parts.read_tables(variants.variant_dir(tmp_path, "generic", v.vid) / "kernel_tables.json")
              for v in built)
    assert set(ta) == {"default", "h22_i19", "h24_i28"}
    differ = [(t, p) for t in ta for p in parts.PARTS if ta[t][p] != tb[t][p]]
    assert differ == [("h22_i19", "f32")]
    for t in ta:
        for p in parts.PARTS:
            assert parts.object_path(tmp_path / "generic", ta[t][p]).is_file()
    # the code, read through the parts: the class tables differ in f32 functions only
    ca, cb = (variants.kernel_code(tmp_path, "generic", v.vid, table="h22_i19") for v in built)
    changed = [k for k in set(ca) | set(cb) if ca.get(k) != cb.get(k)]
    assert changed and all(k.startswith("f32:") for k in changed)
    assert variants.kernel_code(tmp_path, "generic", built[0].vid) == \
        variants.kernel_code(tmp_path, "generic", built[1].vid)  # the same default table
    assert variants.kernel_code(tmp_path, "generic", built[0].vid, table="h99_i99") is None


def test_a_variants_messages_include_those_of_the_parts_it_uses():
    out = "\n".join([
        "colibri: variant aaa parts: cbp_f32_1111 cbp_int8_2222",
        "colibri: variant bbb parts: cbp_f32_1111 cbp_int8_3333",
        "/b/zen4/gen/parts/cbp_f32_1111.c:12:3: error: boom",
        "/b/zen4/gen/parts/cbp_int8_2222.c:9:1: error: aaa's own",
        "/b/zen4/gen/variants/bbb/build_info.c:1:1: warning: bbb's own",
        "/b/zen4/gen/parts/cbp_int4_4444.c:1:1: error: nobody's",
    ])
    assert variants._messages_for(out, "bbb").splitlines() == [
        "/b/zen4/gen/parts/cbp_f32_1111.c:12:3: error: boom",
        "/b/zen4/gen/variants/bbb/build_info.c:1:1: warning: bbb's own"]
    assert "aaa's own" in variants._messages_for(out, "aaa")
    assert "boom" in variants._messages_for(out, "aaa")
    assert variants._messages_for(out, "ccc") == ""
