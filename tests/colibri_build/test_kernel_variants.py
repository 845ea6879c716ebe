"""Corners of the kernel knob space (both classes, decode and prefill): each builds
through SCons (config=) and computes the layer right for every dtype, on shapes with
ragged rows, columns and tokens."""
import pytest
from moe_data import assert_engine, make_case

from colibri._lib import build_profile, open_library
import colibri
from colibri_build import render

# (isa, profile, decode rows, tok_block, unroll, prefetch, prefetch_int8, prefetch_int4,
#  prefill rows, tok_block, unroll, prefetch, gemm rows, vecs, kc, min_tokens,
#  int gemm rows, vecs, amx, amx_kc, amx_f32_min_tokens, gemm_bf16_dot; see _knobs for the
#  bf16, int8 and int4 knobs): every value of each knob appears
# at least once, the int gemm knobs each on a profile with a VNNI dot-product instruction
# (without one, int experts take the dot kernels, which the other corners cover), and the
# AMX knobs each on the profile that targets AMX (elsewhere amx=1 compiles to the AVX-512
# gemm); the T=300 case's experts (~150 tokens) reach every f32 threshold
CORNERS = [
    ("scalar", "generic", 1, 1, 1, 0, 0, 0, 1, 1, 1, 0, 2, 1, 128, 4, 2, 1, 0, 256, 64, 1),
    ("scalar", "generic", 2, 2, 4, 512, 2048, 1024, 4, 4, 1, 2048, 3, 2, 256, 8, 3, 2, 0, 256, 64, 1),
    ("portable", "generic", 4, 2, 1, 2048, 4096, 2048, 2, 4, 2, 4096, 4, 2, 512, 16, 4, 1, 0, 256, 64, 1),
    ("portable", "generic", 1, 2, 4, 512, 8192, 4096, 1, 2, 4, 8192, 6, 1, 128, 32, 2, 2, 0, 256, 64, 1),
    ("avx2", "x86-64-v3", 2, 1, 4, 8192, 16384, 8192, 4, 2, 2, 1024, 2, 2, 256, 4, 3, 1, 1, 512, 64, 0),
    ("avx2", "sapphirerapids", 4, 2, 2, 2048, 8192, 2048, 2, 2, 4, 0, 3, 1, 512, 8, 2, 2, 1, 256, 64, 1),
    ("avx512", "icelake-server", 1, 2, 4, 8192, 16384, 8192, 1, 4, 4, 16384, 6, 2, 128, 16, 3, 2, 1, 1024, 64, 1),
    ("avx512", "x86-64-v4", 4, 1, 2, 0, 0, 0, 4, 4, 1, 2048, 4, 1, 256, 4, 4, 1, 0, 512, 64, 0),
    ("avx512", "sapphirerapids", 2, 2, 2, 512, 4096, 1024, 2, 2, 1, 0, 2, 1, 512, 32, 4, 1, 1, 512, 16, 1),
    # AMX tiles (f32/bf16 gemm): off, and each k-tile and f32 threshold, where AMX is built
    ("avx512", "sapphirerapids", 4, 1, 1, 2048, 2048, 2048, 4, 1, 2, 16384, 3, 2, 256, 16, 2, 1, 0, 1024, 64, 0),
    ("avx512", "sapphirerapids", 1, 1, 2, 0, 8192, 4096, 2, 4, 1, 1024, 4, 2, 128, 4, 3, 2, 1, 256, 32, 1),
    ("avx512", "sapphirerapids", 2, 2, 1, 8192, 0, 1024, 1, 2, 2, 0, 6, 1, 512, 8, 2, 2, 1, 1024, 128, 1),
    # the bf16 pair dot (gemm_bf16_dot) on and off where the target has AVX512_BF16 and AMX is not built
    ("avx512", "zen5", 2, 1, 2, 512, 4096, 2048, 4, 2, 1, 8192, 4, 2, 256, 8, 3, 2, 0, 512, 64, 1),
    ("avx512", "zen4", 1, 2, 1, 2048, 0, 0, 2, 1, 2, 0, 6, 1, 128, 16, 2, 1, 0, 256, 32, 0),
    ("avx512", "zen5", 4, 2, 2, 0, 2048, 1024, 1, 4, 4, 1024, 3, 2, 512, 4, 4, 1, 0, 1024, 16, 1),
    # NEON: SDOT on neoverse-n1; on neoverse-v2 BFDOT, BFMMLA and SMMLA (the gemm_mmla
    # switches alternate by corner, see _knobs). Off aarch64 these run under qemu-user
    # (tuner verify's kernel check on the corner's library), or skip without it.
    ("neon", "neoverse-n1", 2, 2, 2, 2048, 4096, 2048, 2, 4, 1, 4096, 3, 2, 256, 8, 3, 2, 0, 512, 64, 1),
    ("neon", "neoverse-v2", 4, 1, 2, 512, 8192, 4096, 4, 2, 1, 1024, 2, 2, 128, 16, 2, 2, 0, 256, 32, 1),
    ("neon", "neoverse-v2", 1, 2, 1, 8192, 2048, 1024, 1, 4, 2, 8192, 3, 1, 512, 4, 4, 1, 0, 1024, 16, 0),
    # AVX2 with AVX-VNNI on a host that runs it: the int gemm and packed int8 on 8-lane vectors
    ("avx2", "zen5", 1, 2, 2, 2048, 8192, 4096, 2, 2, 1, 4096, 2, 1, 256, 8, 2, 1, 0, 512, 64, 1),
    # AVX2 alone (zen3's flags): the int gemm on the vpmaddubsw dot, int weights in their row
    # layouts (the x86-64-v3 corner packs them)
    ("avx2", "zen3", 4, 1, 2, 512, 2048, 1024, 2, 4, 1, 2048, 3, 2, 128, 16, 3, 2, 0, 256, 64, 0),
]
KNOBS = ["isa", "rows", "tok_block", "unroll", "prefetch", "prefetch_int8", "prefetch_int4",
         "prefill_rows", "prefill_tok_block", "prefill_unroll", "prefill_prefetch_f32",
         "gemm_rows", "gemm_vecs", "gemm_kc", "gemm_min_tokens_f32", "igemm_rows", "igemm_vecs",
         "amx", "amx_kc", "amx_f32_min_tokens", "gemm_bf16_dot"]


