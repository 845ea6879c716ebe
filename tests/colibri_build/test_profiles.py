"""Profile registry, compiler resolution, version ranges and host matching."""
from __future__ import annotations

import json
import os
import shutil
from dataclasses import replace
from pathlib import Path

import pytest

from colibri_build import cpuinfo, hostid, isas, profiles

REQUIRED = ["generic", "x86-64-v2", "x86-64-v3", "x86-64-v4", "haswell", "skylake-avx512",
            "icelake-server", "sapphirerapids", "zen3", "zen4", "zen5", "neoverse-n1",
            "neoverse-v2", "apple-m1", "debug", "asan"]


@pytest.fixture(scope="module")
def reg():
    return profiles.load_registry()


# ---------------------------------------------------------------- registry

def test_registry_has_every_required_profile(reg):
    assert set(REQUIRED) <= set(reg)
    for name, prof in reg.items():
        assert prof.name == name and prof.description, name


def test_inheritance_accumulates_features_and_merges_knobs(reg):
    v3, v4, spr = reg["x86-64-v3"], reg["x86-64-v4"], reg["sapphirerapids"]
    assert v3.features < v4.features < spr.features
    assert {"avx512_bf16", "avx512f", "avx2", "sse4_2"} <= spr.features
    assert spr.chain == ("sapphirerapids", "icelake-server", "skylake-avx512", "x86-64-v4",
                         "x86-64-v3", "x86-64-v2", "generic")
    # knobs merge: v4 sets isa/rows, generic's prefetch survives
    assert spr.knobs["isa"] == "avx512" and spr.knobs["prefetch_f32"] == reg["generic"].knobs["prefetch_f32"]
    # flag lists replace: nothing of x86-64-v4's -march leaks into sapphirerapids
    gcc_flags = [f for rule in spr.flags["gcc"] for f in rule.cflags]
    assert "-march=x86-64-v4" not in gcc_flags
    # cross compilers are inherited, match entries are not
    assert reg["neoverse-v2"].cross["gcc"].cc == "aarch64-linux-gnu-gcc"
    assert reg["icelake-server"].match.cpuid != spr.match.cpuid


def test_build_kinds(reg):
    for name in ("debug", "asan"):
        prof = reg[name]
        assert prof.kind == "build" and prof.inherits == "generic" and prof.arch == "any"
    asan = reg["asan"].flags["gcc"][0]
    assert "-fsanitize=address,undefined" in asan.cflags and "-fsanitize=address,undefined" in asan.ldflags
    assert "-O0" in reg["debug"].flags["gcc"][0].cflags
    # fuzz: clang only (gcc has no libFuzzer), instrumented objects, fuzzer linked in
    fuzz = reg["fuzz"]
    assert fuzz.kind == "build" and set(fuzz.flags) == {"clang"}
    rule = fuzz.flags["clang"][0]
    assert "-fsanitize=fuzzer-no-link,address,undefined" in rule.cflags
    assert "-fsanitize=fuzzer,address,undefined" in rule.ldflags


def test_kernel_isas_are_backed_by_features(reg):
    for prof in reg.values():
        for isa in prof.kernel_isas:
            assert set(isas.records()[isa].features) <= prof.features, (prof.name, isa)
        assert prof.knobs.get("isa", "portable") in prof.kernel_isas, prof.name


def test_no_profile_uses_march_native(reg):
    for prof in reg.values():
        for rules in prof.flags.values():
            for rule in rules:
                assert not any("native" in f for f in rule.cflags), prof.name


def test_unknown_profile_lists_the_valid_ones(reg):
    with pytest.raises(profiles.UnknownProfile) as exc:
        profiles.get_profile("zen9", reg)
    message = str(exc.value)
    assert "zen9" in message and "sapphirerapids" in message and "neoverse-n1" in message


def _write(dir_: Path, name: str, text: str) -> None:
    (dir_ / f"{name}.yaml").write_text(text)


