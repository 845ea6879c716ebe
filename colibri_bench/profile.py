"""python -m colibri_bench profile: where one case's time goes, on hosts without perf.

Runs one reference problem (shape/phase/dtype, as `bench` and `ab` name them) through the
library's own timing loop while libcolibri samples the process (kernels/sample.c: a SIGPROF
every period of CPU time, the interrupted instruction's address, in whichever thread ran),
then names the addresses: the mapped object from /proc/self/maps, the function from `nm`,
and, with `objdump`, the loops (runs of sampled addresses, with the instructions in them).
Shares are of all samples, the OpenMP runtime's waits included. The kernel delivers SIGPROF
on its scheduler tick, so a period below the tick (often 1-4 ms) gives one sample a tick.

Prints three tables (objects, functions, loops) and writes them as JSON (--out, default
reports/<host-id>/profile.json)."""
from __future__ import annotations

import bisect
import json
import os
import shutil
import subprocess
import sys
from collections import Counter
from pathlib import Path

from colibri import _cli, quant
from colibri_build import hostid
from colibri_build.paths import build_dir_default, reports_dir_default

LOOP_GAP = 64  # sampled addresses closer than this many bytes belong to one loop


def read_maps(text: str) -> list[tuple[int, int, int, str]]:
    """The executable mappings of a /proc/<pid>/maps text: (start, end, file offset, path)."""
    out = []
    for line in text.splitlines():
        f = line.split()
        if len(f) >= 6 and "x" in f[1]:
            lo, hi = (int(x, 16) for x in f[0].split("-"))
            out.append((lo, hi, int(f[2], 16), f[5]))
    return out


def read_symbols(nm_text: str) -> tuple[list[int], list[str]]:
    """Code symbols of `nm -n --defined-only` output, sorted: (addresses, names)."""
    addrs, names = [], []
    for line in nm_text.splitlines():
        f = line.split()
        if len(f) >= 3 and f[1] in "tTwWiI":
            addrs.append(int(f[0], 16))
            names.append(f[2])
    order = sorted(range(len(addrs)), key=addrs.__getitem__)
    return [addrs[i] for i in order], [names[i] for i in order]


def symbol_at(table: tuple[list[int], list[str]], offset: int) -> str:
    i = bisect.bisect_right(table[0], offset) - 1
    return table[1][i] if i >= 0 else "?"


def loops_of(offsets: Counter, gap: int = LOOP_GAP) -> list[list[int]]:
    """Sampled offsets of one function grouped into runs whose neighbours lie within gap."""
    runs, run = [], []
    for o in sorted(offsets):
        if run and o - run[-1] > gap:
            runs.append(run)
            run = []
        run.append(o)
    return runs + ([run] if run else [])


def _tool(name: str, *args: str) -> str | None:
    if not shutil.which(name):
        return None
    r = subprocess.run([name, *args], capture_output=True, text=True)
    return r.stdout if r.returncode == 0 else None


def _instructions(path: str) -> dict[int, tuple[str, str]]:
    """offset -> (function, mnemonic) from objdump -d, or {} without objdump."""
    text = _tool("objdump", "-d", "--no-show-raw-insn", path) or ""
    out, fn = {}, "?"
    for line in text.splitlines():
        if line.endswith(">:"):
            fn = line.split("<", 1)[1][:-2]
        elif line.startswith(" ") and ":" in line:
            at, _, ins = line.partition(":")
            try:
                out[int(at, 16)] = (fn, (ins.split() or ["?"])[0])
            except ValueError:
                pass
    return out


def attribute(ips, maps, lib_path: str, top_loops: int = 12) -> dict:
    """Samples by object, by function (nm) and by loop in the library (objdump)."""
    n = len(ips)
    objects, functions, lib_offsets = Counter(), Counter(), Counter()
    tables: dict[str, tuple] = {}
    lib_real = os.path.realpath(lib_path)
    for ip in ips:
        m = next((m for m in maps if m[0] <= ip < m[1]), None)
        if m is None:
            objects["?"] += 1
            functions["?"] += 1
            continue
        obj = m[3]
        objects[Path(obj).name] += 1
        off = ip - m[0] + m[2]
        if obj not in tables:  # a stripped object keeps its dynamic symbols only
            tables[obj] = read_symbols(_tool("nm", "-n", "--defined-only", obj) or "")
            if not tables[obj][0]:
                tables[obj] = read_symbols(_tool("nm", "-D", "-n", "--defined-only", obj) or "")
        functions[f"{Path(obj).name}:{symbol_at(tables[obj], off)}"] += 1
        if os.path.realpath(obj) == lib_real:
            lib_offsets[off] += 1
    loops = []
    ins = _instructions(lib_path) if lib_offsets else {}
    if ins:
        by_fn: dict[str, Counter] = {}
        for off, c in lib_offsets.items():
            by_fn.setdefault(ins.get(off, ("?", ""))[0], Counter())[off] = c
        for fn, offs in by_fn.items():
            for run in loops_of(offs):
                mix = Counter(mn for at, (f, mn) in ins.items() if run[0] - 40 <= at <= run[-1] and f == fn)
                loops.append({"function": fn, "start": hex(run[0]), "end": hex(run[-1]),
                              "share": sum(offs[o] for o in run) / n,
                              "instructions": dict(mix.most_common(8))})
        loops.sort(key=lambda r: -r["share"])
    share = lambda c: [{"name": k, "share": v / n} for k, v in c.most_common()]  # noqa: E731
    return {"samples": n, "objects": share(objects), "functions": share(functions),
            "loops": loops[:top_loops], "objdump": bool(ins), "nm": any(t[0] for t in tables.values())}


