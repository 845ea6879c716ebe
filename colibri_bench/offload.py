"""python -m colibri_bench offload: a model larger than the memory it may use, under a memory
cgroup, with a memory budget (Model.load(memory_budget=), the expert cache) against plain
mmap (the experts read in place from the file's mapping, the page cache deciding what stays).

    python -m colibri_bench offload [--shape qwen3-30b-a3b] [--dtype int4g32] [--layers 4]
                                    [--share 1 --share 0.5 --share 0.25] [--decode 32]
                                    [--prefill 128] [--rounds 2] [--threads 2]
                                    [--io-threads N] [--read-depth N] [--direct-io 1|-1]
                                    [--policy lru|lfu]
                                    [--model FILE] [--out FILE]

For each share s the cgroup's limit is s x the file's size (so at 0.25 the file is four times
the limit), and the budget is that limit less MARGIN, what the process holds besides its
weights. Each run is kernels/tools/infer_model.c (C: the limit is not spent on an
interpreter) with the file's pages dropped from the page cache first: `--decode` tokens one
call each, then, in a run of its own, one `--prefill`-token call. The ways, alternating
within a round:
  budget  the default library with the budget;
  mmap    a library built with the dtype's stored (rows) layout and no budget, whose kernels
          read the experts in place (none exists for int4, which every build packs: use
          int4g32, the 5-bit format read in place).
It prints tokens/s (the calls' wall time) and the load's seconds apart (plain mmap checks
every tensor's CRC at load, so it reads the whole file there, and at a limit the file fits
in, it starts warm), the cache's hit rate, its stall and disk wait, the peak resident set
and OOM kills; checks that the budgeted outputs are the same
bits as an unlimited run's; writes the JSON (default reports/<host-id>/offload.json) and,
with matplotlib, a plot of tokens/s against the budget beside it.
Needs a writable memory cgroup (root; v2 memory.max or v1 memory.limit_in_bytes).
Exit status: 0 done; 1 a run failed or gave other bits; 2 usage, or no cgroup here."""
from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path

import numpy as np

from colibri import _cli
from colibri.storage_settings import POLICIES
from tuner.measure import cgroup, infer_tool

MARGIN = 32 << 20  # default: the library, libgomp and its threads, activations, one call's scratch
# the knob that keeps each dtype that a build can read in place in its stored layout (the
# 4.5-bit int4 has none: every build packs it)
ROWS_KNOB = {"f32": "layout_f32", "bf16": "layout_bf16", "int8": "layout_int8", "int4g32": "layout_int4"}
def rows_library(dtype: str, work: Path, say) -> Path:
    """The host profile's library with `dtype` in its stored layout (read in place)."""
    from colibri._lib import build_profile
    from colibri_build import hostid, profiles, render

    name = hostid.host_profile_name()
    knobs = dict(profiles.get_profile(name).knobs, **{ROWS_KNOB[dtype]: "rows"})
    say(f"building the {name} library with {dtype} in its stored layout (the plain-mmap way)")
    cfg = render.write_config_h(work / "config-rows.h", knobs, signature="0", profile=name)
    return Path(build_profile(name, config=cfg, build_dir=work / "build-rows", quiet=True)).resolve()