def test_registry_rejects_typos_cycles_and_bad_isas(tmp_path):
    _write(tmp_path, "a", "name: a\nfeaturez: []\n")
    with pytest.raises(profiles.ProfileError, match="unknown key 'featurez'"):
        profiles.load_registry(tmp_path)
    _write(tmp_path, "a", "name: a\ninherits: b\n")
    _write(tmp_path, "b", "name: b\ninherits: a\n")
    with pytest.raises(profiles.ProfileError, match="cycle"):
        profiles.load_registry(tmp_path)
    _write(tmp_path, "a", "name: a\narch: x86_64\nkernel_isas: [avx512]\n")
    _write(tmp_path, "b", "name: b\n")
    with pytest.raises(profiles.ProfileError, match="avx512f"):
        profiles.load_registry(tmp_path)
    _write(tmp_path, "a", "name: a\nflags: {gcc: [{versions: '>>9', cflags: []}]}\n")
    with pytest.raises(profiles.ProfileError, match="version range"):
        profiles.load_registry(tmp_path)
    _write(tmp_path, "a", "name: wrong\n")
    with pytest.raises(profiles.ProfileError, match="file name"):
        profiles.load_registry(tmp_path)


# ---------------------------------------------------------------- version ranges

@pytest.mark.parametrize("version,spec,expected", [
    ("12.2.0", ">=13", False),
    ("13.1.0", ">=13", True),
    ("12.2.0", ">=10.3,<12.3", True),
    ("12.3.0", ">=10.3,<12.3", False),
    ("13.0.0", "<13", False),
    ("12.2.0", "12", True),
    ("12.2.0", "12.3", False),
    ("11.4.0", "!=11.4", False),
    ("9.5.0", "", True),
    ("9.5.0", "any", True),
    ("14", ">=14.1", False),
    ("14.1", ">=14.1.0", True),
    ("12.2.0-14", "==12.2", True),
])
def test_version_in_range(version, spec, expected):
    assert profiles.version_in_range(version, spec) is expected


def test_bad_version_range():
    with pytest.raises(ValueError):
        profiles.check_range("~>12")


@pytest.mark.parametrize("profile,family,version,march,fallback", [
    ("zen4", "gcc", "12.2.0", "-march=znver3", True),
    ("zen4", "gcc", "12.3.0", "-march=znver4", False),
    ("zen4", "gcc", "13.2.0", "-march=znver4", False),
    ("zen5", "gcc", "12.2.0", "-march=znver3", True),
    ("zen5", "gcc", "13.2.0", "-march=znver4", True),
    ("zen5", "gcc", "14.1.0", "-march=znver5", False),
    ("zen4", "clang", "15.0.7", "-march=znver3", True),
    ("zen4", "clang", "16.0.6", "-march=znver4", False),
    ("zen5", "clang", "19.1.0", "-march=znver5", False),
    ("sapphirerapids", "gcc", "10.2.1", "-march=icelake-server", True),
    ("sapphirerapids", "gcc", "12.2.0", "-march=sapphirerapids", False),
    ("x86-64-v3", "gcc", "10.2.1", "-march=x86-64", True),
    ("neoverse-v2", "gcc", "12.2.0", "-march=armv9-a+i8mm+bf16", True),
    ("neoverse-v2", "gcc", "13.1.0", "-mcpu=neoverse-v2", False),
    ("apple-m1", "gcc", "12.2.0", "-march=armv8.4-a+fp16+fp16fml", True),
    ("apple-m1", "clang", "14.0.0", "-mcpu=apple-m1", False),
])
def test_flag_table_picks_by_compiler_version(reg, profile, family, version, march, fallback):
    rule = profiles.select_flags(reg[profile], family, version)
    assert rule.cflags[0] == march
    assert bool(rule.note) is fallback
    if profile == "zen4" and fallback:
        assert {"-mavx512f", "-mavx512bw", "-mavx512vl", "-mavx512bf16"} <= set(rule.cflags)
        assert "znver4" in rule.note


def test_too_old_compiler_is_refused(reg):
    with pytest.raises(profiles.ResolveError, match=r"gcc 8\.5\.0 is not supported.*>=9"):
        profiles.select_flags(reg["generic"], "gcc", "8.5.0")


# ---------------------------------------------------------------- resolution on this host

def test_every_profile_resolves_with_gcc_or_says_why(reg):
    host = cpuinfo.host_cpu()
    for name, prof in reg.items():
        try:
            res = profiles.resolve(prof, "gcc", host)
        except profiles.ResolveError as exc:
            message = str(exc)
            if "gcc" not in prof.flags:  # a clang-only build kind (fuzz: libFuzzer)
                assert prof.kind == "build" and "no flag table for gcc" in message, message
                continue
            assert prof.arch not in ("any", host.arch), f"{name} should build here: {message}"
            cross = prof.cross["gcc"]
            assert cross.cc in message and cross.package in message, message
            assert shutil.which(cross.cc) is None  # only refused because it is missing
            continue
        assert res.compiler.family == "gcc" and res.version[0].isdigit()
        assert os.path.isabs(res.compiler_path)
        assert res.cflags[: len(profiles.BASE_CFLAGS)] == profiles.BASE_CFLAGS
        assert not any("native" in f for f in res.cflags)
        assert res.reason
        if res.runnable_here:
            assert not profiles.missing_features(prof, host)
        else:
            assert profiles.missing_features(prof, host) or res.cross


