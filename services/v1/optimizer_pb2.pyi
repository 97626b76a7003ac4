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

class EnforcementState(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    ENFORCEMENT_STATE_UNSPECIFIED: _ClassVar[EnforcementState]
    ENFORCEMENT_STATE_APPLYING: _ClassVar[EnforcementState]
    ENFORCEMENT_STATE_APPLIED: _ClassVar[EnforcementState]
    ENFORCEMENT_STATE_FAILED: _ClassVar[EnforcementState]
    ENFORCEMENT_STATE_ROLLED_BACK: _ClassVar[EnforcementState]
    ENFORCEMENT_STATE_REFUSED: _ClassVar[EnforcementState]
ENFORCEMENT_STATE_UNSPECIFIED: EnforcementState
ENFORCEMENT_STATE_APPLYING: EnforcementState
ENFORCEMENT_STATE_APPLIED: EnforcementState
ENFORCEMENT_STATE_FAILED: EnforcementState
ENFORCEMENT_STATE_ROLLED_BACK: EnforcementState
ENFORCEMENT_STATE_REFUSED: EnforcementState

class PoolAttainment(_message.Message):
    __slots__ = ("pool", "window_s", "requests", "attainment_fraction")
    POOL_FIELD_NUMBER: _ClassVar[int]
    WINDOW_S_FIELD_NUMBER: _ClassVar[int]
    REQUESTS_FIELD_NUMBER: _ClassVar[int]
    ATTAINMENT_FRACTION_FIELD_NUMBER: _ClassVar[int]
    pool: str
    window_s: float
    requests: int
    attainment_fraction: float
    def __init__(self, pool: _Optional[str] = ..., window_s: _Optional[float] = ..., requests: _Optional[int] = ..., attainment_fraction: _Optional[float] = ...) -> None: ...

class ReportAttainmentRequest(_message.Message):
    __slots__ = ("instance", "pools")
    INSTANCE_FIELD_NUMBER: _ClassVar[int]
    POOLS_FIELD_NUMBER: _ClassVar[int]
    instance: str
    pools: _containers.RepeatedCompositeFieldContainer[PoolAttainment]
    def __init__(self, instance: _Optional[str] = ..., pools: _Optional[_Iterable[_Union[PoolAttainment, _Mapping]]] = ...) -> None: ...

class ReportAttainmentResponse(_message.Message):
    __slots__ = ("replan_triggered",)
    REPLAN_TRIGGERED_FIELD_NUMBER: _ClassVar[int]
    replan_triggered: bool
    def __init__(self, replan_triggered: _Optional[bool] = ...) -> None: ...

class EnforcementReport(_message.Message):
    __slots__ = ("component", "instance", "plan_version", "interval_start", "state", "detail", "reported_at")
    COMPONENT_FIELD_NUMBER: _ClassVar[int]
    INSTANCE_FIELD_NUMBER: _ClassVar[int]
    PLAN_VERSION_FIELD_NUMBER: _ClassVar[int]
    INTERVAL_START_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    DETAIL_FIELD_NUMBER: _ClassVar[int]
    REPORTED_AT_FIELD_NUMBER: _ClassVar[int]
    component: str
    instance: str
    plan_version: int
    interval_start: _timestamp_pb2.Timestamp
    state: EnforcementState
    detail: str
    reported_at: _timestamp_pb2.Timestamp
    def __init__(self, component: _Optional[str] = ..., instance: _Optional[str] = ..., plan_version: _Optional[int] = ..., interval_start: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., state: _Optional[_Union[EnforcementState, str]] = ..., detail: _Optional[str] = ..., reported_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ...) -> None: ...

class ReportEnforcementRequest(_message.Message):
    __slots__ = ("report",)
    REPORT_FIELD_NUMBER: _ClassVar[int]
    report: EnforcementReport
    def __init__(self, report: _Optional[_Union[EnforcementReport, _Mapping]] = ...) -> None: ...

class ReportEnforcementResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class GetPlanStatusRequest(_message.Message):
    __slots__ = ("version",)
    VERSION_FIELD_NUMBER: _ClassVar[int]
    version: int
    def __init__(self, version: _Optional[int] = ...) -> None: ...

class GetPlanStatusResponse(_message.Message):
    __slots__ = ("plan", "reports", "fleet_matches_plan", "pending_components")
    PLAN_FIELD_NUMBER: _ClassVar[int]
    REPORTS_FIELD_NUMBER: _ClassVar[int]
    FLEET_MATCHES_PLAN_FIELD_NUMBER: _ClassVar[int]
    PENDING_COMPONENTS_FIELD_NUMBER: _ClassVar[int]
    plan: _common_pb2.Plan
    reports: _containers.RepeatedCompositeFieldContainer[EnforcementReport]
    fleet_matches_plan: bool
    pending_components: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, plan: _Optional[_Union[_common_pb2.Plan, _Mapping]] = ..., reports: _Optional[_Iterable[_Union[EnforcementReport, _Mapping]]] = ..., fleet_matches_plan: _Optional[bool] = ..., pending_components: _Optional[_Iterable[str]] = ...) -> None: ...

