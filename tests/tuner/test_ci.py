"""tuner ci: a tiny tuning run packed into colibri-<profile>-<host-id>.tar.gz."""
import json
import os
import sqlite3
import subprocess
import sys
import tarfile

import pytest
from ci_artifact import ROOT_MEMBERS, artifact, ci_args, run_ci

ROOT = __import__("pathlib").Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def made(tmp_path_factory):
    return artifact(tmp_path_factory)


def test_tarball_holds_every_member_and_nothing_half_written(made):
    res = made["result"]
    tarball = made["root"] / "out" / f"colibri-{res['profile']}-{res['host_id']}.tar.gz"
    assert res["tarball"] == str(tarball) and tarball.is_file()
    # only the finished tarball in --out: no temporary file or staging directory left
    assert sorted(p.name for p in (made["root"] / "out").iterdir()) == [tarball.name]
    name = tarball.name[:-len(".tar.gz")]
    with tarfile.open(tarball) as tar:
        names = tar.getnames()
        plots = [n for n in names if n.startswith(f"{name}/report-") and n.endswith(".png")]
        assert plots  # the images report.md links, beside it
        assert sorted(set(names) - set(plots)) == sorted(f"{name}/{m}" for m in ROOT_MEMBERS)
        md = tar.extractfile(f"{name}/report.md").read().decode()
        assert all(n.split("/")[-1] in md for n in plots)
        html = tar.extractfile(f"{name}/report.html").read().decode()
        assert "data:image/png;base64," in html
        assert sorted(res["members"]) == sorted(names)
        manifest = json.load(tar.extractfile(f"{name}/manifest.json"))
        config = tar.extractfile(f"{name}/config.h").read().decode()
        header = tar.extractfile(f"{name}/colibri.h").read()
        lib = tar.extractfile(f"{name}/libcolibri.so").read()
        tar.extract(f"{name}/results.sqlite", made["root"] / "x", filter="data")
    assert header == (ROOT / "kernels" / "colibri.h").read_bytes()
    assert lib[:4] == b"\x7fELF"
    assert manifest["signature"] in config and manifest["profile"] == res["profile"]
    assert res["winner"] == manifest["summary"]["winner"]["vid"]
    assert manifest["measure"]["min_seconds"] == 0.05
    # the store snapshot: one file, every row of the run's store
    snap = made["root"] / "x" / name / "results.sqlite"
    con = sqlite3.connect(f"file:{snap}?mode=ro", uri=True)
    live = sqlite3.connect(f"file:{made['root'] / 'store.sqlite'}?mode=ro", uri=True)
    q = "select key, status, median_s from measurements order by key"
    assert con.execute(q).fetchall() == live.execute(q).fetchall()
    assert len(con.execute(q).fetchall()) == res["evaluations"] + 1  # + the profile default
    assert con.execute("pragma journal_mode").fetchone()[0] == "delete"


def test_progress_is_plain_lines(made):
    err = made["stderr"]
    assert "\r" not in err
    assert "class decode" in err and "racing" in err and "writing the report" in err


def test_rerun_as_a_ci_job_prints_the_tarball_and_measures_nothing(made):
    args = [a for a in made["args"] if a != "--json"]
    res = subprocess.run([sys.executable, "-m", "tuner", "ci", *args], cwd=ROOT,
                         capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stderr[-3000:]
    assert res.stdout.strip() == made["result"]["tarball"]  # stdout: only where it is
    assert "\r" not in res.stderr and "measured 0 this run" in res.stderr


def test_missing_report_module_fails_before_tuning(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "tuner.report", None)  # import raises ImportError
    rc, out, err = run_ci(ci_args(tmp_path))
    assert rc == 1
    assert "report module tuner/report/__init__.py cannot be imported" in err
    assert not (tmp_path / "store.sqlite").exists()  # failed in seconds, nothing tuned
    assert not (tmp_path / "out").exists() or not any((tmp_path / "out").iterdir())


def test_failing_report_is_named_and_leaves_no_tarball(made, tmp_path):
    def broken(store_path, tuned_dir, out_dir, *, bench_json=None):
        raise ValueError("no plots today")

    args = ci_args(made["root"])
    args[args.index("--out") + 1] = str(tmp_path / "out")
    rc, out, err = run_ci(args, broken)  # the run itself comes from the store: seconds
    assert rc == 1
    assert "writing the report failed: ValueError: no plots today" in err
    assert list((tmp_path / "out").iterdir()) == []


def test_pack_is_atomic(tmp_path):
    from tuner.fleet.ci import pack

    (tmp_path / "a").write_text("A")
    with pytest.raises(FileNotFoundError):
        pack(tmp_path / "out", "art", {"a": tmp_path / "a", "b": tmp_path / "missing"})
    assert list((tmp_path / "out").iterdir()) == []
    path = pack(tmp_path / "out", "art", {"a": tmp_path / "a"})
    with tarfile.open(path) as tar:
        assert tar.getnames() == ["art/a"] and tar.extractfile("art/a").read() == b"A"
    assert oct(os.stat(path).st_mode & 0o777) == "0o644"


def test_bad_options_are_usage_errors(tmp_path):
    rc, out, err = run_ci(["--out", str(tmp_path), "--space", "rows"])
    assert rc == 2 and "--space wants KNOB=V1,V2" in err


def test_example_workflow_tunes_each_machine_type_and_uploads_its_tarball():
    import yaml

    wf = yaml.safe_load((ROOT / ".github" / "workflows" / "tune.yml").read_text())
    job = wf["jobs"]["tune"]
    assert len(job["strategy"]["matrix"]["runner"]) >= 2
    assert job["runs-on"] == "${{ matrix.runner }}"
    runs = [st.get("run", "") for st in job["steps"]]
    assert "scripts/setup && python -m tuner ci --out artifacts --quick" in runs
    up = [st for st in job["steps"] if st.get("uses", "").startswith("actions/upload-artifact")]
    assert up and up[0]["with"]["path"] == "artifacts/colibri-*.tar.gz"
    merge = " ".join(st.get("run", "") for st in wf["jobs"]["registry"]["steps"])
    assert "python -m tuner merge" in merge and "--into registry.sqlite" in merge