def test_gcc_12_2_resolution_records_fallback_note():
    comp = profiles.probe_compiler("gcc")
    if not profiles.version_in_range(comp.version, ">=10.3,<12.3"):
        pytest.skip(f"host gcc is {comp.version}; the znver3 fallback applies to 10.3-12.2")
    res = profiles.resolve("zen4", "gcc")
    assert "-march=znver3" in res.cflags and "-mavx512f" in res.cflags
    assert any("znver4" in n for n in res.notes)


def test_missing_compiler_message_names_it():
    with pytest.raises(profiles.CompilerMissing, match="no-such-cc-xyz"):
        profiles.resolve("generic", "no-such-cc-xyz")


def test_profile_for_features_the_host_lacks_is_not_runnable(reg):
    host = replace(cpuinfo.host_cpu(), flags=frozenset({"sse4_2"}))
    ok, why = profiles.runs_on(reg["x86-64-v4"], replace(host, arch="x86_64"))
    assert not ok and "avx512f" in why
    ok, why = profiles.runs_on(reg["neoverse-n1"], replace(host, arch="x86_64"))
    assert not ok and "aarch64" in why


# ---------------------------------------------------------------- cpuinfo parsing

EMR_VM = """processor\t: 0
vendor_id\t: GenuineIntel
cpu family\t: 6
model\t\t: 207
model name\t: Intel(R) Xeon(R) Processor
stepping\t: 2
flags\t\t: fpu sse sse2 ssse3 cx16 pni popcnt sse4_1 sse4_2 lahf_lm abm avx avx2 bmi1 bmi2 f16c fma movbe xsave avx512f avx512dq avx512ifma avx512cd avx512bw avx512vl avx512vbmi avx512_vbmi2 gfni vaes vpclmulqdq avx512_vnni avx512_bitalg avx512_vpopcntdq avx_vnni avx512_bf16 avx512_fp16 amx_bf16 amx_tile amx_int8 hypervisor

processor\t: 1
vendor_id\t: GenuineIntel
"""

GRAVITON2 = """processor\t: 0
BogoMIPS\t: 243.75
Features\t: fp asimd evtstrm aes pmull sha1 sha2 crc32 atomics fphp asimdhp cpuid asimdrdm lrcpc dcpop asimddp ssbs
CPU implementer\t: 0x41
CPU architecture: 8
CPU variant\t: 0x3
CPU part\t: 0xd0c
CPU revision\t: 1
"""


# A KVM guest seen here (2026-12-04): Sapphire Rapids' flags (AMX, AVX512-FP16) under
# model 167, an identity no profile lists; archspec says icelake.
KVM_SPR_MODEL_167 = ("processor\t: 0\nvendor_id\t: GenuineIntel\ncpu family\t: 6\nmodel\t\t: 167\n"
    "model name\t: Intel(R) Xeon(R) Processor\nstepping\t: 1\nflags\t\t: "
    "fpu vme de pse tsc msr pae mce cx8 apic sep mtrr pge mca cmov pat pse36 clflush mmx "
    "fxsr sse sse2 ss ht syscall nx pdpe1gb rdtscp lm constant_tsc rep_good nopl "
    "xtopology nonstop_tsc cpuid tsc_known_freq pni pclmulqdq ssse3 fma cx16 pcid sse4_1 "
    "sse4_2 x2apic movbe popcnt tsc_deadline_timer aes xsave avx f16c rdrand hypervisor "
    "lahf_lm abm 3dnowprefetch cpuid_fault fsgsbase tsc_adjust bmi1 hle avx2 smep bmi2 "
    "erms invpcid rtm avx512f avx512dq rdseed adx smap avx512ifma clflushopt clwb "
    "avx512cd sha_ni avx512bw avx512vl xsaveopt xsavec xgetbv1 xsaves avx_vnni "
    "avx512_bf16 arat avx512vbmi umip avx512_vbmi2 gfni vaes vpclmulqdq avx512_vnni "
    "avx512_bitalg avx512_vpopcntdq rdpid cldemote movdiri movdir64b fsrm serialize "
    "tsxldtrk amx_bf16 avx512_fp16 amx_tile amx_int8 arch_capabilities"
    "\n")


