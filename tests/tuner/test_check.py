"""tuner check: an artifact made here matches here; a doctored one does not; drift is
flagged against the recorded figures and the default build."""
import contextlib
import io
import json
import tarfile

import pytest
from ci_artifact import artifact

from tuner.fleet.check import config_signature


@pytest.fixture(scope="module")
def made(tmp_path_factory):
    return artifact(tmp_path_factory)


def check(*argv):
    from tuner import __main__ as cli

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            rc = cli.main(["check", *argv])
        except SystemExit as exc:  # a usage error, refused by the parser
            rc = exc.code
    return rc, out.getvalue(), err.getvalue()


def unpacked(made, dest):
    with tarfile.open(made["result"]["tarball"]) as tar:
        tar.extractall(dest, filter="data")
    return dest / made["result"]["name"]


def test_artifact_made_here_matches_here(made):
    rc, out, err = check(made["result"]["tarball"], "--no-retime", "--json")
    assert rc == 0, err
    res = json.loads(out)
    assert res["compare"]["match"] and res["compare"]["differ"] == []
    assert {r["part"] for r in res["compare"]["parts"]} == {
        "host", "microarchitecture", "profile", "compiler", "compiler_version", "flags", "template"}
    assert res["compare"]["signature"]["same"]  # the config.h signature recomputed here
    assert res["compare"]["signature"]["consistent"]  # and the recorded parts hash to it
    assert res["retime"] is None and res["retime_skipped"] == "--no-retime"


def test_doctored_manifest_is_a_mismatch_naming_the_parts(made, tmp_path):
    d = unpacked(made, tmp_path)
    m = json.loads((d / "manifest.json").read_text())
    m["signature_parts"]["host"] = "0123456789abcdef"
    m["signature_parts"]["compiler_version"] = "99.1.0"
    m["signature"] = config_signature(m["signature_parts"])  # as that host would stamp it
    (d / "manifest.json").write_text(json.dumps(m))
    rc, out, err = check(str(d), "--no-retime")
    assert rc == 4, err
    assert "was made for another host or toolchain" in out
    differ = [line.split()[1] for line in out.splitlines() if line.strip().startswith("DIFFERS")]
    assert differ == ["host", "compiler_version"]
    assert "99.1.0" in out and "edited" not in out
    rc, out, err = check(str(d), "--no-retime", "--json")
    res = json.loads(out)
    assert rc == 4 and res["exit"] == 4
    assert not res["compare"]["signature"]["same"] and res["compare"]["signature"]["consistent"]


def test_edited_manifest_is_refused(made, tmp_path):
    d = unpacked(made, tmp_path)
    m = json.loads((d / "manifest.json").read_text())
    rows = 1 if m["knobs"]["rows"] != 1 else 2  # claims other knobs than config.h has
    m["knobs"]["rows"] = m["signature_parts"]["knobs"]["rows"] = rows
    (d / "manifest.json").write_text(json.dumps(m))
    rc, out, err = check(str(d), "--no-retime")
    assert rc == 4 and "do not hash to its signature" in out


def test_retime_against_the_default_flags_drift(made, tmp_path, lib):
    from colibri_build.paths import build_dir_default

    # the default build folder, which the session's `lib` fixture brought up to date: scons
    # finds the default library there current (a fresh --build-dir compiled all of it)
    build = str(build_dir_default())
    # a threshold no machine can cross: both libraries verified and timed, no drift (the
    # gate sample has no threshold to widen: its noise is not this test's subject)
    rc, out, err = check(made["result"]["tarball"], "--rounds", "1", "--min-seconds", "0.05",
                         "--threshold", "1e9", "--build-dir", build, "--gate-sample", "0", "--json")
    assert rc == 0, err[-3000:]
    rt = json.loads(out)["retime"]
    # the manifest's rows: the tuned problem, and any more the gate timed
    with tarfile.open(made["result"]["tarball"]) as tar:
        m = json.load(tar.extractfile(f"{made['result']['name']}/manifest.json"))
    recorded = list(dict.fromkeys(r["problem"] for r in m["summary"]["rows"]))
    assert [r["problem"] for r in rt["rows"]] == recorded and "tiny/decode/f32" in recorded
    row = rt["rows"][0]
    assert row["artifact_s"] > 0 and row["default_s"] > 0 and row["drift"] == []
    assert rt["default_library"].startswith(build) and rt["failures"] == []
    # a manifest claiming an impossible time: the artifact is now "slower than recorded"
    d = unpacked(made, tmp_path)
    m = json.loads((d / "manifest.json").read_text())
    m["summary"]["rows"][0]["tuned_s"] = 1e-12
    (d / "manifest.json").write_text(json.dumps(m))
    rc, out, err = check(str(d), "--rounds", "1", "--min-seconds", "0.05", "--build-dir", build)
    assert rc == 1, err[-3000:]
    assert "DRIFT" in out and "slower than recorded" in out


