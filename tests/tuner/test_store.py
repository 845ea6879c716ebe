"""The results store: round trips, persistence, kill -9 safety, the writer lock, merging."""
from __future__ import annotations

import os
import random
import signal
import sqlite3
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from tuner.store import SCHEMA_VERSION, Measurement, Store, StoreError, StoreLocked

ROOT = Path(__file__).resolve().parents[2]


def meas(i: int, **kw) -> Measurement:
    base = dict(key=f"{i:064x}", kernel="expert_ffn", problem="qwen3-30b-a3b/decode/f32",
                knobs={"isa": "avx2", "rows": [1, 2, 4][i % 3], "prefetch": 256 * (i % 5)},
                status="ok", reason="", median_s=1e-3 * (1 + i % 7), spread=0.02, samples=25,
                gbps=42.5, bw_fraction=0.61, extra={"max_rel_err": 1e-7, "i": i},
                host_id="host-a", profile="zen4", created=1_700_000_000.0 + i)
    base.update(kw)
    return Measurement(**base)


def test_round_trip_keeps_every_field(tmp_path):
    m = meas(1, extra={"nested": {"a": [1, 2.5, None, "x"]}, "gflops": 12.0})
    failed = meas(2, status="crash", reason="SIGSEGV", median_s=None, spread=None, samples=0,
                  gbps=None, bw_fraction=None)
    with Store(tmp_path / "r.sqlite") as st:
        st.put(m)
        st.put(failed)
        assert st.get(m.key) == m
        assert st.get(failed.key) == failed
        assert st.get("nope") is None
        assert m.key in st and len(st) == 2
        assert st.keys() == {m.key, failed.key}


