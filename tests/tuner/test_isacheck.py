"""tuner/build/isacheck.py: the kernel symbols' vector registers against the build's promise,
on libraries built here (generic + isa=scalar, x86-64-v4 + isa=avx512) and on
disassembly text written by hand (both architectures)."""
import platform
import shutil

import pytest

from colibri_build import render
from tuner.build import isacheck

X86 = platform.machine() in ("x86_64", "AMD64")
needs_objdump = pytest.mark.skipif(shutil.which("objdump") is None,
                                   reason="objdump (binutils) is not installed")


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """{name: path of libcolibri.so}: generic with isa=scalar, and x86-64-v4 (isa=avx512)."""
    from colibri._lib import build_profile

    root = tmp_path_factory.mktemp("isabuild")
    cfg = render.write_config_h(root / "scalar.h", {"isa": "scalar"}, signature="0" * 16,
                                profile="generic")
    libs = {"generic-scalar": build_profile("generic", config=cfg, build_dir=root, quiet=True)}
    if X86:
        libs["x86-64-v4"] = build_profile("x86-64-v4", build_dir=root, quiet=True)
        # built, never run here: the disassembly is what is checked
        libs["sapphirerapids"] = build_profile("sapphirerapids", build_dir=root, quiet=True)
    return libs


@needs_objdump
def test_scalar_generic_build_claims_no_wide_registers(built):
    r = isacheck.check_library(built["generic-scalar"])
    assert r.isa == "scalar"                        # read from build_info.json
    assert r.ok is True, r.message
    assert "part_gateup" in r.symbols and "part_rows_acc" in r.symbols
    if X86:
        assert r.found["zmm"] == 0 and r.found["ymm"] == 0
        # generic requires no features: wide registers are forbidden, none promised
        assert set(r.promised["forbid"]) == {"zmm", "ymm"} and r.promised["require"] == []


@needs_objdump
@pytest.mark.skipif(not X86, reason="AVX-512 kernels are x86-64 only")
def test_avx512_build_uses_zmm_in_its_kernels(built):
    r = isacheck.check_library(built["x86-64-v4"])
    assert r.isa == "avx512"
    assert r.ok is True, r.message
    assert r.promised["require"] == ["zmm"] and r.promised["forbid"] == []
    assert r.found["zmm"] > 0
    assert {"part_gateup", "part_rows_acc"} <= set(r.symbols)


@needs_objdump
@pytest.mark.skipif(not X86, reason="AMX is x86-64 only")
def test_amx_build_requires_and_has_tile_products(built):
    from colibri_build import profiles

    r = isacheck.check_library(built["sapphirerapids"])
    if "-march=sapphirerapids" not in profiles.resolve("sapphirerapids").cflags:
        pytest.skip("this compiler has no -march=sapphirerapids: the build has no AMX")
    assert r.ok is True, r.message
    # int4g32's tiles (tdpbusd) only where the profile keeps amx_int4 on (it sets 0: the VNNI
    # gemm was faster, docs/amx.md); then nothing is promised for them
    int4_tiles = profiles.get_profile("sapphirerapids").knobs.get("amx_int4", 1)
    # packed int8's tiles (tdpbsud) where the profile packs int8
    int8_packed = profiles.get_profile("sapphirerapids").knobs.get("layout_int8") == "interleaved"
    want = ({"tdpbf16ps", "tdpbssd"} | ({"tdpbusd"} if int4_tiles else set())
            | ({"tdpbsud"} if int8_packed else set()))
    assert want <= set(r.promised["require"])
    assert all(r.found[i] > 0 for i in want), r.found
    assert int4_tiles or "tdpbusd" not in r.promised["require"]


AMX_DISASM = """
0000000000001000 <amx_gemm_bf16>:
    1000:	vmovups	zmm0, zmm1
    1004:	tdpbf16ps	tmm0, tmm4, tmm6
    1008:	call	1200 <cb_emu_dpbf16ps@plt>
    100c:	tdpbssd	tmm0, tmm4, tmm6
    1010:	call	1210 <cb_emu_dpbssd@plt>
    1014:	tdpbusd	tmm0, tmm4, tmm6
    1018:	tdpbsud	tmm0, tmm4, tmm6
    101c:	call	1220 <cb_emu_dpbsud@plt>
"""


