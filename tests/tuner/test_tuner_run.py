"""The tuner end to end on a tiny problem and space: faults injected into variants,
a run killed mid-way and resumed, a re-run that measures nothing, emit."""
import json
import os
import re
import shutil
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PROBLEMS = ("tiny/decode/f32",)
FAKE_HOST = {"host_id": "testhost-000000000000", "fingerprint": "f" * 16,
             "bandwidth": {"read": {"1": 10.0, "2": 20.0}}}

FAULTS = {
    # knob value -> C statement at the top of every part's part_gateup (or a syntax error)
    "compile": "this is not C;",
    "crash": "{ volatile int *p = 0; *p = 1; }",
    "hang": "{ volatile int spin = 1; while (spin) {} }",
    # allocates and touches 16 KiB per call, never frees it (the pointer escapes through a
    # volatile, or the compiler removes the allocation)
    "leak": "{ static void *volatile sink; char *p = malloc(16384); if (p) memset(p, 1, 16384); sink = p; }",
    # correct but slow: a busy loop per call (a deterministic loser for the kill test)
    "slow": "{ for (volatile long i = 0; i < 200000; ++i) {} }",
    # another knob value, the same machine code
    "same": "",
}
# after the kernel has written its output: a wrong answer, not a crash
WRONG = "    if (ntok > 0 && r1 > r0) Hout[r0] += 1.0f;\n"
# one float past the expert's scratch block (the rows end at ldh)
OOB_SCRATCH = "    if (ntok > 0 && r1 == ldh) Hout[(size_t)(ntok - 1) * ldh + r1] = 1.0f;\n"
# one float past the output row of the last token (at T=1: past the output)
OOB_OUT = "    if (ntok > 0 && r1 == ldy) Y[(size_t)tok[ntok - 1] * ldy + r1] = 1.0f;\n"
ALL_FAULTS = ["none", *FAULTS, "wrong", "oob_scratch", "oob_out"]


def make_broken_templates(d: Path) -> Path:
    """A copy of templates/ at d whose expert_ffn has a `fault` knob (deliberately broken
    variants)."""
    shutil.copytree(ROOT / "templates", d)
    src = (d / "expert_ffn.c.j2").read_text()
    marker = ("static void part_gateup(int dtype, const cb_mat *gate, const cb_mat *up, const float *X, int ldx,\n"
              "                        const int32_t *tok, int ntok, int r0, int r1, float *Hout, int ldh, void *ws,\n"
              "                        const void *xprep) {\n")
    assert marker in src
    inject = "".join(f'{{% if fault == "{k}" %}}    {v}\n{{% endif %}}' for k, v in FAULTS.items())
    # fault_int8 reaches the int8 part's code only, as a real int8 knob does
    inject += "".join(f'{{% if part == "int8" and fault_int8 == "{k}" %}}    {FAULTS["slow"].replace("200000", n)}\n{{% endif %}}'
                      for k, n in (("slow", "200000"), ("slower", "400000")))
    # after each entry point's paths, before the function's closing brace
    end, nxt = "    } while (0);\n", "}\n\nstatic void part_rows_acc("
    assert src.count(end + nxt) == 1
    src = src.replace(end + nxt, end + '{% if fault == "wrong" %}' + WRONG + "{% endif %}"
                      + '{% if fault == "oob_scratch" %}' + OOB_SCRATCH + "{% endif %}" + nxt)
    nxt_acc = "}\n\nconst cbk_part {{ part_symbol }}"
    assert src.count(end + nxt_acc) == 1
    src = src.replace(end + nxt_acc, end + '{% if fault == "oob_out" %}' + OOB_OUT + "{% endif %}" + nxt_acc)
    src = src.replace("#include <string.h>\n", "#include <stdlib.h>\n#include <string.h>\n", 1)
    (d / "expert_ffn.c.j2").write_text(src.replace(marker, marker + inject))
    knobs = (d / "expert_ffn.knobs.yaml").read_text().replace(
        "constraints:", f"  fault:\n    values: [{', '.join(ALL_FAULTS)}]\n"
        "    default: none\n    class: decode\n    domain: {paths: [decode], dtypes: [f32]}\n    doc: test-only fault injection\n"
        "  fault_int8:\n    values: [none, slow, slower]\n    default: none\n    class: decode\n"
        "    domain: {paths: [decode], dtypes: [int8]}\n    doc: test-only, int8's part\nconstraints:")
    (d / "expert_ffn.knobs.yaml").write_text(knobs)
    return d