class ReportGpusRequest(_message.Message):
    __slots__ = ("node", "gpus")
    NODE_FIELD_NUMBER: _ClassVar[int]
    GPUS_FIELD_NUMBER: _ClassVar[int]
    node: str
    gpus: _containers.RepeatedCompositeFieldContainer[_common_pb2.Gpu]
    def __init__(self, node: _Optional[str] = ..., gpus: _Optional[_Iterable[_Union[_common_pb2.Gpu, _Mapping]]] = ...) -> None: ...

class ReportGpusResponse(_message.Message):
    __slots__ = ("fleet",)
    FLEET_FIELD_NUMBER: _ClassVar[int]
    fleet: _common_pb2.FleetInventory
    def __init__(self, fleet: _Optional[_Union[_common_pb2.FleetInventory, _Mapping]] = ...) -> None: ...

class ComputePlanRequest(_message.Message):
    __slots__ = ("horizon_hours", "carbon_weight_fraction", "carbon_params", "dry_run", "trigger", "hold_for_approval")
    HORIZON_HOURS_FIELD_NUMBER: _ClassVar[int]
    CARBON_WEIGHT_FRACTION_FIELD_NUMBER: _ClassVar[int]
    CARBON_PARAMS_FIELD_NUMBER: _ClassVar[int]
    DRY_RUN_FIELD_NUMBER: _ClassVar[int]
    TRIGGER_FIELD_NUMBER: _ClassVar[int]
    HOLD_FOR_APPROVAL_FIELD_NUMBER: _ClassVar[int]
    horizon_hours: int
    carbon_weight_fraction: float
    carbon_params: _common_pb2.CarbonParams
    dry_run: bool
    trigger: str
    hold_for_approval: bool
    def __init__(self, horizon_hours: _Optional[int] = ..., carbon_weight_fraction: _Optional[float] = ..., carbon_params: _Optional[_Union[_common_pb2.CarbonParams, _Mapping]] = ..., dry_run: _Optional[bool] = ..., trigger: _Optional[str] = ..., hold_for_approval: _Optional[bool] = ...) -> None: ...

class ComputePlanResponse(_message.Message):
    __slots__ = ("plan", "solve_s")
    PLAN_FIELD_NUMBER: _ClassVar[int]
    SOLVE_S_FIELD_NUMBER: _ClassVar[int]
    plan: _common_pb2.Plan
    solve_s: float
    def __init__(self, plan: _Optional[_Union[_common_pb2.Plan, _Mapping]] = ..., solve_s: _Optional[float] = ...) -> None: ...

class GetPlanRequest(_message.Message):
    __slots__ = ("version",)
    VERSION_FIELD_NUMBER: _ClassVar[int]
    version: int
    def __init__(self, version: _Optional[int] = ...) -> None: ...

class GetPlanResponse(_message.Message):
    __slots__ = ("plan",)
    PLAN_FIELD_NUMBER: _ClassVar[int]
    plan: _common_pb2.Plan
    def __init__(self, plan: _Optional[_Union[_common_pb2.Plan, _Mapping]] = ...) -> None: ...

class ListPlansRequest(_message.Message):
    __slots__ = ("page_size", "page_token")
    PAGE_SIZE_FIELD_NUMBER: _ClassVar[int]
    PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    page_size: int
    page_token: str
    def __init__(self, page_size: _Optional[int] = ..., page_token: _Optional[str] = ...) -> None: ...

class ListPlansResponse(_message.Message):
    __slots__ = ("plans", "next_page_token")
    PLANS_FIELD_NUMBER: _ClassVar[int]
    NEXT_PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    plans: _containers.RepeatedCompositeFieldContainer[_common_pb2.Plan]
    next_page_token: str
    def __init__(self, plans: _Optional[_Iterable[_Union[_common_pb2.Plan, _Mapping]]] = ..., next_page_token: _Optional[str] = ...) -> None: ...

