"""python -m colibri generate: a local transformers checkpoint, patched, streaming its text.

    python -m colibri generate --model DIR --prompt TEXT [--weight-dtype int4]
                               [--max-new-tokens N] [--threads T] [--no-patch]
                               [--handoff auto|off|N] [--json]

Loads the checkpoint folder DIR (config.json, its weights and its tokenizer) with
transformers, never fetching anything from a hub; replaces its sparse-MoE blocks by
Colibri's (colibri.hf.patch); generates greedily, printing the text as it comes; then
prints the prefill and decode speeds and the peak memory (RSS) to stderr. --json prints
one JSON object with the text and the same figures instead of streaming.
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import sys
import time
from pathlib import Path

from . import quant

DESCRIPTION = ("Load a local transformers checkpoint folder and its tokenizer (nothing is "
               "fetched from a hub), run its sparse-MoE blocks on Colibri's layers and "
               "generate greedily, streaming the text; then print prefill and decode tokens/s "
               "and peak memory.")
EPILOG = "Exit status: 0 generated; 1 failure (message on stderr); 2 usage error."


def add_arguments(p: argparse.ArgumentParser) -> None:
    from . import _cli
    from ._cli import positive_int

    p.add_argument("--model", required=True, metavar="DIR", help="a checkpoint folder saved by save_pretrained")
    p.add_argument("--prompt", required=True, help="the prompt text")
    p.add_argument("--weight-dtype", choices=list(quant.DTYPES), default=None,
                   help="the MoE experts' weight dtype (default: bf16 for a bf16 checkpoint, else f32)")
    p.add_argument("--max-new-tokens", type=positive_int, default=32, help="tokens to generate (default 32)")
    p.add_argument("--threads", type=positive_int, default=None,
                   help="threads of Colibri's layers and of torch (default: one per CPU)")
    p.add_argument("--no-patch", action="store_true", help="run the model as transformers has it (a baseline)")
    p.add_argument("--handoff", type=_cli.handoff, default="auto",
                   help="colibri.hf.patch's hand-off of calls to the original modules: auto (timed at "
                   "patch time for f32/bf16 weights, the default), off, or a token count")
    p.add_argument("--json", action="store_true", help="print one JSON object (text and figures)")


class _Timer:
    """A transformers streamer that notes when each step's tokens arrive (the first put()
    is the prompt, the second the first new token: prefill ends there)."""

    def __init__(self, tokenizer, echo):
        self.tokenizer, self.echo = tokenizer, echo
        self.times, self.tokens, self.printed = [], [], ""

    def put(self, value):
        self.times.append(time.perf_counter())
        if len(self.times) == 1:
            return  # the prompt
        self.tokens.extend(int(t) for t in value.reshape(-1).tolist())
        if self.echo:
            text = self.tokenizer.decode(self.tokens, skip_special_tokens=True)
            sys.stdout.write(text[len(self.printed):])
            sys.stdout.flush()
            self.printed = text

    def end(self):
        if self.echo:
            sys.stdout.write("\n")
            sys.stdout.flush()


def _peak_rss_bytes() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux: KiB


def load(model_dir: Path):
    """(model, tokenizer) from a local folder; ValueError with the reason if it cannot."""
    try:
        import torch  # noqa: F401
        import transformers
    except ImportError as exc:
        raise ValueError(f"generate needs torch and transformers ({exc}): pip install torch transformers") from None
    if not model_dir.is_dir():
        raise ValueError(f"--model {model_dir}: not a folder")
    if not (model_dir / "config.json").is_file():
        raise ValueError(f"--model {model_dir}: no config.json (a folder written by save_pretrained)")
    try:
        config = transformers.AutoConfig.from_pretrained(model_dir, local_files_only=True)
    except (ValueError, KeyError, OSError) as exc:
        raise ValueError(f"--model {model_dir}: unknown or unreadable architecture: {exc}") from None
    try:
        tok = transformers.AutoTokenizer.from_pretrained(model_dir, local_files_only=True)
    except (ValueError, KeyError, OSError) as exc:
        raise ValueError(f"--model {model_dir}: no usable tokenizer: {exc}") from None
    try:
        model = transformers.AutoModelForCausalLM.from_pretrained(model_dir, local_files_only=True,
                                                                  dtype="auto")
    except (ValueError, KeyError, OSError) as exc:
        raise ValueError(f"--model {model_dir}: cannot load {type(config).__name__}: {exc}") from None
    return model.eval(), tok


def run(args) -> dict:
    import torch

    from . import hf

    if args.threads:
        torch.set_num_threads(args.threads)
    model, tok = load(Path(args.model))
    dtype = next(model.parameters()).dtype
    wdt = args.weight_dtype or ("bf16" if dtype == torch.bfloat16 else "f32")
    replaced = 0
    t0 = time.perf_counter()
    if not args.no_patch:
        replaced = hf.patch(model, weight_dtype=wdt, threads=args.threads, handoff=args.handoff)
        if replaced == 0:
            raise ValueError(f"--model {args.model}: {type(model).__name__} has no sparse-MoE block "
                             "Colibri can replace (use --no-patch to run it as it is)")
    patch_s = time.perf_counter() - t0
    ids = tok(args.prompt, return_tensors="pt")
    timer = _Timer(tok, echo=not args.json)
    start = time.perf_counter()
    with torch.no_grad():
        out = model.generate(**ids, max_new_tokens=args.max_new_tokens, do_sample=False, streamer=timer,
                             pad_token_id=tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id)
    times = timer.times
    prompt_tokens, new = int(ids["input_ids"].shape[1]), int(out.shape[1] - ids["input_ids"].shape[1])
    prefill_s = (times[1] - start) if len(times) > 1 else float("nan")
    decode_s = (times[-1] - times[1]) if len(times) > 2 else float("nan")
    return {"model": str(args.model), "architecture": type(model).__name__, "patched_blocks": replaced,
            "weight_dtype": None if args.no_patch else wdt, "model_dtype": str(dtype).replace("torch.", ""),
            "threads": args.threads or os.cpu_count(), "prompt_tokens": prompt_tokens, "new_tokens": new,
            "text": tok.decode(out[0, prompt_tokens:], skip_special_tokens=True),
            "patch_s": round(patch_s, 3), "handoffs": {} if args.no_patch else hf.handoffs(model),
            "prefill_s": prefill_s,
            "prefill_tokens_per_s": prompt_tokens / prefill_s if prefill_s > 0 else None,
            "decode_tokens_per_s": (new - 1) / decode_s if new > 1 and decode_s > 0 else None,
            "peak_rss_bytes": _peak_rss_bytes()}


def main(args) -> int:
    try:
        res = run(args)
    except (ValueError, NotImplementedError) as exc:
        print(f"colibri generate: {exc}", file=sys.stderr)
        return 1
    if args.json:
        json.dump(res, sys.stdout, indent=1)
        print()
        return 0
    from . import hf

    fmt = lambda v: "n/a" if v is None else f"{v:.2f}"
    how = f"{res['weight_dtype']}; {hf.handoff_summary(res['handoffs'])}" if res["weight_dtype"] else "not patched"
    print(f"colibri generate: {res['architecture']}, {res['patched_blocks']} MoE blocks on Colibri "
          f"({how}); prefill {res['prompt_tokens']} tokens at "
          f"{fmt(res['prefill_tokens_per_s'])} tok/s, decode {res['new_tokens']} tokens at "
          f"{fmt(res['decode_tokens_per_s'])} tok/s; peak RSS {res['peak_rss_bytes'] / 2**20:.0f} MiB",
          file=sys.stderr)
    return 0
