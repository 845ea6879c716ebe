"""colibri_bench bench on the tiny shape: the table's rows, figures and JSON (not speed)."""
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_bench_runs_and_writes_json(tmp_path):
    out = tmp_path / "bench.json"
    res = subprocess.run([sys.executable, "-m", "colibri_bench", "bench", "--shape", "tiny", "--dtype", "f32",
                          "--dtype", "int8", "--dtype", "int4", "--phase", "decode", "--phase", "prefill16",
                          "--phase", "prefill512", "--rounds", "2",
                          "--threads", "1", "--min-seconds", "0.05", "--out", str(out)],
                         cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stderr[-3000:]
    assert "vs numpy" in res.stdout
    data = json.loads(out.read_text())
    impls = {(r["case"], r["impl"]) for r in data["rows"]}
    assert ("tiny/decode/f32", "numpy") in impls and ("tiny/decode/f32", "colibri-default") in impls
    assert ("tiny/decode/int8", "colibri-default") in impls
    assert ("tiny/decode/int4", "colibri-default") in impls
    for r in data["rows"]:
        assert r["seconds"] > 0 and r["gflops"] > 0 and len(r["round_seconds"]) == 2
        if "/decode/" in r["case"]:
            assert r["gbps"] > 0 and r["read_bw_gbps"] > 0 and r["pct_of_bound"] > 0
        if r["impl"].startswith("colibri"):
            assert r["vs_numpy"] > 0
        else:
            assert r["weights"] == "f32"  # the peers always run the f32 weights
    # a byte bound per dtype: int4 streams fewer bytes than int8, int8 fewer than f32
    bound = {r["case"]: r["bound_ms_per_token"] for r in data["rows"] if r["impl"] == "colibri-default"}
    assert bound["tiny/decode/int4"] < bound["tiny/decode/int8"] < bound["tiny/decode/f32"]
    # whether each library runs its f32/bf16 gemm on AMX tiles, as the library says
    from colibri._lib import open_library

    assert set(data["amx"]) == set(data["libs"])
    for name, path in data["libs"].items():
        assert data["amx"][name] is bool(open_library(path).colibri_uses_amx())
    assert "on AMX tiles: colibri-default" in res.stdout
    route = data["routing"][0]
    assert route["T"] == 512 and route["route_seconds"] > 0 and route["pct_of_layer"] > 0


def test_rounds_rotate_which_implementation_goes_first():
    from tuner.measure.worker import round_order

    names = ["colibri-tuned", "colibri-default", "numpy", "torch"]
    orders = [round_order(names, r) for r in range(4)]
    assert [o[0] for o in orders] == names            # each one first once in 4 rounds
    assert all(sorted(o) == sorted(names) for o in orders)
    assert round_order(names, 4) == names and round_order([], 3) == []

