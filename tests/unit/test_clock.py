"""The one clock (greenserve.common.clock): wall, virtual (start, speed, anchor), parsing, env and flag config."""

from __future__ import annotations

import asyncio
import math
import time
from datetime import UTC, datetime

import pytest

from greenserve.cache_manager.settings import CacheManagerSettings
from greenserve.common import clock as clock_mod
from greenserve.common.clock import (
    Clock,
    VirtualClock,
    clock_from_env,
    hour_floor_s,
    make_clock,
    parse_instant_s,
    set_clock,
)
from greenserve.common.config import load_settings

START = "2026-07-01T00:00:00Z"
START_S = datetime(2026, 7, 1, tzinfo=UTC).timestamp()


@pytest.fixture
def restore_clock():
    previous = clock_mod.clock()
    yield
    set_clock(previous)


def test_wall_clock_reads_time_time() -> None:
    c = Clock()
    before = time.time()
    now = c.now_s()
    assert before <= now <= time.time()
    assert not c.virtual and c.speed == 1.0 and c.describe() == "wall clock"
    assert c.now().tzinfo is not None and c.now().utcoffset().total_seconds() == 0
    assert c.real_delay_s(2.5) == 2.5 and c.real_delay_s(-1.0) == 0.0


def test_virtual_clock_runs_from_its_start_at_its_speed_from_its_anchor() -> None:
    anchor = time.time() - 10.0
    c = VirtualClock(START_S, speed=60.0, anchor_s=anchor)
    before = time.time()
    now = c.now_s()
    after = time.time()
    assert START_S + (before - anchor) * 60 <= now <= START_S + (after - anchor) * 60
    assert now - START_S >= 600  # ten real seconds after the anchor are ten virtual minutes
    assert c.virtual and c.real_delay_s(120.0) == 2.0 and c.real_delay_s(-5.0) == 0.0
    assert "2026-07-01T00:00:00+00:00 at 60x" in c.describe()


async def test_virtual_sleeps_take_virtual_time() -> None:
    c = VirtualClock(START_S, speed=10_000.0)
    target = c.now_s() + 100.0  # 10 ms of real time
    await asyncio.wait_for(c.sleep_until(target), 5)
    assert c.now_s() >= target
    before = c.now_s()
    await asyncio.wait_for(c.sleep(50.0), 5)
    assert c.now_s() >= before + 50.0
    await asyncio.wait_for(c.sleep_until(0.0), 5)  # in the past: returns at once


def test_two_virtual_clocks_with_one_anchor_agree_and_without_one_do_not() -> None:
    anchor = time.time() - 100.0
    a = VirtualClock(START_S, 60.0, anchor)
    time.sleep(0.01)
    b = VirtualClock(START_S, 60.0, anchor)  # another process, started later, same flags
    t0 = time.time()
    va, vb = a.now_s(), b.now_s()
    t1 = time.time()
    assert abs(va - vb) <= (t1 - t0) * 60 + 1e-6
    c = VirtualClock(START_S, 60.0)  # anchored at its own start: 100 real s = 6000 virtual s behind
    assert a.now_s() - c.now_s() > 5000


@pytest.mark.parametrize(("build", "field"), [
    (lambda: VirtualClock(math.nan), "clock_start"),
    (lambda: VirtualClock(START_S, speed=0.0), "clock_speed"),
    (lambda: VirtualClock(START_S, speed=-1.0), "clock_speed"),
    (lambda: VirtualClock(START_S, speed=1e6), "clock_speed"),
    (lambda: VirtualClock(START_S, speed=math.inf), "clock_speed"),
    (lambda: VirtualClock(START_S, anchor_s=math.inf), "clock_anchor_s"),
    (lambda: parse_instant_s("yesterday"), "clock_start"),
    (lambda: parse_instant_s("2026-13-01T00:00:00Z"), "clock_start"),
    (lambda: make_clock("noon"), "clock_start"),
])
def test_bad_values_name_the_field(build, field) -> None:
    with pytest.raises(ValueError, match=rf"^{field}:"):
        build()


def test_instants_parse_as_iso_utc_or_unix_seconds() -> None:
    assert parse_instant_s(START) == START_S
    assert parse_instant_s("2026-07-01T00:00:00") == START_S  # no offset: UTC
    assert parse_instant_s("2026-07-01T02:00:00+02:00") == START_S
    assert parse_instant_s(f" {START_S} ") == START_S


def test_make_clock_is_the_wall_clock_unless_a_virtual_one_is_asked_for() -> None:
    assert type(make_clock(None)) is Clock
    assert type(make_clock(None, 1.0)) is Clock
    c = make_clock(START, 3600.0, anchor_s=123.0)
    assert isinstance(c, VirtualClock) and (c.start_s, c.speed, c.anchor_s) == (START_S, 3600.0, 123.0)
    fast = make_clock(None, 60.0)  # speed alone: starts now
    assert isinstance(fast, VirtualClock) and abs(fast.start_s - time.time()) < 60


def test_env_config() -> None:
    assert type(clock_from_env({})) is Clock
    c = clock_from_env({"GREENSERVE_CLOCK_START": START, "GREENSERVE_CLOCK_SPEED": "60",
                        "GREENSERVE_CLOCK_ANCHOR_S": "1700000000"})
    assert isinstance(c, VirtualClock) and (c.start_s, c.speed, c.anchor_s) == (START_S, 60.0, 1_700_000_000.0)
    with pytest.raises(ValueError, match=r"^clock_start: .*GREENSERVE_CLOCK_\* environment"):
        clock_from_env({"GREENSERVE_CLOCK_START": "soon"})
    with pytest.raises(ValueError, match=r"^clock_speed: GREENSERVE_CLOCK_SPEED is not a number"):
        clock_from_env({"GREENSERVE_CLOCK_SPEED": "fast"})
    with pytest.raises(ValueError, match=r"^clock_anchor_s: GREENSERVE_CLOCK_ANCHOR_S is not a number"):
        clock_from_env({"GREENSERVE_CLOCK_ANCHOR_S": "later"})
    with pytest.raises(ValueError, match=r"^clock_speed:"):
        clock_from_env({"GREENSERVE_CLOCK_SPEED": "0"})


def test_service_flags_and_env_vars_make_the_clock(monkeypatch, capsys) -> None:
    settings = load_settings(CacheManagerSettings, ["--clock-start", START, "--clock-speed", "120",
                                                    "--clock-anchor-s", "1700000000"])
    c = settings.make_clock()
    assert isinstance(c, VirtualClock) and (c.start_s, c.speed, c.anchor_s) == (START_S, 120.0, 1_700_000_000.0)
    monkeypatch.setenv("GREENSERVE_CLOCK_SPEED", "30")
    assert load_settings(CacheManagerSettings, []).make_clock().speed == 30.0
    with pytest.raises(SystemExit) as exc:
        load_settings(CacheManagerSettings, ["--clock-speed", "0"])
    assert exc.value.code == 2 and "--clock-speed" in capsys.readouterr().err


def test_the_process_clock_is_replaceable(restore_clock) -> None:
    virtual = VirtualClock(START_S, 1.0, anchor_s=time.time())
    previous = set_clock(virtual)
    assert clock_mod.clock() is virtual and START_S <= clock_mod.now_s() < START_S + 60
    assert set_clock(previous) is virtual


def test_hour_floor() -> None:
    assert hour_floor_s(START_S + 3599.9) == START_S and hour_floor_s(START_S + 3600) == START_S + 3600
