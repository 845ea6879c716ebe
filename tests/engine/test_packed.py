"""Packed int8, int4g32, f32 and bf16 weights (layout_<dtype>=interleaved,
templates/expert_ffn/packed.j2 and packed_float.j2): a library built with the layouts packs
a layer's experts at create and a model file's at load, and computes what the
stored-layout library computes, within the dtype's tolerance, at every token count
(decode, prefill, many tokens per expert)."""
import json
import shlex
import subprocess
from pathlib import Path

import numpy as np
import pytest
from moe_data import assert_engine, make_case

import colibri
from colibri import quant
from colibri._lib import build_profile
from colibri.model import Model
from colibri.modelfile import save_model
from colibri_build import cpuinfo, hostid, profiles, render
from tuner.context import predefined_macros


def _packs_here(profile, dtype, lib=None) -> bool:
    """The int layouts apply where the profile's kernel ISA has an int dot product: AVX-512's
    with VNNI, AVX2's always (AVX-VNNI, or vpmaddubsw + vpmaddwd without it); f32's and
    bf16's on AVX-512 and AVX2, f32's only where the build's flags give no AMX tiles (which
    take f32 experts in the row layout; bf16's read the packed blocks): read from the built
    library's compiler and flags."""
    isa = profile.knobs.get("isa")
    if dtype in ("f32", "bf16"):
        if isa not in ("avx2", "avx512"):
            return False
        if lib is None or dtype == "bf16":
            return True
        bi = json.loads((Path(lib).parent / "build_info.json").read_text())
        macros = predefined_macros(bi["compiler"]["path"], bi["cflags"])
        assert macros is not None, "the compiler of the build cannot list its macros"
        return not ({"__AMX_BF16__", "CB_AMX_EMULATED"} & macros)
    return isa == "avx2" or (isa == "avx512" and "avx512_vnni" in cpuinfo.host_cpu().flags)


PF = 4096  # the decode kernels' software prefetch distance in the fixture's library


@pytest.fixture(scope="module")
def packed_lib(tmp_path_factory):
    name = hostid.host_profile_name()
    prof = profiles.get_profile(name)
    if not any(_packs_here(prof, dt) for dt in ("int8", "bf16")):
        pytest.skip(f"profile {name} packs no weights here: they stay in their stored layout")
    d = tmp_path_factory.mktemp("packed")
    cfg = render.write_config_h(d / "config.h", {"layout_int8": "interleaved", "layout_int4": "interleaved",
                                                   "layout_bf16": "interleaved", "layout_f32": "interleaved",
                                                   "vec_rows": 2, "vec_rows_float": 2,
                                                   "vec_prefetch_int8": PF, "vec_prefetch_int4": PF,
                                                   "vec_prefetch_f32": PF, "vec_prefetch_bf16": PF},
                                signature="0", profile=name)
    return build_profile(name, config=cfg, build_dir=d / "build", quiet=True), prof


DTYPES = pytest.mark.parametrize("dtype", ["int8", "int4g32", "f32", "bf16"])


def _lib(packed_lib, dtype):
    lib, prof = packed_lib
    if not _packs_here(prof, dtype, lib):
        pytest.skip(f"profile {prof.name} keeps {dtype} weights in their stored layout")
    return lib


@DTYPES
def test_a_layer_packs_at_create_and_computes_right(packed_lib, dtype):
    packed_lib = _lib(packed_lib, dtype)
    # rows and columns off every block and group size, a shared expert, odd token counts
    case = make_case(H=67, I=45, E=8, k=3, S=21, gated=True, seed=11)
    L = colibri.MoELayer(case.router, case.gate, case.up, case.down, weight_dtype=dtype,
                         lib=packed_lib, **case.layer_kwargs())
    # ... up to experts past pk_gemm_min_tokens (128 by default): the int gemm on tiles
    # copied out of the packed blocks
    for T in (1, 2, 3, 7, 40, 130, 420):
        x = case.inputs(T, seed=T)
        assert_engine(L(x), case.reference(x, dtype), dtype)
        if dtype == "bf16":  # activations exact in bf16 (a bf16 model's): the pair dot's hi-only kernels
            xb = quant.roundtrip(x, "bf16").astype(np.float32)
            assert_engine(L(xb), case.reference(xb, dtype), dtype)


