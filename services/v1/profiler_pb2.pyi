import datetime

from google.protobuf import timestamp_pb2 as _timestamp_pb2
from greenserve.v1 import common_pb2 as _common_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class SweepBackend(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    SWEEP_BACKEND_UNSPECIFIED: _ClassVar[SweepBackend]
    SWEEP_BACKEND_ENGINE: _ClassVar[SweepBackend]
    SWEEP_BACKEND_SIMULATOR: _ClassVar[SweepBackend]

class SweepState(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    SWEEP_STATE_UNSPECIFIED: _ClassVar[SweepState]
    SWEEP_STATE_PENDING: _ClassVar[SweepState]
    SWEEP_STATE_RUNNING: _ClassVar[SweepState]
    SWEEP_STATE_SUCCEEDED: _ClassVar[SweepState]
    SWEEP_STATE_FAILED: _ClassVar[SweepState]
    SWEEP_STATE_CANCELLED: _ClassVar[SweepState]
SWEEP_BACKEND_UNSPECIFIED: SweepBackend
SWEEP_BACKEND_ENGINE: SweepBackend
SWEEP_BACKEND_SIMULATOR: SweepBackend
SWEEP_STATE_UNSPECIFIED: SweepState
SWEEP_STATE_PENDING: SweepState
SWEEP_STATE_RUNNING: SweepState
SWEEP_STATE_SUCCEEDED: SweepState
SWEEP_STATE_FAILED: SweepState
SWEEP_STATE_CANCELLED: SweepState

class SweepSpec(_message.Message):
    __slots__ = ("configs", "request_rates_per_s", "workload", "slo", "backend", "engine_url", "point_duration_s", "seed", "method", "cache_server_id", "engine_modelled_s_per_wall_s", "model_version")
    CONFIGS_FIELD_NUMBER: _ClassVar[int]
    REQUEST_RATES_PER_S_FIELD_NUMBER: _ClassVar[int]
    WORKLOAD_FIELD_NUMBER: _ClassVar[int]
    SLO_FIELD_NUMBER: _ClassVar[int]
    BACKEND_FIELD_NUMBER: _ClassVar[int]
    ENGINE_URL_FIELD_NUMBER: _ClassVar[int]
    POINT_DURATION_S_FIELD_NUMBER: _ClassVar[int]
    SEED_FIELD_NUMBER: _ClassVar[int]
    METHOD_FIELD_NUMBER: _ClassVar[int]
    CACHE_SERVER_ID_FIELD_NUMBER: _ClassVar[int]
    ENGINE_MODELLED_S_PER_WALL_S_FIELD_NUMBER: _ClassVar[int]
    MODEL_VERSION_FIELD_NUMBER: _ClassVar[int]
    configs: _containers.RepeatedCompositeFieldContainer[_common_pb2.ProfileConfig]
    request_rates_per_s: _containers.RepeatedScalarFieldContainer[float]
    workload: str
    slo: _common_pb2.Slo
    backend: SweepBackend
    engine_url: str
    point_duration_s: float
    seed: int
    method: _common_pb2.ProfileMethod
    cache_server_id: str
    engine_modelled_s_per_wall_s: float
    model_version: str
    def __init__(self, configs: _Optional[_Iterable[_Union[_common_pb2.ProfileConfig, _Mapping]]] = ..., request_rates_per_s: _Optional[_Iterable[float]] = ..., workload: _Optional[str] = ..., slo: _Optional[_Union[_common_pb2.Slo, _Mapping]] = ..., backend: _Optional[_Union[SweepBackend, str]] = ..., engine_url: _Optional[str] = ..., point_duration_s: _Optional[float] = ..., seed: _Optional[int] = ..., method: _Optional[_Union[_common_pb2.ProfileMethod, _Mapping]] = ..., cache_server_id: _Optional[str] = ..., engine_modelled_s_per_wall_s: _Optional[float] = ..., model_version: _Optional[str] = ...) -> None: ...

class Sweep(_message.Message):
    __slots__ = ("id", "spec", "state", "done_points", "total_points", "error", "profile_ids", "created_at", "updated_at", "eta_s", "skipped_points", "notes")
    ID_FIELD_NUMBER: _ClassVar[int]
    SPEC_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    DONE_POINTS_FIELD_NUMBER: _ClassVar[int]
    TOTAL_POINTS_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    PROFILE_IDS_FIELD_NUMBER: _ClassVar[int]
    CREATED_AT_FIELD_NUMBER: _ClassVar[int]
    UPDATED_AT_FIELD_NUMBER: _ClassVar[int]
    ETA_S_FIELD_NUMBER: _ClassVar[int]
    SKIPPED_POINTS_FIELD_NUMBER: _ClassVar[int]
    NOTES_FIELD_NUMBER: _ClassVar[int]
    id: str
    spec: SweepSpec
    state: SweepState
    done_points: int
    total_points: int
    error: str
    profile_ids: _containers.RepeatedScalarFieldContainer[str]
    created_at: _timestamp_pb2.Timestamp
    updated_at: _timestamp_pb2.Timestamp
    eta_s: float
    skipped_points: int
    notes: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, id: _Optional[str] = ..., spec: _Optional[_Union[SweepSpec, _Mapping]] = ..., state: _Optional[_Union[SweepState, str]] = ..., done_points: _Optional[int] = ..., total_points: _Optional[int] = ..., error: _Optional[str] = ..., profile_ids: _Optional[_Iterable[str]] = ..., created_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., updated_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., eta_s: _Optional[float] = ..., skipped_points: _Optional[int] = ..., notes: _Optional[_Iterable[str]] = ...) -> None: ...

class StartSweepRequest(_message.Message):
    __slots__ = ("spec",)
    SPEC_FIELD_NUMBER: _ClassVar[int]
    spec: SweepSpec
    def __init__(self, spec: _Optional[_Union[SweepSpec, _Mapping]] = ...) -> None: ...

class StartSweepResponse(_message.Message):
    __slots__ = ("sweep",)
    SWEEP_FIELD_NUMBER: _ClassVar[int]
    sweep: Sweep
    def __init__(self, sweep: _Optional[_Union[Sweep, _Mapping]] = ...) -> None: ...

class GetSweepRequest(_message.Message):
    __slots__ = ("sweep_id",)
    SWEEP_ID_FIELD_NUMBER: _ClassVar[int]
    sweep_id: str
    def __init__(self, sweep_id: _Optional[str] = ...) -> None: ...

class GetSweepResponse(_message.Message):
    __slots__ = ("sweep",)
    SWEEP_FIELD_NUMBER: _ClassVar[int]
    sweep: Sweep
    def __init__(self, sweep: _Optional[_Union[Sweep, _Mapping]] = ...) -> None: ...

class WatchSweepRequest(_message.Message):
    __slots__ = ("sweep_id",)
    SWEEP_ID_FIELD_NUMBER: _ClassVar[int]
    sweep_id: str
    def __init__(self, sweep_id: _Optional[str] = ...) -> None: ...

class WatchSweepResponse(_message.Message):
    __slots__ = ("sweep", "point")
    SWEEP_FIELD_NUMBER: _ClassVar[int]
    POINT_FIELD_NUMBER: _ClassVar[int]
    sweep: Sweep
    point: _common_pb2.ProfilePoint
    def __init__(self, sweep: _Optional[_Union[Sweep, _Mapping]] = ..., point: _Optional[_Union[_common_pb2.ProfilePoint, _Mapping]] = ...) -> None: ...

class CancelSweepRequest(_message.Message):
    __slots__ = ("sweep_id",)
    SWEEP_ID_FIELD_NUMBER: _ClassVar[int]
    sweep_id: str
    def __init__(self, sweep_id: _Optional[str] = ...) -> None: ...

class CancelSweepResponse(_message.Message):
    __slots__ = ("sweep",)
    SWEEP_FIELD_NUMBER: _ClassVar[int]
    sweep: Sweep
    def __init__(self, sweep: _Optional[_Union[Sweep, _Mapping]] = ...) -> None: ...

class ListSweepsRequest(_message.Message):
    __slots__ = ("page_size", "page_token")
    PAGE_SIZE_FIELD_NUMBER: _ClassVar[int]
    PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    page_size: int
    page_token: str
    def __init__(self, page_size: _Optional[int] = ..., page_token: _Optional[str] = ...) -> None: ...

class ListSweepsResponse(_message.Message):
    __slots__ = ("sweeps", "next_page_token")
    SWEEPS_FIELD_NUMBER: _ClassVar[int]
    NEXT_PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    sweeps: _containers.RepeatedCompositeFieldContainer[Sweep]
    next_page_token: str
    def __init__(self, sweeps: _Optional[_Iterable[_Union[Sweep, _Mapping]]] = ..., next_page_token: _Optional[str] = ...) -> None: ...

class GetProfileRequest(_message.Message):
    __slots__ = ("config_key", "version")
    CONFIG_KEY_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    config_key: str
    version: int
    def __init__(self, config_key: _Optional[str] = ..., version: _Optional[int] = ...) -> None: ...

class GetProfileResponse(_message.Message):
    __slots__ = ("profile",)
    PROFILE_FIELD_NUMBER: _ClassVar[int]
    profile: _common_pb2.Profile
    def __init__(self, profile: _Optional[_Union[_common_pb2.Profile, _Mapping]] = ...) -> None: ...

class ListProfilesRequest(_message.Message):
    __slots__ = ("model", "hardware", "latest_only", "source", "workload", "page_size", "page_token")
    MODEL_FIELD_NUMBER: _ClassVar[int]
    HARDWARE_FIELD_NUMBER: _ClassVar[int]
    LATEST_ONLY_FIELD_NUMBER: _ClassVar[int]
    SOURCE_FIELD_NUMBER: _ClassVar[int]
    WORKLOAD_FIELD_NUMBER: _ClassVar[int]
    PAGE_SIZE_FIELD_NUMBER: _ClassVar[int]
    PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    model: str
    hardware: str
    latest_only: bool
    source: _common_pb2.ProfileSource
    workload: str
    page_size: int
    page_token: str
    def __init__(self, model: _Optional[str] = ..., hardware: _Optional[str] = ..., latest_only: _Optional[bool] = ..., source: _Optional[_Union[_common_pb2.ProfileSource, str]] = ..., workload: _Optional[str] = ..., page_size: _Optional[int] = ..., page_token: _Optional[str] = ...) -> None: ...

class ListProfilesResponse(_message.Message):
    __slots__ = ("profiles", "next_page_token")
    PROFILES_FIELD_NUMBER: _ClassVar[int]
    NEXT_PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    profiles: _containers.RepeatedCompositeFieldContainer[_common_pb2.Profile]
    next_page_token: str
    def __init__(self, profiles: _Optional[_Iterable[_Union[_common_pb2.Profile, _Mapping]]] = ..., next_page_token: _Optional[str] = ...) -> None: ...

class PutProfileRequest(_message.Message):
    __slots__ = ("profile",)
    PROFILE_FIELD_NUMBER: _ClassVar[int]
    profile: _common_pb2.Profile
    def __init__(self, profile: _Optional[_Union[_common_pb2.Profile, _Mapping]] = ...) -> None: ...

class PutProfileResponse(_message.Message):
    __slots__ = ("profile",)
    PROFILE_FIELD_NUMBER: _ClassVar[int]
    profile: _common_pb2.Profile
    def __init__(self, profile: _Optional[_Union[_common_pb2.Profile, _Mapping]] = ...) -> None: ...

class CalibrateRequest(_message.Message):
    __slots__ = ("config_key", "version")
    CONFIG_KEY_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    config_key: str
    version: int
    def __init__(self, config_key: _Optional[str] = ..., version: _Optional[int] = ...) -> None: ...

class CalibrationCheck(_message.Message):
    __slots__ = ("request_rate_per_s", "quantity", "measured_s", "default_model_s", "calibrated_model_s")
    REQUEST_RATE_PER_S_FIELD_NUMBER: _ClassVar[int]
    QUANTITY_FIELD_NUMBER: _ClassVar[int]
    MEASURED_S_FIELD_NUMBER: _ClassVar[int]
    DEFAULT_MODEL_S_FIELD_NUMBER: _ClassVar[int]
    CALIBRATED_MODEL_S_FIELD_NUMBER: _ClassVar[int]
    request_rate_per_s: float
    quantity: str
    measured_s: float
    default_model_s: float
    calibrated_model_s: float
    def __init__(self, request_rate_per_s: _Optional[float] = ..., quantity: _Optional[str] = ..., measured_s: _Optional[float] = ..., default_model_s: _Optional[float] = ..., calibrated_model_s: _Optional[float] = ...) -> None: ...

class ModelVersion(_message.Message):
    __slots__ = ("name", "base_profile", "parameters", "calibrated_from", "rms_relative_error", "checks", "created_at")
    class ParametersEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: float
        def __init__(self, key: _Optional[str] = ..., value: _Optional[float] = ...) -> None: ...
    class RmsRelativeErrorEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: float
        def __init__(self, key: _Optional[str] = ..., value: _Optional[float] = ...) -> None: ...
    NAME_FIELD_NUMBER: _ClassVar[int]
    BASE_PROFILE_FIELD_NUMBER: _ClassVar[int]
    PARAMETERS_FIELD_NUMBER: _ClassVar[int]
    CALIBRATED_FROM_FIELD_NUMBER: _ClassVar[int]
    RMS_RELATIVE_ERROR_FIELD_NUMBER: _ClassVar[int]
    CHECKS_FIELD_NUMBER: _ClassVar[int]
    CREATED_AT_FIELD_NUMBER: _ClassVar[int]
    name: str
    base_profile: str
    parameters: _containers.ScalarMap[str, float]
    calibrated_from: str
    rms_relative_error: _containers.ScalarMap[str, float]
    checks: _containers.RepeatedCompositeFieldContainer[CalibrationCheck]
    created_at: _timestamp_pb2.Timestamp
    def __init__(self, name: _Optional[str] = ..., base_profile: _Optional[str] = ..., parameters: _Optional[_Mapping[str, float]] = ..., calibrated_from: _Optional[str] = ..., rms_relative_error: _Optional[_Mapping[str, float]] = ..., checks: _Optional[_Iterable[_Union[CalibrationCheck, _Mapping]]] = ..., created_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ...) -> None: ...

class CalibrateResponse(_message.Message):
    __slots__ = ("model_version",)
    MODEL_VERSION_FIELD_NUMBER: _ClassVar[int]
    model_version: ModelVersion
    def __init__(self, model_version: _Optional[_Union[ModelVersion, _Mapping]] = ...) -> None: ...

class ListModelVersionsRequest(_message.Message):
    __slots__ = ("base_profile",)
    BASE_PROFILE_FIELD_NUMBER: _ClassVar[int]
    base_profile: str
    def __init__(self, base_profile: _Optional[str] = ...) -> None: ...

class ListModelVersionsResponse(_message.Message):
    __slots__ = ("model_versions",)
    MODEL_VERSIONS_FIELD_NUMBER: _ClassVar[int]
    model_versions: _containers.RepeatedCompositeFieldContainer[ModelVersion]
    def __init__(self, model_versions: _Optional[_Iterable[_Union[ModelVersion, _Mapping]]] = ...) -> None: ...
