"""The tuner end to end on a tiny problem and space: faults injected into variants,
a run killed mid-way and resumed, a re-run that measures nothing, emit."""
import json
import os
import shutil
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PROBLEMS = ("tiny/decode/f32",)
FAKE_HOST = {"host_id": "testhost-000000000000", "fingerprint": "f" * 16,
             "bandwidth": {"read": {"1": 10.0, "2": 20.0}}}

FAULTS = {
    # knob value -> C statement at the top of cbk_gateup (or a syntax error)
    "compile": "this is not C;",
    "crash": "{ volatile int *p = 0; *p = 1; }",
    "hang": "{ volatile int spin = 1; while (spin) {} }",
}
# after the kernel has written its output: a wrong answer, not a crash
WRONG = "    if (ntok > 0 && r1 > r0) Hout[r0] += 1.0f;\n"


@pytest.fixture
def broken_templates(tmp_path, monkeypatch):
    """A copy of templates/ whose expert_ffn has a `fault` knob (deliberately broken variants)."""
    d = tmp_path / "templates"
    shutil.copytree(ROOT / "templates", d)
    src = (d / "expert_ffn.c.j2").read_text()
    marker = "void cbk_gateup(int dtype, const cb_mat *gate, const cb_mat *up, const float *X, int ldx,\n                const int32_t *tok, int ntok, int r0, int r1, float *Hout, int ldh) {\n"
    assert marker in src
    inject = "".join(f'{{% if fault == "{k}" %}}    {v}\n{{% endif %}}' for k, v in FAULTS.items())
    end = "    case COLIBRI_INT8: (dec ? gateup_i8_dec : gateup_i8_pre)(gate, up, X, ldx, tok, ntok, r0, r1, Hout, ldh); break;\n    }\n"
    assert end in src
    src = src.replace(end, end + '{% if fault == "wrong" %}' + WRONG + "{% endif %}")
    (d / "expert_ffn.c.j2").write_text(src.replace(marker, marker + inject))
    knobs = (d / "expert_ffn.knobs.yaml").read_text().replace(
        "constraints:", "  fault:\n    values: [none, compile, crash, hang, wrong]\n"
        "    default: none\n    doc: test-only fault injection\nconstraints:")
    (d / "expert_ffn.knobs.yaml").write_text(knobs)
    monkeypatch.setenv("COLIBRI_TEMPLATES_DIR", str(d))
    return d


def _run_in_subprocess(tmp_path, extra_env, args, timeout=600):
    env = dict(os.environ, **extra_env)
    return subprocess.run([sys.executable, "-m", "tuner", "run", *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=timeout)


def test_faulty_variants_are_recorded_and_a_correct_winner_is_chosen(tmp_path, broken_templates):
    # run in a fresh process: the templates directory is read at import time
    code = f"""
import json, sys
from pathlib import Path
from tuner.run import RunConfig, run
cfg = RunConfig(profile="generic", problems={PROBLEMS!r}, strategy="exhaustive", quick=True,
                min_seconds=0.05, retime_rounds=1, worker_timeout_s=20,
                build_dir=Path({str(tmp_path / 'build')!r}),
                report_dir=Path({str(tmp_path / 'reports')!r}),
                space_overrides={{"isa": ["portable"], "rows": [1, 2], "tok_block": [1],
                                  "unroll": [2], "prefetch": [0],
                                  "fault": ["none", "compile", "crash", "hang", "wrong"]}})
s = run(cfg, host={FAKE_HOST!r})
json.dump(s, sys.stdout, default=str)
"""
    res = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True,
                         timeout=900, env=dict(os.environ, COLIBRI_TEMPLATES_DIR=str(broken_templates)))
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
    reasons = [r for (r,) in con.execute("select reason from measurements where status='compile_error'")]
    assert any("error" in r for r in reasons), reasons
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
    args = ["--problem", "tiny/decode/f32", "--profile", "generic", "--strategy", "exhaustive",
            "--quick", "--min-seconds", "0.05", "--no-bandwidth", "--build-dir",
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
    assert s["measured_this_run"] == s["evaluations"] - len(before)
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
    manifest = json.loads((emitted / "manifest.json").read_text())
    assert manifest["knobs"] == s2["winner"]["knobs"] and manifest["summary"]["rows"]
    assert manifest["isa_check"]["ok"] is True
    assert (tmp_path / "reports" / "report.html").exists() and (tmp_path / "reports" / "report.md").exists()
    res = subprocess.run([sys.executable, "-c", "from colibri._lib import default_library_path as d;"
                          "print(d())"], cwd=ROOT, capture_output=True, text=True,
                         env=dict(os.environ, COLIBRI_BUILD_DIR=str(tmp_path / "build")))
    assert Path(res.stdout.strip()) == emitted / "libcolibri.so", res.stderr