def test_a_loaded_models_packed_weights_ask_for_huge_pages(packed_lib, tmp_path, thp_offered):
    packed_lib = _lib(packed_lib, "int8")
    case = make_case(H=256, I=256, E=12, k=2, seed=13)  # 2.25 MiB of int8 experts: over one huge page
    p = tmp_path / "m.colibri"
    save_model(p, [dict(router=case.router, gate=case.gate, up=case.up, down=case.down, top_k=2)],
               weight_dtype="int8")
    with Model.load(p, lib=packed_lib) as m:
        # the build's default (scons hugepages=auto): decode streams these pages
        assert m.layer_page_kind(0) in (("hugetlb", "thp") if thp_offered else ("normal", "hugetlb", "thp"))
        x = case.inputs(3)
        assert_engine(m(x) - x, case.reference(x, "int8"), "int8")


@DTYPES
def test_a_model_file_packs_at_load_and_matches_the_layer(packed_lib, tmp_path, dtype):
    packed_lib = _lib(packed_lib, dtype)
    case = make_case(H=96, I=80, E=4, k=2, seed=12)
    d = dict(router=case.router, gate=case.gate, up=case.up, down=case.down, top_k=2)
    p = tmp_path / "m.colibri"
    save_model(p, [d], weight_dtype=dtype)
    L = colibri.MoELayer(case.router, case.gate, case.up, case.down, weight_dtype=dtype,
                         top_k=2, lib=packed_lib)
    with Model.load(p, lib=packed_lib) as m:
        # packed into a pool at load: no longer read from the file's pages
        assert m.layer_page_kind(0) != "file"
        for T in (1, 5, 64):
            x = case.inputs(T, seed=T)
            want = x + L(x)  # the model adds the layer's output to its input
            np.testing.assert_array_equal(m(x), want)
    with Model.load(p) as m:  # the stored-layout library reads the same file in place
        x = case.inputs(5, seed=5)
        assert_engine(m(x) - x, case.reference(x, dtype), dtype)


@DTYPES
def test_a_dense_matrix_packs_and_computes_right(packed_lib, dtype):
    packed_lib = _lib(packed_lib, dtype)
    # colibri.Linear packs in the default table's layout too: rows off the 16-row blocks,
    # thread splits inside a block, every token path, against NumPy on the weights as held
    # (tolerances: tests/engine/test_linear.py's, the activations are quantized too)
    rtol = {"int8": 2e-2, "int4g32": 3e-2, "f32": 1e-5, "bf16": 1e-4}[dtype]
    rng = np.random.default_rng(5)
    # (256 columns: whole 32-k tiles, which packed bf16 on AMX tiles needs)
    for rows, cols in ((37, 67), (300, 130), (200, 256)):
        W = rng.standard_normal((rows, cols), dtype=np.float32)
        ref_w = quant.roundtrip(W, dtype).astype(np.float64)
        with colibri.Linear(W, weight_dtype=dtype, lib=packed_lib, threads=3) as lin:
            for T in (1, 2, 7, 40, 300):
                x = rng.standard_normal((T, cols), dtype=np.float32)
                ref = x.astype(np.float64) @ ref_w.T
                assert np.linalg.norm(lin(x) - ref) / np.linalg.norm(ref) <= rtol, (rows, T)


@pytest.mark.parametrize("dtype", ["f32", "bf16"])
def test_packed_float_results_do_not_depend_on_the_thread_count(packed_lib, dtype):
    # a thread's rows end inside a block or not, so a kernel call takes one block or two:
    # the sums' order must not follow (bitwise equal at every thread count)
    packed_lib = _lib(packed_lib, dtype)
    # the second: every matrix in whole 32-k tiles (bf16 on AMX tiles, where the host has them)
    for case in (make_case(H=300, I=130, E=4, k=2, S=40, gated=True),
                 make_case(H=320, I=96, E=4, k=2, S=64, gated=True)):
        for T in (1, 2, 70):
            x = case.inputs(T, seed=T)
            outs = [colibri.MoELayer(case.router, case.gate, case.up, case.down, weight_dtype=dtype,
                                     lib=packed_lib, threads=n, **case.layer_kwargs())(x) for n in (1, 2, 3, 7)]
            for o in outs[1:]:
                np.testing.assert_array_equal(o, outs[0])
            assert_engine(outs[0], case.reference(x, dtype), dtype)


