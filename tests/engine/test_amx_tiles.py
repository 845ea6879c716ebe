"""kernels/amx_tiles.h on a real tile unit's compiler flags: the tile operations that touch
memory must say so to the compiler. gcc 12's <immintrin.h> forms say that ldtilecfg reads 8
bytes and that tileloadd/tilestored touch no memory, so stores they depend on could be dropped
or moved; one build dropped the configuration's row stores and faulted at ldtilecfg. These
checks read the compiler's output, so they hold on any x86 host with a compiler that knows
AMX (no tile unit needed)."""
import re
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

SRC = r"""
#include <stdint.h>
#include "amx_tiles.h"
/* each store before the operation is live only if the operation reads it */
void cfg_store(cb_tilecfg *c) { c->rows[7] = 13; CB_TILE_LOADCONFIG(c); c->rows[7] = 0; }
void load_store(uint16_t *b) { b[100] = 0x1234; CB_TILE_LOADD(4, b, 64); b[100] = 0; }
/* the read after the tile store must come from memory, not from the earlier store */
float stored_read(float *c) { c[5] = 1.0f; CB_TILE_STORED(0, c, 64); return c[5]; }
"""


def _functions(asm: str) -> dict:
    out, name = {}, None
    for line in asm.splitlines():
        m = re.match(r"^([A-Za-z_]\w*):", line)
        if m:
            name = m.group(1)
            out[name] = []
        elif name and line.startswith("\t") and not line.startswith("\t."):
            out[name].append(line.strip())
    return out


def test_tile_operations_carry_their_memory_operands(tmp_path):
    cc = shutil.which("gcc") or shutil.which("cc")
    if cc is None:
        pytest.skip("no C compiler")
    src = tmp_path / "t.c"
    src.write_text(SRC)
    asm = tmp_path / "t.s"
    res = subprocess.run([cc, "-std=c11", "-O2", "-mamx-tile", "-mamx-bf16", "-mamx-int8", "-S",
                          f"-I{ROOT / 'kernels'}", str(src), "-o", str(asm)], capture_output=True, text=True)
    if res.returncode != 0 and "amx" in res.stderr:
        pytest.skip(f"the compiler does not know AMX: {res.stderr.strip()[:200]}")
    assert res.returncode == 0, res.stderr
    fns = _functions(asm.read_text())
    cfg, load, stored = fns["cfg_store"], fns["load_store"], fns["stored_read"]
    at = next(i for i, l in enumerate(cfg) if l.startswith("ldtilecfg"))
    assert any(re.match(r"movb\s+\S+,\s*55\(%rdi\)", l) for l in cfg[:at]), "\n".join(cfg)
    at = next(i for i, l in enumerate(load) if l.startswith("tileloadd"))
    assert any(re.match(r"movw\s+\S+,\s*200\(%rdi\)", l) for l in load[:at]), "\n".join(load)
    at = next(i for i, l in enumerate(stored) if l.startswith("tilestored"))
    assert any(re.match(r"vmovss\s+20\(%rdi\)|movss\s+20\(%rdi\)", l) for l in stored[at:]), "\n".join(stored)
