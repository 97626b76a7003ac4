"""How a command line names a file it cannot read: by its whole path (a relative name given in another directory,
or a base name, leaves the user guessing which file was meant), then the system's reason."""

from __future__ import annotations

import os
from pathlib import Path


def os_error_text(exc: OSError, path: str | os.PathLike[str] | None = None, doing: str = "") -> str:
    """'/abs/dir/file: <doing>No such file or directory' for an OSError on ``path`` (default: the file the error
    names); the error's own text when it names no file (a port that cannot be bound)."""
    name = path if path is not None else exc.filename
    if name is None or isinstance(name, int):
        return str(exc)
    return f"{Path(os.fsdecode(name)).absolute()}: {doing}{exc.strerror or exc}"


def cannot_read(exc: OSError, path: str | os.PathLike[str] | None = None) -> str:
    """'/abs/dir/file.csv: cannot read: No such file or directory' for an OSError raised reading ``path``."""
    return os_error_text(exc, path, "cannot read: ")
