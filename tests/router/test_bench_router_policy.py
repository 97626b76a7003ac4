"""`greenserve bench router-policy`: the per-decision cost of the routing policy, measured through the router's own
RoutingPolicy.choose on engines in service states; --quick runs in a few seconds and its JSON line is complete."""

from __future__ import annotations

import json
import math

import pytest
from greenserve_client.commands.bench import main as bench_main

from greenserve.bench import router_policy
from greenserve.router.routing.policy import RoutingPolicy


def _last_json(capsys: pytest.CaptureFixture[str]) -> dict:
    lines = capsys.readouterr().out.strip().splitlines()
    assert len(lines) == 1  # --json: the JSON line alone
    return json.loads(lines[-1])


def test_quick_through_the_cli_gives_every_engine_count_and_case(capsys: pytest.CaptureFixture[str]) -> None:
    assert bench_main(["router-policy", "--quick", "--json"]) == 0
    result = _last_json(capsys)
    assert result["benchmark"] == "router-policy" and result["fleet"] == "mixed" and result["clock"] == "thread_time"
    assert (result["repeats"], result["calls"]) == (2, 100)
    assert result["prompt_blocks"] == 16 and result["block_chars"] == 256
    assert len(result["load_average_1m"]) == 2
    rows = result["results"]
    assert [(r["engines"], r["case"]) for r in rows] == [(n, c) for n in (2, 8, 32) for c in router_policy.CASES]
    for row in rows:
        rounds = row["us_per_decision_rounds"]
        assert len(rounds) == 2 and all(math.isfinite(v) and v > 0 for v in rounds), row
        assert row["us_per_decision"] == min(rounds) and row["us_per_decision_median"] >= row["us_per_decision"]
        assert sum(row["states"].values()) == row["engines"]
        assert row["chosen_not_routable"] == 0 and 1 <= row["chosen_engines"] <= row["routable"]
    by = {(r["engines"], r["case"]): r for r in rows}
    # one engine of each role in 8: 3 awake ones with fresh metrics, a stale one, and the ones that take no request
    assert by[8, "plain"]["states"] == {"draining": 1, "ejected": 2, "healthy": 3, "sleeping": 1, "stale": 1}
    assert by[8, "plain"]["routable"] == 5 and by[32, "plain"]["routable"] == 20
    assert by[2, "plain"]["routable"] == 2
    # without a session the moving loads spread the requests; with one they stay on the session's engine
    assert by[32, "plain"]["chosen_engines"] > 1 and by[32, "full"]["chosen_engines"] < by[32, "plain"]["chosen_engines"]


def test_every_decision_goes_through_the_routers_policy(monkeypatch: pytest.MonkeyPatch,
                                                         capsys: pytest.CaptureFixture[str]) -> None:
    calls = []
    choose = RoutingPolicy.choose

    def counted(self: RoutingPolicy, *args: object, **kwargs: object) -> object:
        calls.append(args[0])
        return choose(self, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(RoutingPolicy, "choose", counted)
    assert router_policy.main(["--json", "--engines", "8", "--cases", "full", "--fleet", "uniform",
                               "--repeats", "3", "--calls", "50"]) == 0
    result = _last_json(capsys)
    assert len(calls) == 3 * 50 + 50  # the timed rounds, then the untimed round
    row, = result["results"]
    assert row["states"] == {"stale": 8} and row["routable"] == 8 and row["us_per_decision"] > 0


def test_without_json_a_table_comes_first(capsys: pytest.CaptureFixture[str]) -> None:
    assert router_policy.main(["--quick", "--engines", "2", "--cases", "plain"]) == 0
    out = capsys.readouterr().out.strip().splitlines()
    assert out[0].startswith("engines") and out[1].split()[:2] == ["2", "2"]
    assert json.loads(out[-1])["results"][0]["case"] == "plain"


@pytest.mark.parametrize(("args", "flag"), [
    (["--engines", "0"], "--engines"), (["--engines", "two"], "--engines"), (["--engines", ""], "--engines"),
    (["--cases", "plain,fancy"], "--cases"), (["--repeats", "0"], "--repeats"), (["--calls", "-1"], "--calls"),
    (["--prompt-chars", "-5"], "--prompt-chars"), (["--fleet", "odd"], "--fleet"),
])
def test_bad_flags_are_refused_naming_the_flag(args: list[str], flag: str,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        router_policy.main(["--quick", *args])
    captured = capsys.readouterr()
    assert exc.value.code == 2 and flag in captured.err and captured.out == ""