@pytest.mark.parametrize("cflags, knobs, drop, problem", [
    (["-mamx-tile", "-mamx-bf16", "-mavx512bf16"], {"amx_bf16": 1}, None, None),
    (["-mamx-tile", "-mamx-bf16", "-mavx512bf16"], {"amx_bf16": 1}, "tdpbf16ps", "tdpbf16ps instructions"),
    # the knob keeps bf16 off the tiles: nothing promised
    (["-mamx-tile", "-mamx-bf16", "-mavx512bf16"], {"amx_bf16": 0}, "tdpbf16ps", None),
    # flags without AMX promise no tile products
    (["-mavx512bf16"], {"amx_bf16": 1}, "tdpbf16ps", None),
    # the emulated unit: its calls stand for the products
    (["-mavx512bf16", "-DCB_AMX_EMULATED=1"], {"amx_bf16": 1}, "tdpbf16ps", None),
    (["-mavx512bf16", "-DCB_AMX_EMULATED=1"], {"amx_bf16": 1}, "call", "cb_emu_dpbf16ps instructions"),
    # int8 on tiles: tdpbssd, or the emulated unit's calls
    (["-mamx-tile", "-mamx-int8", "-mavx512vnni"], {"amx_int8": 1}, None, None),
    (["-mamx-tile", "-mamx-int8", "-mavx512vnni"], {"amx_int8": 1}, "tdpbssd", "tdpbssd instructions"),
    (["-mamx-tile", "-mamx-int8", "-mavx512vnni"], {"amx_int8": 0}, "tdpbssd", None),
    (["-mavx512vnni", "-DCB_AMX_EMULATED=1"], {"amx_int8": 1}, "call", "cb_emu_dpbssd instructions"),
    # packed int8 on tiles: tdpbsud as well (the rows' tdpbssd kernels are built too)
    (["-mamx-tile", "-mamx-int8", "-mavx512vnni"], {"amx_int8": 1, "layout_int8": "interleaved"}, "tdpbsud",
     "tdpbsud instructions"),
    (["-mamx-tile", "-mamx-int8", "-mavx512vnni"], {"amx_int8": 1, "layout_int8": "rows"}, "tdpbsud", None),
    (["-mavx512vnni", "-DCB_AMX_EMULATED=1"], {"amx_int8": 1, "layout_int8": "interleaved"}, "call",
     "cb_emu_dpbsud instructions"),
    # int4g32 on tiles: tdpbusd where its knob is on (the sapphirerapids profile keeps it off)
    (["-mamx-tile", "-mamx-int8", "-mavx512vnni"], {"amx_int4": 1}, "tdpbusd", "tdpbusd instructions"),
    (["-mamx-tile", "-mamx-int8", "-mavx512vnni"], {"amx_int4": 0}, "tdpbusd", None),
])
@pytest.mark.skipif(not X86 or shutil.which("gcc") is None, reason="x86-64 gcc's macros")
def test_amx_tile_products_are_required_by_the_build_flags(tmp_path, monkeypatch, cflags, knobs,
                                                           drop, problem):
    import json

    lib = tmp_path / "libcolibri.so"
    lib.write_bytes(b"\x7fELF\x02\x01" + b"\0" * 12 + (62).to_bytes(2, "little") + b"\0" * 40)
    (tmp_path / "build_info.json").write_text(json.dumps(
        {"kernel_isa": "avx512", "features": ["avx", "avx512f", "avx512_bf16"], "knobs": repr(knobs),
         "compiler": {"path": shutil.which("gcc")}, "cflags": ["-march=x86-64-v4", *cflags]}))
    text = "\n".join(line for line in AMX_DISASM.splitlines() if not (drop and f"\t{drop}\t" in line))
    monkeypatch.setattr(isacheck, "disassemble", lambda lib, arch: text)
    res = isacheck.check_library(lib)
    assert res.ok is (problem is None), res.message
    if problem:
        assert problem in res.message


@needs_objdump
def test_a_wrong_promise_fails_with_a_message(built):
    r = isacheck.check_library(built["generic-scalar"], isa="avx512")
    if not X86:
        pytest.skip("zmm is an x86 promise")
    assert r.ok is False
    assert "promises zmm" in r.message and "use none" in r.message


@needs_objdump
@pytest.mark.skipif(not X86, reason="x86 register classes")
def test_registers_the_profile_does_not_allow_fail(built):
    r = isacheck.check_library(built["x86-64-v4"], features=["sse2"])
    assert r.ok is False
    assert "zmm registers, which the profile does not allow" in r.message
    assert "avx512f" in r.message


def test_missing_or_foreign_files_are_not_checked_not_crashed(tmp_path):
    r = isacheck.check_library(tmp_path / "nope.so")
    assert r.ok is None and "cannot read" in r.message
    junk = tmp_path / "libjunk.so"
    junk.write_bytes(b"not an elf file at all, but long enough")
    r = isacheck.check_library(junk)
    assert r.ok is None and "not an ELF file" in r.message