def offload(model: Path, *, shares, decode: int, prefill: int, rounds: int, threads: int, reads: dict,
            work: Path, mmap: bool = True, margin: int = MARGIN, say=print) -> dict:
    """The runs and their summary; reads: the budget's read options (infer_tool.READ_OPTIONS)."""
    from colibri._lib import default_library_path
    from colibri.model import Model
    from colibri.modelfile import DTYPE_NAMES, expert_payload_bytes, read_header

    size = model.stat().st_size
    for share in shares:
        if share * size <= margin:
            raise ValueError(f"share {share}: a limit of {int(share * size)} bytes leaves nothing past the "
                             f"{margin}-byte margin")
    hdr = read_header(model)
    dtype, H = DTYPE_NAMES[hdr["weight_dtype"]], hdr["hidden"]
    work.mkdir(parents=True, exist_ok=True)
    exe = {"budget": infer_tool.compile_tool(default_library_path().resolve(), work / "infer_model")}
    if mmap and dtype in ROWS_KNOB:
        lib = rows_library(dtype, work, say)
        with Model.load(model, lib=str(lib), check_crc=False) as m:
            kinds = {m.layer_page_kind(i) for i in range(m.n_layers)}
        if kinds != {"file"}:
            raise RuntimeError(f"{lib} packs {dtype} ({sorted(kinds)} pages, not the file's): no in-place baseline")
        exe["mmap"] = infer_tool.compile_tool(lib, work / "infer_model-rows")
    elif mmap:
        say(f"no build reads {dtype} in place (every build packs it at load): budget runs only")
    experts = expert_payload_bytes(hdr)
    rng = np.random.default_rng(0)
    phases = {"decode": decode, "prefill": prefill}
    xs, want = {}, {}
    for ph, T in phases.items():
        if not T:
            continue
        xs[ph] = work / f"x-{ph}.bin"
        rng.standard_normal((T, H), dtype=np.float32).tofile(xs[ph])
        want[ph] = work / f"want-{ph}.bin"
        say(f"the unlimited run's {ph} outputs, for the bits")
        rc, _, err = infer_tool.run(exe["budget"], model, xs[ph], T, want[ph], budget=0,
                                    mode="all" if ph == "prefill" else "decode", threads=threads)
        if rc:
            raise RuntimeError(f"the unlimited run failed (exit {rc}): {err}")
    runs = []
    for share in shares:
        limit = int(share * size)
        budget = limit - margin
        for r in range(rounds):
            ways = list(exe) if r % 2 == 0 else list(exe)[::-1]
            for way in ways:
                for ph, T in phases.items():
                    if not T:
                        continue
                    out = work / f"y-{way}-{ph}.bin"
                    cgroup.drop_from_page_cache(model)
                    with cgroup.memory_cgroup(limit, tag="colibri-offload") as (version, cg):
                        rc, st, err = infer_tool.run(exe[way], model, xs[ph], T, out,
                                                     budget=budget if way == "budget" else 0,
                                                     mode="all" if ph == "prefill" else "decode", threads=threads,
                                                     reads=reads, cg=cg)
                        kills = cgroup.oom_kills(version, cg)
                    row = {"share": share, "limit": limit, "budget": budget if way == "budget" else 0, "way": way,
                           "phase": ph, "tokens": T, "round": r, "rc": rc, "oom_kills": kills, "stats": st,
                           "stderr": err if rc else ""}
                    if rc == 0:
                        row["tok_s"] = T / st["infer_seconds"]
                        if way == "budget":
                            row["same_bits"] = out.read_bytes() == want[ph].read_bytes()
                    runs.append(row)
                    say(_line(row))
    return {"model": str(model), "dtype": dtype, "file_bytes": size, "expert_bytes": experts, "margin": margin,
            "threads": threads, **reads, "decode": decode,
            "prefill": prefill, "runs": runs, "summary": summarize(runs, experts)}


def _line(row: dict) -> str:
    head = f"share {row['share']:.2f} {row['way']:6} {row['phase']:7}"
    if row["rc"]:
        return f"{head} exit {row['rc']} (OOM kills {row['oom_kills']}) {row['stderr'][-120:]}"
    st = row["stats"]
    hits = st.get("hits", 0) + st.get("misses", 0)
    cache = (f"  hit {st['hits'] / hits:.0%}  stall {st['stall_seconds']:.2f} s (disk {st['wait_seconds']:.2f})"
             if row["way"] == "budget" and hits else "")
    bits = "" if "same_bits" not in row else ("  same bits" if row["same_bits"] else "  OTHER BITS")
    return (f"{head} {row['tok_s']:8.2f} tok/s  load {st['load_seconds']:5.2f} s  "
            f"peak {st['peak_rss_bytes'] / 2**20:6.0f} MiB{cache}{bits}")


