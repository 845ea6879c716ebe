"""Publishing the tuned artifacts: the set is switched as a whole, and a writer killed at
any instant leaves the old complete set or the new one, never a mix or a torn file."""
import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tuner.build import emit

ROOT = Path(__file__).resolve().parents[2]


def _set(gen: int, size: int = 1 << 16) -> dict:
    """Artifacts that all say which generation they belong to, each with a length check."""
    body = (f"generation {gen}\n" * (size // 16)).encode()
    return {"config.h": f"/* generation {gen} */\n#define COLIBRI_KNOB_ROWS {gen}\n",
            "libcolibri.so": body + f"END {len(body)}\n".encode(),
            "build_info.json": json.dumps({"generation": gen}) + "\n",
            "manifest.json": json.dumps({"generation": gen, "pad": "x" * size}) + "\n"}


def _generation_of(public: Path) -> int:
    """The generation the published set belongs to; fails on a mixed or torn set."""
    assert sorted(p.name for p in public.iterdir()) == sorted(_set(0)), list(public.iterdir())
    gens = set()
    cfg = (public / "config.h").read_text()
    assert cfg.endswith(f"#define COLIBRI_KNOB_ROWS {cfg.split()[2]}\n"), cfg
    gens.add(int(cfg.split()[2]))
    lib = (public / "libcolibri.so").read_bytes()
    head, _, tail = lib.rstrip(b"\n").rpartition(b"END ")
    assert int(tail) == len(head), "torn library"
    gens.add(int(head.split(b"\n", 1)[0].split()[1]))
    gens.add(json.loads((public / "build_info.json").read_text())["generation"])
    gens.add(json.loads((public / "manifest.json").read_text())["generation"])
    assert len(gens) == 1, f"mixed set: {gens}"
    return gens.pop()


def test_publish_replaces_the_whole_set(tmp_path):
    public = tmp_path / "tuned" / "host-1"
    gen1 = emit.publish(public, _set(1))
    assert public.is_symlink() and public.resolve() == gen1.resolve()
    assert _generation_of(public) == 1
    assert os.access(public / "libcolibri.so", os.R_OK)
    emit.publish(public, _set(2))
    assert _generation_of(public) == 2
    # a file of the old set that the new one lacks does not linger
    emit.publish(public, {k: v for k, v in _set(3).items()} | {"extra.txt": "x"})
    emit.publish(public, _set(4))
    assert not (public / "extra.txt").exists() and _generation_of(public) == 4


def test_publish_keeps_the_previous_generation_and_prunes_older_ones(tmp_path, monkeypatch):
    monkeypatch.setattr(emit, "PRUNE_AFTER_S", 0)
    public = tmp_path / "host-1"
    gens = [emit.publish(public, _set(i)) for i in range(4)]
    left = {p.name for p in tmp_path.iterdir()}
    assert left == {"host-1", gens[-1].name, gens[-2].name}


def test_publish_over_a_plain_directory_from_an_older_tuner(tmp_path):
    public = tmp_path / "host-1"
    public.mkdir()
    for name, content in _set(7).items():
        (public / name).write_bytes(content.encode() if isinstance(content, str) else content)
    (public / "_build").mkdir()  # the old in-place build tree
    emit.publish(public, _set(8))
    assert public.is_symlink() and _generation_of(public) == 8
    assert [p.name for p in tmp_path.iterdir() if not p.name.startswith(".host-1.")] == ["host-1"]


def test_publish_refuses_a_path_as_an_artifact_name(tmp_path):
    with pytest.raises(ValueError, match="plain file name"):
        emit.publish(tmp_path / "h", {"../evil": "x"})
    assert not (tmp_path / "h").exists()
    assert list(tmp_path.iterdir()) == []  # the half-made generation is removed


WRITER = """
import sys, time
sys.path.insert(0, {root!r})
from tests.tuner.test_emit import _set
from tuner.build import emit
emit.PRUNE_AFTER_S = 0  # one writer at a time here: debris can go at once
gen = 1
while True:
    emit.publish({public!r}, _set(gen, 1 << 20))
    print(gen, flush=True)
    gen += 1
"""


def test_a_writer_killed_at_random_instants_never_leaves_a_torn_or_mixed_set(tmp_path):
    public = tmp_path / "tuned" / "host-1"
    emit.publish(public, _set(0))
    rng = random.Random(6)
    kills, seen = 0, {0}
    last = 0
    for _ in range(20):
        proc = subprocess.Popen([sys.executable, "-c", WRITER.format(root=str(ROOT), public=str(public))],
                                cwd=ROOT, stdout=subprocess.PIPE, text=True)
        # the first line: the writer is running (imports done); then a random instant
        # within the next few publishes (each copies ~2 MB and fsyncs)
        first = proc.stdout.readline()
        assert first, "the writer died before publishing"
        time.sleep(rng.uniform(0, 0.15))
        proc.send_signal(signal.SIGKILL)
        printed = [int(first)] + [int(x) for x in proc.stdout.read().split()]
        proc.wait()
        kills += 1
        gen = _generation_of(public)
        # the set published is one the writer completed, or the one it was making
        assert gen in (printed[-1], printed[-1] + 1), (gen, printed)
        seen.add(gen)
        last = gen
    print(f"{kills} kills during publish; generations seen {sorted(seen)[:5]}...; last {last}")
    assert kills == 20 and len(seen) >= 3