def templates_env(templates: Path, lib: str) -> dict:
    """The environment of a tuner run on `templates`, its binding on the checkout's default
    library (conftest.checkout_lib: nothing rebuilds that from the test templates)."""
    return dict(os.environ, COLIBRI_TEMPLATES_DIR=str(templates), COLIBRI_LIB=lib)


@pytest.fixture
def broken_templates(tmp_path, monkeypatch, checkout_lib):
    # checkout_lib first: found while $COLIBRI_TEMPLATES_DIR is still the checkout's
    d = make_broken_templates(tmp_path / "templates")
    monkeypatch.setenv("COLIBRI_TEMPLATES_DIR", str(d))
    return d


def _run_in_subprocess(tmp_path, extra_env, args, timeout=600):
    env = dict(os.environ, **extra_env)
    return subprocess.run([sys.executable, "-m", "tuner", "run", *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=timeout)


def test_faulty_variants_are_recorded_and_a_correct_winner_is_chosen(tmp_path, broken_templates,
                                                                    checkout_lib):
    # run in a fresh process: the templates directory is read at import time. The hanging
    # variant costs the whole worker timeout: 10 s, where a healthy worker on the tiny
    # problem (start, verify, 0.05 s timed) needs a few; race and gate timed as --quick's
    # (tuner/cli.py)
    code = f"""
import json, sys
from pathlib import Path
from tuner.run import RunConfig, run
cfg = RunConfig(profile="generic", problems={PROBLEMS!r}, strategy="exhaustive", quick=True,
                min_seconds=0.05, race_rounds=(1, 1), worker_timeout_s=10,
                race_min_seconds=0.05, gate_min_seconds=0.05, gate_rounds=6,
                build_dir=Path({str(tmp_path / 'build')!r}),
                report_dir=Path({str(tmp_path / 'reports')!r}),
                space_overrides={{"isa": ["portable"], "rows": [1], "tok_block": [1],
                                  "unroll": [2], "prefetch_f32": [0],
                                  "fault": ["none", "compile", "crash", "hang", "wrong",
                                            "oob_scratch", "oob_out", "leak"]}})
s = run(cfg, host={FAKE_HOST!r})
json.dump(s, sys.stdout, default=str)
"""
    res = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True,
                         timeout=900, env=templates_env(broken_templates, checkout_lib))
    assert res.returncode == 0, res.stderr[-3000:]
    s = json.loads(res.stdout)
    assert s["winner"]["knobs"]["fault"] == "none"
    statuses = {}
    for f in s["failed"]:
        statuses.setdefault(f["vid"], set()).add(f["status"])
    by_fault = {}
    con = sqlite3.connect(s["store"])
    for knobs, status, reason in con.execute("select knobs, status, reason from measurements"):
        by_fault.setdefault(json.loads(knobs)["fault"], set()).add(status)
    assert by_fault["none"] == {"ok"}
    assert by_fault["compile"] == {"compile_error"}
    assert by_fault["crash"] == {"crash"}
    assert by_fault["hang"] == {"timeout"}
    assert by_fault["wrong"] == {"wrong"}
    assert by_fault["oob_scratch"] == by_fault["oob_out"] == {"wrong"}
    assert by_fault["leak"] == {"leak"}
    reasons = [r for (r,) in con.execute("select reason from measurements where status='compile_error'")]
    assert any("error" in r for r in reasons), reasons
    why = {json.loads(k)["fault"]: r for k, r in con.execute("select knobs, reason from measurements")}
    assert why["oob_scratch"].startswith("out-of-bounds write: a kernel wrote past the scratch of "), why
    assert why["oob_out"].startswith("out-of-bounds write: a kernel wrote 1 float(s) past the output"), why
    assert why["wrong"].startswith("max relative error"), why
    assert re.match(r"leaks \d+\.\d+ MB per 1000 calls", why["leak"]), why
    # 16 KiB per kernel call, a few kernel calls per layer call
    assert float(why["leak"].split()[1]) > 10, why
    print(f"faults injected {len(by_fault) - 1}, all recorded: "
          + "; ".join(f"{f}: {why.get(f, 'ok')[:70]}" for f in sorted(by_fault)))
    emitted = Path(s["emitted"]["dir"])
    assert (emitted / "config.h").exists() and (emitted / "libcolibri.so").exists()
    assert "COLIBRI_KNOB_FAULT none" in (emitted / "config.h").read_text()
    # the emitted library keeps the ISA promise, and the report names every failure
    assert s["isa_check"]["ok"] is True, s["isa_check"]
    assert s["report"]["errors"] == [] and Path(s["report"]["html"]).parent == tmp_path / "reports"
    page = Path(s["report"]["html"]).read_text()
    for status in ("compile_error", "crash", "timeout", "wrong"):
        assert f"<td>{status}</td>" in page, status
    assert page.count('<img src="data:image/png;base64,') == 4


