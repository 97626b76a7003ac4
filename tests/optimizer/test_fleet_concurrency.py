"""Two fleet writes at once leave the optimizer's in-memory fleet equal to the stored one.

FleetStore wrote the database and then, in a second step, its in-memory copy, with nothing keeping a second
writer out in between: when the first writer's commit and memory update straddled the second writer's, the
database held the second fleet and the memory (what plans are computed over) the first, until a restart switched
to the other. Found by an adversarial audit of concurrent SetFleet / ReportGpus (failed before the fix)."""

from __future__ import annotations

import itertools
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from greenserve.common.persistence import Database
from greenserve.optimizer.fleet import FleetStore
from greenserve.v1 import common_pb2, optimizer_pb2

from tests.optimizer.conftest import pool


def _declare(name: str) -> Callable[[FleetStore], Any]:
    return lambda store: store.set_declared(common_pb2.FleetInventory(pools=[pool(name, [])]))


def _report(gpu: str) -> Callable[[FleetStore], Any]:
    return lambda store: store.report_gpus(optimizer_pb2.ReportGpusRequest(node="n1", gpus=[common_pb2.Gpu(uuid=gpu)]))


@pytest.mark.parametrize(("first", "second"), [(_declare("a"), _declare("b")), (_report("GPU-a"), _report("GPU-b"))],
                         ids=["SetFleet", "ReportGpus"])
def test_two_writes_at_once_leave_memory_as_stored(tmp_path: Path, first, second) -> None:
    db = Database.open(f"sqlite:///{tmp_path / 'optimizer.db'}", "optimizer")
    try:
        store = FleetStore(db)
        store.load()
        first_committed, second_done = threading.Event(), threading.Event()
        writes = itertools.count()
        real_session = db.session

        @contextmanager
        def session(*, readonly: bool = False) -> Iterator[Any]:
            n = None if readonly else next(writes)
            with real_session(readonly=readonly) as s:
                yield s
            if n == 0:  # the first write is committed: give the second writer the time to run to its end
                first_committed.set()
                second_done.wait(2)

        db.session = session  # type: ignore[method-assign]
        one = threading.Thread(target=first, args=(store,))
        one.start()
        assert first_committed.wait(10)
        two = threading.Thread(target=lambda: (second(store), second_done.set()))
        two.start()
        one.join(10)
        two.join(10)
        db.session = real_session  # type: ignore[method-assign]
        stored = FleetStore(db)
        stored.load()
        assert store.declared == stored.declared
        assert store.reports == stored.reports
    finally:
        db.close()
