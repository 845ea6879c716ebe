"""pack(): a CI artifact's tarball, written atomically (tuner ci and tuner ci --emulated)."""
from __future__ import annotations

import os
import tarfile
import tempfile
from pathlib import Path


def pack(out_dir: Path, name: str, files: dict[str, Path]) -> Path:
    """Write out_dir/<name>.tar.gz holding files (member name -> path) under <name>/,
    atomically: a temporary file in out_dir, renamed when complete."""
    out_dir.mkdir(parents=True, exist_ok=True)
    final = out_dir / f"{name}.tar.gz"
    fd, tmp = tempfile.mkstemp(prefix=f".{name}.", suffix=".tmp", dir=out_dir)
    try:
        with os.fdopen(fd, "wb") as raw, tarfile.open(fileobj=raw, mode="w:gz") as tar:
            for member, path in files.items():
                tar.add(str(path), arcname=f"{name}/{member}", recursive=False)
        os.chmod(tmp, 0o644)
        os.replace(tmp, final)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return final
