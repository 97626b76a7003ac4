"""CLOVER's LLM analogue (issue 19 "Figures"): the headline module follows the seeds' convention, meets the issue's
conditions (accuracy loss <= 4 %, every hour proven optimal) and reports its saving against BASE."""

from __future__ import annotations


def test_clover_headline_quick() -> None:
    from greenserve.evaluation.headlines import check, clover

    row = check("clover", clover.run(quick=True))
    ours = row["ours"]
    assert ours["the reproduction's conditions (loss <= 4 %, a saving, optimum = ORACLE)"] is True
    assert 0 < ours["accuracy loss (%)"]["value"] <= 4.0
    saved = ours["operational carbon saved vs BASE (%)"]
    assert saved["hours"] == clover.QUICK_HOURS and saved["ours_g"] < saved["base_g"]
    # the verdict is the saving against CLOVER's 75 %, honestly: an 8B's 4-bit variant saves far less
    assert row["within_tolerance"] == (abs(saved["value"] - 75.0) <= 15.0)
