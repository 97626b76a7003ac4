"""Reading the lock files under scripts/ (constraints*.txt: NAME==VERSION lines and # comments)."""

from __future__ import annotations

import re
from pathlib import Path

from packaging.utils import canonicalize_name
from packaging.version import Version

SCRIPTS = Path(__file__).resolve().parents[1] / "scripts"


def read_lock(name: str) -> dict[str, Version]:
    """The pins of scripts/<name>, by canonical package name; fails the test on a malformed line or a repeated name."""
    pins: dict[str, Version] = {}
    for number, line in enumerate((SCRIPTS / name).read_text().splitlines(), 1):
        if not line or line.startswith("#"):
            continue
        match = re.fullmatch(r"([A-Za-z0-9._-]+)==([A-Za-z0-9.+!-]+)", line)
        assert match, f"scripts/{name} line {number} is not NAME==VERSION: {line!r}"
        package = canonicalize_name(match.group(1))
        assert package not in pins, f"scripts/{name} pins {package} twice"
        pins[package] = Version(match.group(2))
    return pins
