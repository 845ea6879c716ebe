"""Does a built library's kernel code use the vector registers its build promises?

    check_library(lib, *, isa=None, features=None, arch=None) -> IsaCheck

A profile or a winning `isa` knob that says AVX-512 but a library whose kernels
never touch a zmm register means the tuner measured (and shipped) something other
than what it reports: a template or flag mistake that no timing shows. The reverse,
a register class the profile's -march does not allow, means a library that dies with
SIGILL on the hosts the profile claims. So: disassemble the library
(`objdump -d --no-show-raw-insn`), keep the instructions of the kernel symbols (the
functions the kernel templates define, `cbk_*` included, and the compiler's clones of
them such as `.part.0`), count the instructions that name each vector register class,
and compare with the promise:

    isa knob  the ISA record's `registers` (templates/isas.yaml): avx512 -> zmm required,
              avx2 -> ymm, neon -> fmla on .4s; portable, scalar -> nothing beyond -march
    features  the record's `when_feature`: aarch64 levels show by mnemonic: asimddp -> sdot;
    and knobs i8mm with gemm_mmla_int8=1 -> smmla; bf16 with gemm_mmla_bf16=1 -> bfmmla,
              with gemm_mmla_bf16=0 and gemm_bf16_dot=1 -> bfdot
    macros    entries of `when_feature` that name compiler macros instead: x86 AMX, which no
    and knobs profile requires of its hosts (VMs hide it; the kernels ask at run time), shows
              in the build's predefined macros: __AMX_BF16__ with amx_bf16=1 -> tdpbf16ps,
              __AMX_INT8__ with amx_int8=1 -> tdpbssd (and with layout_int8=interleaved
              tdpbsud too), with amx_int4=1 -> tdpbusd; the
              emulated tile unit (CB_AMX_EMULATED) -> calls to its cb_emu_* stand-ins
    features  (the profile's required ISA features, from build_info.json)
              x86: no avx512f -> zmm forbidden; no avx -> ymm forbidden
              aarch64: no sve -> z (SVE) registers forbidden

The promise is read from build_info.json beside the library unless given. Reads
files and runs objdump; never loads the library.
"""
from __future__ import annotations

import ast
import json
import re
import shutil
import subprocess
from dataclasses import asdict, dataclass, field
from pathlib import Path

from colibri_build import isas, paths, render

# Register classes counted per architecture: name -> operand pattern.
REGISTER_CLASSES = {
    "x86_64": {"xmm": r"\bxmm\d+\b", "ymm": r"\bymm\d+\b", "zmm": r"\bzmm\d+\b"},
    # NEON vectors print as v0.4s (arrangement) or q0 (128-bit scalar view); SVE as z0.s
    "aarch64": {"v": r"\bv\d+\.\d*[bhsdq]\b", "q": r"\bq\d+\b", "z": r"\bz\d+\.[bhsdq]\b"},
}
# Instructions counted like the register classes: aarch64 kernels show their ISA level by
# mnemonic (every level uses the same v registers).
INSTRUCTION_CLASSES = {
    "aarch64": {"fmla.4s": r"^\s*fmla\s+v\d+\.4s\b", "sdot": r"^\s*sdot\s", "bfdot": r"^\s*bfdot\s",
                "bfmmla": r"^\s*bfmmla\s", "smmla": r"^\s*smmla\s"},
    # AMX tile products, and the emulated unit's stand-in for them (kernels/amx_emu.c)
    "x86_64": {"tdpbf16ps": r"^\s*tdpbf16ps\s", "tdpbssd": r"^\s*tdpbssd\s",
               "tdpbusd": r"^\s*tdpbusd\s", "tdpbsud": r"^\s*tdpbsud\s",
               "cb_emu_dpbf16ps": r"^\s*call\w*\s.*<cb_emu_dpbf16ps",
               "cb_emu_dpbssd": r"^\s*call\w*\s.*<cb_emu_dpbssd",
               "cb_emu_dpbusd": r"^\s*call\w*\s.*<cb_emu_dpbusd",
               "cb_emu_dpbsud": r"^\s*call\w*\s.*<cb_emu_dpbsud"},
}
# What the `isa` knob promises the kernels use (at least one instruction of each class),
# and what a profile's feature adds where the knobs select its path: the ISA records'
# `registers` and `when_feature` (templates/isas.yaml)
# A class the build may only contain if the profile requires this feature.
FORBIDDEN_WITHOUT = {
    "x86_64": {"zmm": "avx512f", "ymm": "avx"},
    "aarch64": {"z": "sve"},
}
# ELF e_machine -> architecture name as profiles spell it
ELF_MACHINES = {62: "x86_64", 183: "aarch64"}
OBJDUMPS = {"x86_64": ("objdump", "x86_64-linux-gnu-objdump"),
            "aarch64": ("aarch64-linux-gnu-objdump", "objdump")}
