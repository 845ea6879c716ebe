"""Runs of a model under a memory budget, cold, in a memory cgroup: the storage class's
measure (tuner/storage.py). A run is kernels/tools/infer_model.c on a trace's cell with
the read options of a point, in a fresh cgroup limited to `limit` bytes, after the model's
pages were dropped from the page cache; it costs the calls' seconds per token and must
give the unbudgeted run's bits."""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import numpy as np

from tuner.measure import cgroup, infer_tool

# infer_model's mode for each cell
MODES = {"decode": "decode", "prefill": "all"}


class RunFailed(RuntimeError):
    """A candidate's run failed, was killed or gave other bits; the message says which."""


@dataclass
class BudgetRuns:
    exe: Path                 # infer_model linked against the library measured
    model: Path
    trace: np.ndarray         # [T, hidden] float32: the hidden states entering the first layer
    cells: dict               # name -> (first row, rows); names are MODES' keys
    limit: int                # the cgroup's memory limit in bytes
    budget: int               # the model's memory budget
    threads: int
    work: Path
    options: Callable[[dict], dict] | None = None  # point -> colibri_load_options values (default: the point)
    log: list = field(default_factory=list)  # every run: point, cell, seconds, stats

    def __post_init__(self):
        self.work.mkdir(parents=True, exist_ok=True)
        self.inputs, self.want = {}, {}
        for name, (r0, n) in self.cells.items():
            self.inputs[name] = self.work / f"trace-{name}.bin"
            np.ascontiguousarray(self.trace[r0:r0 + n], np.float32).tofile(self.inputs[name])
            self.want[name] = self.work / f"want-{name}.bin"
            rc, _, err = infer_tool.run(self.exe, self.model, self.inputs[name], n, self.want[name], budget=0,
                                        mode=MODES[name], threads=self.threads)
            if rc:
                raise RuntimeError(f"the unbudgeted {name} run failed (exit {rc}): {err}")

    def __call__(self, point: dict, cell: str) -> float:
        """One cold run of `cell` with `point`'s read options: seconds per token. Raises
        RunFailed when it fails, is killed or gives other bits."""
        n = self.cells[cell][1]
        out = self.work / f"y-{cell}.bin"
        out.unlink(missing_ok=True)
        cgroup.drop_from_page_cache(self.model)
        with cgroup.memory_cgroup(self.limit, tag="colibri-storage") as (version, cg):
            rc, st, err = infer_tool.run(self.exe, self.model, self.inputs[cell], n, out, budget=self.budget,
                                         mode=MODES[cell], threads=self.threads,
                                         reads=(self.options or dict)(point), cg=cg)
            kills = cgroup.oom_kills(version, cg)
        row = {"point": dict(point), "cell": cell, "rc": rc, "oom_kills": kills, "stats": st}
        self.log.append(row)
        if rc or kills:
            row["error"] = f"exit {rc}, {kills} OOM kill(s): {err.strip()[-200:]}"
        elif out.read_bytes() != self.want[cell].read_bytes():
            row["error"] = "its outputs are not the unbudgeted run's bits"
        if "error" in row:
            raise RunFailed(row["error"])
        return st["infer_seconds"] / n
