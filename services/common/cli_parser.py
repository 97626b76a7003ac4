"""The argparse parser every greenserve command line is built on (the `greenserve` CLI, its benchmarks, the engine
emulator, the services' settings).

- No abbreviations: `--grid ES` is an unknown flag, not `--grids ES`.
- An unknown flag is answered in one line, with the closest real flag of the (sub-)command that read it
  (`--csv`: "did you mean --ci-csv?"), not with the whole usage block; the exit status is 2, as argparse's.
- Every option's help shows its default, unless the help already states one or there is none to show.
"""

from __future__ import annotations

import argparse
import difflib
import sys
from collections.abc import Iterable
from typing import Any, NoReturn, TypeVar, overload

_UNKNOWN_IN = "_greenserve_unknown_flags_parser"  # namespace attribute: the innermost parser that left extras
_NO_DEFAULT: tuple[object, ...] = (None, False, argparse.SUPPRESS, [], "")
_N = TypeVar("_N")  # the namespace object a caller passes to parse_known_args


class HelpFormatter(argparse.HelpFormatter):
    """argparse's formatter, plus "(default: X)" after an option's help when it has a default worth showing
    (not None, False, [] or '') and its help does not state one already."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        if not action.option_strings or "default" in text.lower():
            return text
        if isinstance(action.default, (list, tuple, dict)) or action.default in _NO_DEFAULT:
            return text
        return f"{text} (default: %(default)s)" if text else "(default: %(default)s)"


class Parser(argparse.ArgumentParser):
    """An ArgumentParser without abbreviations, with defaults in the help and a one-line answer to unknown flags.
    Sub-commands made with `add_subparsers().add_parser` are Parsers too (argparse uses the parent's class)."""

    def __init__(self, *args: object, **kwargs: object) -> None:
        kwargs.setdefault("allow_abbrev", False)
        kwargs.setdefault("formatter_class", HelpFormatter)
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        self._unknown_in: Parser | None = None
        self._given: list[str] = []

    # argparse's signature: a Namespace, or the caller's own namespace object
    @overload
    def parse_known_args(self, args: Iterable[str] | None = None,
                         namespace: None = None) -> tuple[argparse.Namespace, list[str]]: ...
    @overload
    def parse_known_args(self, args: Iterable[str] | None, namespace: _N) -> tuple[_N, list[str]]: ...
    @overload
    def parse_known_args(self, *, namespace: _N) -> tuple[_N, list[str]]: ...

    def parse_known_args(self, args: Iterable[str] | None = None, namespace: Any = None) -> tuple[Any, list[str]]:
        self._given = list(sys.argv[1:] if args is None else args)
        namespace, extras = super().parse_known_args(args, namespace)
        if extras:
            # a sub-command's parser returns first and its namespace is copied into its parent's: the innermost
            # parser that saw unknown arguments is the one whose flags a hint should offer
            if not hasattr(namespace, _UNKNOWN_IN):
                setattr(namespace, _UNKNOWN_IN, self)
            self._unknown_in = getattr(namespace, _UNKNOWN_IN)
        return namespace, extras

    def error(self, message: str) -> NoReturn:
        prefix = "unrecognized arguments: "
        if message.startswith(prefix):
            where = self._unknown_in or self
            self.exit(2, f"{where.prog}: error: {unknown_flags_message(where, message[len(prefix):].split())}\n")
        stray = self._stray_flags()
        if stray:  # an unknown flag first: a missing --csv or a value read as VERSION is what it caused
            self.exit(2, f"{self.prog}: error: {unknown_flags_message(self, stray)}\n")
        hint = _choice_hint(message)
        super().error(message + hint)

    def _stray_flags(self) -> list[str]:
        """The long flags given to this parser that it does not know (none for a parser with sub-commands or one
        that passes the rest on, like `greenserve bench NAME ARGS...`: the flags it was given may be theirs)."""
        if any(isinstance(a, argparse._SubParsersAction) or a.nargs == argparse.REMAINDER for a in self._actions):
            return []
        given = self._given[:self._given.index("--")] if "--" in self._given else self._given
        return [a for a in given if a.startswith("--") and a.split("=", 1)[0] not in self._option_string_actions]


def unknown_flags_message(parser: argparse.ArgumentParser, extras: list[str]) -> str:
    """'unknown flag --csv (did you mean --ci-csv?)', the closest long flag of ``parser``; only the flags are named
    (what follows one is its value), or the stray arguments when there is no flag among them."""
    flags = [a.split("=", 1)[0] for a in extras if a.startswith("-")]
    if not flags:
        return f"unrecognized arguments: {' '.join(extras)} ({parser.prog} --help lists what it takes)"
    known = [s for s in parser._option_string_actions if s.startswith("--")]
    parts = []
    for flag in flags:
        close = difflib.get_close_matches(flag, known, n=1, cutoff=0.6)
        parts.append(f"unknown flag {flag} (did you mean {close[0]}?)" if close else f"unknown flag {flag}")
    text = "; ".join(parts)
    return text if "did you mean" in text else f"{text} ({parser.prog} --help lists the flags)"


def _choice_hint(message: str) -> str:
    """"; did you mean 'status'?" for argparse's "invalid choice: 'statsu' (choose from ...)", else ''."""
    marker = "invalid choice: "
    if marker not in message or "(choose from " not in message:
        return ""
    given = message.split(marker, 1)[1].split(" (choose from ", 1)[0].strip("'")
    choices = [c.strip().strip("'") for c in message.rsplit("(choose from ", 1)[1].rstrip(")").split(",")]
    close = difflib.get_close_matches(given, choices, n=1, cutoff=0.6)
    return f"; did you mean {close[0]!r}?" if close else ""