def test_unreadable_artifacts_fail_clearly(tmp_path):
    junk = tmp_path / "junk.tar.gz"
    junk.write_bytes(b"not a tarball")
    rc, out, err = check(str(junk))
    assert rc == 1 and "is not a readable tarball" in err
    rc, out, err = check(str(tmp_path / "nope"))
    assert rc == 1 and "does not exist" in err
    (tmp_path / "empty").mkdir()
    rc, out, err = check(str(tmp_path / "empty"))
    assert rc == 1 and "expected one manifest.json" in err
    rc, out, err = check(str(tmp_path), "--rounds", "0")
    assert rc == 2


def test_tarball_members_outside_the_archive_are_refused(tmp_path):
    evil = tmp_path / "evil.tar.gz"
    (tmp_path / "f").write_text("x")
    with tarfile.open(evil, "w:gz") as tar:
        tar.add(tmp_path / "f", arcname="../escape")
    rc, out, err = check(str(evil))
    assert rc == 1 and "refusing tar member '../escape'" in err
    assert not (tmp_path.parent / "escape").exists()


def test_unknown_profile_is_a_mismatch_not_a_crash(made, tmp_path):
    d = unpacked(made, tmp_path)
    m = json.loads((d / "manifest.json").read_text())
    m["profile"] = m["signature_parts"]["profile"] = "no-such-profile"
    m["signature"] = config_signature(m["signature_parts"])
    (d / "manifest.json").write_text(json.dumps(m))
    rc, out, err = check(str(d))  # not re-timed: its profile cannot be resolved here
    assert rc == 4, err
    assert "cannot run here" in out and "no-such-profile" in out and "not re-timed" in out


def test_manifest_without_signature_parts_is_compared_by_its_fields():
    from tuner.fleet.check import artifact_parts

    old = {"profile": "zen4", "knobs": {}, "host": {"fingerprint": "ab", "microarchitecture": "zen4"},
           "compiler": {"family": "gcc", "version": "12.2.0"}, "cflags": ["-O3"], "ldflags": ["-lm"]}
    assert artifact_parts(old) == {"host": "ab", "microarchitecture": "zen4", "profile": "zen4",
                                   "compiler": "gcc", "compiler_version": "12.2.0",
                                   "flags": ["-O3", "-lm"], "template": None}


# ---------------------------------------------------------------- the gate sample

def _cell(problem, threads, median, status="ok"):
    if status != "ok":
        return {"problem": problem, "threads": threads, "status": status, "reason": "SIGSEGV"}
    return {"problem": problem, "threads": threads, "status": "ok", "median": median,
            "lo": median - 0.02, "hi": median + 0.02, "slower": False, "faster": False}


GATE_CELLS = [_cell(f"{s}/{ph}/{d}", th, 1.0 + 0.001 * i)
              for i, (s, ph, d, th) in enumerate(
                  (s, ph, d, th) for s in ("qwen3-30b-a3b", "olmoe-1b-7b")
                  for ph in ("decode", "prefill128", "prefill512")
                  for d in ("f32", "bf16", "int8", "int4g32") for th in (1, 2))]
SLOWEST = "olmoe-1b-7b/prefill128/int8"


def _gate_cells():
    cells = [dict(c) for c in GATE_CELLS]
    next(c for c in cells if c["problem"] == SLOWEST and c["threads"] == 2).update(
        median=0.985, lo=0.965, hi=1.005)
    cells.append(_cell("tiny/decode/f32", 1, 0.5, status="crash"))  # failed: never sampled
    return cells


