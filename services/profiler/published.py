"""The seeds' published tables as PUBLISHED profiles (``data/published_profiles.toml``).

The same TOML format is what ``greenserve profile import FILE`` reads: a list of ``[[profiles]]`` tables, each
with a ``citation`` (stored as the profile's note), a ``config`` (ProfileConfig fields; ``serving_mode`` by its
short name, e.g. "standalone"), an optional ``slo``, optional ``facts`` (name -> number, unit in the name) and
optional ``points`` (ProfilePoint fields, ascending rate) and ``variant_quality_fraction``.
"""

from __future__ import annotations

import tomllib
from collections.abc import Mapping
from importlib import resources
from pathlib import Path
from typing import Any

from google.protobuf import json_format

from greenserve.v1 import common_pb2

DATA_FILE = "published_profiles.toml"


def _config(table: Mapping[str, Any], where: str) -> common_pb2.ProfileConfig:
    values = dict(table)
    mode = values.pop("serving_mode", "")
    try:
        config = json_format.ParseDict(values, common_pb2.ProfileConfig())
    except json_format.ParseError as exc:
        raise ValueError(f"{where}.config: {exc}") from None
    if mode:
        name = "SERVING_MODE_" + str(mode).upper()
        if name not in common_pb2.ServingMode.keys():
            raise ValueError(f"{where}.config.serving_mode: unknown mode {mode!r}")
        config.serving_mode = common_pb2.ServingMode.Value(name)
    return config


def profiles_from_document(document: Mapping[str, Any], *,
                           source: common_pb2.ProfileSource = common_pb2.PROFILE_SOURCE_PUBLISHED,
                           origin: str = "") -> list[common_pb2.Profile]:
    """Profiles (not yet validated against the store's rules) from a parsed TOML document."""
    tables = document.get("profiles")
    if not isinstance(tables, list) or not tables:
        raise ValueError("profiles: the file needs at least one [[profiles]] table")
    out: list[common_pb2.Profile] = []
    for i, table in enumerate(tables):
        where = f"profiles[{i}]"
        if not isinstance(table, Mapping):
            raise ValueError(f"{where}: must be a table")
        unknown = set(table) - {"citation", "config", "slo", "facts", "points", "variant_quality_fraction"}
        if unknown:
            raise ValueError(f"{where}: unknown keys {sorted(unknown)}")
        citation = str(table.get("citation", "")).strip()
        if not citation:
            raise ValueError(f"{where}.citation: required")
        profile = common_pb2.Profile(source=source, note=citation + (f" [{origin}]" if origin else ""))
        profile.config.CopyFrom(_config(table.get("config", {}), where))
        try:
            if "slo" in table:
                json_format.ParseDict(dict(table["slo"]), profile.slo)
            for _j, point in enumerate(table.get("points", [])):
                json_format.ParseDict(dict(point), profile.points.add())
        except (json_format.ParseError, TypeError) as exc:
            raise ValueError(f"{where}: {exc}") from None
        profile.variant_quality_fraction = float(table.get("variant_quality_fraction", 0.0))
        for name, value in dict(table.get("facts", {})).items():
            if not isinstance(value, int | float) or isinstance(value, bool):
                raise ValueError(f"{where}.facts.{name}: must be a number")
            profile.facts.add(name=str(name), value=float(value), citation=citation)
        out.append(profile)
    return out


def load_file(path: str | Path) -> list[common_pb2.Profile]:
    """Profiles of a TOML file in this module's format (ValueError naming the bad entry)."""
    path = Path(path)
    try:
        document = tomllib.loads(path.read_text())
    except tomllib.TOMLDecodeError as exc:
        raise ValueError(f"{path.name}: not valid TOML: {exc}") from None
    return profiles_from_document(document)


def builtin_profiles() -> list[common_pb2.Profile]:
    """The seeds' published numbers shipped with the profiler."""
    text = resources.files("greenserve.profiler").joinpath("data", DATA_FILE).read_text()
    return profiles_from_document(tomllib.loads(text))


def same_content(a: common_pb2.Profile, b: common_pb2.Profile) -> bool:
    """True when two profiles hold the same numbers and provenance (ignoring key, version and time)."""
    def strip(p: common_pb2.Profile) -> bytes:
        c = common_pb2.Profile()
        c.CopyFrom(p)
        c.ClearField("config_key")
        c.ClearField("version")
        c.ClearField("created_at")
        return c.SerializeToString(deterministic=True)

    return strip(a) == strip(b)
