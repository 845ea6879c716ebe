"""colibri_bench bench on the tiny shape: the table's rows, figures and JSON (not speed)."""
import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def test_bench_runs_and_writes_json(tmp_path):
    out = tmp_path / "bench.json"
    res = subprocess.run([sys.executable, "-m", "colibri_bench", "bench", "--shape", "tiny", "--dtype", "f32",
                          "--dtype", "int8", "--dtype", "int4g32", "--dtype", "int4", "--phase", "decode", "--phase", "prefill16",
                          "--phase", "prefill512", "--rounds", "2",
                          "--threads", "1", "--min-seconds", "0.05", "--out", str(out)],
                         cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stderr[-3000:]
    assert "vs numpy" in res.stdout
    data = json.loads(out.read_text())
    impls = {(r["case"], r["impl"]) for r in data["rows"]}
    assert ("tiny/decode/f32", "numpy") in impls and ("tiny/decode/f32", "colibri-default") in impls
    assert ("tiny/decode/int8", "colibri-default") in impls
    assert ("tiny/decode/int4g32", "colibri-default") in impls
    assert ("tiny/prefill16/int4", "colibri-default") in impls  # int4 and int4g32 run the int4 part's kernels
    # which kernel table each library's layer ran (tiny is no tuned shape class here)
    assert all(r["kernels"] for r in data["rows"] if r["impl"].startswith("colibri"))
    extended = set()  # (case, threads) the bench measured again: "bench: CASE at 1, 2 thread(s): ..."
    for line in (res.stderr + res.stdout).splitlines():
        if "more rounds" in line:
            case, threads = line.split(" at ", 1)[0].split()[1], line.split(" at ", 1)[1].split(" thread")[0]
            extended |= {(case, int(t)) for t in threads.split(", ")}
    for r in data["rows"]:
        # 2 rounds; 2 + 4 for the libraries of a row that read below 0.98 (the bench says so)
        want = 6 if r["impl"].startswith("colibri") and (r["case"], r["threads"]) in extended else 2
        assert r["seconds"] > 0 and r["gflops"] > 0 and len(r["round_seconds"]) == want
        assert r["rounds"] == want
        if "/decode/" in r["case"]:
            assert r["gbps"] > 0 and r["read_bw_gbps"] > 0 and r["pct_of_read_bw"] > 0
            assert r["roof_by"] == "read bw"  # decode's roof is its weight stream
        # every row has a roofline: its time bound, the measured share of it and its unit
        assert r["roof_ms_per_token"] > 0 and r["pct_of_roof"] > 0 and r["roof_by"]
        assert r["pct_of_roof"] == pytest.approx(100 * r["roof_ms_per_token"] / r["ms_per_token"])
        if r["impl"].startswith("colibri"):
            assert r["vs_numpy"] > 0
        else:
            assert r["weights"] == "f32"  # the peers always run the f32 weights
    # a byte bound per dtype: int4g32 streams fewer bytes than int8, int8 fewer than f32
    bound = {r["case"]: r["roof_ms_per_token"] for r in data["rows"] if r["impl"] == "colibri-default"}
    assert bound["tiny/decode/int4g32"] < bound["tiny/decode/int8"] < bound["tiny/decode/f32"]
    # the compute peaks the prefill roofs used, measured in the same run
    peaks = data["compute_peaks"]
    assert peaks["f32_fma"]["1"] > 0
    assert "compute peaks (GOP/s) f32_fma 1 thr" in res.stdout
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


def test_a_tuned_row_below_the_line_gets_more_rounds_pooled(monkeypatch):
    """Timings injected: the tuned library 3% slower at 2 threads only. That group gets
    2x the rounds more (libraries only), pooled; 1 thread keeps its 4."""
    from colibri_bench import bench

    speed = {("colibri-default", 1): 1.0, ("colibri-tuned", 1): 0.9,
             ("colibri-default", 2): 1.0, ("colibri-tuned", 2): 1.03}
    builds = []

    def build(name):
        builds.append(name)
        return name

    monkeypatch.setattr(bench, "time_colibri", lambda layers, xs, th, s: speed[(layers, th)])
    monkeypatch.setattr(bench, "time_python", lambda fn, xs, s: 2.0)
    libs = {"colibri-default": "d.so", "colibri-tuned": "t.so"}
    said = []
    per, bws = bench.measure_group("tiny/prefill8/f32", libs, build, {"numpy": None}, None, [1, 2],
                                   4, 0.1, lambda th: 10.0, said.append)
    assert [len(per[1][n]) for n in ("colibri-default", "colibri-tuned", "numpy")] == [4, 4, 4]
    assert [len(per[2][n]) for n in ("colibri-default", "colibri-tuned", "numpy")] == [12, 12, 4]
    assert len(said) == 1 and "2 thread(s)" in said[0] and "8 more rounds" in said[0]
    # each pass maps both libraries' layers once (they share the model file's memory)
    assert builds == ["colibri-default", "colibri-tuned"] * 2
    assert bench._tuned_ratio(per[2]) < bench.MIN_RATIO < bench._tuned_ratio(per[1])


def test_roof_is_the_larger_of_memory_and_compute():
    """Injected figures: a prefill problem whose flops over the dtype's best unit exceed
    its bytes over the bandwidth is compute-bound, named by that unit; without peaks the
    roof is the bandwidth's."""
    from colibri_bench.bench import roof
    from tuner.measure import problems

    p = problems.problem("mixtral-8x7b/prefill512/bf16")
    peaks = {"f32_fma": {"2": 500.0}, "bf16_dot": {"2": 1200.0}, "int8_dot": {"2": 1050.0}}
    r = roof(p, p.E, 50.0, peaks, 2)  # bf16: the pair dot at half its rate (split activations)
    assert r["roof_by"] == "bf16_dot x 0.5" and r["roof_seconds"] == pytest.approx(p.flops / 0.6e12)
    mem = (p.E * p.expert_bytes + p.E * p.H * 4) / 50e9
    assert roof(p, p.E, 50.0, None, 2) == {"roof_seconds": pytest.approx(mem), "roof_by": "read bw"}
    # f32 on the FMA; int4g32 on the int8 dot, the fastest unit that computes it
    assert roof(problems.problem("mixtral-8x7b/prefill512/f32"), p.E, 50.0, peaks, 2)["roof_by"] == "f32_fma"
    assert roof(problems.problem("mixtral-8x7b/prefill512/int4g32"), p.E, 50.0, peaks, 2)["roof_by"] == "int8_dot"
    # decode: one token's k experts over the bandwidth
    d = problems.problem("mixtral-8x7b/decode/int4g32")
    assert roof(d, d.k, 50.0, peaks, 2) == {"roof_seconds": pytest.approx(d.decode_bytes / 50e9),
                                            "roof_by": "read bw"}


def test_a_groups_roof_takes_the_best_burst_of_its_own_rounds():
    """Injected figures: the rounds' bursts replace the start-of-run figure of the units
    they measured, at the group's thread count, by their best; other units and thread
    counts keep the start's."""
    from colibri_bench.bench import group_peaks

    start = {"f32_fma": {"1": 250.0, "2": 500.0}, "int8_dot": {"2": 1000.0},
             "reasons": {"amx_int8": "no AMX"}, "runs": []}
    rounds = [{"int8_dot": 700.0, "f32_fma": 480.0}, {"int8_dot": 820.0}, {"int8_dot": 760.0}]
    got = group_peaks(start, rounds, 2)
    assert got == {"f32_fma": {"1": 250.0, "2": 480.0}, "int8_dot": {"2": 820.0}}
    assert group_peaks(start, [], 2) == {"f32_fma": {"1": 250.0, "2": 500.0}, "int8_dot": {"2": 1000.0}}
    assert group_peaks(None, [], 2) is None


def test_a_cell_whose_parts_match_is_not_timed_for_the_tuned_library(tmp_path, monkeypatch):
    """Two copies of the default library; the 'tuned' one's kernel_tables.json names another
    int8 part. The f32 cell runs the same part from the same compiler and flags in both: the
    tuned library is not timed there, and the default row says so. The int8 cell differs and
    is timed; --time-same-code times the f32 cell too, marked same code."""
    import shutil

    from colibri._lib import current_default_build
    from colibri_bench import bench
    from colibri_build import hostid, parts

    src = Path(current_default_build(hostid.host_profile_name(), None))
    tables = parts.read_tables(src.parent / "kernel_tables.json")
    libs = {}
    for name in ("colibri-default", "colibri-tuned"):
        d = tmp_path / name
        d.mkdir()
        shutil.copy2(src, d / "libcolibri.so")
        t = json.loads(json.dumps(tables))
        if name == "colibri-tuned":
            for table in t.values():
                table["int8"] = table["int8"][:-4] + "beef"
        (d / "kernel_tables.json").write_text(json.dumps(t))
        libs[name] = d / "libcolibri.so"
    monkeypatch.setattr(bench, "_libs", lambda build_dir, profile, say: dict(libs))
    said = []
    out = bench.run_bench(["tiny"], ["f32", "int8"], ["decode"], [1], 0.02, rounds=1, peers=(),
                          say=said.append)
    rows = {(r["case"], r["impl"]): r for r in out["rows"]}
    assert ("tiny/decode/f32", "colibri-tuned") not in rows
    f32 = rows[("tiny/decode/f32", "colibri-default")]
    assert f32["tuned_same_code"]["part"] == f32["part"] and f32["part"].startswith("cbp_f32_")
    assert any("not timed: the same machine code" in m and "tiny/decode/f32" in m for m in said)
    int8 = rows[("tiny/decode/int8", "colibri-tuned")]
    assert int8["tuned_vs_default"] > 0 and int8["same_code"] is False and int8["part"].endswith("beef")
    assert "tuned_same_code" not in rows[("tiny/decode/int8", "colibri-default")]
    assert said[-1].startswith("tuned vs default: 1 cell(s) run the default's machine code "
                               "(not timed); 1 cell(s) differ: tuned/default ")
    out = bench.run_bench(["tiny"], ["f32"], ["decode"], [1], 0.02, rounds=1, peers=(),
                          say=said.append, time_same=True)
    tuned = next(r for r in out["rows"] if r["impl"] == "colibri-tuned")
    assert tuned["same_code"] is True and tuned["tuned_vs_default"] > 0
    assert said[-1] == "tuned vs default: 1 cell(s) run the default's machine code; 0 cell(s) differ"


def test_a_group_that_fails_keeps_the_rows_measured_before_it(tmp_path, monkeypatch):
    # a full disk while writing the second dtype's model file: the first dtype's rows are
    # returned and written, with where and why it stopped, and the exit status says so
    from colibri_bench import bench
    from tuner.measure import weights

    real = weights.ensure_model

    def ensure_model(wdir, p, *a, **k):
        if p.dtype == "int8":
            raise OSError(28, "No space left on device")
        return real(wdir, p, *a, **k)

    monkeypatch.setattr(weights, "ensure_model", ensure_model)
    out = tmp_path / "bench.json"
    rc = bench.main(["--shape", "tiny", "--dtype", "f32", "--dtype", "int8", "--phase", "decode",
                     "--threads", "1", "--rounds", "1", "--min-seconds", "0.02", "--no-numpy",
                     "--no-torch", "--keep-blas-env", "--out", str(out)])
    assert rc == 1
    data = json.loads(out.read_text())
    assert {r["case"] for r in data["rows"]} == {"tiny/decode/f32"}
    assert data["incomplete"] == ("stopped at tiny/decode/int8: OSError: [Errno 28] No space "
                                  "left on device")


def test_a_decode_rows_share_of_bandwidth_pairs_each_round_with_its_own_reading():
    # the bandwidth read 30 GB/s in two rounds and 60 in two (this VM switches between such
    # figures within a group); the kernel streamed 90% of each round's reading. Medians taken
    # apart would pair its slow rounds with a fast reading and say 80%.
    from colibri_bench import bench
    from tuner.measure import problems

    p = problems.problem("tiny/decode/int8")
    nbytes = bench._bytes_per_token(p)
    bws = [30.0, 60.0, 30.0, 60.0]
    ts = [nbytes / (0.9 * b * 1e9) for b in bws]
    row, = bench.group_rows(p, problems.problem("tiny/decode/f32"), {"colibri-default": ts}, bws, 1,
                            {"colibri-default": 1}, reached=p.k)
    assert row["pct_of_read_bw"] == pytest.approx(90.0)
    assert row["pct_of_roof"] == pytest.approx(90.0) and row["roof_by"] == "read bw"
    assert row["pct_of_roof"] == pytest.approx(100 * row["roof_ms_per_token"] / row["ms_per_token"])
    assert row["round_read_bw_gbps"] == bws
    # a round without a reading: the medians, as before
    row, = bench.group_rows(p, problems.problem("tiny/decode/f32"), {"colibri-default": ts}, bws[:3], 1,
                            {"colibri-default": 1}, reached=p.k)
    assert row["pct_of_read_bw"] == pytest.approx(100 * nbytes / bench._median(ts) / 1e9 / 30.0)


def test_a_group_that_read_its_weights_from_disk_says_so(tmp_path, monkeypatch):
    # injected: 5000 major faults between the start and the end of each group's rounds
    from colibri_bench import bench

    count = iter(range(0, 10 ** 6, 5000))
    monkeypatch.setattr(bench, "major_faults", lambda: next(count))
    said = []
    out = bench.run_bench(["tiny"], ["int8"], ["decode"], [1], 0.02, rounds=1, peers=(),
                          say=said.append)
    rows = [r for r in out["rows"] if r["impl"] == "colibri-default"]
    assert rows and all(r["major_faults"] == 5000 for r in rows)
    assert any("5000 pages came from disk during the rounds" in m for m in said), said


def test_another_dtype_beside_a_group_is_timed_in_its_rounds(tmp_path):
    from colibri_bench import bench

    said = []
    out = bench.run_bench(["tiny"], ["int4"], ["decode"], [1], 0.02, rounds=2, peers=(),
                          say=said.append, beside="int4g32")
    rows = {r["impl"]: r for r in out["rows"]}
    b, c = rows["colibri-int4g32"], rows["colibri-default"]
    assert b["weights"] == "int4g32" and c["weights"] == "int4" and len(b["round_seconds"]) == 2
    assert c["vs"]["colibri-int4g32"] == pytest.approx(
        bench._median([x / y for x, y in zip(b["round_seconds"], c["round_seconds"])]))
    assert any("int4g32 time / int4 time" in m and "(the same rounds)" in m for m in said), said


def test_each_group_holds_a_throwaway_copy_loaded_before_its_timed_layers(tmp_path, monkeypatch):
    from colibri_bench import bench

    events, real_mapped, real_held = [], bench.Mapped, bench.held_copy

    kinds = {}  # file name -> page kind of its layers (all but "file": packed into a pool)
    pooled = ("normal", "thp", "hugetlb")

    class Logged(real_mapped):
        def __init__(self, path, lib_path):
            events.append(("load", Path(path).name))
            super().__init__(path, lib_path)
            kinds[Path(path).name] = self.model.layer_page_kind(0)

    def held(path, lib_path):
        events.append(("held", Path(path).name))
        m = real_held(path, lib_path)
        if m is not None:
            events.append(("kept", m.model.layer_page_kind(0)))
        return m

    monkeypatch.setattr(bench, "Mapped", Logged)
    monkeypatch.setattr(bench, "held_copy", held)
    bench.run_bench(["tiny"], ["f32", "int4"], ["decode"], [1], 0.02, rounds=1, peers=(),
                    say=lambda *_: None, beside="int4g32")
    # per dtype group, the held copy is the group's first load; a packed model is kept (int4
    # is packed at load everywhere; f32 where the profile packs it, as zen4 does), one read
    # in place from its file is not held
    starts = [i for i, e in enumerate(events) if e[0] == "held"]
    assert len(starts) == 2
    for i in starts:
        assert events[i + 1][0] == "load" and events[i + 1][1] == events[i][1]
    f32_file = events[starts[0]][1]
    if kinds[f32_file] in pooled:
        assert events[starts[0] + 2][0] == "kept" and events[starts[0] + 2][1] in pooled
        assert events[starts[0] + 3][0] == "load"
    else:
        assert events[starts[0] + 2][0] == "load"  # f32 read in place: nothing kept
    assert events[starts[1] + 2][0] == "kept" and events[starts[1] + 2][1] in pooled
    assert all(e[0] == "load" for e in events[starts[1] + 3:])


def test_beside_ratios_name_each_librarys_own_pair():
    from colibri_bench.bench import beside_name, beside_ratios

    assert beside_name("colibri-default", "int4g32") == "colibri-int4g32"
    assert beside_name("colibri-tuned", "int4g32") == "colibri-tuned-int4g32"
    row = lambda impl, vs: {"case": "c", "threads": 2, "impl": impl, "vs": vs}  # noqa: E731
    rows = [row("colibri-default", {"colibri-int4g32": 1.08, "colibri-tuned-int4g32": 1.2}),
            row("colibri-tuned", {"colibri-tuned-int4g32": 1.09, "colibri-int4g32": 1.0})]
    assert beside_ratios(rows, "c", 2, "int4g32", tuned=True) == "1.080 default, 1.090 tuned"
    assert beside_ratios(rows[:1], "c", 2, "int4g32", tuned=False) == "1.080 default"
    assert beside_ratios(rows[:1], "c", 2, "int4g32", tuned=True) == (
        "1.080 default, tuned: the default's code in one of the two")
