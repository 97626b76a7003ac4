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


def os_error_text(exc: OSError) -> str:
    """'/abs/dir/file: No such file or directory' for an OSError on a file (opening, reading, creating it); the
    error's own text for one on no file (a port that cannot be bound)."""
    if exc.filename is None or isinstance(exc.filename, int):
        return str(exc)
    return f"{Path(os.fsdecode(exc.filename)).absolute()}: {exc.strerror or exc}"
