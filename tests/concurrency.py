"""Running one function from many threads at once, for the tests of concurrent writes."""

from __future__ import annotations

import threading
from collections.abc import Callable


def all_at_once(fn: Callable[[int], object], n: int, timeout_s: float = 60.0) -> list[BaseException]:
    """Calls ``fn(0)`` .. ``fn(n - 1)`` from ``n`` threads released together (a barrier), waits for them, and
    returns what they raised (empty when every call succeeded)."""
    start = threading.Barrier(n)
    errors: list[BaseException] = []

    def run(i: int) -> None:
        start.wait()
        try:
            fn(i)
        except BaseException as exc:  # noqa: BLE001 - returned to the test
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout_s)
    return errors