def test_parse_x86_cpuinfo():
    cpu = cpuinfo.parse_cpuinfo(EMR_VM)
    assert (cpu.arch, cpu.vendor, cpu.family, cpu.model, cpu.stepping) == ("x86_64", "GenuineIntel", 6, 207, 2)
    assert cpu.model_name == "Intel(R) Xeon(R) Processor"
    assert {"avx512f", "avx512_bf16", "amx_tile"} <= cpu.flags


def test_parse_arm_cpuinfo():
    cpu = cpuinfo.parse_cpuinfo(GRAVITON2)
    assert (cpu.arch, cpu.implementer, cpu.part) == ("aarch64", 0x41, 0xD0C)
    assert {"asimd", "asimddp", "atomics"} <= cpu.flags


# ---------------------------------------------------------------- host matching

def test_emerald_rapids_vm_matches_sapphirerapids():
    # archspec sees no WAITPKG in such VMs and says icelake; the CPUID table is exact.
    best, reasons = profiles.match_host(cpuinfo.parse_cpuinfo(EMR_VM))
    assert best == "sapphirerapids"
    assert "model 207" in reasons["sapphirerapids"]
    assert reasons["asan"].startswith("build kind")


def test_unlisted_identity_with_every_feature_takes_the_derived_profile():
    cpu = cpuinfo.parse_cpuinfo(KVM_SPR_MODEL_167)
    if cpu.archspec_name is None:
        pytest.skip("archspec is not installed")
    assert cpu.archspec_name == "icelake"
    best, reasons = profiles.match_host(cpu)
    assert best == "sapphirerapids", reasons
    assert "every feature of sapphirerapids" in reasons["sapphirerapids"]
    # without the derived profile's own features it stays where archspec put it
    lacking = replace(cpu, flags=cpu.flags - {"avx512_fp16"})
    assert profiles.match_host(lacking)[0] == "icelake-server"


def test_graviton2_matches_neoverse_n1():
    best, _ = profiles.match_host(cpuinfo.parse_cpuinfo(GRAVITON2))
    assert best == "neoverse-n1"


def test_hidden_flags_fall_back_to_a_level():
    cpu = replace(cpuinfo.parse_cpuinfo(EMR_VM), flags=frozenset(
        "cx16 lahf_lm popcnt pni sse4_1 sse4_2 ssse3 abm avx avx2 bmi1 bmi2 f16c fma movbe xsave".split()))
    best, reasons = profiles.match_host(cpu)
    assert best in ("x86-64-v3", "haswell")
    assert "lacks" in reasons["sapphirerapids"] and "avx512f" in reasons["sapphirerapids"]


def test_this_host_matches_a_runnable_profile(reg):
    host = cpuinfo.host_cpu()
    best = hostid.host_profile_name()
    assert profiles.runs_on(reg[best], host)[0]
    if (host.vendor, host.family, host.model) in {("GenuineIntel", 6, 143), ("GenuineIntel", 6, 207)}:
        assert best == "sapphirerapids"


def test_text_path_agrees_with_archspec_on_this_host():
    archspec = pytest.importorskip("archspec.cpu")
    path = Path("/proc/cpuinfo")
    if not path.exists():
        pytest.skip("no /proc/cpuinfo")
    assert cpuinfo.parse_cpuinfo(path.read_text()).archspec_name == archspec.host().name


def _archspec_dumps() -> Path | None:
    try:
        import archspec
    except ImportError:
        return None
    d = Path(archspec.__file__).parent / "json" / "tests" / "targets"
    return d if d.is_dir() else None


# Recorded /proc/cpuinfo of real machines, shipped with archspec -> expected profile.
DUMPS = {
    "linux-unknown-sapphirerapids": "sapphirerapids",
    "linux-rocky8.5-zen4": "zen4",
    "linux-rocky9-zen5": "zen5",
    "linux-rocky9-zen6": "zen5",
    "linux-ubuntu20.04-zen3": "zen3",
    "linux-rhel7-zen": "x86-64-v3",
    "linux-rhel7-haswell": "haswell",
    "linux-rhel7-broadwell": "haswell",
    "linux-ubuntu24.04-alderlake": "haswell",
    "linux-rhel7-skylake_avx512": "skylake-avx512",
    "linux-centos7-cascadelake": "skylake-avx512",
    "linux-rhel7-ivybridge": "x86-64-v2",
    "linux-scientific7-k10": "generic",
    "linux-amazon-neoverse_n1": "neoverse-n1",
    "linux-amazon-neoverse_v1": "neoverse-n1",
    "linux-rhel9-neoverse_v2": "neoverse-v2",
    "linux-ubuntu22.04-neoverse_v2": "neoverse-v2",
    "linux-asahi-m1": "apple-m1",
    "linux-asahi-m2": "apple-m1",
    "linux-amazon-cortex_a72": "armv8-a",
}


