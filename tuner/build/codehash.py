"""Machine code of a rendered kernel object, function by function: two variants whose
functions are the same bytes cannot differ in speed, so the tuner does not time them.

    hashes = function_hashes("…/obj/parts/cbp_f32_<hash>.os")   # {symbol: sha256}
    differing(a, b)        # the symbols whose code differs ([] = identical code)

An ELF64 relocatable object (what SConstruct compiles a rendered template into, with
-ffunction-sections so that calls between functions are relocations, not offsets that
move with the size of every other function) is read directly: each function's bytes, its
relocations (offset, type, addend, target by name). A target in read-only data (where
the compiler puts vector constants) is the bytes there (the entry of a pool of fixed-size
constants, else 64 bytes), so one function's new constant, which moves the others, does
not make every other function differ; any other section target is its name and addend,
with one entry "<data>" for the bytes of those sections. Anything that is not such an
object gives None: the caller then has to time.
"""
from __future__ import annotations

import hashlib
import struct
from pathlib import Path

_SHT_PROGBITS, _SHT_SYMTAB, _SHT_RELA, _SHT_NOBITS = 1, 2, 4, 8
_SHF_WRITE, _SHF_ALLOC, _SHF_EXECINSTR, _SHF_MERGE = 0x1, 0x2, 0x4, 0x10
_STT_FUNC, _STT_SECTION = 2, 3
DATA = "<data>"


def function_hashes(path: str | Path) -> dict[str, str] | None:
    """{function symbol: sha256 of its bytes and relocations, DATA: the constant sections'}
    of an ELF64 little-endian relocatable object; None if the file is not one."""
    try:
        buf = Path(path).read_bytes()
    except OSError:
        return None
    if len(buf) < 64 or buf[:4] != b"\x7fELF" or buf[4] != 2 or buf[5] != 1:
        return None
    e_type, = struct.unpack_from("<H", buf, 16)
    if e_type != 1:  # ET_REL
        return None
    shoff, = struct.unpack_from("<Q", buf, 40)
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", buf, 58)
    try:
        secs = [struct.unpack_from("<IIQQQQIIQQ", buf, shoff + i * shentsize) for i in range(shnum)]
    except struct.error:
        return None

    def data(i: int) -> bytes:
        s = secs[i]
        return b"" if s[1] == _SHT_NOBITS else buf[s[4]:s[4] + s[5]]

    def cstr(table: bytes, off: int) -> str:
        end = table.find(b"\0", off)
        return table[off:end if end >= 0 else None].decode("utf-8", "replace")

    shstr = data(shstrndx)
    names = [cstr(shstr, s[0]) for s in secs]
    symtab = next((i for i, s in enumerate(secs) if s[1] == _SHT_SYMTAB), None)
    if symtab is None:
        return None
    strtab = data(secs[symtab][6])
    raw = data(symtab)
    syms = []
    for off in range(0, len(raw) - 23, 24):
        st_name, st_info, _, st_shndx, st_value, st_size = struct.unpack_from("<IBBHQQ", raw, off)
        syms.append((cstr(strtab, st_name), st_info & 0xF, st_shndx, st_value, st_size))

    def constants(shndx: int) -> bool:
        s = secs[shndx]
        return (s[1] == _SHT_PROGBITS and bool(s[2] & _SHF_ALLOC)
                and not s[2] & (_SHF_EXECINSTR | _SHF_WRITE) and names[shndx].startswith(".rodata"))

    relocs: dict[int, list] = {}
    for i, s in enumerate(secs):
        if s[1] != _SHT_RELA:
            continue
        rel = data(i)
        for off in range(0, len(rel) - 23, 24):
            r_offset, r_info, r_addend = struct.unpack_from("<QQq", rel, off)
            name, kind, shndx, value, _ = syms[r_info >> 32]
            if 0 < shndx < len(secs) and constants(shndx):
                # x86-64 RIP-relative operands point 4 bytes (plus any immediate) past the
                # addend; a pool's entry is the aligned one holding that address
                at = value + r_addend + 4
                size = secs[shndx][9] if secs[shndx][2] & _SHF_MERGE and secs[shndx][9] else 64
                if secs[shndx][2] & _SHF_MERGE and secs[shndx][9]:
                    at = at // size * size
                target, r_addend = f"const {data(shndx)[at:at + size].hex()}", 0
            elif kind == _STT_SECTION and shndx < len(names):
                target = f"section {names[shndx]}"
            else:
                target = name
            relocs.setdefault(s[7], []).append((r_offset, r_info & 0xFFFFFFFF, r_addend, target))

    out = {}
    for name, kind, shndx, value, size in syms:
        if kind != _STT_FUNC or not 0 < shndx < len(secs):
            continue
        h = hashlib.sha256(data(shndx)[value:value + size])
        for r_off, r_type, addend, target in sorted(relocs.get(shndx, ())):
            if value <= r_off < value + size:
                h.update(f"|{r_off - value}:{r_type}:{addend}:{target}".encode())
        out[name] = h.hexdigest()
    h = hashlib.sha256()
    for i, s in enumerate(secs):
        if (s[2] & _SHF_ALLOC and not s[2] & _SHF_EXECINSTR and s[1] == _SHT_PROGBITS
                and not constants(i) and names[i] != ".eh_frame"):  # unwind tables: not behaviour
            h.update(names[i].encode() + b"\0" + data(i))
    out[DATA] = h.hexdigest()
    return out


def differing(a: dict[str, str] | None, b: dict[str, str] | None) -> list[str] | None:
    """The symbols whose code differs between two function_hashes() results (those only
    one of them has included); None when either could not be read."""
    if a is None or b is None:
        return None
    return sorted(n for n in set(a) | set(b) if a.get(n) != b.get(n))
