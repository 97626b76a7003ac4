import datetime

from google.protobuf import timestamp_pb2 as _timestamp_pb2
from greenserve.v1 import common_pb2 as _common_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class SeriesGap(_message.Message):
    __slots__ = ("start", "missing_points")
    START_FIELD_NUMBER: _ClassVar[int]
    MISSING_POINTS_FIELD_NUMBER: _ClassVar[int]
    start: _timestamp_pb2.Timestamp
    missing_points: int
    def __init__(self, start: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., missing_points: _Optional[int] = ...) -> None: ...

class IngestPointsRequest(_message.Message):
    __slots__ = ("series", "resolution_s", "points", "source")
    SERIES_FIELD_NUMBER: _ClassVar[int]
    RESOLUTION_S_FIELD_NUMBER: _ClassVar[int]
    POINTS_FIELD_NUMBER: _ClassVar[int]
    SOURCE_FIELD_NUMBER: _ClassVar[int]
    series: _common_pb2.SeriesRef
    resolution_s: int
    points: _containers.RepeatedCompositeFieldContainer[_common_pb2.TimeSeriesPoint]
    source: str
    def __init__(self, series: _Optional[_Union[_common_pb2.SeriesRef, _Mapping]] = ..., resolution_s: _Optional[int] = ..., points: _Optional[_Iterable[_Union[_common_pb2.TimeSeriesPoint, _Mapping]]] = ..., source: _Optional[str] = ...) -> None: ...

class IngestPointsResponse(_message.Message):
    __slots__ = ("inserted_points", "duplicate_points", "gaps")
    INSERTED_POINTS_FIELD_NUMBER: _ClassVar[int]
    DUPLICATE_POINTS_FIELD_NUMBER: _ClassVar[int]
    GAPS_FIELD_NUMBER: _ClassVar[int]
    inserted_points: int
    duplicate_points: int
    gaps: _containers.RepeatedCompositeFieldContainer[SeriesGap]
    def __init__(self, inserted_points: _Optional[int] = ..., duplicate_points: _Optional[int] = ..., gaps: _Optional[_Iterable[_Union[SeriesGap, _Mapping]]] = ...) -> None: ...

class StreamLoadRequest(_message.Message):
    __slots__ = ("pool", "time", "window_s", "requests", "input_tokens", "output_tokens")
    POOL_FIELD_NUMBER: _ClassVar[int]
    TIME_FIELD_NUMBER: _ClassVar[int]
    WINDOW_S_FIELD_NUMBER: _ClassVar[int]
    REQUESTS_FIELD_NUMBER: _ClassVar[int]
    INPUT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    OUTPUT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    pool: str
    time: _timestamp_pb2.Timestamp
    window_s: float
    requests: int
    input_tokens: int
    output_tokens: int
    def __init__(self, pool: _Optional[str] = ..., time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., window_s: _Optional[float] = ..., requests: _Optional[int] = ..., input_tokens: _Optional[int] = ..., output_tokens: _Optional[int] = ...) -> None: ...

class StreamLoadResponse(_message.Message):
    __slots__ = ("accepted_samples",)
    ACCEPTED_SAMPLES_FIELD_NUMBER: _ClassVar[int]
    accepted_samples: int
    def __init__(self, accepted_samples: _Optional[int] = ...) -> None: ...

class GetPointsRequest(_message.Message):
    __slots__ = ("series", "start", "end")
    SERIES_FIELD_NUMBER: _ClassVar[int]
    START_FIELD_NUMBER: _ClassVar[int]
    END_FIELD_NUMBER: _ClassVar[int]
    series: _common_pb2.SeriesRef
    start: _timestamp_pb2.Timestamp
    end: _timestamp_pb2.Timestamp
    def __init__(self, series: _Optional[_Union[_common_pb2.SeriesRef, _Mapping]] = ..., start: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., end: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ...) -> None: ...

class GetPointsResponse(_message.Message):
    __slots__ = ("points", "resolution_s")
    POINTS_FIELD_NUMBER: _ClassVar[int]
    RESOLUTION_S_FIELD_NUMBER: _ClassVar[int]
    points: _containers.RepeatedCompositeFieldContainer[_common_pb2.TimeSeriesPoint]
    resolution_s: int
    def __init__(self, points: _Optional[_Iterable[_Union[_common_pb2.TimeSeriesPoint, _Mapping]]] = ..., resolution_s: _Optional[int] = ...) -> None: ...

class ListSeriesRequest(_message.Message):
    __slots__ = ("kind",)
    KIND_FIELD_NUMBER: _ClassVar[int]
    kind: _common_pb2.SeriesKind
    def __init__(self, kind: _Optional[_Union[_common_pb2.SeriesKind, str]] = ...) -> None: ...

class SeriesInfo(_message.Message):
    __slots__ = ("series", "resolution_s", "first", "last", "point_count", "model")
    SERIES_FIELD_NUMBER: _ClassVar[int]
    RESOLUTION_S_FIELD_NUMBER: _ClassVar[int]
    FIRST_FIELD_NUMBER: _ClassVar[int]
    LAST_FIELD_NUMBER: _ClassVar[int]
    POINT_COUNT_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    series: _common_pb2.SeriesRef
    resolution_s: int
    first: _timestamp_pb2.Timestamp
    last: _timestamp_pb2.Timestamp
    point_count: int
    model: str
    def __init__(self, series: _Optional[_Union[_common_pb2.SeriesRef, _Mapping]] = ..., resolution_s: _Optional[int] = ..., first: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., last: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., point_count: _Optional[int] = ..., model: _Optional[str] = ...) -> None: ...