def _rows(store):
    con = sqlite3.connect(f"file:{store}?mode=ro", uri=True)
    try:
        return {k: (st, med) for k, st, med in
                con.execute("select key, status, median_s from measurements")}
    except sqlite3.OperationalError:  # not created yet
        return {}
    finally:
        con.close()


def test_killed_run_resumes_without_losing_measurements_and_a_rerun_measures_nothing(tmp_path):
    store = tmp_path / "store.sqlite"
    # --no-gate: nothing here asserts on the gate (test_faulty_variants... and test_gate.py
    # cover it); where a class adopted a change it re-timed the resumed run's candidate, ~16 s
    args = ["--problem", "tiny/decode/f32", "--profile", "generic", "--strategy", "exhaustive",
            "--quick", "--no-gate", "--min-seconds", "0.05", "--no-bandwidth", "--build-dir",
            str(tmp_path / "build"), "--store", str(store), "--report-dir",
            str(tmp_path / "reports"), "--json"]
    proc = subprocess.Popen([sys.executable, "-m", "tuner", "run", *args], cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    deadline = time.time() + 300
    while time.time() < deadline and proc.poll() is None:
        if store.exists() and len(_rows(store)) >= 4:
            break
        time.sleep(0.1)
    assert proc.poll() is None, "the run ended before it could be killed: " + proc.stderr.read()[-2000:]
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    before = _rows(store)
    assert len(before) >= 4

    res = _run_in_subprocess(tmp_path, {}, args)
    assert res.returncode == 0, res.stderr[-3000:]
    s = json.loads(res.stdout)
    after = _rows(store)
    for k, v in before.items():
        assert after.get(k) == v, f"measurement {k} lost or re-measured after the kill"
    # one problem: one row per variant; the resumed run measured exactly the missing ones
    # (a class's default may be another class's winner, evaluated again from the store)
    assert s["measured_this_run"] == len(after) - len(before)
    assert s["winner"] is not None

    t0 = time.time()
    res = _run_in_subprocess(tmp_path, {}, args)
    assert res.returncode == 0, res.stderr[-3000:]
    s2 = json.loads(res.stdout)
    assert s2["measured_this_run"] == 0
    assert _rows(store) == after
    assert s2["winner"]["knobs"] == s["winner"]["knobs"]
    assert time.time() - t0 < 60
    # the emitted library is what the binding loads by default on this host
    emitted = Path(s2["emitted"]["dir"])
    assert {"config.h", "libcolibri.so", "manifest.json"} <= {p.name for p in emitted.iterdir()}
    # which part each kernel table runs, for the bench's same-code check
    assert "default" in json.loads((emitted / "kernel_tables.json").read_text())
    manifest = json.loads((emitted / "manifest.json").read_text())
    assert manifest["knobs"] == s2["winner"]["knobs"] and manifest["summary"]["rows"]
    assert manifest["isa_check"]["ok"] is True
    assert (tmp_path / "reports" / "report.html").exists() and (tmp_path / "reports" / "report.md").exists()
    res = subprocess.run([sys.executable, "-c", "from colibri._lib import default_library_path as d;"
                          "print(d())"], cwd=ROOT, capture_output=True, text=True,
                         env=dict(os.environ, COLIBRI_BUILD_DIR=str(tmp_path / "build")))
    assert Path(res.stdout.strip()) == emitted / "libcolibri.so", res.stderr


# ---------------------------------------------------------------- kills, locks, load

def _space_args(faults) -> list[str]:
    """--space pinning the decode knobs at generic's defaults, so that only `fault` varies:
    the winner is then fault=none whatever the noise (slow is ~100x slower)."""
    from colibri_build import profiles, render

    prof = profiles.get_profile("generic")
    d = render.resolve_knobs(render.load_knob_spec("expert_ffn"), prof.knobs, None, prof.kernel_isas)
    pins = [f"--space={k}={d[k]}" for k in ("isa", "rows", "tok_block", "unroll", "prefetch_f32")]
    return pins + [f"--space=fault={','.join(faults)}"]


def _full_rows(store):
    if not Path(store).exists():  # killed before the run created it
        return {}
    con = sqlite3.connect(f"file:{store}?mode=ro", uri=True)
    try:
        return {r[0]: tuple(r) for r in con.execute("select * from measurements")}
    except sqlite3.OperationalError:
        return {}
    finally:
        con.close()


PHASES = ("probing", "building", "measuring", "emitting")


def _phase_of(line: str) -> str | None:
    line = re.sub(r"^\[ *\d+ s\] ", "", line)  # the run's elapsed-time prefix
    if line.startswith("probing the host"):
        return "probing"
    if line.startswith(("building ", "[")):
        return "building"
    if line.startswith(("built ", "  ", "racing")):
        return "measuring"
    if line.startswith("emitting:"):
        return "emitting"
    return None


def _life(cmd, env, target: str, delay: float, store: Path):
    """Start the run, wait for the target phase (or a later one), wait `delay`, snapshot the
    committed rows from a reader and SIGKILL the run's process group. Returns (phase at
    the kill, rows committed before it) or None when the run finished first."""
    import threading

    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)
    lines = []
    reader = threading.Thread(target=lambda: lines.extend(iter(proc.stderr.readline, "")), daemon=True)
    reader.start()
    want = PHASES.index(target)
    while proc.poll() is None:
        phases = [p for p in map(_phase_of, list(lines)) if p]
        if any(PHASES.index(p) >= want for p in phases):
            break
        time.sleep(0.02)
    time.sleep(delay)
    if proc.poll() is not None:
        reader.join()
        return None
    rows = _full_rows(store)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    reader.join()
    phase = next((p for p in map(_phase_of, reversed(lines)) if p), "probing")
    return phase, rows


