"""Live carbon intensity from an HTTP API shaped like Electricity Maps v3.

Endpoints (``GET``, header ``auth-token: <token>``, query ``zone`` and ``emissionFactorType``
= ``direct`` | ``lifecycle``):

* ``/v3/carbon-intensity/latest``  -> ``{"zone", "carbonIntensity", "datetime", "isEstimated", ...}``
* ``/v3/carbon-intensity/history`` -> ``{"zone", "history": [ {same fields}, ... ]}`` (last 24 h)
* ``/v3/carbon-intensity/forecast`` -> ``{"zone", "forecast": [ {"carbonIntensity", "datetime"}, ... ]}``

:func:`poll_forever` ingests the history of each configured zone into the forecaster on a schedule, skipping
hours already stored (an API revising a value does not rewrite stored history).
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import aiohttp
import numpy as np
import pandas as pd

from greenserve.forecaster.csv_sources import HOUR_S

if TYPE_CHECKING:
    from greenserve.forecaster.service import ForecasterServicer

log = logging.getLogger("greenserve.forecaster.electricitymaps")


class ProviderError(RuntimeError):
    """The API answered with an error status or a body that is not the expected shape."""


@dataclass(frozen=True)
class CiReading:
    """One carbon-intensity value from the API."""

    zone: str
    time_s: int
    ci_g_per_kwh: float
    estimated: bool


def _reading(zone: str, item: dict[str, Any]) -> CiReading:
    try:
        when = pd.Timestamp(item["datetime"])
        when = when.tz_localize("UTC") if when.tzinfo is None else when.tz_convert("UTC")
        value = item["carbonIntensity"]
        return CiReading(zone, int(when.timestamp()), float("nan") if value is None else float(value),
                         bool(item.get("isEstimated", False)))
    except (KeyError, TypeError, ValueError) as exc:
        raise ProviderError(f"unexpected item in {zone} response: {item!r}") from exc


class ElectricityMapsClient:
    """Minimal async client of the three endpoints."""

    def __init__(self, base_url: str, token: str | None, timeout_s: float = 10.0) -> None:
        self.base_url = base_url.rstrip("/")
        self.token = token
        self.timeout = aiohttp.ClientTimeout(total=timeout_s)

    async def _get(self, path: str, zone: str, signal: str) -> dict[str, Any]:
        headers = {"auth-token": self.token} if self.token else {}
        params = {"zone": zone, "emissionFactorType": signal}
        async with aiohttp.ClientSession(timeout=self.timeout) as session:
            async with session.get(f"{self.base_url}/v3/carbon-intensity/{path}", params=params,
                                   headers=headers) as resp:
                if resp.status != 200:
                    body = (await resp.text())[:200]
                    raise ProviderError(f"{path} {zone}: HTTP {resp.status}: {body}")
                data = await resp.json()
        if not isinstance(data, dict):
            raise ProviderError(f"{path} {zone}: body is not a JSON object")
        return data

    async def latest(self, zone: str, signal: str = "direct") -> CiReading:
        return _reading(zone, await self._get("latest", zone, signal))

    async def history(self, zone: str, signal: str = "direct") -> list[CiReading]:
        data = await self._get("history", zone, signal)
        return [_reading(zone, item) for item in data.get("history", [])]

    async def forecast(self, zone: str, signal: str = "direct") -> list[CiReading]:
        data = await self._get("forecast", zone, signal)
        return [_reading(zone, item) for item in data.get("forecast", [])]


async def ingest_history(client: ElectricityMapsClient, servicer: ForecasterServicer, zone: str,
                         signal: str = "direct") -> int:
    """Fetch a zone's history and store the hours not stored yet; returns how many were new."""
    from greenserve.forecaster import ingest

    readings = [r for r in await client.history(zone, signal) if np.isfinite(r.ci_g_per_kwh)]
    readings = [r for r in readings if r.time_s % HOUR_S == 0]
    key = ingest.SeriesKey("ci", zone, signal, "g_per_kwh")
    series_id = servicer.by_key.get(key)
    stored: set[int] = set()
    if series_id is not None and readings:
        stored = await asyncio.to_thread(_stored_times, servicer, series_id, min(r.time_s for r in readings),
                                         max(r.time_s for r in readings) + 1)
    fresh = [r for r in readings if r.time_s not in stored]
    if not fresh:
        return 0
    times = np.array([r.time_s for r in fresh], dtype=np.int64)
    values = np.array([r.ci_g_per_kwh for r in fresh], dtype=np.float64)
    result = await servicer.ingest_arrays(key, HOUR_S, times, values)
    return result.inserted


def _stored_times(servicer: ForecasterServicer, series_id: int, start_s: int, end_s: int) -> set[int]:
    from greenserve.forecaster import ingest

    first, grid = ingest.load_grid(servicer.db, series_id, HOUR_S, start_s, end_s)
    return {first + i * HOUR_S for i, v in enumerate(grid) if np.isfinite(v)}


async def poll_forever(client: ElectricityMapsClient, servicer: ForecasterServicer, zones: list[str],
                       interval_s: float, signals: tuple[str, ...] = ("direct", "lifecycle")) -> None:
    """Poll every zone and signal each ``interval_s``; errors are logged and retried next round."""
    while True:
        for zone in zones:
            for signal in signals:
                try:
                    new = await ingest_history(client, servicer, zone, signal)
                    log.info("electricitymaps %s/%s: %d new hours", zone, signal, new)
                except Exception as exc:  # noqa: BLE001 - one zone's failure is logged, the poll goes on
                    log.warning("electricitymaps %s/%s: %s", zone, signal, exc)
        await asyncio.sleep(interval_s)