# Always kernel code, whatever the templates define
KERNEL_PREFIXES = ("cbk_",)

_FUNC_DEF = re.compile(
    r"^(?:static\s+)?(?:inline\s+)?(?:const\s+)?(?:void|float|int|double|vf)\s+\**"
    r"([A-Za-z_]\w*?)(?:\{\{|\()", re.M)
_SYMBOL = re.compile(r"^[0-9a-f]+ <([^>]+)>:\s*$")


class IsaCheckError(RuntimeError):
    """The library cannot be examined at all (missing, not ELF)."""


@dataclass
class IsaCheck:
    """ok: True (promise kept), False (broken), None (could not check: why in message)."""
    ok: bool | None
    library: str
    arch: str | None
    isa: str | None
    promised: dict = field(default_factory=dict)    # {"require": [...], "forbid": [...]}
    found: dict = field(default_factory=dict)       # class -> instructions naming it
    symbols: list = field(default_factory=list)     # kernel symbols examined
    message: str = ""

    def to_dict(self) -> dict:
        return asdict(self)


def kernel_prefixes(templates_dir: str | Path | None = None) -> tuple[str, ...]:
    """Names of the functions the kernel templates and their partials define, as symbol
    prefixes. A templated name such as `dot_{{ dt }}_...` contributes its literal head
    (`dot_`)."""
    tdir = Path(templates_dir or render.TEMPLATES_DIR)
    names = set(KERNEL_PREFIXES)
    for path in sorted(tdir.glob(f"*{render.TEMPLATE_SUFFIX}")) + paths.partials(tdir):
        names.update(m.group(1) for m in _FUNC_DEF.finditer(path.read_text()))
    return tuple(sorted(names))


def elf_arch(lib: str | Path) -> str:
    path = Path(lib)
    try:
        with open(path, "rb") as f:
            head = f.read(20)
    except OSError as exc:
        raise IsaCheckError(f"cannot read {path}: {exc.strerror}") from None
    if len(head) < 20 or head[:4] != b"\x7fELF":
        raise IsaCheckError(f"{path} is not an ELF file")
    order = "little" if head[5] == 1 else "big"
    machine = int.from_bytes(head[18:20], order)
    return ELF_MACHINES.get(machine, f"elf-machine-{machine}")


def disassemble(lib: str | Path, arch: str) -> str:
    """objdump's disassembly; IsaCheckError naming what is missing if none works."""
    tried = []
    for tool in OBJDUMPS.get(arch, ("objdump",)):
        exe = shutil.which(tool)
        if not exe:
            tried.append(f"{tool}: not installed")
            continue
        res = subprocess.run([exe, "-d", "--no-show-raw-insn", str(lib)], capture_output=True,
                             text=True)
        if res.returncode == 0:
            return res.stdout
        tried.append(f"{tool}: {res.stderr.strip().splitlines()[-1] if res.stderr.strip() else res.returncode}")
    raise IsaCheckError(f"cannot disassemble {lib} ({arch}): " + "; ".join(tried)
                        + " (install binutils, or binutils-multiarch for other architectures)")


def count_registers(disasm: str, arch: str, prefixes: tuple[str, ...]) -> tuple[dict, list]:
    """Instructions naming each register class inside symbols starting with a prefix."""
    patterns = {k: re.compile(v) for k, v in {**REGISTER_CLASSES.get(arch, {}),
                                              **INSTRUCTION_CLASSES.get(arch, {})}.items()}
    counts = {k: 0 for k in patterns}
    symbols, inside = [], False
    for line in disasm.splitlines():
        m = _SYMBOL.match(line)
        if m:
            name = m.group(1)
            inside = "@" not in name and name.startswith(prefixes)
            if inside:
                symbols.append(name)
            continue
        if inside and ":" in line:
            insn = line.split(":", 1)[1]
            for cls, pat in patterns.items():
                if pat.search(insn):
                    counts[cls] += 1
    return counts, symbols