def summarize(runs: list[dict], experts: int) -> list[dict]:
    """Medians per share, way and phase, and the budget's ratio to mmap."""
    out = []
    for share in sorted({r["share"] for r in runs}, reverse=True):
        for ph in ("decode", "prefill"):
            cell = {"share": share, "phase": ph}
            for way in ("budget", "mmap"):
                rs = [r for r in runs if r["share"] == share and r["phase"] == ph and r["way"] == way]
                if not rs:
                    continue
                ok = [r["tok_s"] for r in rs if r["rc"] == 0]
                cell[way] = {"tok_s": statistics.median(ok) if ok else None, "runs": len(rs),
                             "failed": sum(r["rc"] != 0 for r in rs), "oom_kills": sum(r["oom_kills"] for r in rs),
                             "load_seconds": statistics.median(r["stats"]["load_seconds"] for r in rs if r["rc"] == 0)
                             if ok else None}
                if way == "budget" and ok:
                    st = [r["stats"] for r in rs if r["rc"] == 0]
                    cell["budget_share_of_experts"] = rs[0]["budget"] / experts
                    cell[way]["hit_rate"] = statistics.median(s["hits"] / max(1, s["hits"] + s["misses"]) for s in st)
                    cell[way]["stall_seconds"] = statistics.median(s["stall_seconds"] for s in st)
                    cell[way]["wait_seconds"] = statistics.median(s["wait_seconds"] for s in st)
                    cell[way]["same_bits"] = all(r.get("same_bits") for r in rs if r["rc"] == 0)
            if cell.get("budget", {}).get("tok_s") and cell.get("mmap", {}).get("tok_s"):
                cell["ratio"] = cell["budget"]["tok_s"] / cell["mmap"]["tok_s"]
            if len(cell) > 2:
                out.append(cell)
    return out


