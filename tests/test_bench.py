"""tuner bench on the tiny shape: the table's rows, figures and JSON (not speed)."""
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_bench_runs_and_writes_json(tmp_path):
    out = tmp_path / "bench.json"
    res = subprocess.run([sys.executable, "-m", "tuner", "bench", "--shape", "tiny", "--dtype", "f32",
                          "--dtype", "int8", "--phase", "decode", "--phase", "prefill16",
                          "--threads", "1", "--min-seconds", "0.05", "--out", str(out)],
                         cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stderr[-3000:]
    assert "vs numpy" in res.stdout
    data = json.loads(out.read_text())
    impls = {(r["case"], r["impl"]) for r in data["rows"]}
    assert ("tiny/decode/f32", "numpy") in impls and ("tiny/decode/f32", "colibri-default") in impls
    assert ("tiny/decode/int8", "colibri-default") in impls
    for r in data["rows"]:
        assert r["seconds"] > 0 and r["gflops"] > 0
        if r["case"].endswith("decode/f32"):
            assert r["gbps"] > 0 and r["read_bw_gbps"] > 0 and r["vs_numpy"] > 0
