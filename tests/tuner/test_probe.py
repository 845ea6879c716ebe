"""tuner.host.probe / tuner.host.sysfs / the probe and profiles commands.

Most tests probe the recorded hosts of tests/fixtures/hosts/ (see its README): the
probe must tell a Zen 5 VM from a Zen 3 server and a Graviton from a Xeon without
being on them. Nothing here measures bandwidth (tests/tuner/test_bandwidth.py does).
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import shutil
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from colibri_build import cpuinfo, hostid, profiles
from tuner.host import commands as cli_probe, probe, sysfs

ROOT = Path(__file__).resolve().parents[2]
HOSTS = Path(__file__).resolve().parents[1] / "fixtures" / "hosts"
FIXTURES = sorted(p.name for p in HOSTS.iterdir() if (p / "expected.json").exists())
CACHE_FIELDS = ("level", "type", "size_bytes", "line_size", "ways", "shared_cpu_count")
CONTRACT = ("vendor", "family", "model", "stepping", "model_name", "microarchitecture",
            "microarchitecture_source", "arch", "isa", "cores", "threads", "caches", "numa",
            "hugepages", "memory_channels", "memory_channels_reason", "memory_total_bytes",
            "compilers", "bandwidth", "bandwidth_reason", "profile", "profile_reason", "host_id",
            "fingerprint")


def expected(name: str) -> dict:
    return json.loads((HOSTS / name / "expected.json").read_text())


@pytest.fixture(scope="module")
def probed() -> dict[str, probe.HostInfo]:
    return {name: probe.probe(root=HOSTS / name, measure_bandwidth=False) for name in FIXTURES}


# ---------------------------------------------------------------- recorded hosts

def test_fixtures_cover_the_fleet():
    assert len(FIXTURES) >= 6
    exp = [expected(n) for n in FIXTURES]
    assert {"GenuineIntel", "AuthenticAMD", "ARM"} <= {e["vendor"] for e in exp}
    assert any(e["microarchitecture_source"] == "cpuid-table" for e in exp)  # VMs hiding flags
    assert any(len(e["numa"]["nodes"]) >= 2 for e in exp)
    assert {"zen3", "zen4", "zen5", "icelake", "neoverse_n1"} <= {e["microarchitecture"] for e in exp}


@pytest.mark.parametrize("name", FIXTURES)
def test_recorded_host(name, probed):
    exp, info = expected(name), probed[name]
    for key in ("vendor", "family", "model", "stepping", "arch", "cores", "threads", "sockets",
                "microarchitecture", "microarchitecture_source", "profile", "memory_channels",
                "llc_total_bytes", "implementer", "part"):
        if key in exp:
            assert getattr(info, key) == exp[key], (key, info.microarchitecture_reason)
    if "archspec" in exp:
        pytest.importorskip("archspec")
        assert info.archspec == exp["archspec"]
    assert [{k: c[k] for k in CACHE_FIELDS} for c in info.caches] == exp["caches"]
    assert [{"id": n["id"], "cpus": n["cpus"]} for n in info.numa["nodes"]] == exp["numa"]["nodes"]
    assert info.numa["distances"] == exp["numa"]["distances"]
    hp = info.hugepages
    assert (hp["thp_enabled"], hp["thp_defrag"]) == (exp["hugepages"]["thp_enabled"],
                                                     exp["hugepages"]["thp_defrag"])
    assert [{k: p[k] for k in ("page_size_bytes", "nr", "free")} for p in hp["hugetlb_pools"]] \
        == exp["hugepages"]["hugetlb_pools"]
    if "memory_channels_reason_contains" in exp:
        assert exp["memory_channels_reason_contains"] in info.memory_channels_reason
    assert info.memory_channels_reason  # always says how, or why not
    assert info.bandwidth is None and "--no-bandwidth" in info.bandwidth_reason
    assert info.profile_reason.startswith("selected")
    assert info.microarchitecture_reason
    assert info.memory_total_bytes and info.memory_total_bytes > 0
    assert list(info.isa) == sorted(info.isa) and info.isa


@pytest.mark.parametrize("name", FIXTURES)
def test_recorded_host_id_is_hostid_id(name, probed):
    cpu = cpuinfo.parse_cpuinfo((HOSTS / name / "proc" / "cpuinfo").read_text())
    assert probed[name].host_id == hostid.host_id(cpu)
    assert probed[name].host_id.startswith(expected(name)["profile"] + "-")


def test_vm_hiding_flags_is_still_known(probed):
    """The two cases archspec alone gets wrong: the identity table decides."""
    zen5 = probed["zen5-vm"]
    assert (zen5.archspec, zen5.microarchitecture, zen5.microarchitecture_source) == \
        ("x86_64_v4", "zen5", "cpuid-table")
    assert "generic level" in zen5.microarchitecture_reason and "clzero" in zen5.microarchitecture_reason
    emr = probed["emr-vm-2vcpu"]
    assert emr.microarchitecture == "sapphirerapids" and "waitpkg" in emr.microarchitecture_reason
    # archspec's answer is kept when it is the more specific one
    assert probed["clx-2s"].microarchitecture == "cascadelake"


def test_identify_rules():
    reg = profiles.registry()
    text = (HOSTS / "genoa-2s" / "proc" / "cpuinfo").read_text()
    genoa = cpuinfo.parse_cpuinfo(text)
    assert probe.identify(genoa, reg)[:2] == ("zen4", "archspec")
    # an identity no profile lists: archspec decides
    unlisted = replace(genoa, family=99)
    assert probe.identify(unlisted, reg)[:2] == ("zen4", "archspec")
    # archspec absent: the table still names it
    assert probe.identify(replace(genoa, archspec_name=None, archspec_ancestors=()), reg)[:2] == \
        ("zen4", "cpuid-table")
    # neither: the architecture, source none
    assert probe.identify(replace(unlisted, archspec_name=None, archspec_ancestors=()), reg)[:2] == \
        ("x86_64", "none")


def test_topology_exact_when_every_cpu_is_recorded(probed):
    assert probed["emr-vm-2vcpu"].topology_source == "sysfs"
    assert probed["genoa-2s"].topology_source == "cpu0-siblings"


def test_llc_total_counts_every_instance(probed):
    genoa = probed["genoa-2s"]
    assert genoa.llc_bytes == 32 << 20
    assert genoa.llc_total_bytes == 24 * (32 << 20)  # 12 CCDs x 2 sockets


# ---------------------------------------------------------------- fingerprint

def test_fingerprint_is_stable_and_tracks_identity(probed):
    again = probe.probe(root=HOSTS / "genoa-2s", measure_bandwidth=False)
    first = probed["genoa-2s"]
    assert again.fingerprint == first.fingerprint and len(first.fingerprint) == 16
    d = first.to_dict()
    assert probe.fingerprint(d) == first.fingerprint
    # run-time state is not identity
    noisy = {**d, "bandwidth": {"read_gbps": 1.0}, "memory_total_bytes": 1,
             "hugepages": {"thp_enabled": "never"}, "memory_channels": 3}
    assert probe.fingerprint(noisy) == first.fingerprint
    # identity is
    for key, value in (("isa", d["isa"][:-1]), ("stepping", 2), ("model_name", "other"),
                       ("threads", 192), ("compilers", {"gcc": {"family": "gcc", "version": "99.1"}})):
        assert probe.fingerprint({**d, key: value}) != first.fingerprint, key
    caches = [dict(c) for c in d["caches"]]
    caches[-1]["size_bytes"] *= 2
    assert probe.fingerprint({**d, "caches": caches}) != first.fingerprint
    numa = {**d["numa"], "distances": [[10, 12], [12, 10]]}
    assert probe.fingerprint({**d, "numa": numa}) != first.fingerprint


def test_fingerprint_changes_with_the_recorded_tree(tmp_path, probed):
    tree = tmp_path / "host"
    shutil.copytree(HOSTS / "milan-nps4", tree)
    (tree / "sys/devices/system/cpu/cpu0/cache/index3/size").write_text("16384K\n")
    changed = probe.probe(root=tree, measure_bandwidth=False)
    assert changed.caches[-1]["size_bytes"] == 16 << 20
    assert changed.fingerprint != probed["milan-nps4"].fingerprint
    (tree / "sys/kernel/mm/transparent_hugepage/enabled").write_text("[always] madvise never\n")
    assert probe.probe(root=tree, measure_bandwidth=False).fingerprint == changed.fingerprint


def test_hostinfo_round_trips_through_json(probed):
    info = probed["icx-2s"]
    d = json.loads(json.dumps(info.to_dict()))
    assert probe.HostInfo.from_dict(d) == info
    assert set(CONTRACT) <= set(d)
    with pytest.raises(dataclasses.FrozenInstanceError):
        info.vendor = "x"  # type: ignore[misc]


# ---------------------------------------------------------------- sysfs pieces

def test_cpulist_and_sizes():
    assert sysfs.parse_cpulist("0-3,8,10-11\n") == [0, 1, 2, 3, 8, 10, 11]
    assert sysfs.parse_cpulist("") == [] and sysfs.parse_cpulist(None) == []
    assert sysfs.format_cpulist([0, 1, 2, 3, 8, 10, 11]) == "0-3,8,10-11"
    assert sysfs.format_cpulist([5]) == "5"
    assert sysfs.parse_size("48K") == 48 << 10 and sysfs.parse_size("32M") == 32 << 20
    assert sysfs.parse_size("1G") == 1 << 30 and sysfs.parse_size("bogus") is None


def test_a_bare_tree_probes_with_what_it_has(tmp_path):
    """Containers and old kernels hide sysfs: the probe reports unknowns, never fails."""
    (tmp_path / "proc").mkdir()
    shutil.copy(HOSTS / "graviton2" / "proc" / "cpuinfo", tmp_path / "proc" / "cpuinfo")
    info = probe.probe(root=tmp_path, measure_bandwidth=False, detect_compilers=False)
    assert info.microarchitecture == "neoverse_n1"
    assert info.caches == () and info.llc_bytes is None and info.cores is None
    assert info.numa["source"] == "assumed" and info.numa["distances"] == [[10]]
    assert info.hugepages == {"thp_enabled": None, "thp_defrag": None, "hugetlb_pools": []}
    assert info.memory_channels is None and info.memory_total_bytes is None
    json.dumps(info.to_dict())


def test_missing_cpuinfo_is_an_error(tmp_path):
    with pytest.raises(FileNotFoundError):
        probe.probe(root=tmp_path, measure_bandwidth=False)


# ---------------------------------------------------------------- memory channels

def _dimm(size, locator, bank):
    return (f"Handle 0x1100, DMI type 17, 92 bytes\nMemory Device\n\tSize: {size}\n"
            f"\tLocator: {locator}\n\tBank Locator: {bank}\n\tType: DDR5\n\n")


def test_channels_from_dmidecode():
    amd = "".join(_dimm("64 GB", f"P1-DIMM{c}1", f"P0 CHANNEL {c}") for c in "ABCDEFGHIJKL")
    amd += _dimm("No Module Installed", "P1-DIMMA2", "P0 CHANNEL A")
    assert probe.channels_from_dmidecode(amd)[0] == 12
    # two DIMMs per channel count once; two sockets count apart
    intel = "".join(_dimm("32 GB", f"CPU{s}_DIMM_{c}{slot}", f"NODE {s}")
                    for s in (1, 2) for c in "ABCD" for slot in (1, 2))
    assert probe.channels_from_dmidecode(intel)[0] == 8
    n, why = probe.channels_from_dmidecode("".join(_dimm("16 GB", f"A{i}", "Not Specified")
                                                   for i in range(4)))
    assert n is None and "do not name channels" in why
    assert probe.channels_from_dmidecode("") == (None, "dmidecode lists no memory devices (DMI type 17)")
    n, why = probe.channels_from_dmidecode(_dimm("No Module Installed", "DIMM_A1", "P0"))
    assert n is None and "none populated" in why


def test_vm_channels_are_not_guessed():
    cpu = cpuinfo.parse_cpuinfo((HOSTS / "zen5-vm" / "proc" / "cpuinfo").read_text())
    n, why = probe.memory_channels(cpu, HOSTS / "genoa-2s", is_host=False)
    assert n is None and "virtual machine" in why


# ---------------------------------------------------------------- this machine

def test_this_host():
    info = probe.probe(measure_bandwidth=False)
    assert info.host_id == hostid.host_id()
    assert info.profile == hostid.host_profile_name()
    assert info.arch == cpuinfo.host_arch() and info.isa
    assert info.threads and info.threads >= 1 and info.memory_total_bytes > 0
    if Path("/sys/devices/system/cpu/cpu0/cache").exists():
        assert info.caches and info.llc_bytes
    assert info.bandwidth is None and "--no-bandwidth" in info.bandwidth_reason
    assert info.memory_channels is not None or info.memory_channels_reason
    gcc = shutil.which("gcc")
    if gcc:
        assert info.compilers["gcc"]["family"] == "gcc" and info.compilers["gcc"]["version"]
    assert probe.probe(measure_bandwidth=False).fingerprint == info.fingerprint


# ---------------------------------------------------------------- commands

def _run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "tuner.host.commands", *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=300)


def test_probe_command_prints_json():
    res = _run("probe", "--json", "--no-bandwidth")
    assert res.returncode == 0, res.stderr
    data = json.loads(res.stdout)
    assert set(CONTRACT) <= set(data)
    assert data["bandwidth"] is None and data["host_id"] == hostid.host_id()


def test_probe_command_reads_a_recorded_tree():
    res = _run("probe", "--no-bandwidth", "--root", str(HOSTS / "zen5-vm"))
    assert res.returncode == 0, res.stderr
    assert "zen5" in res.stdout and "cpuid-table" in res.stdout and "x86_64_v4" in res.stdout


def test_profiles_command():
    res = _run("profiles", "--json")
    assert res.returncode == 0, res.stderr
    rep = json.loads(res.stdout)
    rows = {r["profile"]: r for r in rep["profiles"]}
    assert set(rows) == set(profiles.registry())
    assert rep["host_profile"] == hostid.host_profile_name()
    assert rows[rep["host_profile"]]["selected"]
    assert rows[rep["host_profile"]]["host_match"].startswith("selected")
    for row in rows.values():
        assert row["host_match"], row["profile"]
        if not row["runnable_here"] and row["kind"] == "target":
            assert row["host_match"].startswith("not runnable")
        if row["ok"]:
            assert row["compiler"]["version"] and isinstance(row["cflags"], list)
    assert rows["sapphirerapids"]["chain"][-1] == "generic"
    text = _run("profiles")
    assert text.returncode == 0 and f"host profile: {rep['host_profile']}" in text.stdout


def test_profiles_report_says_why_others_lose():
    zen3 = cpuinfo.parse_cpuinfo((HOSTS / "milan-nps4" / "proc" / "cpuinfo").read_text())
    rep = profiles.report(host=zen3)
    rows = {r["profile"]: r for r in rep["profiles"]}
    assert rep["host_profile"] == "zen3"
    assert "avx512" in rows["zen4"]["host_match"] and "lacks" in rows["zen4"]["host_match"]
    assert "aarch64" in rows["neoverse-n1"]["host_match"]
    assert "more specific" in rows["x86-64-v3"]["host_match"]
    assert rows["haswell"]["host_match"].startswith("runnable, not selected")
    vm = cpuinfo.parse_cpuinfo((HOSTS / "zen5-vm" / "proc" / "cpuinfo").read_text())
    lacking = replace(vm, flags=vm.flags - {"avx512_vp2intersect"})
    best, reasons = profiles.match_host(lacking)
    assert best != "zen5" and "avx512_vp2intersect" in reasons["zen5"]
    assert "zen5" in profiles.format_report(profiles.report(host=vm))


def test_add_commands_registers_both():
    ap = argparse.ArgumentParser()
    sub = ap.add_subparsers(dest="command", required=True)
    cli_probe.add_commands(sub)
    args = ap.parse_args(["probe", "--json", "--no-bandwidth"])
    assert args.func is cli_probe.cmd_probe and args.json and args.no_bandwidth
    args = ap.parse_args(["profiles", "--cc", "gcc", "zen4"])
    assert args.func is cli_probe.cmd_profiles and args.names == ["zen4"]
    with pytest.raises(SystemExit):
        ap.parse_args(["probe", "--quick", "--no-bandwidth"])