def table(rep: dict) -> str:
    lines = [f"{rep['dtype']} file {rep['file_bytes'] / 1e9:.2f} GB, experts {rep['expert_bytes'] / 1e9:.2f} GB, "
             f"{rep['threads']} threads; limit = share x file, budget = limit - {rep['margin'] >> 20} MiB; "
             "page cache dropped before each run",
             "| share | phase | budget (of experts) | budget tok/s | load s | hit | stall s | mmap tok/s | load s "
             "| budget / mmap |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]

    def tok(c):
        if not c:
            return "- | -"
        if not c["tok_s"]:
            return f"failed ({c['oom_kills']} OOM kills) | -"
        return f"{c['tok_s']:.2f} | {c['load_seconds']:.2f}"

    for c in rep["summary"]:
        b = c.get("budget") or {}
        ratio = f"{c['ratio']:.2f}x" if "ratio" in c else "-"
        lines.append(f"| {c['share']:.2f} | {c['phase']} | {c.get('budget_share_of_experts', 0):.0%} | {tok(b)} | "
                     f"{b.get('hit_rate', 0):.0%} | {b.get('stall_seconds', 0):.2f} | {tok(c.get('mmap'))} | {ratio} |")
    return "\n".join(lines)


def plot(rep: dict, path: Path) -> Path | None:
    """tokens/s against the budget's share of the experts, per way and phase (None without
    matplotlib)."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    fig, ax = plt.subplots(figsize=(6, 4))
    for way, style in (("budget", "-o"), ("mmap", "--s")):
        for ph in ("decode", "prefill"):
            pts = [(c["share"], c[way]["tok_s"]) for c in rep["summary"]
                   if c["phase"] == ph and c.get(way, {}).get("tok_s")]
            if pts:
                ax.plot(*zip(*sorted(pts)), style, label=f"{way}, {ph}")
    ax.set_xlabel("memory limit / file size (budget = limit - margin)")
    ax.set_ylabel("tokens/s")
    ax.set_yscale("log")
    ax.set_title(f"{rep['dtype']}, {rep['file_bytes'] / 1e9:.2f} GB file, cold page cache")
    ax.legend()
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def main(argv: list[str] | None = None) -> int:
    from tuner.measure import problems

    p = _cli.Parser(prog="python -m colibri_bench offload", description=__doc__.split("\n")[0],
                    epilog="Exit status: 0 done; 1 a run failed or gave other bits; 2 usage or no cgroup.")
    p.add_argument("--shape", default="qwen3-30b-a3b", choices=sorted(problems.SHAPES))
    p.add_argument("--dtype", default="int4g32", choices=["f32", "bf16", "int8", "int4", "int4g32"])
    p.add_argument("--layers", type=_cli.positive_int, default=4, help="layers of the generated model (default 4)")
    p.add_argument("--model", metavar="FILE", help="this model file instead of a generated one")
    p.add_argument("--share", type=_cli.fraction, action="append", metavar="S",
                   help="memory limit as a share of the file, repeatable (default 1, 0.5, 0.25)")
    p.add_argument("--decode", type=_cli.count, default=32, help="decode steps, one token a call (default 32)")
    p.add_argument("--prefill", type=_cli.count, default=128, help="tokens of the prefill call (default 128; 0: none)")
    p.add_argument("--rounds", type=_cli.positive_int, default=2)
    p.add_argument("--threads", type=_cli.positive_int, default=2)
    p.add_argument("--io-threads", type=int, default=0, help="colibri_load_options.io_threads (0: the default)")
    p.add_argument("--read-depth", type=_cli.count, default=0, help="colibri_load_options.read_depth (0: the default)")
    p.add_argument("--direct-io", type=int, choices=[-1, 0, 1], default=0,
                   help="colibri_load_options.direct_io (1: O_DIRECT, -1: through the page cache, 0: the default)")
    p.add_argument("--policy", choices=POLICIES, help="colibri_load_options.policy (default: the build's, lru)")
    p.add_argument("--no-mmap", action="store_true", help="budget runs only")
    p.add_argument("--margin-mib", type=_cli.positive_int, default=MARGIN >> 20,
                   help=f"the limit less the budget (default {MARGIN >> 20})")
    p.add_argument("--out", metavar="FILE", help="the JSON (default reports/<host-id>/offload.json)")
    try:
        args = p.parse_args(argv)
    except SystemExit as exc:
        return _cli.EXIT_USAGE if exc.code else 0
    def usage(msg: str) -> int:
        print(f"{p.prog}: error: {msg}", file=sys.stderr)
        return _cli.EXIT_USAGE

    if not args.decode and not args.prefill:
        return usage("--decode 0 and --prefill 0 leave nothing to run")
    from colibri_build import hostid
    from colibri_build.paths import build_dir_default, reports_dir_default

    try:
        cgroup.cgroup_root()
    except cgroup.NoCgroup as e:
        return usage(f"needs a memory cgroup: {e}")
    work = build_dir_default() / "offload"
    if args.model:
        model = Path(args.model)
        if not model.is_file():
            return usage(f"--model {model}: no such file")
    else:
        from tuner.measure import weights

        model = weights.ensure_model(build_dir_default() / "tuner" / "weights",
                                     problems.problem(f"{args.shape}/decode/{args.dtype}"), copies=args.layers,
                                     progress=print)
    out = Path(args.out) if args.out else reports_dir_default() / hostid.host_id() / "offload.json"
    try:
        rep = offload(model, shares=args.share or [1.0, 0.5, 0.25], decode=args.decode, prefill=args.prefill,
                      rounds=args.rounds, threads=args.threads,
                      reads={"io_threads": args.io_threads, "read_depth": args.read_depth,
                             "direct_io": args.direct_io,
                             "policy": POLICIES.index(args.policy) + 1 if args.policy else 0},
                      work=work, mmap=not args.no_mmap, margin=args.margin_mib << 20, say=print)
    except (ValueError, cgroup.NoCgroup) as e:
        return usage(str(e))
    print(table(rep))
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(rep, indent=1))
    png = plot(rep, out.with_suffix(".png"))
    print(f"wrote {out}" + (f" and {png}" if png else " (no matplotlib: no plot)"))
    bad = [r for r in rep["runs"] if r["way"] == "budget" and (r["rc"] or not r.get("same_bits"))]
    return 1 if bad else 0
