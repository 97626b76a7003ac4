"""What every service's ORM models are declared with: the constraint naming convention and ``UtcDateTime``.

Each service declares its tables in ``greenserve.<service>.models`` on its own ``DeclarativeBase`` whose
``MetaData`` uses :data:`NAMING_CONVENTION`; every timestamp column is a :class:`UtcDateTime`, which refuses
naive datetimes (importing this module installs the ORM hook that checks them at assignment).
"""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Any

from sqlalchemy import Dialect, event
from sqlalchemy.orm import Mapper
from sqlalchemy.types import DateTime, TypeDecorator

__all__ = ["NAMING_CONVENTION", "UtcDateTime", "utcnow"]

#: Constraint/index naming used by every service's MetaData, so names are the same on every backend
#: and migrations can refer to them (``ck_<table>_<name>``, ``uq_<table>_<cols>``, ...).
NAMING_CONVENTION: dict[str, str] = {
    "ix": "ix_%(table_name)s_%(column_0_N_name)s",
    "uq": "uq_%(table_name)s_%(column_0_N_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_N_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}


def utcnow() -> datetime:
    """The current time as a timezone-aware UTC datetime (what ``UtcDateTime`` columns store)."""
    return datetime.now(timezone.utc)


class UtcDateTime(TypeDecorator[datetime]):
    """A timestamp stored in UTC and always returned as a timezone-aware UTC ``datetime``.

    Binding a naive datetime raises ``ValueError``: a timestamp without a zone is ambiguous, and
    silently assuming local time or UTC is how carbon data ends up shifted by hours. Aware values in
    any zone are converted to UTC. On PostgreSQL the column is ``timestamp with time zone``; on
    SQLite (which has no zone support) the UTC wall time is stored as ISO text, which also sorts in
    time order, and UTC is attached again on the way out.
    """

    impl = DateTime(timezone=True)
    cache_ok = True

    @property
    def python_type(self) -> type[datetime]:
        return datetime

    def process_bind_param(self, value: Any, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        if not isinstance(value, datetime):
            raise TypeError(f"UtcDateTime expects a datetime, got {type(value).__name__}")
        value = _aware_utc(value)
        if dialect.name == "sqlite":
            return value.replace(tzinfo=None)
        return value

    def process_result_value(self, value: Any, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        if isinstance(value, str):  # defensive: raw text in a SQLite column
            value = datetime.fromisoformat(value)
        if value.tzinfo is None:
            return value.replace(tzinfo=timezone.utc)
        return value.astimezone(timezone.utc)


def _aware_utc(value: Any) -> Any:
    """ORM attribute hook for ``UtcDateTime`` columns: refuse naive datetimes when they are
    assigned (a plain ``ValueError`` at the caller's line, not a wrapped error at flush time) and
    keep the in-memory value in UTC, as it will read back."""
    if isinstance(value, datetime):
        if value.tzinfo is None or value.tzinfo.utcoffset(value) is None:
            raise ValueError(
                f"naive datetime {value.isoformat()} refused: store timezone-aware datetimes "
                "(e.g. datetime.now(timezone.utc))"
            )
        return value.astimezone(timezone.utc)
    return value


def _on_utc_attribute_set(_target: Any, value: Any, _oldvalue: Any, _initiator: Any) -> Any:
    return _aware_utc(value)


@event.listens_for(Mapper, "mapper_configured")
def _install_utc_attribute_checks(mapper: Mapper[Any], _class: type) -> None:
    for prop in mapper.column_attrs:
        if any(isinstance(getattr(col, "type", None), UtcDateTime) for col in prop.columns):
            event.listen(prop.class_attribute, "set", _on_utc_attribute_set, retval=True)