class ListSeriesResponse(_message.Message):
    __slots__ = ("series",)
    SERIES_FIELD_NUMBER: _ClassVar[int]
    series: _containers.RepeatedCompositeFieldContainer[SeriesInfo]
    def __init__(self, series: _Optional[_Iterable[_Union[SeriesInfo, _Mapping]]] = ...) -> None: ...

class GetCurrentCarbonIntensityRequest(_message.Message):
    __slots__ = ("region", "carbon_signal")
    REGION_FIELD_NUMBER: _ClassVar[int]
    CARBON_SIGNAL_FIELD_NUMBER: _ClassVar[int]
    region: str
    carbon_signal: _common_pb2.CarbonSignal
    def __init__(self, region: _Optional[str] = ..., carbon_signal: _Optional[_Union[_common_pb2.CarbonSignal, str]] = ...) -> None: ...

class GetCurrentCarbonIntensityResponse(_message.Message):
    __slots__ = ("carbon_intensity",)
    CARBON_INTENSITY_FIELD_NUMBER: _ClassVar[int]
    carbon_intensity: _common_pb2.CarbonIntensity
    def __init__(self, carbon_intensity: _Optional[_Union[_common_pb2.CarbonIntensity, _Mapping]] = ...) -> None: ...

class GetForecastRequest(_message.Message):
    __slots__ = ("series", "horizon_steps", "interval_coverage_fraction")
    SERIES_FIELD_NUMBER: _ClassVar[int]
    HORIZON_STEPS_FIELD_NUMBER: _ClassVar[int]
    INTERVAL_COVERAGE_FRACTION_FIELD_NUMBER: _ClassVar[int]
    series: _common_pb2.SeriesRef
    horizon_steps: int
    interval_coverage_fraction: float
    def __init__(self, series: _Optional[_Union[_common_pb2.SeriesRef, _Mapping]] = ..., horizon_steps: _Optional[int] = ..., interval_coverage_fraction: _Optional[float] = ...) -> None: ...

class GetForecastResponse(_message.Message):
    __slots__ = ("forecast",)
    FORECAST_FIELD_NUMBER: _ClassVar[int]
    forecast: _common_pb2.Forecast
    def __init__(self, forecast: _Optional[_Union[_common_pb2.Forecast, _Mapping]] = ...) -> None: ...

class BacktestRequest(_message.Message):
    __slots__ = ("series", "inline", "history_hours", "horizon_hours", "days", "model")
    SERIES_FIELD_NUMBER: _ClassVar[int]
    INLINE_FIELD_NUMBER: _ClassVar[int]
    HISTORY_HOURS_FIELD_NUMBER: _ClassVar[int]
    HORIZON_HOURS_FIELD_NUMBER: _ClassVar[int]
    DAYS_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    series: _common_pb2.SeriesRef
    inline: InlineSeries
    history_hours: int
    horizon_hours: int
    days: int
    model: str
    def __init__(self, series: _Optional[_Union[_common_pb2.SeriesRef, _Mapping]] = ..., inline: _Optional[_Union[InlineSeries, _Mapping]] = ..., history_hours: _Optional[int] = ..., horizon_hours: _Optional[int] = ..., days: _Optional[int] = ..., model: _Optional[str] = ...) -> None: ...

class InlineSeries(_message.Message):
    __slots__ = ("points", "name")
    POINTS_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    points: _containers.RepeatedCompositeFieldContainer[_common_pb2.TimeSeriesPoint]
    name: str
    def __init__(self, points: _Optional[_Iterable[_Union[_common_pb2.TimeSeriesPoint, _Mapping]]] = ..., name: _Optional[str] = ...) -> None: ...

class BacktestDay(_message.Message):
    __slots__ = ("day", "mape_percent", "naive_mape_percent", "fit_s", "interval_coverage_fraction")
    DAY_FIELD_NUMBER: _ClassVar[int]
    MAPE_PERCENT_FIELD_NUMBER: _ClassVar[int]
    NAIVE_MAPE_PERCENT_FIELD_NUMBER: _ClassVar[int]
    FIT_S_FIELD_NUMBER: _ClassVar[int]
    INTERVAL_COVERAGE_FRACTION_FIELD_NUMBER: _ClassVar[int]
    day: _timestamp_pb2.Timestamp
    mape_percent: float
    naive_mape_percent: float
    fit_s: float
    interval_coverage_fraction: float
    def __init__(self, day: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., mape_percent: _Optional[float] = ..., naive_mape_percent: _Optional[float] = ..., fit_s: _Optional[float] = ..., interval_coverage_fraction: _Optional[float] = ...) -> None: ...

class BacktestResponse(_message.Message):
    __slots__ = ("mape_percent", "naive_mape_percent", "points", "median_fit_s", "model", "days", "interval_coverage_fraction")
    MAPE_PERCENT_FIELD_NUMBER: _ClassVar[int]
    NAIVE_MAPE_PERCENT_FIELD_NUMBER: _ClassVar[int]
    POINTS_FIELD_NUMBER: _ClassVar[int]
    MEDIAN_FIT_S_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    DAYS_FIELD_NUMBER: _ClassVar[int]
    INTERVAL_COVERAGE_FRACTION_FIELD_NUMBER: _ClassVar[int]
    mape_percent: float
    naive_mape_percent: float
    points: int
    median_fit_s: float
    model: str
    days: _containers.RepeatedCompositeFieldContainer[BacktestDay]
    interval_coverage_fraction: float
    def __init__(self, mape_percent: _Optional[float] = ..., naive_mape_percent: _Optional[float] = ..., points: _Optional[int] = ..., median_fit_s: _Optional[float] = ..., model: _Optional[str] = ..., days: _Optional[_Iterable[_Union[BacktestDay, _Mapping]]] = ..., interval_coverage_fraction: _Optional[float] = ...) -> None: ...