# A harness around one part's source: __builtin_prefetch records its addresses, and the decode
# kernel of two blocks a call runs once on blocks 0 and 1 of four laid side by side, as the
# driver lays a call's blocks.
PREFETCH_HARNESS = r"""
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#if defined(__x86_64__)
#include <immintrin.h> /* its own prefetch forms stay as they are */
#endif
static const void *pf_seen[1 << 16];
static size_t pf_n;
static void pf_rec(const void *a) { if (pf_n < (1u << 16)) pf_seen[pf_n++] = a; }
#define __builtin_prefetch(a, ...) pf_rec((const void *)(a))
#include PART
int main(void) {
    enum { COLS = 1024 };
    const int ng = q_groups(COLS);
    const size_t bb = BLOCK_BYTES;
    uint8_t *w = calloc(4, bb);
    float *x = calloc(COLS, sizeof(float)), acc[2 * VL];
    char *wsp = aligned_alloc(64, 1 << 20);
    for (int i = 0; i < COLS; ++i) x[i] = (float)(i % 7) - 3.0f;
    const uint8_t *p[2] = {w, w + bb};
    KERNEL(p, PREP(x, COLS, NULL, 1, COLS, wsp), 0, ng, acc, 1, bb, bb);
    /* the next call's blocks, 2 and 3: each line of their first PF bytes */
    int missing = 0;
    for (int b = 2; b < 4; ++b)
        for (size_t off = 0; off < PF; off += 64) {
            const uint8_t *line = w + b * bb + off;
            int seen = 0;
            for (size_t i = 0; i < pf_n && !seen; ++i)
                seen = (const uint8_t *)pf_seen[i] >= line && (const uint8_t *)pf_seen[i] < line + 64;
            missing += !seen;
        }
    printf("block bytes %zu, prefetches %zu, lines missing %d\n", bb, pf_n, missing);
    return missing != 0;
}
"""


@pytest.mark.parametrize("dtype", ["int8", "int4g32", "int4"])
def test_decode_prefetch_reaches_the_next_calls_blocks(packed_lib, tmp_path, dtype):
    # A decode call reads two blocks side by side; each block's prefetch runs PF bytes ahead.
    # Past its block's end it must go on into the block the next call reads in the same
    # place, not into the call's other block: without that, the next call's second block
    # started cold (measured: int4 Qwen3 decode 1.13x faster with it, on a Sapphire
    # Rapids-class guest).
    lib, prof = packed_lib
    _lib(packed_lib, "int8" if dtype == "int8" else "int4")
    part = "int8" if dtype == "int8" else "int4"
    build = Path(lib).parent
    cmds = json.loads((build / "compile_commands.json").read_text())
    entry = next(c for c in cmds if f"/cbp_{part}_" in c["file"])
    args = shlex.split(entry["command"])
    flags = [a for a in args[1:] if a.startswith(("-O", "-std", "-m", "-D", "-f"))]
    incs = [a if not a.startswith("-I") or Path(a[2:]).is_absolute() else f"-I{Path(entry['directory']) / a[2:]}"
            for a in args if a.startswith("-I")]
    others = [str(Path(entry["directory"]) / c["output"]) for c in cmds
              if c is not entry and c["output"].endswith(".os")]
    mode = {"int8": ("pk8_dec_v2_t1", "pk_prep_rows", "(size_t)ng * PK_GS"),
            "int4g32": ("pk4_dec_v2_t1", "pk_prep_rows", "(size_t)ng * PK_GS"),
            "int4": ("k4pk_dec_v2_t1", "k4_prep_rows", "k4pk_block_bytes(COLS)")}[dtype]
    src = tmp_path / "h.c"
    src.write_text(PREFETCH_HARNESS)
    exe = tmp_path / "h"
    res = subprocess.run([args[0], *flags, *incs, f'-DPART="{entry["file"]}"', f"-DPF={PF}",
                          f"-DKERNEL={mode[0]}", f"-DPREP={mode[1]}", f"-DBLOCK_BYTES={mode[2]}",
                          # the library's other objects: the part calls into them
                          str(src), *others, "-o", str(exe), "-lm"], capture_output=True, text=True)
    assert res.returncode == 0, res.stderr[-3000:]
    run = subprocess.run([str(exe)], capture_output=True, text=True)
    assert run.returncode == 0, run.stdout + run.stderr
