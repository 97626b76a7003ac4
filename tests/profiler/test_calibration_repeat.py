"""The calibration figure on a repeat of the real-engine sweep: the shipped run4 is run3's command on another
occasion (docs/profiler.md, "Real engine")."""

from __future__ import annotations

import json

import pytest

from greenserve.bench import profiler_calibration as bench_calibration

STORED = bench_calibration.STORED_SWEEP / bench_calibration.DEFAULT_RUN


def test_a_repeat_sweep_gives_the_figure_and_each_fit_predicts_the_other(capsys: pytest.CaptureFixture[str]) -> None:
    """run4 is the same sweep as run3 on another occasion: fitted alone it predicts its held-back rates within 10 %,
    and each sweep's fit predicts every rate of the other (TTFT p50 within 10 %; TPOT p50 within 20 %: the machine's
    decode step differs between occasions by more than between the rates, docs/profiler.md "Real engine")."""
    run3, run4 = STORED, bench_calibration.STORED_SWEEP / "run4"
    assert bench_calibration.main([f"--sweep={run4}", f"--check-sweep={run3}"]) == 0
    out = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    worst = out["max_abs_error_held_back"]
    assert worst["ttft_p50_s"] < 0.10 and worst["tpot_p50_s"] < 0.10
    check = out["sweeps"][0]["check"]
    assert check["sweep"] == run3.name and len(check["rows"]) == 10
    assert check["max_abs_error"]["ttft_p50_s"] < 0.10 and check["max_abs_error"]["tpot_p50_s"] < 0.20
    assert bench_calibration.main([f"--sweep={run3}", f"--check-sweep={run4}"]) == 0
    check = json.loads(capsys.readouterr().out.strip().splitlines()[-1])["sweeps"][0]["check"]
    assert check["max_abs_error"]["ttft_p50_s"] < 0.10 and check["max_abs_error"]["tpot_p50_s"] < 0.10
    with pytest.raises(SystemExit) as exc:
        bench_calibration.main([f"--check-sweep={run4 / 'missing'}"])
    assert exc.value.code != 0 and "--check-sweep" in capsys.readouterr().err