def _knobs(corner):
    """The corner's knob values. int4's decode rows are the next corner's. Its prefetch and amx columns drive both dtypes' knobs:
    f32 takes them as written, bf16 the next corner's prefetch and, on every other
    corner, the opposite amx switch (so f32 and bf16 differ in some corners). The prefill
    prefetch column is f32's; bf16 takes the next corner's, int8 and int4 the two after
    (int4 halved: its rows hold half the bytes), each capped to its knob's values. Its
    min_tokens column is f32's gemm threshold; bf16, int8 and int4 take the next three
    corners' (so one corner sends the dtypes' experts down different paths). The int gemm
    k-tiles come from the gemm_kc column (see below)."""
    k = dict(zip(KNOBS, corner[:1] + corner[2:]))
    i = CORNERS.index(corner)
    for step, dt in enumerate(("bf16", "int8", "int4"), 1):
        k[f"gemm_min_tokens_{dt}"] = CORNERS[(i + step) % len(CORNERS)][15]
    k["prefetch_f32"] = k.pop("prefetch")
    k["rows_int4"] = CORNERS[(i + 1) % len(CORNERS)][2]
    k["prefetch_bf16"] = CORNERS[(i + 1) % len(CORNERS)][5]
    k["prefill_prefetch_bf16"] = CORNERS[(i + 1) % len(CORNERS)][11]
    k["prefill_prefetch_int8"] = min(CORNERS[(i + 2) % len(CORNERS)][11], 8192)
    k["prefill_prefetch_int4"] = min(CORNERS[(i + 3) % len(CORNERS)][11] // 2, 4096)
    # the int gemm k-tiles: the gemm_kc column scaled into their values, int4 the next corner's
    ikc = {128: 256, 256: 1024, 512: 4096}
    k["igemm_kc_int8"] = ikc[k["gemm_kc"]]
    k["igemm_kc_int4"] = ikc[CORNERS[(i + 1) % len(CORNERS)][14]]
    amx = k.pop("amx")
    k["amx_f32"], k["amx_bf16"] = amx, (amx if i % 2 == 0 else 1 - amx)
    # Arm's matrix multiplies: bf16 on odd corners, int8 on even ones
    k["gemm_mmla_bf16"], k["gemm_mmla_int8"] = i % 2, 1 - i % 2
    # packed int8 on even corners and on AVX2 (its 8-row vectors), its blocks of rows by
    # the corner's index (within the register constraint on each class's tokens)
    # (the zen3 corner keeps both row layouts: the AVX2 dot's int gemm on the stored rows)
    avx2_packs = k["isa"] == "avx2" and corner[1] != "zen3"
    rows_only = corner[1] == "zen3"
    k["layout_int8"] = "interleaved" if (i % 2 == 0 or avx2_packs) and not rows_only else "rows"
    # int8 on AMX tiles on rows corners (amx_int.j2) and on packed corners 0 mod 4 (the blocks
    # as B tiles, amx_int_packed.j2); packed corners 2 mod 4 keep the packed kernels
    k["amx_int8"] = int(k["layout_int8"] == "rows" or i % 4 == 0)
    k["vec_rows"] = 2 if i % 4 in (0, 1) else 1
    k["prefill_vec_rows"] = 2 if i % 4 == 0 and k["prefill_tok_block"] <= 2 else 1
    k["prefill_kc_int8"] = (128, 256, 1024, 4096)[i // 2 % 4]
    k["vec_prefetch_int8"] = (0, 2048, 4096, 8192)[(i // 2 + 1) % 4]
    # packed int4 on all but corners 3 mod 4 (so with both block shapes, and on the
    # icelake-server and zen4 corners that run on a Zen 4 host)
    k["layout_int4"] = "interleaved" if (i % 4 != 3 or avx2_packs) and not rows_only else "rows"
    # int4g32 on the tiles on rows corners (amx_int.j2) and on packed corners 1 mod 4 (its
    # k-tiles unpacked to B tiles, amx_int4_packed.j2)
    k["amx_int4"] = int(k["layout_int4"] == "rows" or i % 4 == 1)
    # int4 (int4k, always packed) on the tiles on odd corners, from every expert size among them
    k["amx_int4k"] = i % 2
    k["amx_int4_min_tokens"] = (16, 24, 32, 48, 64)[(i + 1) % 5]
    k["prefill_kc_int4"] = (128, 256, 1024, 4096)[(i // 2) % 4]
    k["vec_prefetch_int4"] = (0, 2048, 4096, 8192)[(i // 2 + 1) % 4]
    # where packed experts switch to the int gemm, every value among the packed corners (32:
    # the shared expert of tuner verify's 40-token case takes that path)
    k["pk_gemm_min_tokens_int4"] = {6: 32, 13: 64, 5: 128, 8: 256, 9: 4096}.get(i, 128)
    k["pk_gemm_min_tokens_int8"] = {6: 32, 8: 64, 10: 256, 12: 4096, 14: 128}.get(i, 128)
    k["prefill_run_int"] = (32, 64, 128, 256)[(i // 2 + 1) % 4]
    # their prefetches into L1 or L2, each on packed corners with and without a prefetch distance
    k["prefill_prefetch_level_int8"] = (1, 2)[(i // 2) % 2]
    k["prefill_prefetch_level_int4"] = (1, 2)[(i // 2 + 1) % 2]
    # packed bf16 and f32 on two corners in three each (zen4 and zen5's both ways; they pack
    # on AVX-512 and AVX2 where AMX does not take the dtype), every block shape, k-chunk and
    # run among them
    k["layout_bf16"] = "interleaved" if i % 3 != 2 else "rows"
    k["vec_rows_float"] = 2 if i % 4 in (1, 2) else 1
    k["prefill_vec_rows_float"] = 2 if i % 2 == 0 else 1
    k["prefill_kc_bf16"] = (128, 256, 1024, 4096)[i % 4]
    k["prefill_kc_f32"] = (128, 256, 1024, 4096)[(i + 2) % 4]
    k["prefill_run_float"] = (32, 64, 128, 256)[(i + 1) % 4]
    k["layout_f32"] = "interleaved" if i % 3 != 0 else "rows"
    k["vec_prefetch_bf16"] = (0, 2048, 4096, 8192)[(i + 1) % 4]
    k["vec_prefetch_f32"] = (0, 2048, 4096, 8192)[(i + 3) % 4]
    # their prefill's prefetches into L2, every distance among the packed corners
    k["prefill_prefetch_packed_bf16"] = (0, 4096, 8192, 16384, 32768)[i % 5]
    k["prefill_prefetch_packed_f32"] = (0, 4096, 8192, 16384, 32768)[(i + 2) % 5]
    return k


EMULATED = "sapphirerapids-amx-emulated"


def _targets_amx(knobs, profile):
    return ((knobs["amx_f32"] or knobs["amx_bf16"] or knobs["amx_int8"] or knobs["amx_int4"] or knobs["amx_int4k"])
            and knobs["isa"] == "avx512"
            and profile in ("sapphirerapids", EMULATED))


def _corner_profile(corner):
    """The profile a corner builds under here, and whether and why not it runs: an AVX-512
    sapphirerapids corner on a host that cannot run that profile runs its AMX code on the
    emulated tile unit instead (sapphirerapids-amx-emulated), where the host can run that."""
    from colibri_build import cpuinfo, profiles

    host = cpuinfo.host_cpu()
    ok, why = profiles.runs_on(profiles.get_profile(corner[1]), host)
    if not ok and corner[:2] == ("avx512", "sapphirerapids"):
        emu_ok, emu_why = profiles.runs_on(profiles.get_profile(EMULATED), host)
        if emu_ok:
            return EMULATED, True, ""
        why = f"{why}; nor {EMULATED}: {emu_why}"
    return corner[1], ok, why


def _host_grants_amx():
    """AMX tile and bf16 flags, and a Linux new enough to grant the tile state (5.16)."""
    import platform

    from colibri_build import cpuinfo

    flags = cpuinfo.host_cpu().flags
    try:
        version = tuple(int(v) for v in platform.release().split(".")[:2])
    except ValueError:
        return False
    return {"amx_tile", "amx_bf16"} <= flags and platform.system() == "Linux" and version >= (5, 16)


@pytest.fixture(scope="module")
def cases():
    # the third: an expert with > 128 tokens (two token chunks of the gemm path), more rows
    # than one row chunk and more columns than one k-tile; the fourth: every token on one
    # expert; the fifth: most experts with one token or none, beside a few with more
    return [make_case(H=67, I=45, E=8, k=3, S=21, gated=True, seed=1),
            make_case(H=130, I=64, E=5, k=2, scoring="softmax_topk", seed=2),
            make_case(H=300, I=301, E=2, k=1, S=129, seed=3),
            make_case(H=97, I=50, E=1, k=1, seed=4),
            make_case(H=64, I=33, E=48, k=1, seed=5)]


@pytest.fixture(scope="module")
def expected(cases):
    """(x, float64 reference) of case i at T tokens in a dtype, computed once for every corner
    (the weights' round trip and the reference cost more than a corner's checks)."""
    memo = {}

    def get(i, T, dtype):
        if (i, T, dtype) not in memo:
            x = cases[i].inputs(T, seed=T)
            memo[(i, T, dtype)] = (x, cases[i].reference(x, dtype))
        return memo[(i, T, dtype)]
    return get


@pytest.fixture(scope="module")
def build_root(tmp_path_factory):
    """One build folder for every corner: a profile's objects outside the kernel parts
    (pool, routing, layer, loader, ...) do not depend on the knobs, so the corners after
    the first of their profile compile only their parts (x86-64-v4: 4.8 s against 8.1)."""
    return tmp_path_factory.mktemp("corners")


def _build_corner(profile, cfg, build_root, tmp_path):
    """The corner's library, copied out of the shared folder (the next corner's build
    replaces it there, and a path dlopen has seen names the library loaded first)."""
    import shutil

    built = build_profile(profile, config=cfg, build_dir=build_root, quiet=True)
    (tmp_path / "lib").mkdir()
    for name in ("libcolibri.so", "build_info.json"):
        shutil.copy2(built.parent / name, tmp_path / "lib" / name)
    return tmp_path / "lib" / "libcolibri.so"


@pytest.mark.parametrize("corner", CORNERS, ids=lambda c: "-".join(map(str, c)))
def test_corner_builds_and_is_correct(tmp_path, cases, expected, build_root, corner):
    profile, ok, why = _corner_profile(corner)
    knobs = _knobs(corner)
    cfg = render.write_config_h(tmp_path / "config.h", knobs, signature="0", profile=profile)
    if not ok:
        _emulated(profile, cfg, tmp_path, why)
        return
    lib = _build_corner(profile, cfg, build_root, tmp_path)
    for i, case in enumerate(cases):
        for dtype in ("f32", "bf16", "int8", "int4g32", "int4"):
            L = colibri.MoELayer(case.router, case.gate, case.up, case.down, weight_dtype=dtype,
                                 lib=lib, **case.layer_kwargs())
            # decode class (<= 2 tokens per expert), prefill dot kernels and the gemm path
            for T in ((1, 2, 7, 40) if case.hidden < 300 else (40, 300)):
                x, ref = expected(i, T, dtype)
                assert_engine(L(x), ref, dtype)
    # the AMX corners above ran on tiles wherever this host has them, else on the emulated unit
    uses = open_library(lib).colibri_uses_amx()
    if not _targets_amx(knobs, profile):
        assert uses == 0
    elif profile == EMULATED:
        assert uses == 1, "the emulated tile unit needs no grant: the AMX path must run"
    elif _host_grants_amx():
        assert uses == 1, "the host has AMX and Linux >= 5.16, but the library did not get its tiles"


def _emulated(profile, cfg, tmp_path, why):
    """A corner for another architecture: its library and a colibri.h-only program run under
    qemu-user on tuner verify's cases (every dtype; decode, prefill and gemm token counts)."""
    from tuner.fleet import verify

    if profiles_arch(profile) not in verify.QEMU:
        pytest.skip(f"{profile} kernels cannot run on this host: {why}")
    try:
        rows = verify.verify(profile, build_dir=tmp_path / "build", config=cfg)
    except verify.VerifyError as exc:
        if "not installed" in str(exc) or "no aarch64 C library" in str(exc) or "absent" in str(exc):
            pytest.skip(f"{exc} (`scripts/setup --test` installs it)")
        raise
    bad = [r for r in rows if not r.ok]
    assert rows and not bad, bad
    # and its instructions are the ISA level's these knobs select (BFDOT or BFMMLA, SDOT, SMMLA)
    from tuner.build import isacheck

    isa = isacheck.check_library(tmp_path / "build" / profile / "libcolibri.so")
    assert isa.ok is True, isa.message


def profiles_arch(profile):
    from colibri_build import profiles

    return profiles.get_profile(profile).arch


def test_corners_cover_every_knob_value():
    spec = render.load_knob_spec("expert_ffn")
    names = set(_knobs(CORNERS[0]))
    assert names == set(spec.knobs)
    for name in names:
        assert {_knobs(c)[name] for c in CORNERS} == set(spec.knobs[name].values), name
    # the int gemm knobs, on x86 profiles whose ISA has a dot-product instruction
    vnni = [_knobs(c) for c in CORNERS if c[1] in ("icelake-server", "sapphirerapids", "zen4", "zen5")]
    for name in ("igemm_rows", "igemm_vecs", "igemm_kc_int8", "igemm_kc_int4", "gemm_min_tokens_int8",
                 "gemm_min_tokens_int4"):
        assert {k[name] for k in vnni} == set(spec.knobs[name].values), name
    # the AMX knobs, where AMX is compiled in
    amx = [_knobs(c) for c in CORNERS if c[:2] == ("avx512", "sapphirerapids")]
    for name in ("amx_f32", "amx_bf16", "amx_int8", "amx_int4", "amx_int4k", "amx_kc", "amx_f32_min_tokens"):
        assert {k[name] for k in amx} == set(spec.knobs[name].values), name
    assert {k["amx_kc"] for k in amx if k["amx_f32"] or k["amx_bf16"]} == set(spec.knobs["amx_kc"].values)
    assert {(k["amx_f32"], k["amx_bf16"]) for k in amx} >= {(1, 0), (0, 1), (1, 1)}
    assert {(k["layout_int8"], k["amx_int8"]) for k in amx} == {("rows", 1), ("interleaved", 1),
                                                                ("interleaved", 0)}
    # the bf16 pair dot, on profiles with AVX512_BF16 and no AMX (else bf16 takes the tiles)
    bfdot = [_knobs(c) for c in CORNERS if c[1] in ("zen4", "zen5")]
    assert {k["gemm_bf16_dot"] for k in bfdot} == set(spec.knobs["gemm_bf16_dot"].values)
    # Arm's matrix multiplies where the target has them, each dtype on and off, and the bf16
    # pair dot (BFDOT) on a corner without BFMMLA
    v2 = [_knobs(c) for c in CORNERS if c[1] == "neoverse-v2"]
    for name in ("gemm_mmla_bf16", "gemm_mmla_int8"):
        assert {k[name] for k in v2} == set(spec.knobs[name].values), name
    assert any(k["gemm_bf16_dot"] and not k["gemm_mmla_bf16"] for k in v2)
    # packed int8 and its register blocks, where the target has an int dot product
    packed = [k for k in vnni if k["layout_int8"] == "interleaved"]
    assert {k["layout_int8"] for k in vnni} == set(spec.knobs["layout_int8"].values)
    for name in ("vec_rows", "prefill_vec_rows", "prefill_kc_int8", "vec_prefetch_int8", "pk_gemm_min_tokens_int8",
                 "prefill_run_int"):
        assert {k[name] for k in packed} == set(spec.knobs[name].values), name
    packed4 = [k for k in vnni if k["layout_int4"] == "interleaved"]
    assert {k["layout_int4"] for k in vnni} == set(spec.knobs["layout_int4"].values)
    for name in ("vec_rows", "prefill_vec_rows", "prefill_kc_int4", "vec_prefetch_int4", "pk_gemm_min_tokens_int4",
                 "prefill_run_int"):
        assert {k[name] for k in packed4} == set(spec.knobs[name].values), name
    # packed bf16 and its blocks, on corners that run here wherever the host is x86 with AVX-512
    pbf = [_knobs(c) for c in CORNERS if c[1] in ("x86-64-v3", "icelake-server", "x86-64-v4", "zen4", "zen5")]
    for dt in ("f32", "bf16"):
        assert {k[f"layout_{dt}"] for k in pbf} == set(spec.knobs[f"layout_{dt}"].values)
        for name in ("vec_rows_float", "prefill_vec_rows_float", f"prefill_kc_{dt}", "prefill_run_float",
                     f"vec_prefetch_{dt}"):
            assert {k[name] for k in pbf if k[f"layout_{dt}"] == "interleaved"} == set(spec.knobs[name].values), (dt, name)
    for c in CORNERS:
        render.validate_knobs(spec, _knobs(c))
