"""The Electricity Maps-shaped provider adapter against a local aiohttp server serving real CSV data."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from aiohttp import web

from greenserve.forecaster.csv_sources import read_csv_series
from greenserve.forecaster.provider_electricitymaps import ElectricityMapsClient, ProviderError, ingest_history
from greenserve.forecaster.service import build
from greenserve.forecaster.settings import ForecasterSettings

TOKEN = "test-token"
NOW = pd.Timestamp("2023-06-01T12:00Z")


def _iso(ts_s: int) -> str:
    return pd.Timestamp(ts_s, unit="s", tz="UTC").strftime("%Y-%m-%dT%H:%M:%S.000Z")


@pytest.fixture
async def em_server(data_dir):
    """Serves GB (Electricity Maps CSV, 2023-05-28 to 06-02) as /v3/carbon-intensity/{latest,history,forecast} at
    NOW."""
    path = data_dir / "GB_2023_hourly.csv"
    data = {s: read_csv_series(path, signal=s) for s in ("direct", "lifecycle")}
    now_s = int(NOW.timestamp())

    def items(signal: str, lo: int, hi: int) -> list[dict[str, object]]:
        series = data[signal]
        keep = (series.times_s >= lo) & (series.times_s < hi)
        return [{"zone": "GB", "carbonIntensity": float(v), "datetime": _iso(int(t)), "isEstimated": False,
                 "emissionFactorType": signal} for t, v in zip(series.times_s[keep], series.values[keep], strict=True)]

    async def handler(request: web.Request) -> web.Response:
        if request.headers.get("auth-token") != TOKEN:
            return web.json_response({"error": "bad token"}, status=401)
        if request.query.get("zone") != "GB":
            return web.json_response({"error": "unknown zone"}, status=404)
        signal = request.query.get("emissionFactorType", "lifecycle")
        kind = request.match_info["kind"]
        if kind == "latest":
            return web.json_response(items(signal, now_s, now_s + 3600)[0])
        if kind == "history":
            return web.json_response({"zone": "GB", "history": items(signal, now_s - 23 * 3600, now_s + 1)})
        return web.json_response({"zone": "GB", "forecast": items(signal, now_s + 3600, now_s + 25 * 3600)})

    app = web.Application()
    app.router.add_get("/v3/carbon-intensity/{kind}", handler)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    yield f"http://127.0.0.1:{port}", data
    await runner.cleanup()


async def test_latest_history_forecast_shapes(em_server) -> None:
    url, data = em_server
    client = ElectricityMapsClient(url, TOKEN)
    latest = await client.latest("GB", "direct")
    i = int(np.flatnonzero(data["direct"].times_s == NOW.timestamp())[0])
    assert latest.time_s == NOW.timestamp() and latest.ci_g_per_kwh == data["direct"].values[i]
    history = await client.history("GB", "lifecycle")
    assert len(history) == 24 and history[-1].time_s == NOW.timestamp()
    assert history[-1].ci_g_per_kwh == data["lifecycle"].values[i]
    forecast = await client.forecast("GB")
    assert len(forecast) == 24 and forecast[0].time_s == NOW.timestamp() + 3600


async def test_wrong_token_and_unknown_zone_are_errors(em_server) -> None:
    url, _ = em_server
    with pytest.raises(ProviderError, match="401"):
        await ElectricityMapsClient(url, "wrong").latest("GB")
    with pytest.raises(ProviderError, match="404"):
        await ElectricityMapsClient(url, TOKEN).history("XX")


async def test_history_is_ingested_once(em_server, start_inprocess) -> None:
    url, data = em_server
    svc = await start_inprocess(ForecasterSettings, build, forecast_model="seasonal_naive")
    servicer = svc.server.registrations[0].servicer
    client = ElectricityMapsClient(url, TOKEN)
    assert await ingest_history(client, servicer, "GB", "direct") == 24
    assert await ingest_history(client, servicer, "GB", "direct") == 0  # same hours again: nothing new
    key = next(k for k in servicer.by_key if k.key == "GB")
    assert key.signal == "direct"
    from greenserve.forecaster import ingest

    first, grid = ingest.load_grid(servicer.db, servicer.by_key[key], 3600)
    assert first == NOW.timestamp() - 23 * 3600 and len(grid) == 24
    assert grid[-1] == data["direct"].values[int(np.flatnonzero(data["direct"].times_s == NOW.timestamp())[0])]