class ActivatePlanRequest(_message.Message):
    __slots__ = ("version",)
    VERSION_FIELD_NUMBER: _ClassVar[int]
    version: int
    def __init__(self, version: _Optional[int] = ...) -> None: ...

class ActivatePlanResponse(_message.Message):
    __slots__ = ("plan",)
    PLAN_FIELD_NUMBER: _ClassVar[int]
    plan: _common_pb2.Plan
    def __init__(self, plan: _Optional[_Union[_common_pb2.Plan, _Mapping]] = ...) -> None: ...

class WatchPlansRequest(_message.Message):
    __slots__ = ("after_version",)
    AFTER_VERSION_FIELD_NUMBER: _ClassVar[int]
    after_version: int
    def __init__(self, after_version: _Optional[int] = ...) -> None: ...

class WatchPlansResponse(_message.Message):
    __slots__ = ("plan",)
    PLAN_FIELD_NUMBER: _ClassVar[int]
    plan: _common_pb2.Plan
    def __init__(self, plan: _Optional[_Union[_common_pb2.Plan, _Mapping]] = ...) -> None: ...

class SetFleetRequest(_message.Message):
    __slots__ = ("fleet",)
    FLEET_FIELD_NUMBER: _ClassVar[int]
    fleet: _common_pb2.FleetInventory
    def __init__(self, fleet: _Optional[_Union[_common_pb2.FleetInventory, _Mapping]] = ...) -> None: ...

class SetFleetResponse(_message.Message):
    __slots__ = ("fleet",)
    FLEET_FIELD_NUMBER: _ClassVar[int]
    fleet: _common_pb2.FleetInventory
    def __init__(self, fleet: _Optional[_Union[_common_pb2.FleetInventory, _Mapping]] = ...) -> None: ...

class GetFleetRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class GetFleetResponse(_message.Message):
    __slots__ = ("fleet", "updated_at")
    FLEET_FIELD_NUMBER: _ClassVar[int]
    UPDATED_AT_FIELD_NUMBER: _ClassVar[int]
    fleet: _common_pb2.FleetInventory
    updated_at: _timestamp_pb2.Timestamp
    def __init__(self, fleet: _Optional[_Union[_common_pb2.FleetInventory, _Mapping]] = ..., updated_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ...) -> None: ...

class EstimateCarbonRequest(_message.Message):
    __slots__ = ("energy_kwh", "ci_g_per_kwh", "duration_s", "mean_batch_size", "cache_allocated_bytes", "carbon_params")
    ENERGY_KWH_FIELD_NUMBER: _ClassVar[int]
    CI_G_PER_KWH_FIELD_NUMBER: _ClassVar[int]
    DURATION_S_FIELD_NUMBER: _ClassVar[int]
    MEAN_BATCH_SIZE_FIELD_NUMBER: _ClassVar[int]
    CACHE_ALLOCATED_BYTES_FIELD_NUMBER: _ClassVar[int]
    CARBON_PARAMS_FIELD_NUMBER: _ClassVar[int]
    energy_kwh: float
    ci_g_per_kwh: float
    duration_s: float
    mean_batch_size: float
    cache_allocated_bytes: int
    carbon_params: _common_pb2.CarbonParams
    def __init__(self, energy_kwh: _Optional[float] = ..., ci_g_per_kwh: _Optional[float] = ..., duration_s: _Optional[float] = ..., mean_batch_size: _Optional[float] = ..., cache_allocated_bytes: _Optional[int] = ..., carbon_params: _Optional[_Union[_common_pb2.CarbonParams, _Mapping]] = ...) -> None: ...

class EstimateCarbonResponse(_message.Message):
    __slots__ = ("carbon", "carbon_params")
    CARBON_FIELD_NUMBER: _ClassVar[int]
    CARBON_PARAMS_FIELD_NUMBER: _ClassVar[int]
    carbon: _common_pb2.CarbonBreakdown
    carbon_params: _common_pb2.CarbonParams
    def __init__(self, carbon: _Optional[_Union[_common_pb2.CarbonBreakdown, _Mapping]] = ..., carbon_params: _Optional[_Union[_common_pb2.CarbonParams, _Mapping]] = ...) -> None: ...