def main(argv=None) -> int:
    ap = _cli.Parser(prog="python -m colibri_bench profile", description=__doc__.split("\n\n")[0],
                     epilog="Exit status: 0 done, 1 the run or the sampling failed, 2 usage error.")
    ap.add_argument("--shape", default="qwen3-30b-a3b", help="reference shape (default qwen3-30b-a3b)")
    ap.add_argument("--phase", default="prefill512", help="decode, prefill128 or prefill512 (default prefill512)")
    ap.add_argument("--dtype", default="bf16", choices=list(quant.DTYPES), help="weight dtype (default bf16)")
    ap.add_argument("--threads", type=_cli.positive_int, default=os.cpu_count() or 1,
                    help="OpenMP threads (default all CPUs)")
    ap.add_argument("--seconds", type=_cli.positive_float, default=3.0, help="sampled time (default 3)")
    ap.add_argument("--period-us", type=_cli.positive_int, default=500,
                    help="CPU microseconds between samples (default 500; at least the kernel's tick)")
    ap.add_argument("--lib", help="libcolibri.so (default: the one the binding loads)")
    ap.add_argument("--top", type=_cli.positive_int, default=12, help="rows of each table (default 12)")
    ap.add_argument("--out", help="JSON output (default reports/<host-id>/profile.json)")
    args = ap.parse_args(argv)
    from colibri._lib import default_library_path, ffi

    from colibri_bench.bench import Mapped, _inputs, time_colibri
    from tuner.host.bandwidth import _llc_total_here, copies_for
    from tuner.measure import problems, weights

    try:
        p = problems.problem(f"{args.shape}/{args.phase}/{args.dtype}")
    except ValueError as exc:
        ap.error(str(exc))
    lib_path = args.lib or str(default_library_path())
    if not Path(lib_path).is_file():
        ap.error(f"no library at {lib_path}")
    say = lambda m: print(m, file=sys.stderr, flush=True)  # noqa: E731
    wdir = build_dir_default() / "tuner" / "weights"
    weights.ensure_f32(wdir, problems.problem(f"{args.shape}/{args.phase}/f32"), 0, progress=say)
    copies = copies_for(p, _llc_total_here())
    path = weights.ensure_model(wdir, p, 0, copies, progress=say)
    layers = Mapped(path, lib_path)
    lib = layers.lib
    xs = _inputs(p, max(2, min(64, 2048 // p.T)), 1)
    time_colibri(layers, xs, args.threads, 0.2)  # warm: weights mapped, threads up
    cap = int(args.seconds * args.threads * 1e6 / args.period_us) + 4096
    if lib.colibri_sample_start(args.period_us, cap):
        print(f"colibri_bench profile: {ffi.string(lib.colibri_last_error()).decode()}", file=sys.stderr)
        return 1
    try:
        sec = time_colibri(layers, xs, args.threads, args.seconds)
    finally:
        buf, n, taken = ffi.new("uint64_t[]", cap), ffi.new("size_t *"), ffi.new("size_t *")
        st = lib.colibri_sample_stop(buf, cap, n, taken)
        maps = read_maps(Path("/proc/self/maps").read_text())
    if st:
        print(f"colibri_bench profile: {ffi.string(lib.colibri_last_error()).decode()}", file=sys.stderr)
        return 1
    res = attribute([buf[i] for i in range(n[0])], maps, lib_path, args.top)
    res.update({"case": p.name, "threads": args.threads, "ms_per_call": sec * 1e3, "lib": lib_path,
                "period_us": args.period_us, "samples_taken": taken[0]})
    print(f"{p.name}, {args.threads} threads: {sec * 1e3:.3f} ms per call, {res['samples']} samples")
    for title, key in (("object", "objects"), ("function", "functions")):
        print(f"\n{'share':>6}  {title}")
        for r in res[key][:args.top]:
            print(f"{100 * r['share']:5.1f}%  {r['name']}")
    if res["loops"]:
        print(f"\n{'share':>6}  loop in {Path(lib_path).name} (function, addresses, instructions)")
        for r in res["loops"]:
            mix = " ".join(f"{k}x{v}" for k, v in r["instructions"].items())
            print(f"{100 * r['share']:5.1f}%  {r['function']} {r['start']}-{r['end']}  {mix}")
    else:
        print("\n(no loop table: objdump is not on PATH)" if not res["objdump"] else "")
    if not res["nm"]:
        print("(functions are '?': nm is not on PATH)")
    out = Path(args.out) if args.out else reports_dir_default() / hostid.host_id() / "profile.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(res, indent=1))
    print(f"written: {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
