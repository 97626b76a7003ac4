import datetime

from google.protobuf import timestamp_pb2 as _timestamp_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class Unit(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    UNIT_UNSPECIFIED: _ClassVar[Unit]
    UNIT_G_PER_KWH: _ClassVar[Unit]
    UNIT_REQUESTS_PER_S: _ClassVar[Unit]
    UNIT_INPUT_TOKENS_PER_S: _ClassVar[Unit]
    UNIT_OUTPUT_TOKENS_PER_S: _ClassVar[Unit]

class SeriesKind(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    SERIES_KIND_UNSPECIFIED: _ClassVar[SeriesKind]
    SERIES_KIND_CARBON_INTENSITY: _ClassVar[SeriesKind]
    SERIES_KIND_LOAD: _ClassVar[SeriesKind]

class CarbonSignal(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    CARBON_SIGNAL_UNSPECIFIED: _ClassVar[CarbonSignal]
    CARBON_SIGNAL_DIRECT: _ClassVar[CarbonSignal]
    CARBON_SIGNAL_LIFECYCLE: _ClassVar[CarbonSignal]

class ComponentKind(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    COMPONENT_KIND_UNSPECIFIED: _ClassVar[ComponentKind]
    COMPONENT_KIND_GPU: _ClassVar[ComponentKind]
    COMPONENT_KIND_CPU: _ClassVar[ComponentKind]
    COMPONENT_KIND_DRAM: _ClassVar[ComponentKind]
    COMPONENT_KIND_SSD: _ClassVar[ComponentKind]

class GpuModel(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    GPU_MODEL_UNSPECIFIED: _ClassVar[GpuModel]
    GPU_MODEL_A100_40GB: _ClassVar[GpuModel]
    GPU_MODEL_A100_80GB: _ClassVar[GpuModel]
    GPU_MODEL_H100_80GB: _ClassVar[GpuModel]
    GPU_MODEL_H200_141GB: _ClassVar[GpuModel]
    GPU_MODEL_OTHER: _ClassVar[GpuModel]

class EngineKind(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    ENGINE_KIND_UNSPECIFIED: _ClassVar[EngineKind]
    ENGINE_KIND_VLLM: _ClassVar[EngineKind]
    ENGINE_KIND_SIMULATED: _ClassVar[EngineKind]

class EngineState(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    ENGINE_STATE_UNSPECIFIED: _ClassVar[EngineState]
    ENGINE_STATE_HEALTHY: _ClassVar[EngineState]
    ENGINE_STATE_DRAINING: _ClassVar[EngineState]
    ENGINE_STATE_DRAINED: _ClassVar[EngineState]
    ENGINE_STATE_EJECTED: _ClassVar[EngineState]
    ENGINE_STATE_STALE: _ClassVar[EngineState]
    ENGINE_STATE_SLEEPING: _ClassVar[EngineState]
    ENGINE_STATE_WAKING: _ClassVar[EngineState]

class ServingMode(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    SERVING_MODE_UNSPECIFIED: _ClassVar[ServingMode]
    SERVING_MODE_STANDALONE: _ClassVar[ServingMode]
    SERVING_MODE_SPEC_DECODE: _ClassVar[ServingMode]
    SERVING_MODE_DISAGGREGATED: _ClassVar[ServingMode]
    SERVING_MODE_DISAGGREGATED_SPEC_DECODE: _ClassVar[ServingMode]

class CacheTier(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    CACHE_TIER_UNSPECIFIED: _ClassVar[CacheTier]
    CACHE_TIER_HBM: _ClassVar[CacheTier]
    CACHE_TIER_DRAM: _ClassVar[CacheTier]
    CACHE_TIER_DISK: _ClassVar[CacheTier]

class ProfileSource(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    PROFILE_SOURCE_UNSPECIFIED: _ClassVar[ProfileSource]
    PROFILE_SOURCE_MEASURED: _ClassVar[ProfileSource]
    PROFILE_SOURCE_SIMULATED: _ClassVar[ProfileSource]
    PROFILE_SOURCE_PUBLISHED: _ClassVar[ProfileSource]

class KvConnectorState(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    KV_CONNECTOR_STATE_UNSPECIFIED: _ClassVar[KvConnectorState]
    KV_CONNECTOR_STATE_NONE: _ClassVar[KvConnectorState]
    KV_CONNECTOR_STATE_WORKING: _ClassVar[KvConnectorState]
    KV_CONNECTOR_STATE_UNKNOWN: _ClassVar[KvConnectorState]
    KV_CONNECTOR_STATE_DEGRADED: _ClassVar[KvConnectorState]

class LadderStopRule(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    LADDER_STOP_RULE_UNSPECIFIED: _ClassVar[LadderStopRule]
    LADDER_STOP_RULE_STOP_BELOW_TARGET: _ClassVar[LadderStopRule]
    LADDER_STOP_RULE_FULL_LADDER: _ClassVar[LadderStopRule]

class PlanState(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    PLAN_STATE_UNSPECIFIED: _ClassVar[PlanState]
    PLAN_STATE_PROPOSED: _ClassVar[PlanState]
    PLAN_STATE_ACTIVE: _ClassVar[PlanState]
    PLAN_STATE_SUPERSEDED: _ClassVar[PlanState]

class EngineRunState(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    ENGINE_RUN_STATE_UNSPECIFIED: _ClassVar[EngineRunState]
    ENGINE_RUN_STATE_AWAKE: _ClassVar[EngineRunState]
    ENGINE_RUN_STATE_SLEEPING: _ClassVar[EngineRunState]

class ErrorReason(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    ERROR_REASON_UNSPECIFIED: _ClassVar[ErrorReason]
    ERROR_REASON_INVALID_FIELD: _ClassVar[ErrorReason]
    ERROR_REASON_NOT_FOUND: _ClassVar[ErrorReason]
    ERROR_REASON_FAILED_PRECONDITION: _ClassVar[ErrorReason]
    ERROR_REASON_DEPENDENCY_UNAVAILABLE: _ClassVar[ErrorReason]
    ERROR_REASON_RESOURCE_EXHAUSTED: _ClassVar[ErrorReason]
UNIT_UNSPECIFIED: Unit
UNIT_G_PER_KWH: Unit
UNIT_REQUESTS_PER_S: Unit
UNIT_INPUT_TOKENS_PER_S: Unit
UNIT_OUTPUT_TOKENS_PER_S: Unit
SERIES_KIND_UNSPECIFIED: SeriesKind
SERIES_KIND_CARBON_INTENSITY: SeriesKind
SERIES_KIND_LOAD: SeriesKind
CARBON_SIGNAL_UNSPECIFIED: CarbonSignal
CARBON_SIGNAL_DIRECT: CarbonSignal
CARBON_SIGNAL_LIFECYCLE: CarbonSignal
COMPONENT_KIND_UNSPECIFIED: ComponentKind
COMPONENT_KIND_GPU: ComponentKind
COMPONENT_KIND_CPU: ComponentKind
COMPONENT_KIND_DRAM: ComponentKind
COMPONENT_KIND_SSD: ComponentKind
GPU_MODEL_UNSPECIFIED: GpuModel
GPU_MODEL_A100_40GB: GpuModel
GPU_MODEL_A100_80GB: GpuModel
GPU_MODEL_H100_80GB: GpuModel
GPU_MODEL_H200_141GB: GpuModel
GPU_MODEL_OTHER: GpuModel
ENGINE_KIND_UNSPECIFIED: EngineKind
ENGINE_KIND_VLLM: EngineKind
ENGINE_KIND_SIMULATED: EngineKind
ENGINE_STATE_UNSPECIFIED: EngineState
ENGINE_STATE_HEALTHY: EngineState
ENGINE_STATE_DRAINING: EngineState
ENGINE_STATE_DRAINED: EngineState
ENGINE_STATE_EJECTED: EngineState
ENGINE_STATE_STALE: EngineState
ENGINE_STATE_SLEEPING: EngineState
ENGINE_STATE_WAKING: EngineState
SERVING_MODE_UNSPECIFIED: ServingMode
SERVING_MODE_STANDALONE: ServingMode
SERVING_MODE_SPEC_DECODE: ServingMode
SERVING_MODE_DISAGGREGATED: ServingMode
SERVING_MODE_DISAGGREGATED_SPEC_DECODE: ServingMode
CACHE_TIER_UNSPECIFIED: CacheTier
CACHE_TIER_HBM: CacheTier
CACHE_TIER_DRAM: CacheTier
CACHE_TIER_DISK: CacheTier
PROFILE_SOURCE_UNSPECIFIED: ProfileSource
PROFILE_SOURCE_MEASURED: ProfileSource
PROFILE_SOURCE_SIMULATED: ProfileSource
PROFILE_SOURCE_PUBLISHED: ProfileSource
KV_CONNECTOR_STATE_UNSPECIFIED: KvConnectorState
KV_CONNECTOR_STATE_NONE: KvConnectorState
KV_CONNECTOR_STATE_WORKING: KvConnectorState
KV_CONNECTOR_STATE_UNKNOWN: KvConnectorState
KV_CONNECTOR_STATE_DEGRADED: KvConnectorState
LADDER_STOP_RULE_UNSPECIFIED: LadderStopRule
LADDER_STOP_RULE_STOP_BELOW_TARGET: LadderStopRule
LADDER_STOP_RULE_FULL_LADDER: LadderStopRule
PLAN_STATE_UNSPECIFIED: PlanState
PLAN_STATE_PROPOSED: PlanState
PLAN_STATE_ACTIVE: PlanState
PLAN_STATE_SUPERSEDED: PlanState
ENGINE_RUN_STATE_UNSPECIFIED: EngineRunState
ENGINE_RUN_STATE_AWAKE: EngineRunState
ENGINE_RUN_STATE_SLEEPING: EngineRunState
ERROR_REASON_UNSPECIFIED: ErrorReason
ERROR_REASON_INVALID_FIELD: ErrorReason
ERROR_REASON_NOT_FOUND: ErrorReason
ERROR_REASON_FAILED_PRECONDITION: ErrorReason
ERROR_REASON_DEPENDENCY_UNAVAILABLE: ErrorReason
ERROR_REASON_RESOURCE_EXHAUSTED: ErrorReason

class SeriesRef(_message.Message):
    __slots__ = ("kind", "key", "carbon_signal", "unit")
    KIND_FIELD_NUMBER: _ClassVar[int]
    KEY_FIELD_NUMBER: _ClassVar[int]
    CARBON_SIGNAL_FIELD_NUMBER: _ClassVar[int]
    UNIT_FIELD_NUMBER: _ClassVar[int]
    kind: SeriesKind
    key: str
    carbon_signal: CarbonSignal
    unit: Unit
    def __init__(self, kind: _Optional[_Union[SeriesKind, str]] = ..., key: _Optional[str] = ..., carbon_signal: _Optional[_Union[CarbonSignal, str]] = ..., unit: _Optional[_Union[Unit, str]] = ...) -> None: ...

class TimeSeriesPoint(_message.Message):
    __slots__ = ("time", "value")
    TIME_FIELD_NUMBER: _ClassVar[int]
    VALUE_FIELD_NUMBER: _ClassVar[int]
    time: _timestamp_pb2.Timestamp
    value: float
    def __init__(self, time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., value: _Optional[float] = ...) -> None: ...

class CarbonIntensity(_message.Message):
    __slots__ = ("region", "carbon_signal", "ci_g_per_kwh", "time", "forecast")
    REGION_FIELD_NUMBER: _ClassVar[int]
    CARBON_SIGNAL_FIELD_NUMBER: _ClassVar[int]
    CI_G_PER_KWH_FIELD_NUMBER: _ClassVar[int]
    TIME_FIELD_NUMBER: _ClassVar[int]
    FORECAST_FIELD_NUMBER: _ClassVar[int]
    region: str
    carbon_signal: CarbonSignal
    ci_g_per_kwh: float
    time: _timestamp_pb2.Timestamp
    forecast: bool
    def __init__(self, region: _Optional[str] = ..., carbon_signal: _Optional[_Union[CarbonSignal, str]] = ..., ci_g_per_kwh: _Optional[float] = ..., time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., forecast: _Optional[bool] = ...) -> None: ...

class ForecastPoint(_message.Message):
    __slots__ = ("time", "mean", "lower", "upper")
    TIME_FIELD_NUMBER: _ClassVar[int]
    MEAN_FIELD_NUMBER: _ClassVar[int]
    LOWER_FIELD_NUMBER: _ClassVar[int]
    UPPER_FIELD_NUMBER: _ClassVar[int]
    time: _timestamp_pb2.Timestamp
    mean: float
    lower: float
    upper: float
    def __init__(self, time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., mean: _Optional[float] = ..., lower: _Optional[float] = ..., upper: _Optional[float] = ...) -> None: ...

class Forecast(_message.Message):
    __slots__ = ("series", "model", "interval_coverage_fraction", "generated_at", "history_end", "points", "resolution_s")
    SERIES_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    INTERVAL_COVERAGE_FRACTION_FIELD_NUMBER: _ClassVar[int]
    GENERATED_AT_FIELD_NUMBER: _ClassVar[int]
    HISTORY_END_FIELD_NUMBER: _ClassVar[int]
    POINTS_FIELD_NUMBER: _ClassVar[int]
    RESOLUTION_S_FIELD_NUMBER: _ClassVar[int]
    series: SeriesRef
    model: str
    interval_coverage_fraction: float
    generated_at: _timestamp_pb2.Timestamp
    history_end: _timestamp_pb2.Timestamp
    points: _containers.RepeatedCompositeFieldContainer[ForecastPoint]
    resolution_s: int
    def __init__(self, series: _Optional[_Union[SeriesRef, _Mapping]] = ..., model: _Optional[str] = ..., interval_coverage_fraction: _Optional[float] = ..., generated_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., history_end: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., points: _Optional[_Iterable[_Union[ForecastPoint, _Mapping]]] = ..., resolution_s: _Optional[int] = ...) -> None: ...

class Slo(_message.Message):
    __slots__ = ("ttft_s", "tpot_s", "attainment_fraction")
    TTFT_S_FIELD_NUMBER: _ClassVar[int]
    TPOT_S_FIELD_NUMBER: _ClassVar[int]
    ATTAINMENT_FRACTION_FIELD_NUMBER: _ClassVar[int]
    ttft_s: float
    tpot_s: float
    attainment_fraction: float
    def __init__(self, ttft_s: _Optional[float] = ..., tpot_s: _Optional[float] = ..., attainment_fraction: _Optional[float] = ...) -> None: ...

class EmbodiedComponent(_message.Message):
    __slots__ = ("kind", "name", "embodied_g", "lifetime_s", "count")
    KIND_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    EMBODIED_G_FIELD_NUMBER: _ClassVar[int]
    LIFETIME_S_FIELD_NUMBER: _ClassVar[int]
    COUNT_FIELD_NUMBER: _ClassVar[int]
    kind: ComponentKind
    name: str
    embodied_g: float
    lifetime_s: float
    count: int
    def __init__(self, kind: _Optional[_Union[ComponentKind, str]] = ..., name: _Optional[str] = ..., embodied_g: _Optional[float] = ..., lifetime_s: _Optional[float] = ..., count: _Optional[int] = ...) -> None: ...

class CarbonParams(_message.Message):
    __slots__ = ("pue", "components", "ssd_embodied_g_per_tb", "ssd_lifetime_s")
    PUE_FIELD_NUMBER: _ClassVar[int]
    COMPONENTS_FIELD_NUMBER: _ClassVar[int]
    SSD_EMBODIED_G_PER_TB_FIELD_NUMBER: _ClassVar[int]
    SSD_LIFETIME_S_FIELD_NUMBER: _ClassVar[int]
    pue: float
    components: _containers.RepeatedCompositeFieldContainer[EmbodiedComponent]
    ssd_embodied_g_per_tb: float
    ssd_lifetime_s: float
    def __init__(self, pue: _Optional[float] = ..., components: _Optional[_Iterable[_Union[EmbodiedComponent, _Mapping]]] = ..., ssd_embodied_g_per_tb: _Optional[float] = ..., ssd_lifetime_s: _Optional[float] = ...) -> None: ...

class CarbonBreakdown(_message.Message):
    __slots__ = ("operational_g", "embodied_compute_g", "embodied_storage_g", "total_g", "energy_kwh", "ci_g_per_kwh")
    OPERATIONAL_G_FIELD_NUMBER: _ClassVar[int]
    EMBODIED_COMPUTE_G_FIELD_NUMBER: _ClassVar[int]
    EMBODIED_STORAGE_G_FIELD_NUMBER: _ClassVar[int]
    TOTAL_G_FIELD_NUMBER: _ClassVar[int]
    ENERGY_KWH_FIELD_NUMBER: _ClassVar[int]
    CI_G_PER_KWH_FIELD_NUMBER: _ClassVar[int]
    operational_g: float
    embodied_compute_g: float
    embodied_storage_g: float
    total_g: float
    energy_kwh: float
    ci_g_per_kwh: float
    def __init__(self, operational_g: _Optional[float] = ..., embodied_compute_g: _Optional[float] = ..., embodied_storage_g: _Optional[float] = ..., total_g: _Optional[float] = ..., energy_kwh: _Optional[float] = ..., ci_g_per_kwh: _Optional[float] = ...) -> None: ...

class MigInstance(_message.Message):
    __slots__ = ("uuid", "profile", "placement_start", "placement_size", "gpu_instance_id", "memory_bytes", "engine_id", "kubernetes_resource", "engine_ids", "engine_urls")
    class EngineUrlsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    UUID_FIELD_NUMBER: _ClassVar[int]
    PROFILE_FIELD_NUMBER: _ClassVar[int]
    PLACEMENT_START_FIELD_NUMBER: _ClassVar[int]
    PLACEMENT_SIZE_FIELD_NUMBER: _ClassVar[int]
    GPU_INSTANCE_ID_FIELD_NUMBER: _ClassVar[int]
    MEMORY_BYTES_FIELD_NUMBER: _ClassVar[int]
    ENGINE_ID_FIELD_NUMBER: _ClassVar[int]
    KUBERNETES_RESOURCE_FIELD_NUMBER: _ClassVar[int]
    ENGINE_IDS_FIELD_NUMBER: _ClassVar[int]
    ENGINE_URLS_FIELD_NUMBER: _ClassVar[int]
    uuid: str
    profile: str
    placement_start: int
    placement_size: int
    gpu_instance_id: int
    memory_bytes: int
    engine_id: str
    kubernetes_resource: str
    engine_ids: _containers.RepeatedScalarFieldContainer[str]
    engine_urls: _containers.ScalarMap[str, str]
    def __init__(self, uuid: _Optional[str] = ..., profile: _Optional[str] = ..., placement_start: _Optional[int] = ..., placement_size: _Optional[int] = ..., gpu_instance_id: _Optional[int] = ..., memory_bytes: _Optional[int] = ..., engine_id: _Optional[str] = ..., kubernetes_resource: _Optional[str] = ..., engine_ids: _Optional[_Iterable[str]] = ..., engine_urls: _Optional[_Mapping[str, str]] = ...) -> None: ...

class Gpu(_message.Message):
    __slots__ = ("uuid", "index", "model", "name", "memory_bytes", "mig_enabled", "instances", "node", "pool", "hardware", "reported_by")
    UUID_FIELD_NUMBER: _ClassVar[int]
    INDEX_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    MEMORY_BYTES_FIELD_NUMBER: _ClassVar[int]
    MIG_ENABLED_FIELD_NUMBER: _ClassVar[int]
    INSTANCES_FIELD_NUMBER: _ClassVar[int]
    NODE_FIELD_NUMBER: _ClassVar[int]
    POOL_FIELD_NUMBER: _ClassVar[int]
    HARDWARE_FIELD_NUMBER: _ClassVar[int]
    REPORTED_BY_FIELD_NUMBER: _ClassVar[int]
    uuid: str
    index: int
    model: GpuModel
    name: str
    memory_bytes: int
    mig_enabled: bool
    instances: _containers.RepeatedCompositeFieldContainer[MigInstance]
    node: str
    pool: str
    hardware: str
    reported_by: str
    def __init__(self, uuid: _Optional[str] = ..., index: _Optional[int] = ..., model: _Optional[_Union[GpuModel, str]] = ..., name: _Optional[str] = ..., memory_bytes: _Optional[int] = ..., mig_enabled: _Optional[bool] = ..., instances: _Optional[_Iterable[_Union[MigInstance, _Mapping]]] = ..., node: _Optional[str] = ..., pool: _Optional[str] = ..., hardware: _Optional[str] = ..., reported_by: _Optional[str] = ...) -> None: ...

class Engine(_message.Message):
    __slots__ = ("id", "url", "pool", "model", "kind", "gpu_uuid", "mig_uuid", "state", "idle_power_w", "busy_power_w", "hardware", "model_variant", "prefill_url", "prefill_kv_transfer_params")
    ID_FIELD_NUMBER: _ClassVar[int]
    URL_FIELD_NUMBER: _ClassVar[int]
    POOL_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    GPU_UUID_FIELD_NUMBER: _ClassVar[int]
    MIG_UUID_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    IDLE_POWER_W_FIELD_NUMBER: _ClassVar[int]
    BUSY_POWER_W_FIELD_NUMBER: _ClassVar[int]
    HARDWARE_FIELD_NUMBER: _ClassVar[int]
    MODEL_VARIANT_FIELD_NUMBER: _ClassVar[int]
    PREFILL_URL_FIELD_NUMBER: _ClassVar[int]
    PREFILL_KV_TRANSFER_PARAMS_FIELD_NUMBER: _ClassVar[int]
    id: str
    url: str
    pool: str
    model: str
    kind: EngineKind
    gpu_uuid: str
    mig_uuid: str
    state: EngineState
    idle_power_w: float
    busy_power_w: float
    hardware: str
    model_variant: str
    prefill_url: str
    prefill_kv_transfer_params: str
    def __init__(self, id: _Optional[str] = ..., url: _Optional[str] = ..., pool: _Optional[str] = ..., model: _Optional[str] = ..., kind: _Optional[_Union[EngineKind, str]] = ..., gpu_uuid: _Optional[str] = ..., mig_uuid: _Optional[str] = ..., state: _Optional[_Union[EngineState, str]] = ..., idle_power_w: _Optional[float] = ..., busy_power_w: _Optional[float] = ..., hardware: _Optional[str] = ..., model_variant: _Optional[str] = ..., prefill_url: _Optional[str] = ..., prefill_kv_transfer_params: _Optional[str] = ...) -> None: ...

class Pool(_message.Message):
    __slots__ = ("name", "model", "slo", "engines", "region", "variants", "load_series_key", "max_cache_dram_bytes", "max_cache_disk_bytes", "cache_step_bytes", "mean_prompt_tokens", "mean_output_tokens", "draft", "disk_tiers")
    NAME_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    SLO_FIELD_NUMBER: _ClassVar[int]
    ENGINES_FIELD_NUMBER: _ClassVar[int]
    REGION_FIELD_NUMBER: _ClassVar[int]
    VARIANTS_FIELD_NUMBER: _ClassVar[int]
    LOAD_SERIES_KEY_FIELD_NUMBER: _ClassVar[int]
    MAX_CACHE_DRAM_BYTES_FIELD_NUMBER: _ClassVar[int]
    MAX_CACHE_DISK_BYTES_FIELD_NUMBER: _ClassVar[int]
    CACHE_STEP_BYTES_FIELD_NUMBER: _ClassVar[int]
    MEAN_PROMPT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    MEAN_OUTPUT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    DRAFT_FIELD_NUMBER: _ClassVar[int]
    DISK_TIERS_FIELD_NUMBER: _ClassVar[int]
    name: str
    model: str
    slo: Slo
    engines: _containers.RepeatedCompositeFieldContainer[Engine]
    region: str
    variants: _containers.RepeatedCompositeFieldContainer[ModelVariant]
    load_series_key: str
    max_cache_dram_bytes: int
    max_cache_disk_bytes: int
    cache_step_bytes: int
    mean_prompt_tokens: int
    mean_output_tokens: int
    draft: SpeculativeDraft
    disk_tiers: _containers.RepeatedCompositeFieldContainer[CacheDiskTier]
    def __init__(self, name: _Optional[str] = ..., model: _Optional[str] = ..., slo: _Optional[_Union[Slo, _Mapping]] = ..., engines: _Optional[_Iterable[_Union[Engine, _Mapping]]] = ..., region: _Optional[str] = ..., variants: _Optional[_Iterable[_Union[ModelVariant, _Mapping]]] = ..., load_series_key: _Optional[str] = ..., max_cache_dram_bytes: _Optional[int] = ..., max_cache_disk_bytes: _Optional[int] = ..., cache_step_bytes: _Optional[int] = ..., mean_prompt_tokens: _Optional[int] = ..., mean_output_tokens: _Optional[int] = ..., draft: _Optional[_Union[SpeculativeDraft, _Mapping]] = ..., disk_tiers: _Optional[_Iterable[_Union[CacheDiskTier, _Mapping]]] = ...) -> None: ...

class CacheDiskTier(_message.Message):
    __slots__ = ("medium", "path", "max_bytes")
    MEDIUM_FIELD_NUMBER: _ClassVar[int]
    PATH_FIELD_NUMBER: _ClassVar[int]
    MAX_BYTES_FIELD_NUMBER: _ClassVar[int]
    medium: str
    path: str
    max_bytes: int
    def __init__(self, medium: _Optional[str] = ..., path: _Optional[str] = ..., max_bytes: _Optional[int] = ...) -> None: ...

class SpeculativeDraft(_message.Message):
    __slots__ = ("model", "simulator_model", "acceptance_fraction", "num_speculative_tokens", "acceptance_source")
    MODEL_FIELD_NUMBER: _ClassVar[int]
    SIMULATOR_MODEL_FIELD_NUMBER: _ClassVar[int]
    ACCEPTANCE_FRACTION_FIELD_NUMBER: _ClassVar[int]
    NUM_SPECULATIVE_TOKENS_FIELD_NUMBER: _ClassVar[int]
    ACCEPTANCE_SOURCE_FIELD_NUMBER: _ClassVar[int]
    model: str
    simulator_model: str
    acceptance_fraction: float
    num_speculative_tokens: int
    acceptance_source: str
    def __init__(self, model: _Optional[str] = ..., simulator_model: _Optional[str] = ..., acceptance_fraction: _Optional[float] = ..., num_speculative_tokens: _Optional[int] = ..., acceptance_source: _Optional[str] = ...) -> None: ...

class ModelVariant(_message.Message):
    __slots__ = ("name", "model", "quality_fraction", "quality_source", "simulator_model", "vllm_args")
    NAME_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    QUALITY_FRACTION_FIELD_NUMBER: _ClassVar[int]
    QUALITY_SOURCE_FIELD_NUMBER: _ClassVar[int]
    SIMULATOR_MODEL_FIELD_NUMBER: _ClassVar[int]
    VLLM_ARGS_FIELD_NUMBER: _ClassVar[int]
    name: str
    model: str
    quality_fraction: float
    quality_source: str
    simulator_model: str
    vllm_args: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, name: _Optional[str] = ..., model: _Optional[str] = ..., quality_fraction: _Optional[float] = ..., quality_source: _Optional[str] = ..., simulator_model: _Optional[str] = ..., vllm_args: _Optional[_Iterable[str]] = ...) -> None: ...

class FleetInventory(_message.Message):
    __slots__ = ("pools", "gpus", "max_cache_storage_bytes", "link_bandwidth_bytes_per_s")
    POOLS_FIELD_NUMBER: _ClassVar[int]
    GPUS_FIELD_NUMBER: _ClassVar[int]
    MAX_CACHE_STORAGE_BYTES_FIELD_NUMBER: _ClassVar[int]
    LINK_BANDWIDTH_BYTES_PER_S_FIELD_NUMBER: _ClassVar[int]
    pools: _containers.RepeatedCompositeFieldContainer[Pool]
    gpus: _containers.RepeatedCompositeFieldContainer[Gpu]
    max_cache_storage_bytes: int
    link_bandwidth_bytes_per_s: float
    def __init__(self, pools: _Optional[_Iterable[_Union[Pool, _Mapping]]] = ..., gpus: _Optional[_Iterable[_Union[Gpu, _Mapping]]] = ..., max_cache_storage_bytes: _Optional[int] = ..., link_bandwidth_bytes_per_s: _Optional[float] = ...) -> None: ...

class ProfileConfig(_message.Message):
    __slots__ = ("model", "model_variant", "hardware", "mig_profile", "cache_dram_bytes", "cache_disk_bytes", "serving_mode", "workload", "draft", "old_hardware", "link_bandwidth_bytes_per_s")
    MODEL_FIELD_NUMBER: _ClassVar[int]
    MODEL_VARIANT_FIELD_NUMBER: _ClassVar[int]
    HARDWARE_FIELD_NUMBER: _ClassVar[int]
    MIG_PROFILE_FIELD_NUMBER: _ClassVar[int]
    CACHE_DRAM_BYTES_FIELD_NUMBER: _ClassVar[int]
    CACHE_DISK_BYTES_FIELD_NUMBER: _ClassVar[int]
    SERVING_MODE_FIELD_NUMBER: _ClassVar[int]
    WORKLOAD_FIELD_NUMBER: _ClassVar[int]
    DRAFT_FIELD_NUMBER: _ClassVar[int]
    OLD_HARDWARE_FIELD_NUMBER: _ClassVar[int]
    LINK_BANDWIDTH_BYTES_PER_S_FIELD_NUMBER: _ClassVar[int]
    model: str
    model_variant: str
    hardware: str
    mig_profile: str
    cache_dram_bytes: int
    cache_disk_bytes: int
    serving_mode: ServingMode
    workload: str
    draft: SpeculativeDraft
    old_hardware: str
    link_bandwidth_bytes_per_s: float
    def __init__(self, model: _Optional[str] = ..., model_variant: _Optional[str] = ..., hardware: _Optional[str] = ..., mig_profile: _Optional[str] = ..., cache_dram_bytes: _Optional[int] = ..., cache_disk_bytes: _Optional[int] = ..., serving_mode: _Optional[_Union[ServingMode, str]] = ..., workload: _Optional[str] = ..., draft: _Optional[_Union[SpeculativeDraft, _Mapping]] = ..., old_hardware: _Optional[str] = ..., link_bandwidth_bytes_per_s: _Optional[float] = ...) -> None: ...

class ProfilePoint(_message.Message):
    __slots__ = ("request_rate_per_s", "ttft_p50_s", "ttft_p90_s", "ttft_p99_s", "tpot_p50_s", "tpot_p90_s", "tpot_p99_s", "slo_attainment_fraction", "throughput_requests_per_s", "cache_hit_fraction", "power_w", "energy_per_request_kwh", "mean_batch_size", "requests", "ttft_slo_attainment_fraction", "tpot_slo_attainment_fraction", "ttft_mean_s", "tpot_mean_s", "e2e_p50_s", "e2e_p95_s", "e2e_p99_s", "throughput_output_tokens_per_s", "energy_per_output_token_j", "carbon_per_output_token_g", "power_source", "failed_requests", "duration_s", "below_slo_target", "kv_connector_state")
    REQUEST_RATE_PER_S_FIELD_NUMBER: _ClassVar[int]
    TTFT_P50_S_FIELD_NUMBER: _ClassVar[int]
    TTFT_P90_S_FIELD_NUMBER: _ClassVar[int]
    TTFT_P99_S_FIELD_NUMBER: _ClassVar[int]
    TPOT_P50_S_FIELD_NUMBER: _ClassVar[int]
    TPOT_P90_S_FIELD_NUMBER: _ClassVar[int]
    TPOT_P99_S_FIELD_NUMBER: _ClassVar[int]
    SLO_ATTAINMENT_FRACTION_FIELD_NUMBER: _ClassVar[int]
    THROUGHPUT_REQUESTS_PER_S_FIELD_NUMBER: _ClassVar[int]
    CACHE_HIT_FRACTION_FIELD_NUMBER: _ClassVar[int]
    POWER_W_FIELD_NUMBER: _ClassVar[int]
    ENERGY_PER_REQUEST_KWH_FIELD_NUMBER: _ClassVar[int]
    MEAN_BATCH_SIZE_FIELD_NUMBER: _ClassVar[int]
    REQUESTS_FIELD_NUMBER: _ClassVar[int]
    TTFT_SLO_ATTAINMENT_FRACTION_FIELD_NUMBER: _ClassVar[int]
    TPOT_SLO_ATTAINMENT_FRACTION_FIELD_NUMBER: _ClassVar[int]
    TTFT_MEAN_S_FIELD_NUMBER: _ClassVar[int]
    TPOT_MEAN_S_FIELD_NUMBER: _ClassVar[int]
    E2E_P50_S_FIELD_NUMBER: _ClassVar[int]
    E2E_P95_S_FIELD_NUMBER: _ClassVar[int]
    E2E_P99_S_FIELD_NUMBER: _ClassVar[int]
    THROUGHPUT_OUTPUT_TOKENS_PER_S_FIELD_NUMBER: _ClassVar[int]
    ENERGY_PER_OUTPUT_TOKEN_J_FIELD_NUMBER: _ClassVar[int]
    CARBON_PER_OUTPUT_TOKEN_G_FIELD_NUMBER: _ClassVar[int]
    POWER_SOURCE_FIELD_NUMBER: _ClassVar[int]
    FAILED_REQUESTS_FIELD_NUMBER: _ClassVar[int]
    DURATION_S_FIELD_NUMBER: _ClassVar[int]
    BELOW_SLO_TARGET_FIELD_NUMBER: _ClassVar[int]
    KV_CONNECTOR_STATE_FIELD_NUMBER: _ClassVar[int]
    request_rate_per_s: float
    ttft_p50_s: float
    ttft_p90_s: float
    ttft_p99_s: float
    tpot_p50_s: float
    tpot_p90_s: float
    tpot_p99_s: float
    slo_attainment_fraction: float
    throughput_requests_per_s: float
    cache_hit_fraction: float
    power_w: float
    energy_per_request_kwh: float
    mean_batch_size: float
    requests: int
    ttft_slo_attainment_fraction: float
    tpot_slo_attainment_fraction: float
    ttft_mean_s: float
    tpot_mean_s: float
    e2e_p50_s: float
    e2e_p95_s: float
    e2e_p99_s: float
    throughput_output_tokens_per_s: float
    energy_per_output_token_j: float
    carbon_per_output_token_g: float
    power_source: str
    failed_requests: int
    duration_s: float
    below_slo_target: bool
    kv_connector_state: KvConnectorState
    def __init__(self, request_rate_per_s: _Optional[float] = ..., ttft_p50_s: _Optional[float] = ..., ttft_p90_s: _Optional[float] = ..., ttft_p99_s: _Optional[float] = ..., tpot_p50_s: _Optional[float] = ..., tpot_p90_s: _Optional[float] = ..., tpot_p99_s: _Optional[float] = ..., slo_attainment_fraction: _Optional[float] = ..., throughput_requests_per_s: _Optional[float] = ..., cache_hit_fraction: _Optional[float] = ..., power_w: _Optional[float] = ..., energy_per_request_kwh: _Optional[float] = ..., mean_batch_size: _Optional[float] = ..., requests: _Optional[int] = ..., ttft_slo_attainment_fraction: _Optional[float] = ..., tpot_slo_attainment_fraction: _Optional[float] = ..., ttft_mean_s: _Optional[float] = ..., tpot_mean_s: _Optional[float] = ..., e2e_p50_s: _Optional[float] = ..., e2e_p95_s: _Optional[float] = ..., e2e_p99_s: _Optional[float] = ..., throughput_output_tokens_per_s: _Optional[float] = ..., energy_per_output_token_j: _Optional[float] = ..., carbon_per_output_token_g: _Optional[float] = ..., power_source: _Optional[str] = ..., failed_requests: _Optional[int] = ..., duration_s: _Optional[float] = ..., below_slo_target: _Optional[bool] = ..., kv_connector_state: _Optional[_Union[KvConnectorState, str]] = ...) -> None: ...

class ProfileMethod(_message.Message):
    __slots__ = ("warmup_s", "requests_per_point", "power_interval_s", "stop_rule", "cache_prefill_requests", "carbon_intensity_g_per_kwh", "arrival", "request_timeout_s")
    WARMUP_S_FIELD_NUMBER: _ClassVar[int]
    REQUESTS_PER_POINT_FIELD_NUMBER: _ClassVar[int]
    POWER_INTERVAL_S_FIELD_NUMBER: _ClassVar[int]
    STOP_RULE_FIELD_NUMBER: _ClassVar[int]
    CACHE_PREFILL_REQUESTS_FIELD_NUMBER: _ClassVar[int]
    CARBON_INTENSITY_G_PER_KWH_FIELD_NUMBER: _ClassVar[int]
    ARRIVAL_FIELD_NUMBER: _ClassVar[int]
    REQUEST_TIMEOUT_S_FIELD_NUMBER: _ClassVar[int]
    warmup_s: float
    requests_per_point: int
    power_interval_s: float
    stop_rule: LadderStopRule
    cache_prefill_requests: int
    carbon_intensity_g_per_kwh: float
    arrival: str
    request_timeout_s: float
    def __init__(self, warmup_s: _Optional[float] = ..., requests_per_point: _Optional[int] = ..., power_interval_s: _Optional[float] = ..., stop_rule: _Optional[_Union[LadderStopRule, str]] = ..., cache_prefill_requests: _Optional[int] = ..., carbon_intensity_g_per_kwh: _Optional[float] = ..., arrival: _Optional[str] = ..., request_timeout_s: _Optional[float] = ...) -> None: ...

class ProfileFact(_message.Message):
    __slots__ = ("name", "value", "citation")
    NAME_FIELD_NUMBER: _ClassVar[int]
    VALUE_FIELD_NUMBER: _ClassVar[int]
    CITATION_FIELD_NUMBER: _ClassVar[int]
    name: str
    value: float
    citation: str
    def __init__(self, name: _Optional[str] = ..., value: _Optional[float] = ..., citation: _Optional[str] = ...) -> None: ...

class Profile(_message.Message):
    __slots__ = ("config_key", "version", "config", "slo", "points", "source", "note", "created_at", "method", "sweep_id", "ladder_note", "skipped_rates_per_s", "variant_quality_fraction", "facts", "model_version")
    CONFIG_KEY_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    CONFIG_FIELD_NUMBER: _ClassVar[int]
    SLO_FIELD_NUMBER: _ClassVar[int]
    POINTS_FIELD_NUMBER: _ClassVar[int]
    SOURCE_FIELD_NUMBER: _ClassVar[int]
    NOTE_FIELD_NUMBER: _ClassVar[int]
    CREATED_AT_FIELD_NUMBER: _ClassVar[int]
    METHOD_FIELD_NUMBER: _ClassVar[int]
    SWEEP_ID_FIELD_NUMBER: _ClassVar[int]
    LADDER_NOTE_FIELD_NUMBER: _ClassVar[int]
    SKIPPED_RATES_PER_S_FIELD_NUMBER: _ClassVar[int]
    VARIANT_QUALITY_FRACTION_FIELD_NUMBER: _ClassVar[int]
    FACTS_FIELD_NUMBER: _ClassVar[int]
    MODEL_VERSION_FIELD_NUMBER: _ClassVar[int]
    config_key: str
    version: int
    config: ProfileConfig
    slo: Slo
    points: _containers.RepeatedCompositeFieldContainer[ProfilePoint]
    source: ProfileSource
    note: str
    created_at: _timestamp_pb2.Timestamp
    method: ProfileMethod
    sweep_id: str
    ladder_note: str
    skipped_rates_per_s: _containers.RepeatedScalarFieldContainer[float]
    variant_quality_fraction: float
    facts: _containers.RepeatedCompositeFieldContainer[ProfileFact]
    model_version: str
    def __init__(self, config_key: _Optional[str] = ..., version: _Optional[int] = ..., config: _Optional[_Union[ProfileConfig, _Mapping]] = ..., slo: _Optional[_Union[Slo, _Mapping]] = ..., points: _Optional[_Iterable[_Union[ProfilePoint, _Mapping]]] = ..., source: _Optional[_Union[ProfileSource, str]] = ..., note: _Optional[str] = ..., created_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., method: _Optional[_Union[ProfileMethod, _Mapping]] = ..., sweep_id: _Optional[str] = ..., ladder_note: _Optional[str] = ..., skipped_rates_per_s: _Optional[_Iterable[float]] = ..., variant_quality_fraction: _Optional[float] = ..., facts: _Optional[_Iterable[_Union[ProfileFact, _Mapping]]] = ..., model_version: _Optional[str] = ...) -> None: ...

class CacheTarget(_message.Message):
    __slots__ = ("pool", "dram_bytes", "disk_bytes", "ttl_s", "disk_medium", "disk_path")
    POOL_FIELD_NUMBER: _ClassVar[int]
    DRAM_BYTES_FIELD_NUMBER: _ClassVar[int]
    DISK_BYTES_FIELD_NUMBER: _ClassVar[int]
    TTL_S_FIELD_NUMBER: _ClassVar[int]
    DISK_MEDIUM_FIELD_NUMBER: _ClassVar[int]
    DISK_PATH_FIELD_NUMBER: _ClassVar[int]
    pool: str
    dram_bytes: int
    disk_bytes: int
    ttl_s: float
    disk_medium: str
    disk_path: str
    def __init__(self, pool: _Optional[str] = ..., dram_bytes: _Optional[int] = ..., disk_bytes: _Optional[int] = ..., ttl_s: _Optional[float] = ..., disk_medium: _Optional[str] = ..., disk_path: _Optional[str] = ...) -> None: ...

class MigPlacement(_message.Message):
    __slots__ = ("profile", "start", "size", "model_variant", "pool")
    PROFILE_FIELD_NUMBER: _ClassVar[int]
    START_FIELD_NUMBER: _ClassVar[int]
    SIZE_FIELD_NUMBER: _ClassVar[int]
    MODEL_VARIANT_FIELD_NUMBER: _ClassVar[int]
    POOL_FIELD_NUMBER: _ClassVar[int]
    profile: str
    start: int
    size: int
    model_variant: str
    pool: str
    def __init__(self, profile: _Optional[str] = ..., start: _Optional[int] = ..., size: _Optional[int] = ..., model_variant: _Optional[str] = ..., pool: _Optional[str] = ...) -> None: ...

class MigLayout(_message.Message):
    __slots__ = ("gpu_uuid", "placements", "node")
    GPU_UUID_FIELD_NUMBER: _ClassVar[int]
    PLACEMENTS_FIELD_NUMBER: _ClassVar[int]
    NODE_FIELD_NUMBER: _ClassVar[int]
    gpu_uuid: str
    placements: _containers.RepeatedCompositeFieldContainer[MigPlacement]
    node: str
    def __init__(self, gpu_uuid: _Optional[str] = ..., placements: _Optional[_Iterable[_Union[MigPlacement, _Mapping]]] = ..., node: _Optional[str] = ...) -> None: ...

class RoutingWeight(_message.Message):
    __slots__ = ("pool", "engine_id", "weight")
    POOL_FIELD_NUMBER: _ClassVar[int]
    ENGINE_ID_FIELD_NUMBER: _ClassVar[int]
    WEIGHT_FIELD_NUMBER: _ClassVar[int]
    pool: str
    engine_id: str
    weight: float
    def __init__(self, pool: _Optional[str] = ..., engine_id: _Optional[str] = ..., weight: _Optional[float] = ...) -> None: ...

class ServingModeTarget(_message.Message):
    __slots__ = ("pool", "serving_mode", "old_hardware", "link_bandwidth_bytes_per_s")
    POOL_FIELD_NUMBER: _ClassVar[int]
    SERVING_MODE_FIELD_NUMBER: _ClassVar[int]
    OLD_HARDWARE_FIELD_NUMBER: _ClassVar[int]
    LINK_BANDWIDTH_BYTES_PER_S_FIELD_NUMBER: _ClassVar[int]
    pool: str
    serving_mode: ServingMode
    old_hardware: str
    link_bandwidth_bytes_per_s: float
    def __init__(self, pool: _Optional[str] = ..., serving_mode: _Optional[_Union[ServingMode, str]] = ..., old_hardware: _Optional[str] = ..., link_bandwidth_bytes_per_s: _Optional[float] = ...) -> None: ...

class EngineRunTarget(_message.Message):
    __slots__ = ("pool", "engine_id", "state")
    POOL_FIELD_NUMBER: _ClassVar[int]
    ENGINE_ID_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    pool: str
    engine_id: str
    state: EngineRunState
    def __init__(self, pool: _Optional[str] = ..., engine_id: _Optional[str] = ..., state: _Optional[_Union[EngineRunState, str]] = ...) -> None: ...

class GpuPowerTarget(_message.Message):
    __slots__ = ("pool", "power_limit_w", "max_sm_clock_mhz", "sm_clock_fraction")
    POOL_FIELD_NUMBER: _ClassVar[int]
    POWER_LIMIT_W_FIELD_NUMBER: _ClassVar[int]
    MAX_SM_CLOCK_MHZ_FIELD_NUMBER: _ClassVar[int]
    SM_CLOCK_FRACTION_FIELD_NUMBER: _ClassVar[int]
    pool: str
    power_limit_w: float
    max_sm_clock_mhz: int
    sm_clock_fraction: float
    def __init__(self, pool: _Optional[str] = ..., power_limit_w: _Optional[float] = ..., max_sm_clock_mhz: _Optional[int] = ..., sm_clock_fraction: _Optional[float] = ...) -> None: ...

class PlanInterval(_message.Message):
    __slots__ = ("start", "end", "ci_g_per_kwh", "load_requests_per_s", "cache_targets", "mig_layouts", "serving_modes", "routing_weights", "expected_carbon", "expected_slo_attainment_fraction", "pools", "engine_runs", "gpu_power")
    START_FIELD_NUMBER: _ClassVar[int]
    END_FIELD_NUMBER: _ClassVar[int]
    CI_G_PER_KWH_FIELD_NUMBER: _ClassVar[int]
    LOAD_REQUESTS_PER_S_FIELD_NUMBER: _ClassVar[int]
    CACHE_TARGETS_FIELD_NUMBER: _ClassVar[int]
    MIG_LAYOUTS_FIELD_NUMBER: _ClassVar[int]
    SERVING_MODES_FIELD_NUMBER: _ClassVar[int]
    ROUTING_WEIGHTS_FIELD_NUMBER: _ClassVar[int]
    EXPECTED_CARBON_FIELD_NUMBER: _ClassVar[int]
    EXPECTED_SLO_ATTAINMENT_FRACTION_FIELD_NUMBER: _ClassVar[int]
    POOLS_FIELD_NUMBER: _ClassVar[int]
    ENGINE_RUNS_FIELD_NUMBER: _ClassVar[int]
    GPU_POWER_FIELD_NUMBER: _ClassVar[int]
    start: _timestamp_pb2.Timestamp
    end: _timestamp_pb2.Timestamp
    ci_g_per_kwh: float
    load_requests_per_s: float
    cache_targets: _containers.RepeatedCompositeFieldContainer[CacheTarget]
    mig_layouts: _containers.RepeatedCompositeFieldContainer[MigLayout]
    serving_modes: _containers.RepeatedCompositeFieldContainer[ServingModeTarget]
    routing_weights: _containers.RepeatedCompositeFieldContainer[RoutingWeight]
    expected_carbon: CarbonBreakdown
    expected_slo_attainment_fraction: float
    pools: _containers.RepeatedCompositeFieldContainer[PoolInterval]
    engine_runs: _containers.RepeatedCompositeFieldContainer[EngineRunTarget]
    gpu_power: _containers.RepeatedCompositeFieldContainer[GpuPowerTarget]
    def __init__(self, start: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., end: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., ci_g_per_kwh: _Optional[float] = ..., load_requests_per_s: _Optional[float] = ..., cache_targets: _Optional[_Iterable[_Union[CacheTarget, _Mapping]]] = ..., mig_layouts: _Optional[_Iterable[_Union[MigLayout, _Mapping]]] = ..., serving_modes: _Optional[_Iterable[_Union[ServingModeTarget, _Mapping]]] = ..., routing_weights: _Optional[_Iterable[_Union[RoutingWeight, _Mapping]]] = ..., expected_carbon: _Optional[_Union[CarbonBreakdown, _Mapping]] = ..., expected_slo_attainment_fraction: _Optional[float] = ..., pools: _Optional[_Iterable[_Union[PoolInterval, _Mapping]]] = ..., engine_runs: _Optional[_Iterable[_Union[EngineRunTarget, _Mapping]]] = ..., gpu_power: _Optional[_Iterable[_Union[GpuPowerTarget, _Mapping]]] = ...) -> None: ...

class PoolInterval(_message.Message):
    __slots__ = ("pool", "ci_g_per_kwh", "load_requests_per_s", "load_upper_requests_per_s", "capacity_requests_per_s", "expected_carbon", "expected_slo_attainment_fraction", "expected_slo_attainment_at_upper_fraction", "engines_awake", "expected_saved_g_by_lever")
    class ExpectedSavedGByLeverEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: float
        def __init__(self, key: _Optional[str] = ..., value: _Optional[float] = ...) -> None: ...
    POOL_FIELD_NUMBER: _ClassVar[int]
    CI_G_PER_KWH_FIELD_NUMBER: _ClassVar[int]
    LOAD_REQUESTS_PER_S_FIELD_NUMBER: _ClassVar[int]
    LOAD_UPPER_REQUESTS_PER_S_FIELD_NUMBER: _ClassVar[int]
    CAPACITY_REQUESTS_PER_S_FIELD_NUMBER: _ClassVar[int]
    EXPECTED_CARBON_FIELD_NUMBER: _ClassVar[int]
    EXPECTED_SLO_ATTAINMENT_FRACTION_FIELD_NUMBER: _ClassVar[int]
    EXPECTED_SLO_ATTAINMENT_AT_UPPER_FRACTION_FIELD_NUMBER: _ClassVar[int]
    ENGINES_AWAKE_FIELD_NUMBER: _ClassVar[int]
    EXPECTED_SAVED_G_BY_LEVER_FIELD_NUMBER: _ClassVar[int]
    pool: str
    ci_g_per_kwh: float
    load_requests_per_s: float
    load_upper_requests_per_s: float
    capacity_requests_per_s: float
    expected_carbon: CarbonBreakdown
    expected_slo_attainment_fraction: float
    expected_slo_attainment_at_upper_fraction: float
    engines_awake: int
    expected_saved_g_by_lever: _containers.ScalarMap[str, float]
    def __init__(self, pool: _Optional[str] = ..., ci_g_per_kwh: _Optional[float] = ..., load_requests_per_s: _Optional[float] = ..., load_upper_requests_per_s: _Optional[float] = ..., capacity_requests_per_s: _Optional[float] = ..., expected_carbon: _Optional[_Union[CarbonBreakdown, _Mapping]] = ..., expected_slo_attainment_fraction: _Optional[float] = ..., expected_slo_attainment_at_upper_fraction: _Optional[float] = ..., engines_awake: _Optional[int] = ..., expected_saved_g_by_lever: _Optional[_Mapping[str, float]] = ...) -> None: ...

class SolverOutcome(_message.Message):
    __slots__ = ("knob", "solver", "status", "detail", "solve_s")
    KNOB_FIELD_NUMBER: _ClassVar[int]
    SOLVER_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    DETAIL_FIELD_NUMBER: _ClassVar[int]
    SOLVE_S_FIELD_NUMBER: _ClassVar[int]
    knob: str
    solver: str
    status: str
    detail: str
    solve_s: float
    def __init__(self, knob: _Optional[str] = ..., solver: _Optional[str] = ..., status: _Optional[str] = ..., detail: _Optional[str] = ..., solve_s: _Optional[float] = ...) -> None: ...

class Plan(_message.Message):
    __slots__ = ("version", "state", "created_at", "valid_from", "valid_until", "intervals", "expected_carbon", "expected_slo_attainment_fraction", "explanation", "trigger", "solver_outcomes", "input_notes", "previous_version", "forecasts", "cache_tier_faults")
    VERSION_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    CREATED_AT_FIELD_NUMBER: _ClassVar[int]
    VALID_FROM_FIELD_NUMBER: _ClassVar[int]
    VALID_UNTIL_FIELD_NUMBER: _ClassVar[int]
    INTERVALS_FIELD_NUMBER: _ClassVar[int]
    EXPECTED_CARBON_FIELD_NUMBER: _ClassVar[int]
    EXPECTED_SLO_ATTAINMENT_FRACTION_FIELD_NUMBER: _ClassVar[int]
    EXPLANATION_FIELD_NUMBER: _ClassVar[int]
    TRIGGER_FIELD_NUMBER: _ClassVar[int]
    SOLVER_OUTCOMES_FIELD_NUMBER: _ClassVar[int]
    INPUT_NOTES_FIELD_NUMBER: _ClassVar[int]
    PREVIOUS_VERSION_FIELD_NUMBER: _ClassVar[int]
    FORECASTS_FIELD_NUMBER: _ClassVar[int]
    CACHE_TIER_FAULTS_FIELD_NUMBER: _ClassVar[int]
    version: int
    state: PlanState
    created_at: _timestamp_pb2.Timestamp
    valid_from: _timestamp_pb2.Timestamp
    valid_until: _timestamp_pb2.Timestamp
    intervals: _containers.RepeatedCompositeFieldContainer[PlanInterval]
    expected_carbon: CarbonBreakdown
    expected_slo_attainment_fraction: float
    explanation: str
    trigger: str
    solver_outcomes: _containers.RepeatedCompositeFieldContainer[SolverOutcome]
    input_notes: _containers.RepeatedScalarFieldContainer[str]
    previous_version: int
    forecasts: _containers.RepeatedCompositeFieldContainer[PlanForecast]
    cache_tier_faults: _containers.RepeatedCompositeFieldContainer[CacheTierFault]
    def __init__(self, version: _Optional[int] = ..., state: _Optional[_Union[PlanState, str]] = ..., created_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., valid_from: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., valid_until: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., intervals: _Optional[_Iterable[_Union[PlanInterval, _Mapping]]] = ..., expected_carbon: _Optional[_Union[CarbonBreakdown, _Mapping]] = ..., expected_slo_attainment_fraction: _Optional[float] = ..., explanation: _Optional[str] = ..., trigger: _Optional[str] = ..., solver_outcomes: _Optional[_Iterable[_Union[SolverOutcome, _Mapping]]] = ..., input_notes: _Optional[_Iterable[str]] = ..., previous_version: _Optional[int] = ..., forecasts: _Optional[_Iterable[_Union[PlanForecast, _Mapping]]] = ..., cache_tier_faults: _Optional[_Iterable[_Union[CacheTierFault, _Mapping]]] = ...) -> None: ...

class CacheTierFault(_message.Message):
    __slots__ = ("pool", "reason", "profile_config_key")
    POOL_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    PROFILE_CONFIG_KEY_FIELD_NUMBER: _ClassVar[int]
    pool: str
    reason: str
    profile_config_key: str
    def __init__(self, pool: _Optional[str] = ..., reason: _Optional[str] = ..., profile_config_key: _Optional[str] = ...) -> None: ...

class PlanForecast(_message.Message):
    __slots__ = ("series", "model", "generated_at", "history_end", "source", "stale_s")
    SERIES_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    GENERATED_AT_FIELD_NUMBER: _ClassVar[int]
    HISTORY_END_FIELD_NUMBER: _ClassVar[int]
    SOURCE_FIELD_NUMBER: _ClassVar[int]
    STALE_S_FIELD_NUMBER: _ClassVar[int]
    series: SeriesRef
    model: str
    generated_at: _timestamp_pb2.Timestamp
    history_end: _timestamp_pb2.Timestamp
    source: str
    stale_s: float
    def __init__(self, series: _Optional[_Union[SeriesRef, _Mapping]] = ..., model: _Optional[str] = ..., generated_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., history_end: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., source: _Optional[str] = ..., stale_s: _Optional[float] = ...) -> None: ...

class ErrorDetail(_message.Message):
    __slots__ = ("reason", "field", "message", "service")
    REASON_FIELD_NUMBER: _ClassVar[int]
    FIELD_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    SERVICE_FIELD_NUMBER: _ClassVar[int]
    reason: ErrorReason
    field: str
    message: str
    service: str
    def __init__(self, reason: _Optional[_Union[ErrorReason, str]] = ..., field: _Optional[str] = ..., message: _Optional[str] = ..., service: _Optional[str] = ...) -> None: ...
