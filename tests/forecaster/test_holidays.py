"""Public holidays as off days: the calendar, the region mapping, the calendar members, the service's wiring."""

from __future__ import annotations

import pickle
from datetime import datetime, timezone

import grpc
import numpy as np
import pytest

from greenserve.forecaster import fitting
from greenserve.forecaster.forecast_models import make_model
from greenserve.forecaster.forecast_models.day_type import DayTypeNaive
from greenserve.forecaster.forecast_models.holiday_calendar import Holidays, holidays_for_region, off_days
from greenserve.forecaster.service import build
from greenserve.forecaster.settings import ForecasterSettings
from greenserve.v1 import common_pb2, forecaster_pb2, forecaster_pb2_grpc

from .test_calendar import office_load
from .test_service import ingest, wait_for_fit


def utc(day: str) -> int:
    return int(datetime.fromisoformat(day).replace(tzinfo=timezone.utc).timestamp())


SUNDAY_S = utc("2021-12-19")  # the Friday after (2021-12-24) is Christmas observed in the US


def test_off_days_are_weekends_and_the_regions_holidays() -> None:
    days = np.array([utc(d) for d in ("2021-12-23", "2021-12-24", "2021-12-25", "2021-12-27", "2021-11-26")])
    california = Holidays.parse("us-ca")
    assert california == Holidays("US", "CA") and california.name == "US-CA"
    # Thu, Fri (Christmas observed), Sat, Mon, the day after Thanksgiving (a California holiday, not federal)
    assert california.off_days(days + 3600).tolist() == [False, True, True, False, True]
    assert Holidays("US").off_days(days).tolist() == [False, True, True, False, False]
    assert off_days(days, None).tolist() == [False, False, True, False, False]  # no calendar: weekends only
    assert Holidays("DE").off_days(np.array([utc("2022-10-03")])).tolist() == [True]  # German Unity Day
    assert Holidays("DE").off_days(np.array([], dtype=np.int64)).tolist() == []
    with pytest.raises(ValueError, match="'XX'"):
        Holidays.parse("XX")
    with pytest.raises(ValueError, match="subdivision 'ZZ'"):
        Holidays.parse("US-ZZ")


@pytest.mark.parametrize(("region", "expected"), [
    ("US-CAL-CISO", "US-CA"), ("CISO", "US-CA"), ("ERCO", "US-TX"), ("US-TEX-ERCO", "US-TX"), ("PJM", "US"),
    ("US-MIDA-PJM", "US"), ("DE-LU", "DE"), ("SE-SE3", "SE"), ("ger", "DE"), ("fr", "FR"), ("GB", "GB"),
    ("servegen-m-mid", None), ("worldcup98", None),
])
def test_region_keys_map_to_their_holidays(region: str, expected: str | None) -> None:
    holidays = holidays_for_region(region)
    assert (holidays.name if holidays else None) == expected


def test_day_type_naive_forecasts_a_holiday_from_the_last_off_day() -> None:
    y = office_load(6, start_s=SUNDAY_S, noise=0.0)  # Sun (low), Mon-Thu (high); Friday is a holiday
    history, friday = y[:120], y[120:]
    plain = DayTypeNaive().fit(history, start_s=SUNDAY_S).predict(24).mean
    assert np.allclose(plain, history[-24:])  # a working Friday: Thursday
    holiday = DayTypeNaive().fit(history, start_s=SUNDAY_S, holidays=Holidays("US", "CA"))
    assert np.allclose(holiday.predict(24).mean, history[:24])  # an off day: Sunday
    assert not np.allclose(friday, history[:24])  # office_load knows no holidays: the truth is a weekday
    clone = pickle.loads(pickle.dumps(holiday))
    assert clone.holidays == Holidays("US", "CA") and np.allclose(clone.predict(24).mean, history[:24])


def test_auto_passes_the_holidays_to_its_members_and_through_a_worker_fit() -> None:
    y = office_load(5, start_s=SUNDAY_S, seed=2)
    model = fitting.load_blob(fitting.fit_blob("auto", y, 24, SUNDAY_S, Holidays("US", "CA")).blob)
    assert model.holidays == Holidays("US", "CA")
    assert all(member.holidays == Holidays("US", "CA") for member in model.members)
    assert make_model("auto").fit(y, start_s=SUNDAY_S).holidays is None


async def test_service_forecasts_a_holiday_of_a_ci_region_as_an_off_day(start_inprocess) -> None:
    svc = await start_inprocess(ForecasterSettings, build, forecast_model="day_type_naive", fit_history_hours=120)
    history = office_load(5, start_s=SUNDAY_S, noise=0.0)
    cisco = common_pb2.SeriesRef(kind=common_pb2.SERIES_KIND_CARBON_INTENSITY, key="US-CAL-CISO",
                                 carbon_signal=common_pb2.CARBON_SIGNAL_DIRECT)
    async with grpc.aio.insecure_channel(svc.address) as channel:
        stub = forecaster_pb2_grpc.ForecasterServiceStub(channel)
        await ingest(stub, history, start_s=SUNDAY_S, series=cisco)
        await wait_for_fit(stub, series=cisco)
        reply = await stub.GetForecast(forecaster_pb2.GetForecastRequest(series=cisco, horizon_steps=24))
    mean = np.array([p.mean for p in reply.forecast.points])
    assert np.allclose(mean, history[:24], rtol=1e-6)  # Christmas observed (Friday) forecast from the Sunday


async def test_service_rejects_an_unknown_load_holiday_country(start_inprocess) -> None:
    with pytest.raises(ValueError, match="'XX'"):
        await start_inprocess(ForecasterSettings, build, load_holidays="XX")