def _tuned_set(build: Path):
    """The published artifact set, checked complete; None before the first emit."""
    pub = next((build / "tuned").glob("[!.]*"), None) if (build / "tuned").exists() else None
    if pub is None:
        return None
    names = {p.name for p in pub.iterdir()}
    assert {"config.h", "libcolibri.so", "manifest.json", "build_info.json"} <= names, names
    manifest = json.loads((pub / "manifest.json").read_text())  # parses: not torn
    config = (pub / "config.h").read_text()
    assert config.endswith("#endif /* COLIBRI_CONFIG_H */\n"), "torn config.h"
    json.loads((pub / "build_info.json").read_text())
    assert manifest["signature"] in config
    return manifest["knobs"], config


# kill points per phase (probing, building, measuring, emitting): 12 in CI; the longer
# version (22 points, as before 2026-12-06) is COLIBRI_KILL_POINTS=2 (the multiplier)
KILL_PLAN = (2, 3, 4, 3)


def test_kill_9_at_random_points_loses_nothing_and_ends_as_an_uninterrupted_run(tmp_path, checkout_lib):
    import random

    templates = make_broken_templates(tmp_path / "templates")
    env = templates_env(templates, checkout_lib)
    build, store = tmp_path / "build", tmp_path / "store.sqlite"
    common = ["--problem", "tiny/decode/f32", "--profile", "generic", "--strategy", "exhaustive",
              "--quick", "--min-seconds", "0.2", "--no-bandwidth", "--threads", "1",
              "--build-dir", str(build), "--report-dir", str(tmp_path / "report"), "--json",
              *_space_args(["none", "slow", "wrong", "oob_out"])]
    cmd = [sys.executable, "-m", "tuner", "run", *common, "--store", str(store)]
    rng = random.Random(20240606)
    times = int(os.environ.get("COLIBRI_KILL_POINTS", "1"))
    counts = [n * times for n in KILL_PLAN]
    plan = ([("probing", rng.uniform(0, 0.4)) for _ in range(counts[0])]
            + [("building", rng.uniform(0, 2.5)) for _ in range(counts[1])]
            + [("measuring", rng.uniform(0, 0.6)) for _ in range(counts[2])]
            + [("emitting", rng.uniform(0, 2.5)) for _ in range(counts[3])])
    kills, snapshots = [], []
    for target, delay in plan:
        # A run that ends before its kill has outrun the drawn delay (emitting takes about
        # 2 s on a 2-vCPU VM, less on faster hosts): draw the kill earlier in the same phase.
        for _ in range(4):
            got = _life(cmd, env, target, delay, store)
            if got is not None:
                break
            delay /= 2
        if got is None:
            break
        kills.append(got[0])
        snapshots.append(got[1])
        if store.exists():
            con = sqlite3.connect(f"file:{store}?mode=ro", uri=True)
            assert con.execute("pragma integrity_check").fetchone()[0] == "ok"
            con.close()
        _tuned_set(build)  # absent or complete, never torn or mixed
    res = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stderr[-3000:]
    final = _full_rows(store)
    lost = sum(1 for snap in snapshots for k, row in snap.items() if final.get(k) != row)
    per_phase = {p: kills.count(p) for p in PHASES}
    print(f"\nkill points {len(kills)} {per_phase}; rows committed before kills "
          f"{sum(map(len, snapshots))} (max {max(map(len, snapshots))}); lost {lost}")
    assert len(kills) >= len(plan) - 2 and lost == 0
    assert sum(1 for p in PHASES if per_phase[p]) >= 3, per_phase
    from tuner.store import Store

    with Store(store, readonly=True) as st:
        assert st.integrity_check() == "ok" and len(st) == len(final) == 4
    knobs, config = _tuned_set(build)
    # the same run uninterrupted, on a fresh store (variants already built)
    ref_store = tmp_path / "ref.sqlite"
    saved = config
    res = subprocess.run([*cmd[:-2], "--store", str(ref_store)], cwd=ROOT, env=env,
                         capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stderr[-3000:]
    ref = json.loads(res.stdout)
    assert ref["winner"]["knobs"] == knobs and knobs["fault"] == "none"
    ref_knobs, ref_config = _tuned_set(build)
    assert ref_config == saved and ref_knobs == knobs
    assert {(r[2], json.loads(r[3])["fault"], r[5]) for r in _full_rows(ref_store).values()} == \
        {(r[2], json.loads(r[3])["fault"], r[5]) for r in final.values()}


def _lock_holder(lock: Path) -> str:
    try:
        return lock.read_text().strip()
    except OSError:
        return ""


def test_a_second_run_on_a_locked_store_refuses_or_waits_and_never_interleaves(tmp_path, checkout_lib):
    templates = make_broken_templates(tmp_path / "templates")
    env = templates_env(templates, checkout_lib)
    store = tmp_path / "store.sqlite"
    base = ["--problem", "tiny/decode/f32", "--profile", "generic", "--quick", "--min-seconds",
            "0.02", "--no-bandwidth", "--threads", "1", "--no-emit", "--build-dir",
            str(tmp_path / "build"), "--store", str(store)]
    a = subprocess.Popen([sys.executable, "-m", "tuner", "run", *base,
                          *_space_args(["none", "slow", "wrong"])], cwd=ROOT, env=env,
                         stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    lock = Path(str(store) + ".lock")
    deadline = time.time() + 120
    while _lock_holder(lock) != str(a.pid) and time.time() < deadline and a.poll() is None:
        time.sleep(0.05)
    assert _lock_holder(lock) == str(a.pid)
    b_args = [sys.executable, "-m", "tuner", "run", *base, *_space_args(["none", "oob_out"])]
    refused = subprocess.run(b_args, cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert refused.returncode == 3
    assert f"pid {a.pid}" in refused.stderr and "--wait" in refused.stderr, refused.stderr
    timed = subprocess.run([*b_args, "--wait", "0.5"], cwd=ROOT, env=env, capture_output=True,
                           text=True, timeout=120)
    assert timed.returncode == 3 and "waited" in timed.stderr, timed.stderr
    assert a.poll() is None, "the first run ended too soon for the test"
    waited = subprocess.run([*b_args, "--wait"], cwd=ROOT, env=env, capture_output=True, text=True,
                            timeout=600)
    a_err = a.stderr.read()
    assert a.wait() == 0, a_err[-2000:]
    assert waited.returncode == 0, waited.stderr[-2000:]
    assert f"pid {a.pid}" in waited.stderr and "waiting for it" in waited.stderr
    rows = sorted(_full_rows(store).values(), key=lambda r: r[-1])  # by created
    faults = [json.loads(r[3])["fault"] for r in rows]
    # A's three variants first, then B's one new variant (its "none" is A's row): no interleaving
    assert sorted(faults[:3]) == ["none", "slow", "wrong"] and faults[3:] == ["oob_out"], faults


def _run_faults(tmp_path, faults, checkout_lib):
    templates = make_broken_templates(tmp_path / "templates")
    env = templates_env(templates, checkout_lib)
    store = tmp_path / "store.sqlite"
    res = subprocess.run([sys.executable, "-m", "tuner", "run", "--problem", "tiny/decode/f32",
                          "--profile", "generic", "--quick", "--min-seconds", "0.02",
                          "--no-bandwidth", "--threads", "1", "--no-emit", "--no-report",
                          "--json", "--build-dir", str(tmp_path / "build"), "--store", str(store),
                          *_space_args(faults)],
                         cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stderr[-3000:]
    return json.loads(res.stdout), res.stderr, [json.loads(r[3])["fault"]
                                                 for r in _full_rows(store).values()]


def test_a_variant_with_the_defaults_machine_code_is_not_timed(tmp_path, checkout_lib):
    s, err, timed = _run_faults(tmp_path / "a", ["none", "same", "slow"], checkout_lib)
    (decode,) = [c for c in s["classes"] if c["class"] == "decode"]
    assert len(decode["same_code_as_default"]) == 1 and "fault=same" in decode["same_code_as_default"][0]
    assert sorted(timed) == ["none", "slow"]  # "same" was built and compared, never timed
    assert "fault=same" in err and "the default's machine code: a tie, not timed" in err
    # one candidate left, what the race takes: raced at once, its rounds kept as its timing
    assert "1 candidate(s), as many as the race takes" in err
    # a quick run compiles its variants once, while the weights are written
    assert err.count("with scons -j") == 1 and "while the weights are written" in err
    # a class whose every variant is the default's code is not tuned at all, nothing timed
    s, err, timed = _run_faults(tmp_path / "b", ["none", "same"], checkout_lib)
    assert timed == [] and not [c for c in s["classes"] if c["class"] == "decode"]
    (skip,) = [c for c in s["skipped_classes"] if c["class"] == "decode"]
    assert "reach no compiled code on this profile" in skip["why"]


def test_a_problem_whose_machine_code_was_timed_is_not_timed_again(tmp_path, broken_templates,
                                                                   checkout_lib):
    # fault_int8 changes the int8 part only: on the f32 problem every candidate runs the
    # default's code (the f32 part, the router's too), so only the int8 problem is timed
    from colibri_build import profiles, render

    prof = profiles.get_profile("generic")
    d = render.resolve_knobs(render.load_knob_spec("expert_ffn"), prof.knobs, None, prof.kernel_isas)
    pins = {k: [d[k]] for k in ("isa", "rows", "tok_block", "unroll")}  # the class default's
    code = f"""
import json, sys
from pathlib import Path
from tuner.run import RunConfig, run
from tuner.build.signature import variant_id
cfg = RunConfig(profile="generic", problems=("tiny/decode/f32", "tiny/decode/int8"),
                strategy="exhaustive", quick=True, min_seconds=0.02, race_rounds=(1, 1),
                build_dir=Path({str(tmp_path / 'build')!r}), emit=False, report=False, gate=False,
                space_overrides={{**{pins!r}, "fault_int8": ["none", "slow", "slower"]}},
                finalists=1)  # two candidates: screened, not raced at once
s = run(cfg, host={FAKE_HOST!r})
json.dump(s, sys.stdout, default=str)
"""
    res = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True,
                         timeout=900, env=templates_env(broken_templates, checkout_lib))
    assert res.returncode == 0, res.stderr[-3000:]
    s = json.loads(res.stdout)
    from tuner.build.signature import variant_id

    (decode,) = [c for c in s["classes"] if c["class"] == "decode"]
    dflt = variant_id(decode["default"])
    con = sqlite3.connect(s["store"])
    rows = {(variant_id(json.loads(k)), p): (json.loads(k)["fault_int8"], json.loads(x), m, r)
            for k, p, x, m, r in con.execute("select knobs, problem, extra, median_s, reason from measurements")}
    assert rows[(dflt, "tiny/decode/f32")][0] == "none" and "same_code_as" not in rows[(dflt, "tiny/decode/f32")][1]
    seen = set()
    for (vid, prob), (f, extra, med, reason) in rows.items():
        if f == "none" or prob != "tiny/decode/f32":
            continue
        seen.add(f)
        assert extra.get("same_code_as") == dflt and med == rows[(dflt, prob)][2], (f, extra, reason)
        assert reason == f"the machine code of {dflt} on this problem: its timing"
        assert "same_code_as" not in rows[(vid, "tiny/decode/int8")][1]  # timed
    assert seen == {"slow", "slower"}
    assert res.stderr.count("(machine code timed above: not timed again)") == 2, res.stderr[-3000:]


def test_load_warning_names_the_threads_whose_timings_will_be_noisy():
    from tuner.run import load_warning

    assert load_warning(0.2, cpus=8, threads=8) is None        # an idle machine
    assert load_warning(3.0, cpus=8, threads=4) is None        # 4 cores left free
    w = load_warning(3.1, cpus=2, threads=2)
    assert w and "3.10" in w and "at 2 threads will be noisy" in w
    assert load_warning(5.0, cpus=8, threads=4) is not None


def test_worker_memory_cap_holds_the_reference_weights_and_every_layer_copy():
    # a worker maps the f32 weights it verifies against (4x an int8 layer) and, per library,
    # the model file of every copy of the layer it cycles through (3 on a 300 MiB LLC): a
    # cap from the int8 bytes alone failed its mmap
    from dataclasses import replace

    from tuner.host.bandwidth import copies_for
    from tuner.measure.problems import problem
    from tuner.measure.worker import memory_cap

    llc = 300 << 20
    for name in ("qwen3-30b-a3b/decode/int8", "qwen3-30b-a3b/decode/int4g32",
                 "mixtral-8x7b/decode/f32"):
        p = problem(name)
        for libs in (1, 3):
            # and the throwaway copy of the first packed model a session holds
            held = (replace(p, dtype="f32").layer_bytes
                    + (libs + 1) * copies_for(p, llc) * p.layer_bytes)
            assert memory_cap([p], libs, llc) >= held + (2 << 30)
    assert memory_cap([problem("tiny/decode/f32")], 1, llc) == 4 << 30


def test_a_knob_pinned_by_space_holds_in_every_class_not_only_its_own(tmp_path):
    """--space KNOB=V (one value) fixes KNOB everywhere: the other classes are tuned with it
    at V (their base), not at its default, so the winners and the emitted build keep it."""
    from tuner.context import Tuner
    from tuner.run import RunConfig, quick_points

    cfg = RunConfig(quick=True, build_dir=tmp_path, measure_bandwidth=False, log=lambda m: None,
                    shapes=("qwen3-30b-a3b",))
    t = Tuner(cfg)
    sc = next(iter(t.shape_groups()))
    default = t.default_for(sc)["rows"]
    pin = next(v for v in t.spec.knobs["rows"].values if v != default)
    cfg.space_overrides = {"rows": [pin]}  # "rows" is the decode class's; the others follow it
    assert t.start_for(sc)["rows"] == pin and t.default_for(sc)["rows"] == default
    points = quick_points(t)
    assert points and all(p["rows"] == pin for p in points)
    t.store.close()
