"""The progress of `greenserve evaluate` says what runs, step by step (a forecast, an hour of a day, a check: never
0 % for long with no message), and no HiGHS banner is printed through it."""

from __future__ import annotations

import subprocess
import sys
from datetime import UTC, datetime

from greenserve.evaluation.progress import Progress


def test_each_step_says_what_runs() -> None:
    seen: list[tuple[int, int, str]] = []
    steps = Progress(lambda *event: seen.append(event), total=6)
    steps.forecasting(["ES", "FR"], "auto")
    steps.finished()
    steps.finished()
    steps.running(["ES/base_full_cache", "ES/joint", "FR/base_full_cache"], 1, ["simulator fidelity"])
    steps.finished("ES/joint")
    steps.finished("simulator fidelity")
    steps.finished("ES/base_full_cache")
    steps.finished("FR/base_full_cache")
    assert seen == [
        (0, 6, "forecasting the day's CI of ES, FR and its load (auto)"),
        (1, 6, "forecasting the day's CI of ES, FR and its load (auto)"),
        (2, 6, "forecasting the day's CI of ES, FR and its load (auto)"),
        (2, 6, "planning and replaying hour 1 of 1: ES/base_full_cache, ES/joint, FR/base_full_cache; checking the "
               "method: simulator fidelity"),
        (3, 6, "planning and replaying hour 1 of 1: ES/base_full_cache, FR/base_full_cache; checking the method: "
               "simulator fidelity"),
        (4, 6, "planning and replaying hour 1 of 1: ES/base_full_cache, FR/base_full_cache"),
        (5, 6, "planning and replaying hour 1 of 1: FR/base_full_cache"),
        (6, 6, "done"),
    ]


def test_many_runs_are_counted_not_listed() -> None:
    seen: list[str] = []
    Progress(lambda _d, _t, doing: seen.append(doing), total=5).running([f"G{i}/joint" for i in range(5)], 1, [])
    assert seen == ["planning and replaying hour 1 of 1: G0/joint, G1/joint, G2/joint +2"]


def _stdout(code: str) -> str:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                          check=True).stdout


def test_the_highs_banner_is_silenced() -> None:
    build = "import highspy; h = highspy.Highs(); h.setOptionValue('output_flag', False); print('solved')"
    assert "Running HiGHS" in _stdout(build)  # what each evaluate worker printed through the progress bar
    quiet = "from greenserve.common.quiet_highs import silence_banner; silence_banner(); " + build
    assert _stdout(quiet) == "solved\n"


def test_hours_are_steps_and_a_finished_day_counts_its_missing_hours_once() -> None:
    seen: list[tuple[int, int, str]] = []
    steps = Progress(lambda *event: seen.append(event), total=1 + 2 * 3)
    steps.finished()  # the forecast
    steps.running(["ES/joint", "FR/joint"], 3, [])
    steps.hour_finished("ES/joint")
    steps.hour_finished("FR/joint")
    steps.hour_finished("ES/joint")
    steps.finished("ES/joint")  # its third hour's tick is still in the queue
    steps.hour_finished("ES/joint")  # ... and arrives late: not counted twice
    steps.finished("FR/joint")
    assert [d for d, _, _ in seen] == [1, 1, 2, 3, 4, 5, 7]
    assert [doing for _, _, doing in seen[1:6]] == [  # the hour each running day is at
        *(f"planning and replaying {hours} of 3: ES/joint, FR/joint" for hours in ("hour 1", "hours 1-2", "hour 2",
                                                                                    "hours 2-3")),
        "planning and replaying hour 2 of 3: FR/joint"]
    assert seen[-1] == (7, 7, "done")


def test_evaluate_reports_every_hour_from_its_worker_processes() -> None:
    """`greenserve evaluate`'s bar moves hour by hour, also when the days run in worker processes."""
    from greenserve.evaluation import grids, run, scenario

    events: list[tuple[int, int, str]] = []
    start = int(datetime(2022, 7, 6, tzinfo=UTC).timestamp())
    run.evaluate({"FR": grids.shipped()["FR"]}, day_start_s=start, strategies=["base_full_cache", "carbon_routing"],
                 scenario=scenario.Scenario(), forecast_model="seasonal_naive", window_s=60.0, hours=3, workers=2,
                 progress=lambda *e: events.append(e), fidelity=False)
    done = [d for d, _, _ in events]
    total = 2 + 2 * 3  # FR's CI and the load forecast, 2 days of 3 hours
    assert events[-1] == (total, total, "done")
    assert done == sorted(done), "the count never goes back"
    assert len({d for d in done if 2 < d < total}) >= 3, f"hours counted one by one: {done}"


def _ticking_job(name: str) -> str:
    from greenserve.evaluation import executor

    for hour in range(3):
        executor.tick((name, hour))
    return name


def test_a_jobs_ticks_all_arrive_before_its_end() -> None:
    """The worker processes' ticks are handed over before the end of the job that sent them (a finished day's
    last hours would otherwise be counted at its end, and the bar jump)."""
    from greenserve.evaluation import executor

    events: list[tuple[str, object]] = []
    names = [f"day{i}" for i in range(6)]
    assert executor.map_jobs(_ticking_job, names, workers=2, on_done=lambda r: events.append(("done", r)),
                             on_tick=lambda t: events.append(("tick", t))) == names
    for name in names:
        end = events.index(("done", name))
        assert [e for e in events[:end] if e[0] == "tick" and e[1][0] == name] == [
            ("tick", (name, h)) for h in range(3)], events