def test_persists_across_reopen_and_processes(tmp_path):
    path = tmp_path / "p.sqlite"
    with Store(path) as st:
        for i in range(10):
            st.put(meas(i))
    with Store(path) as st:
        assert len(st) == 10 and st.get(meas(3).key) == meas(3)
    code = (f"import sys; sys.path.insert(0, {str(ROOT)!r}); from tuner.store import Store; "
            f"print(len(Store({str(path)!r}, readonly=True)))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "10"


def test_put_replaces_the_row_with_the_same_key(tmp_path):
    with Store(tmp_path / "r.sqlite") as st:
        st.put(meas(1))
        st.put(meas(1, median_s=5e-4))
        assert len(st) == 1 and st.get(meas(1).key).median_s == 5e-4


def test_query_filters_and_best(tmp_path):
    with Store(tmp_path / "q.sqlite") as st:
        for i in range(12):
            st.put(meas(i, problem="p1" if i % 2 else "p2", host_id="h1" if i < 6 else "h2"))
        st.put(meas(100, problem="p1", status="wrong", reason="max rel err 0.3", median_s=None))
        st.put(meas(101, problem="p1", kernel="route", median_s=1e-9))
        assert len(st.query()) == 14
        assert {m.problem for m in st.query(problem="p1")} == {"p1"}
        assert len(st.query(kernel="expert_ffn", problem="p1")) == 7
        assert [m.status for m in st.query(status="wrong")] == ["wrong"]
        assert len(st.query(status=["ok", "wrong"], problem="p1", kernel="expert_ffn")) == 7
        assert all(m.host_id == "h2" for m in st.query(host_id="h2"))
        assert [m.created for m in st.query()] == sorted(m.created for m in st.query())
        best = st.best("expert_ffn", "p1")
        ok = [m for m in st.query(kernel="expert_ffn", problem="p1") if m.ok]
        assert best.median_s == min(m.median_s for m in ok) and best.ok
        assert st.best("expert_ffn", "p1", host_id="h2").host_id == "h2"
        assert st.best("expert_ffn", "nothing") is None
        assert st.problems() == [("expert_ffn", "p1"), ("expert_ffn", "p2"), ("route", "p1")]
        with pytest.raises(ValueError):
            st.query(status="fine")


@pytest.mark.parametrize("bad, match", [
    (dict(status="slow"), "status"),
    (dict(median_s=None), "median_s"),
    (dict(median_s=float("nan")), "finite"),
    (dict(status="crash", reason=""), "reason"),
    (dict(key=""), "key"),
])
def test_put_refuses_malformed_measurements(tmp_path, bad, match):
    with Store(tmp_path / "b.sqlite") as st:
        with pytest.raises(StoreError, match=match):
            st.put(meas(1, **bad))
        assert len(st) == 0


def test_readonly_store_neither_creates_nor_writes(tmp_path):
    with pytest.raises(StoreError, match="does not exist"):
        Store(tmp_path / "missing.sqlite", readonly=True)
    assert not (tmp_path / "missing.sqlite").exists()
    with Store(tmp_path / "s.sqlite") as st:
        st.put(meas(1))
    with Store(tmp_path / "s.sqlite", readonly=True) as ro:
        assert ro.get(meas(1).key) == meas(1)
        with pytest.raises(StoreError, match="read-only"):
            ro.put(meas(2))


def test_refuses_other_files_and_other_schema_versions(tmp_path):
    junk = tmp_path / "junk.sqlite"
    junk.write_bytes(b"not a database at all" * 100)
    with pytest.raises(StoreError, match="not a usable results store"):
        Store(junk)
    other = tmp_path / "other.sqlite"
    db = sqlite3.connect(other)
    db.execute("CREATE TABLE t (x)")
    db.commit()
    db.close()
    with pytest.raises(StoreError, match="not a results store"):
        Store(other, readonly=True)
    newer = tmp_path / "newer.sqlite"
    Store(newer).close()
    db = sqlite3.connect(newer)
    db.execute("UPDATE schema_version SET version = ?", (SCHEMA_VERSION + 1,))
    db.commit()
    db.close()
    with pytest.raises(StoreError, match="schema version"):
        Store(newer)


def test_uses_wal_and_full_sync(tmp_path):
    with Store(tmp_path / "w.sqlite") as st:
        assert st._conn().execute("PRAGMA journal_mode").fetchone()[0] == "wal"
        assert st._conn().execute("PRAGMA synchronous").fetchone()[0] == 2  # FULL


def test_merge_from_adds_only_missing_rows(tmp_path):
    a, b = tmp_path / "a.sqlite", tmp_path / "b.sqlite"
    with Store(a) as st:
        for i in range(5):
            st.put(meas(i, host_id="host-a"))
    with Store(b) as st:
        st.put(meas(3, host_id="host-b", median_s=9.0))   # same key, different content: kept
        for i in range(10, 13):
            st.put(meas(i, host_id="host-b"))
        assert st.merge_from(a) == 4
        assert st.merge_from(a) == 0
        assert len(st) == 8
        assert st.get(meas(3).key).median_s == 9.0
        assert st.get(meas(0).key) == meas(0, host_id="host-a")
        assert st.merge_from(b) == 0
        with pytest.raises(StoreError):
            st.merge_from(tmp_path / "none.sqlite")


def test_snapshot_is_one_self_contained_file(tmp_path):
    with Store(tmp_path / "live.sqlite") as st:
        for i in range(20):
            st.put(meas(i))
        snap = st.snapshot(tmp_path / "fixture.sqlite")
    assert not Path(str(snap) + "-wal").exists()
    db = sqlite3.connect(snap)
    assert db.execute("PRAGMA journal_mode").fetchone()[0] == "delete"
    db.close()
    with Store(snap, readonly=True) as ro:
        assert len(ro) == 20 and ro.integrity_check() == "ok"


# ------------------------------------------------------------------ the writer lock

def test_exclusive_lock_refuses_a_second_writer_with_a_clear_message(tmp_path):
    path = tmp_path / "x.sqlite"
    with Store(path, exclusive=True):
        with pytest.raises(StoreLocked) as exc:
            Store(path, exclusive=True)
        msg = str(exc.value)
        assert str(path) in msg and f"pid {os.getpid()}" in msg and "wait=True" in msg
        with Store(path, readonly=True) as reader:      # readers are never locked out
            assert len(reader) == 0
        with pytest.raises(StoreLocked):
            Store(path, exclusive=True, wait=0.2)
    with Store(path, exclusive=True):                     # released on close
        pass


def test_exclusive_lock_wait_blocks_until_released(tmp_path):
    path = tmp_path / "w.sqlite"
    holder = Store(path, exclusive=True)
    threading.Timer(0.4, holder.close).start()
    t0 = time.monotonic()
    with Store(path, exclusive=True, wait=True) as st:
        waited = time.monotonic() - t0
        st.put(meas(1))
    assert waited >= 0.3


_HOLDER = """
import sys, time
sys.path.insert(0, {root!r})
from tuner.store import Store
st = Store({path!r}, exclusive=True)
print("locked", flush=True)
time.sleep(60)
"""


def test_lock_of_a_killed_process_is_released(tmp_path):
    path = tmp_path / "k.sqlite"
    proc = subprocess.Popen([sys.executable, "-c", _HOLDER.format(root=str(ROOT), path=str(path))],
                            stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "locked"
        with pytest.raises(StoreLocked, match=f"pid {proc.pid}"):
            Store(path, exclusive=True)
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    with Store(path, exclusive=True, wait=5):
        pass


# ------------------------------------------------------------------ kill -9 safety

_WRITER = """
import os, random, sys
sys.path.insert(0, {root!r})
from tuner.store import Measurement, Store
rng = random.Random({seed})
st = Store({path!r}, exclusive=True, wait=10)
i = 0
while True:
    key = "{seed:04d}-%06d" % i
    st.put(Measurement(key=key, kernel="expert_ffn", problem="p", knobs={{"i": i}},
                       status="ok", median_s=1e-3 + i * 1e-6, samples=10,
                       extra={{"blob": "x" * rng.randrange(0, 40000)}}, host_id="h"))
    print(key, flush=True)   # only after put() returned: the row is committed
    i += 1
"""


def test_kill_9_of_the_writer_loses_no_committed_measurement(tmp_path):
    path = tmp_path / "killed.sqlite"
    rng = random.Random(2024)
    reported: set[str] = set()
    for seed in range(20):
        proc = subprocess.Popen(
            [sys.executable, "-c", _WRITER.format(root=str(ROOT), path=str(path), seed=seed)],
            stdout=subprocess.PIPE, text=True)
        time.sleep(rng.uniform(0.15, 0.6))        # startup is ~0.1 s: some kills are early
        proc.send_signal(signal.SIGKILL)
        out, _ = proc.communicate()
        assert proc.returncode == -signal.SIGKILL
        lines = out.split("\n")
        reported |= {line for line in lines[:-1] if line}   # the last piece may be half a line
        with Store(path, exclusive=True) as st:             # the lock died with the writer
            assert st.integrity_check() == "ok"
            missing = reported - st.keys()
            assert not missing, f"committed rows lost after kill -9 #{seed}: {sorted(missing)[:5]}"
            st.query()                                      # every row still decodes
    assert len(reported) > 50, "the writer should have committed rows between kills"


_STREAM = """
import sys, time
sys.path.insert(0, {root!r})
from tuner.store import Measurement, Store
st = Store({path!r}, exclusive=True)
for i in range(150):
    st.put(Measurement(key="r%05d" % i, kernel="k", problem="p", knobs={{"i": i}}, status="ok",
                       median_s=1.0, extra={{"blob": "y" * 20000}}))
print("done", flush=True)
"""


def test_a_reader_reads_while_another_process_writes(tmp_path):
    path = tmp_path / "rw.sqlite"
    Store(path).close()
    proc = subprocess.Popen([sys.executable, "-c", _STREAM.format(root=str(ROOT), path=str(path))],
                            stdout=subprocess.PIPE, text=True)
    counts = []
    with Store(path, readonly=True) as reader:
        while proc.poll() is None:
            counts.append(len(reader.query(kernel="k")))
            time.sleep(0.01)
        counts.append(len(reader.query(kernel="k")))
    assert proc.wait() == 0
    assert counts == sorted(counts) and counts[-1] == 150
    assert len(set(counts)) > 2, "the reader should have seen the store grow"


def test_a_store_made_before_the_leak_status_opens_and_takes_leak_rows(tmp_path):
    """The recorded fixture predates "leak": its CHECK refuses it until a writer widens it."""
    import shutil

    old = tmp_path / "old.sqlite"
    shutil.copy(ROOT / "tests/fixtures/stores/expert_ffn-emr-vm.sqlite", old)
    raw = sqlite3.connect(old)
    before = raw.execute("SELECT * FROM measurements ORDER BY rowid").fetchall()
    assert "'leak'" not in raw.execute("SELECT sql FROM sqlite_master WHERE name='measurements'").fetchone()[0]
    raw.close()
    with Store(old, readonly=True) as ro:  # a reader neither needs nor makes the change
        assert len(ro) == len(before)
    leak = meas(7, status="leak", reason="leaks 3.1 MB per 1000 calls")
    with Store(old) as st:
        st.put(leak)
        assert st.get(leak.key) == leak
        assert st.integrity_check() == "ok"
        assert len(st.query(status="leak")) == 1
    raw = sqlite3.connect(old)
    after = raw.execute("SELECT * FROM measurements WHERE key != ? ORDER BY rowid", (leak.key,)).fetchall()
    assert after == before
    assert [r[0] for r in raw.execute("SELECT version FROM schema_version")] == [SCHEMA_VERSION]
    assert raw.execute("SELECT name FROM sqlite_master WHERE name='measurements_by_problem'").fetchone()
    raw.close()


def test_snapshot_is_written_aside_and_linked_into_place(tmp_path):
    with Store(tmp_path / "s.sqlite") as st:
        st.put(meas(1))
        out = tmp_path / "snap"
        out.mkdir()
        st.snapshot(out / "a.sqlite")
        assert [p.name for p in out.iterdir()] == ["a.sqlite"]  # no temp file left behind
        with pytest.raises(StoreError, match="does not overwrite"):
            st.snapshot(out / "a.sqlite")
        assert [p.name for p in out.iterdir()] == ["a.sqlite"]
    with Store(out / "a.sqlite", readonly=True) as snap:
        assert snap.get(meas(1).key) == meas(1) and snap.integrity_check() == "ok"
