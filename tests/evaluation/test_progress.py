"""The progress of `greenserve evaluate` says what runs, step by step (issue 35: it sat at 0 % for 18 s with no
message while the forecasts were made, and counted strategies in "day/s"), and no HiGHS banner is printed through it."""

from __future__ import annotations

import subprocess
import sys

from greenserve.evaluation.progress import Progress


def test_each_step_says_what_runs() -> None:
    seen: list[tuple[int, int, str]] = []
    steps = Progress(lambda *event: seen.append(event), total=6)
    steps.forecasting(["ES", "FR"], "auto")
    steps.finished()
    steps.finished()
    steps.running(["ES/base_full_cache", "ES/joint", "FR/base_full_cache"], 24, ["simulator fidelity"])
    steps.finished("ES/joint")
    steps.finished("simulator fidelity")
    steps.finished("ES/base_full_cache")
    steps.finished("FR/base_full_cache")
    assert seen == [
        (0, 6, "forecasting the day's CI of ES, FR and its load (auto)"),
        (1, 6, "forecasting the day's CI of ES, FR and its load (auto)"),
        (2, 6, "forecasting the day's CI of ES, FR and its load (auto)"),
        (2, 6, "planning and replaying 24 h of ES/base_full_cache, ES/joint, FR/base_full_cache; checking the "
               "method: simulator fidelity"),
        (3, 6, "planning and replaying 24 h of ES/base_full_cache, FR/base_full_cache; checking the method: "
               "simulator fidelity"),
        (4, 6, "planning and replaying 24 h of ES/base_full_cache, FR/base_full_cache"),
        (5, 6, "planning and replaying 24 h of FR/base_full_cache"),
        (6, 6, "done"),
    ]


def test_many_runs_are_counted_not_listed() -> None:
    seen: list[str] = []
    Progress(lambda _d, _t, doing: seen.append(doing), total=5).running([f"G{i}/joint" for i in range(5)], 1, [])
    assert seen == ["planning and replaying 1 h of G0/joint, G1/joint, G2/joint +2"]


def _stdout(code: str) -> str:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                          check=True).stdout


def test_the_highs_banner_is_silenced() -> None:
    build = "import highspy; h = highspy.Highs(); h.setOptionValue('output_flag', False); print('solved')"
    assert "Running HiGHS" in _stdout(build)  # what each evaluate worker printed through the progress bar
    quiet = "from greenserve.common.quiet_highs import silence_banner; silence_banner(); " + build
    assert _stdout(quiet) == "solved\n"