X86_DISASM = """
libx.so:     file format elf64-x86-64

Disassembly of section .text:

0000000000001000 <colibri_layer_forward>:
    1000:	vmovups %zmm0,(%rdi)
    1006:	ret

0000000000001100 <cbk_gateup>:
    1100:	vxorps %xmm0,%xmm0,%xmm0
    1104:	vfmadd231ps (%rsi),%ymm1,%ymm2
    110a:	jmp    1200 <gateup_f32_dec.part.0>

0000000000001200 <gateup_f32_dec.part.0>:
    1200:	vfmadd231ps %zmm1,%zmm2,%zmm3
    1206:	ret

0000000000001300 <cbk_rows_acc@plt>:
    1300:	vmovups %zmm9,(%rax)
"""

ARM_DISASM = """
0000000000001000 <cbk_gateup>:
    1000:	fmla	v0.4s, v1.4s, v2.4s
    1004:	ldr	q3, [x1, #16]
    1008:	fmla	z0.s, p0/m, z1.s, z2.s
    100c:	fadd	s0, s1, s2
0000000000001100 <route_one>:
    1100:	fmla	v9.4s, v9.4s, v9.4s
"""


def test_count_registers_only_inside_kernel_symbols():
    counts, symbols = isacheck.count_registers(X86_DISASM, "x86_64", ("cbk_", "gateup_"))
    assert symbols == ["cbk_gateup", "gateup_f32_dec.part.0"]   # clones count, PLT stubs not
    assert {k: counts[k] for k in ("xmm", "ymm", "zmm")} == {"xmm": 1, "ymm": 1, "zmm": 1}
    assert counts["tdpbf16ps"] == 0                              # colibri_layer_forward's zmm not
    counts, symbols = isacheck.count_registers(ARM_DISASM, "aarch64", ("cbk_",))
    assert symbols == ["cbk_gateup"]
    assert counts == {"v": 1, "q": 1, "z": 1, "fmla.4s": 1, "sdot": 0, "bfdot": 0, "bfmmla": 0, "smmla": 0}


ARM_LEVELS = """
0000000000002000 <cbk_gateup>:
    2000:	fmla	v0.4s, v1.4s, v2.4s
    2004:	sdot	v3.4s, v4.16b, v5.16b
    2008:	smmla	v6.4s, v7.16b, v8.16b
    200c:	bfmmla	v9.4s, v10.8h, v11.8h
"""


@pytest.mark.parametrize("features, knobs, drop, problem", [
    (["asimd"], {}, None, None),                                      # armv8-a: fmla only
    (["asimd", "asimddp"], {}, None, None),                           # dotprod: sdot found
    (["asimd", "asimddp"], {}, "sdot", "sdot instructions"),          # dotprod without sdot
    (["asimd", "asimddp", "i8mm", "bf16"], {"gemm_mmla_int8": 1, "gemm_mmla_bf16": 1}, None, None),
    (["asimd", "asimddp", "i8mm", "bf16"], {"gemm_mmla_int8": 1, "gemm_mmla_bf16": 1}, "smmla",
     "smmla instructions"),
    # the pair dot chosen instead of BFMMLA: bfdot is then required, and absent here
    (["asimd", "asimddp", "i8mm", "bf16"], {"gemm_mmla_int8": 0, "gemm_mmla_bf16": 0, "gemm_bf16_dot": 1},
     None, "bfdot instructions"),
    (["asimd"], {}, "fmla", "fmla.4s instructions"),
])
def test_arm_levels_require_their_instructions(tmp_path, monkeypatch, features, knobs, drop, problem):
    lib = tmp_path / "libcolibri.so"
    lib.write_bytes(b"\x7fELF\x02\x01" + b"\0" * 12 + (183).to_bytes(2, "little") + b"\0" * 40)
    (tmp_path / "build_info.json").write_text(__import__("json").dumps(
        {"kernel_isa": "neon", "features": features, "knobs": repr(knobs)}))
    text = "\n".join(line for line in ARM_LEVELS.splitlines() if not (drop and f"\t{drop}\t" in line))
    monkeypatch.setattr(isacheck, "disassemble", lambda lib, arch: text)
    res = isacheck.check_library(lib)
    assert res.ok is (problem is None), res.message
    if problem:
        assert problem in res.message


def test_kernel_prefixes_come_from_the_templates():
    prefixes = isacheck.kernel_prefixes()
    for name in ("cbk_", "part_gateup", "part_rows_acc", "gateup_", "rows_acc_", "dot_"):
        assert name in prefixes


def test_elf_arch(tmp_path):
    for machine, arch in ((62, "x86_64"), (183, "aarch64")):
        f = tmp_path / f"lib{machine}.so"
        f.write_bytes(b"\x7fELF\x02\x01" + b"\0" * 12 + machine.to_bytes(2, "little") + b"\0" * 40)
        assert isacheck.elf_arch(f) == arch
