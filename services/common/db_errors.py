"""The errors of greenserve's persistence layer, apart so that the engine, migration and session modules
(``db_engine``, ``schema_migrations``, ``persistence``) can all raise them without an import cycle."""

from __future__ import annotations

__all__ = ["PersistenceError", "ReadOnlySessionError", "SchemaVersionError"]


class PersistenceError(RuntimeError):
    """Base class for the errors of greenserve's persistence layer."""


class SchemaVersionError(PersistenceError):
    """The database's schema revision is not one this build knows, or is not at head."""


class ReadOnlySessionError(PersistenceError):
    """Something tried to write through a session opened with ``readonly=True``."""
