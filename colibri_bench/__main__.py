"""python -m colibri_bench: bench (the MoE layer beside its peers), ab (two builds of the
engine, interleaved), soak (memory over a long run), e2e (whole transformers models,
patched against unpatched), quant (the weight formats' error), profile (where the time
goes), overhead (the Python wrappers' cost per call), offload (a model larger than its
memory limit: the memory budget against plain mmap) and cachesim (the expert cache's
eviction policies and a next-layer predictor on a routing trace).
`python -m colibri_bench COMMAND --help` documents each; exit status as in
`python -m tuner` (0 ok, 1 failed, 2 usage)."""
from __future__ import annotations

import importlib
import sys

from colibri import _cli

COMMANDS = {"bench": "the MoE layer side by side with NumPy and PyTorch, tuned and default "
                     "library, with the read bandwidth",
            "ab": "two builds of the engine (libcolibri.so) side by side, interleaved: speed "
                  "ratio and its interval per case",
            "soak": "run a layer over N tokens, creating and freeing layers, and report "
                    "resident memory over time",
            "e2e": "whole transformers models with their MoE blocks on Colibri against unpatched: "
                   "prefill and decode tokens/s, time inside the MoE blocks",
            "quant": "each weight format's bits per weight and error (weights and a layer's "
                     "output), with ggml's q4_0/q4_1/q8_0 as references",
            "profile": "where one case's time goes, by object, function and loop, from samples "
                       "libcolibri takes itself (for hosts without perf)",
            "overhead": "what the Python wrappers (the hf module, MoELayer, Linear) cost per call "
                        "over the engine, on a tiny layer",
            "offload": "a model file larger than a memory cgroup's limit: decode and prefill tokens/s "
                       "with a memory budget against plain mmap, hit rate and stall",
            "cachesim": "the expert cache's eviction policies (LRU, LFU, Belady's bound) and a next-layer "
                        "predictor, simulated on a routing trace"}
MODULES = {"quant": "quanterr"}  # a command whose module has another name


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] and argv[0] in COMMANDS:  # each command is the module of its name
        return importlib.import_module(f"colibri_bench.{MODULES.get(argv[0], argv[0])}").main(argv[1:])
    # each command has its own parser; this one lists them and refuses anything else
    parser = _cli.Parser(prog="python -m colibri_bench", description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name, text in COMMANDS.items():
        sub.add_parser(name, help=text, add_help=False)
    parser.parse_args(argv)
    return _cli.EXIT_USAGE  # not reached: a known command returned above


if __name__ == "__main__":
    sys.exit(main())