def _build_info(lib: Path) -> dict:
    path = lib.with_name("build_info.json")
    if not path.exists():
        return {}
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return {}


def _build_macros(info: dict) -> frozenset[str] | None:
    """The macros the library's compiler predefines under its flags (build_info.json);
    None where that cannot be said (no record, or the compiler is gone)."""
    from tuner.context import predefined_macros

    path = (info.get("compiler") or {}).get("path")
    return predefined_macros(path, info.get("cflags") or []) if path else None


def _knobs(info: dict) -> dict | None:
    """The kernel knobs build_info.json records (a dict, or its repr), None if absent."""
    knobs = info.get("knobs")
    if isinstance(knobs, str):
        try:
            knobs = ast.literal_eval(knobs)
        except (ValueError, SyntaxError):
            return None
    return knobs if isinstance(knobs, dict) else None


def check_library(lib: str | Path, *, isa: str | None = None, features=None,
                  arch: str | None = None, templates_dir: str | Path | None = None) -> IsaCheck:
    """Compare the kernel symbols' vector registers with the promise (module docstring).

    isa / features default to build_info.json beside the library (kernel_isa, features).
    A missing or non-ELF library, or no objdump, gives ok=None with the reason."""
    lib = Path(lib)
    info = _build_info(lib)
    isa = isa if isa is not None else info.get("kernel_isa")
    if features is None:
        features = info.get("features")
    result = IsaCheck(ok=None, library=str(lib), arch=arch, isa=isa)
    try:
        result.arch = arch = arch or elf_arch(lib)
        disasm = disassemble(lib, arch)
    except IsaCheckError as exc:
        result.message = f"not checked: {exc}"
        return result
    if arch not in REGISTER_CLASSES:
        result.message = f"not checked: no register table for architecture {arch}"
        return result
    counts, symbols = count_registers(disasm, arch, kernel_prefixes(templates_dir))
    # class -> who promises it
    rec = isas.records(templates_dir).get(isa or "")
    why = {cls: f"isa={isa}" for cls in (rec.registers if rec else ()) if cls in counts}
    knobs = _knobs(info)
    if rec and features is not None and knobs is not None:
        macros = _build_macros(info) if any(fp.macros for fp in rec.when_feature) else None
        for fp in rec.when_feature:
            if fp.feature and fp.feature not in set(features):
                continue
            if fp.macros and (macros is None or not set(fp.macros) <= macros):
                continue
            if all(knobs.get(k) == v for k, v in fp.knobs):
                basis = (f"the profile's feature {fp.feature}" if fp.feature
                         else f"flags predefining {', '.join(fp.macros)}")
                for cls in fp.registers:
                    why.setdefault(cls, f"isa={isa} with {basis}"
                                   + "".join(f", {k}={v}" for k, v in fp.knobs))
    require = list(why)
    forbid = ([cls for cls, feat in FORBIDDEN_WITHOUT.get(arch, {}).items()
               if feat not in set(features)] if features is not None else [])
    result.found, result.symbols = counts, symbols
    result.promised = {"require": require, "forbid": forbid,
                       "basis": f"isa={isa or '?'}; " + (
                           f"{len(features)} required features" if features is not None
                           else "profile features unknown (no build_info.json)")}
    problems = []
    if not symbols:
        problems.append("no kernel symbols found in the library (stripped, or not a Colibri library)")
    for cls in require:
        if counts.get(cls, 0) == 0:
            what = f"{cls} instructions" if cls in INSTRUCTION_CLASSES.get(arch, {}) else f"{cls} registers"
            problems.append(f"{why[cls]} promises {what}, but the kernel symbols use none")
    for cls in forbid:
        if counts.get(cls, 0) > 0:
            problems.append(f"{counts[cls]} instructions use {cls} registers, which the profile "
                            f"does not allow (it does not require {FORBIDDEN_WITHOUT[arch][cls]})")
    # register classes always; an instruction class (AMX, Arm levels) where found or required
    used = ", ".join(f"{k} {v}" for k, v in counts.items()
                     if v or k in require or k in REGISTER_CLASSES.get(arch, {}))
    if problems:
        result.ok = False
        result.message = "; ".join(problems) + f" (found: {used})"
    else:
        result.ok = True
        result.message = (f"{len(symbols)} kernel symbols: {used}"
                          + (f"; requires {', '.join(require)}" if require else "")
                          + (f"; forbids {', '.join(forbid)}" if forbid else ""))
    return result