def test_gate_sample_takes_the_slowest_then_spreads_over_dtypes_and_phases():
    from tuner.fleet.check import gate_sample

    cells = _gate_cells()
    picked = gate_sample(cells, 4)
    assert (picked[0]["problem"], picked[0]["threads"]) == (SLOWEST, 2)
    assert len(picked) == 4 and all(c["status"] == "ok" for c in picked)
    assert len({c["problem"].split("/")[2] for c in picked}) == 4     # every dtype
    assert len({c["problem"].split("/")[1] for c in picked}) == 3     # every phase
    assert len({c["problem"] for c in picked}) == 4
    # deterministic: the same cells in another order give the same sample
    assert gate_sample(list(reversed(cells)), 4) == picked
    assert gate_sample(cells, 1) == picked[:1]
    assert gate_sample(cells, 0) == [] and gate_sample([], 4) == []
    assert len(gate_sample(cells, 1000)) == len(GATE_CELLS)


def _fake_artifact(tmp_path, monkeypatch, compare_result):
    """A directory artifact whose manifest has gate cells; signature comparison and the
    re-timing stubbed out (they have their own tests), the interleaved timing replaced."""
    import tuner.fleet.check as check_mod
    from tuner.measure import interleave

    d = tmp_path / "art"
    d.mkdir()
    (d / "libcolibri.so").write_bytes(b"")
    (d / "manifest.json").write_text(json.dumps(
        {"profile": "generic", "knobs": {}, "measure": {"seed": 0},
         "gate": {"rounds": 3, "min_seconds": 0.1, "threads": [1, 2], "cells": _gate_cells(),
                  "passes": [{"reverted": []}], "reverted": {}, "passed": True}}))
    monkeypatch.setattr(check_mod, "compare", lambda art: {
        "match": True, "runnable": {"runnable": True}, "parts": [], "differ": [],
        "signature": {"artifact": "s", "here": "s", "same": True, "consistent": True}})
    monkeypatch.setattr(check_mod, "retime", lambda *a, **k: {
        "rows": [], "failures": [], "drift": False, "default_library": str(tmp_path / "default.so")})
    jobs = []

    def fake_interleave(libs, problems, *, threads, verify=None, **kw):
        job = {"libs": [str(x) for x in libs], "problems": [{"name": p.name} for p in problems],
               "threads": list(threads), "verify": list(verify or [])}
        jobs.append(job)
        res = interleave.Interleaved(libs=job["libs"],
                                     cells=[(p.name, th) for p in problems for th in threads])
        res.verified = [None, {"status": "ok"}]
        for p in problems:
            for th in threads:
                res.seconds[(p.name, th)] = compare_result(p.name, th)["seconds"]
        return res

    monkeypatch.setattr(interleave, "interleave", fake_interleave)
    return d, jobs


def test_gate_sample_zero_skips_the_gate_cells(tmp_path, monkeypatch):
    d, jobs = _fake_artifact(tmp_path, monkeypatch, lambda name, th: pytest.fail("measured"))
    rc, out, err = check(str(d), "--gate-sample", "0", "--json")
    assert rc == 0, err
    assert json.loads(out)["gate_sample"] == {"skipped": "--gate-sample 0"} and jobs == []
    rc, out, err = check(str(d), "--gate-sample", "0")
    assert rc == 0 and "gate sample: not re-measured: --gate-sample 0" in out


def test_gate_sample_slower_cell_is_drift(tmp_path, monkeypatch):
    def result(name, th):
        slow = 1.1 if name == SLOWEST else 1.0  # the artifact 10% slower on that cell only
        return {"problem": name, "threads": th, "status": "ok",
                "seconds": [[0.010, 0.011, 0.010], [0.010 * slow, 0.011 * slow, 0.010 * slow]]}

    d, jobs = _fake_artifact(tmp_path, monkeypatch, result)
    rc, out, err = check(str(d), "--gate-sample", "3", "--json")
    assert rc == 1, err
    gs = json.loads(out)["gate_sample"]
    assert gs["drift"] and gs["rounds"] == 3 and len(gs["rows"]) == 3
    # one job per thread count, each timing only its sampled cells, the artifact verified
    assert sum(len(j["problems"]) for j in jobs) == 3
    assert all(len(j["threads"]) == 1 and j["verify"] == [False, True] for j in jobs)
    assert jobs[0]["libs"][0] == str(tmp_path / "default.so")
    drift = [(r["problem"], r["threads"]) for r in gs["rows"] if r["drift"]]
    assert drift == [(SLOWEST, 2)]
    row = gs["rows"][0]
    assert row["median"] == pytest.approx(1 / 1.1) and row["recorded"]["median"] == 0.985
    rc, out, err = check(str(d), "--gate-sample", "3")
    assert rc == 1 and "recorded 0.985x [0.965, 1.005]" in out
    assert "DRIFT: slower than the default" in out
