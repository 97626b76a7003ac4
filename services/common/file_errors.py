"""How a command line names a file it cannot read: by its whole path (a relative name given in another directory,
or a base name, leaves the user guessing which file was meant), then the system's reason."""

from __future__ import annotations

import os
from pathlib import Path


def cannot_read(exc: OSError, path: str | os.PathLike[str] | None = None) -> str:
    """'/abs/dir/file.csv: cannot read: No such file or directory' for an OSError raised on ``path`` (default: the
    file the error names); the error's own text when it names no file."""
    name = path if path is not None else exc.filename
    if name is None or isinstance(name, int):
        return str(exc)
    return f"{Path(os.fsdecode(name)).absolute()}: cannot read: {exc.strerror or exc}"