@pytest.mark.parametrize("dump,expected", sorted(DUMPS.items()))
def test_recorded_hosts_match_sensible_profiles(dump, expected):
    d = _archspec_dumps()
    if d is None or not (d / dump).exists():
        pytest.skip("archspec's recorded cpuinfo dumps are not installed")
    best, reasons = profiles.match_host(cpuinfo.parse_cpuinfo((d / dump).read_text()))
    assert best == expected, reasons[expected]


# ---------------------------------------------------------------- hostid

def test_host_id_is_stable_and_readable():
    a, b = hostid.host_id(), hostid.host_id()
    assert a == b and a.startswith(hostid.host_profile_name() + "-")
    cpu = cpuinfo.parse_cpuinfo(EMR_VM)
    other = replace(cpu, flags=cpu.flags - {"avx512_fp16"})
    assert hostid.host_id(cpu) != hostid.host_id(other)


def test_tuned_library_path(tmp_path):
    assert hostid.tuned_library_path(tmp_path) is None
    lib = hostid.tuned_dir(tmp_path) / "libcolibri.so"
    lib.parent.mkdir(parents=True)
    lib.write_bytes(b"")
    assert hostid.tuned_library_path(tmp_path) == lib
    assert lib.parent.parent == tmp_path / "tuned"


def test_library_mismatch_names_what_the_host_lacks(tmp_path):
    lib = tmp_path / "libcolibri.so"
    lib.write_bytes(b"")
    assert hostid.library_mismatch(lib) is None  # no build_info.json: allowed
    host = cpuinfo.host_cpu()
    info = {"profile": "x", "arch": host.arch, "features": sorted(host.flags)[:3]}
    (tmp_path / "build_info.json").write_text(json.dumps(info))
    assert hostid.library_mismatch(lib) is None
    info["features"] = ["avx512f", "no_such_feature_xyz"]
    (tmp_path / "build_info.json").write_text(json.dumps(info))
    assert "no_such_feature_xyz" in hostid.library_mismatch(lib)
    info.update(arch="sparc64", features=[])
    (tmp_path / "build_info.json").write_text(json.dumps(info))
    assert "sparc64" in hostid.library_mismatch(lib)
    (tmp_path / "build_info.json").write_text("{not json")
    assert "unreadable build info" in hostid.library_mismatch(lib)


def test_binding_refuses_a_library_for_another_host(tmp_path):
    lib_mod = pytest.importorskip("colibri._lib")
    lib = tmp_path / "libcolibri.so"
    lib.write_bytes(b"")
    (tmp_path / "build_info.json").write_text(json.dumps({"profile": "x", "arch": "sparc64"}))
    with pytest.raises(lib_mod.LibraryNotFound, match="sparc64"):
        lib_mod.open_library(lib)


def test_cross_profile_resolves_with_a_cross_compiler(tmp_path, monkeypatch):
    """An aarch64 profile on an x86 host uses the profile's cross compiler, never runs here."""
    if cpuinfo.host_arch() != "x86_64":
        pytest.skip("x86_64 host needed")
    fake = tmp_path / "aarch64-linux-gnu-gcc"  # answers like an aarch64 gcc 12.2 would
    fake.write_text("#!/bin/sh\n"
                    "case \"$*\" in\n"
                    "  *-dumpfullversion*) echo 12.2.0 ;;\n"
                    "  *-dM*) printf '#define __GNUC__ 12\\n#define __aarch64__ 1\\n' ;;\n"
                    "esac\n")
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    res = profiles.resolve("neoverse-v2", "gcc")
    assert res.cross and res.arch == "aarch64" and res.compiler.path == str(fake)
    assert "-march=armv9-a+i8mm+bf16" in res.cflags  # gcc 12.2 fallback
    assert any("neoverse-v2" in n for n in res.notes) and any("cross-compiling" in n for n in res.notes)
    assert not res.runnable_here and "aarch64" in res.reason
    with pytest.raises(profiles.ResolveError, match="generates aarch64 code"):
        profiles.resolve("zen4", str(fake))
