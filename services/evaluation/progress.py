"""What an evaluation is doing, for its progress bar: the steps (each grid's CI forecast and the load forecast, each
hour of each (grid, strategy) day planned and replayed, each table of the method's checks) and, as each finishes,
what still runs. ``report(done, total, doing)`` is called at each change."""

from __future__ import annotations

from collections.abc import Callable, Iterable

Report = Callable[[int, int, str], None]
SHOWN = 3  # names listed per kind of step; the rest as "+N"


def _names(names: list[str]) -> str:
    more = f" +{len(names) - SHOWN}" if len(names) > SHOWN else ""
    return ", ".join(names[:SHOWN]) + more


class Progress:
    """``total`` counts a forecast, an hour of a day and a check as one step each."""

    def __init__(self, report: Report | None, total: int) -> None:
        self._report = report
        self.total = total
        self.done = 0
        self._doing = ""
        self._days: list[str] = []
        self._checks: list[str] = []
        self._hours = 0
        self._hours_done: dict[str, int] = {}

    def forecasting(self, regions: Iterable[str], model: str) -> None:
        self._doing = f"forecasting the day's CI of {_names(list(regions))} and its load ({model})"
        self._emit()

    def running(self, days: list[str], hours: int, checks: list[str]) -> None:
        """The days (``REGION/strategy``, ``hours`` steps each) and the method's checks now running."""
        self._days, self._hours, self._checks = list(days), hours, list(checks)
        self._hours_done = dict.fromkeys(days, 0)
        self._emit_running()

    def hour_finished(self, day: str) -> None:
        """One hour of a running day replayed (an hour of a day already finished is not counted again)."""
        if day not in self._days or self._hours_done[day] >= self._hours:
            return
        self._hours_done[day] += 1
        self.done += 1
        self._emit_running()

    def finished(self, name: str = "") -> None:
        """One step done: a forecast (no name), a day (its hours not yet counted) or a check (by its name)."""
        if name in self._days:
            self.done += self._hours - self._hours_done[name]
            self._days.remove(name)
        else:
            self.done += 1
            if name in self._checks:
                self._checks.remove(name)
        if self._days or self._checks:
            self._emit_running()
        else:  # a forecast (the days have not started), or the last step
            self._doing = "done" if self.done == self.total else self._doing
            self._emit()

    def _hour_now(self) -> str:
        """The hour (1-based) the running days are planning and replaying: "hour 3 of 24", or "hours 2-4 of 24"
        while the days are at different hours."""
        now = sorted({min(self._hours_done[d] + 1, self._hours) for d in self._days})
        span = f"hour {now[0]}" if len(now) == 1 else f"hours {now[0]}-{now[-1]}"
        return f"{span} of {self._hours}"

    def _emit_running(self) -> None:
        parts = []
        if self._days:
            parts.append(f"planning and replaying {self._hour_now()}: {_names(self._days)}")
        if self._checks:
            parts.append(f"checking the method: {_names(self._checks)}")
        self._doing = "; ".join(parts)
        self._emit()

    def _emit(self) -> None:
        if self._report:
            self._report(self.done, self.total, self._doing)
