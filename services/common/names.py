"""The one pattern for names that cross the wire (pools, server ids, engine ids, model names, series keys).

Two shapes, both checked with `re.fullmatch` (a `^...$` pattern with `re.match` lets a trailing newline
through: a pool named "nl\\n" once became a file `nl\\n.npz`):

- **name** (`check_name`): `[A-Za-z0-9][A-Za-z0-9._:-]{0,127}` -- one path segment, safe as a file name
  (no '/', no leading '.', '-' or ':', no whitespace or control characters). Pools, server ids, engine ids,
  plan or node names: anything a service may use to name a file or a metric label.
- **path name** (`check_path_name`): names joined by single '/', at most 256 characters in all, e.g. the
  model name `meta-llama/Meta-Llama-3-8B-Instruct` or a series key `llama/a`. Never used as a file name.

Both raise `InvalidArgument` naming the field, with the value shortened in the message.
"""

from __future__ import annotations

import re

from greenserve.common.errors import InvalidArgument

NAME_MAX_CHARS = 128
PATH_NAME_MAX_CHARS = 256
_SEGMENT = r"[A-Za-z0-9][A-Za-z0-9._:-]*"
NAME_PATTERN = re.compile(_SEGMENT)
PATH_NAME_PATTERN = re.compile(rf"{_SEGMENT}(?:/{_SEGMENT})*")
_SHOWN_CHARS = 64


def _shown(value: str) -> str:
    return repr(value if len(value) <= _SHOWN_CHARS else value[:_SHOWN_CHARS] + "...")


def is_name(value: str, *, max_chars: int = NAME_MAX_CHARS) -> bool:
    """Whether `value` is a valid name (see the module doc) of at most `max_chars` characters."""
    return 0 < len(value) <= max_chars and NAME_PATTERN.fullmatch(value) is not None


def check_name(field: str, value: str, *, max_chars: int = NAME_MAX_CHARS) -> str:
    """`value` when it is a name: 1-`max_chars` of A-Z a-z 0-9 . _ : -, starting with a letter or digit;
    else InvalidArgument naming `field`."""
    if not is_name(value, max_chars=max_chars):
        what = "required" if not value else f"got {_shown(value)}"
        raise InvalidArgument(field, f"must be 1-{max_chars} of A-Z a-z 0-9 . _ : - starting with a letter or "
                              f"digit ({what})")
    return value


def check_path_name(field: str, value: str, *, max_chars: int = PATH_NAME_MAX_CHARS) -> str:
    """`value` when it is names joined by single '/' (e.g. `meta-llama/Meta-Llama-3-8B-Instruct`), at most
    `max_chars` characters; else InvalidArgument naming `field`."""
    if not (0 < len(value) <= max_chars and PATH_NAME_PATTERN.fullmatch(value)):
        what = "required" if not value else f"got {_shown(value)}"
        raise InvalidArgument(field, f"must be names of A-Z a-z 0-9 . _ : - (each starting with a letter or "
                              f"digit) joined by '/', at most {max_chars} characters ({what})")
    return value
