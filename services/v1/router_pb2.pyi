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

class ChatRole(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    CHAT_ROLE_UNSPECIFIED: _ClassVar[ChatRole]
    CHAT_ROLE_SYSTEM: _ClassVar[ChatRole]
    CHAT_ROLE_USER: _ClassVar[ChatRole]
    CHAT_ROLE_ASSISTANT: _ClassVar[ChatRole]
    CHAT_ROLE_TOOL: _ClassVar[ChatRole]
CHAT_ROLE_UNSPECIFIED: ChatRole
CHAT_ROLE_SYSTEM: ChatRole
CHAT_ROLE_USER: ChatRole
CHAT_ROLE_ASSISTANT: ChatRole
CHAT_ROLE_TOOL: ChatRole

class ChatMessage(_message.Message):
    __slots__ = ("role", "content")
    ROLE_FIELD_NUMBER: _ClassVar[int]
    CONTENT_FIELD_NUMBER: _ClassVar[int]
    role: ChatRole
    content: str
    def __init__(self, role: _Optional[_Union[ChatRole, str]] = ..., content: _Optional[str] = ...) -> None: ...

class ChatInput(_message.Message):
    __slots__ = ("messages",)
    MESSAGES_FIELD_NUMBER: _ClassVar[int]
    messages: _containers.RepeatedCompositeFieldContainer[ChatMessage]
    def __init__(self, messages: _Optional[_Iterable[_Union[ChatMessage, _Mapping]]] = ...) -> None: ...

class CompletionInput(_message.Message):
    __slots__ = ("prompt",)
    PROMPT_FIELD_NUMBER: _ClassVar[int]
    prompt: str
    def __init__(self, prompt: _Optional[str] = ...) -> None: ...

class SamplingParams(_message.Message):
    __slots__ = ("max_tokens", "temperature", "top_p", "stop", "seed")
    MAX_TOKENS_FIELD_NUMBER: _ClassVar[int]
    TEMPERATURE_FIELD_NUMBER: _ClassVar[int]
    TOP_P_FIELD_NUMBER: _ClassVar[int]
    STOP_FIELD_NUMBER: _ClassVar[int]
    SEED_FIELD_NUMBER: _ClassVar[int]
    max_tokens: int
    temperature: float
    top_p: float
    stop: _containers.RepeatedScalarFieldContainer[str]
    seed: int
    def __init__(self, max_tokens: _Optional[int] = ..., temperature: _Optional[float] = ..., top_p: _Optional[float] = ..., stop: _Optional[_Iterable[str]] = ..., seed: _Optional[int] = ...) -> None: ...

class RequestDescriptor(_message.Message):
    __slots__ = ("pool", "model", "session_key", "chat", "completion")
    POOL_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    SESSION_KEY_FIELD_NUMBER: _ClassVar[int]
    CHAT_FIELD_NUMBER: _ClassVar[int]
    COMPLETION_FIELD_NUMBER: _ClassVar[int]
    pool: str
    model: str
    session_key: str
    chat: ChatInput
    completion: CompletionInput
    def __init__(self, pool: _Optional[str] = ..., model: _Optional[str] = ..., session_key: _Optional[str] = ..., chat: _Optional[_Union[ChatInput, _Mapping]] = ..., completion: _Optional[_Union[CompletionInput, _Mapping]] = ...) -> None: ...

class GenerateRequest(_message.Message):
    __slots__ = ("request", "sampling", "request_id")
    REQUEST_FIELD_NUMBER: _ClassVar[int]
    SAMPLING_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    request: RequestDescriptor
    sampling: SamplingParams
    request_id: str
    def __init__(self, request: _Optional[_Union[RequestDescriptor, _Mapping]] = ..., sampling: _Optional[_Union[SamplingParams, _Mapping]] = ..., request_id: _Optional[str] = ...) -> None: ...

class GenerateResponse(_message.Message):
    __slots__ = ("request_id", "text_delta", "finish_reason", "receipt", "engine_id", "token_count")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    TEXT_DELTA_FIELD_NUMBER: _ClassVar[int]
    FINISH_REASON_FIELD_NUMBER: _ClassVar[int]
    RECEIPT_FIELD_NUMBER: _ClassVar[int]
    ENGINE_ID_FIELD_NUMBER: _ClassVar[int]
    TOKEN_COUNT_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    text_delta: str
    finish_reason: str
    receipt: CarbonReceipt
    engine_id: str
    token_count: int
    def __init__(self, request_id: _Optional[str] = ..., text_delta: _Optional[str] = ..., finish_reason: _Optional[str] = ..., receipt: _Optional[_Union[CarbonReceipt, _Mapping]] = ..., engine_id: _Optional[str] = ..., token_count: _Optional[int] = ...) -> None: ...

class CarbonReceipt(_message.Message):
    __slots__ = ("engine_id", "pool", "ttft_s", "tpot_s", "e2e_s", "prompt_tokens", "cached_prompt_tokens", "completion_tokens", "energy_kwh", "ci_g_per_kwh", "carbon", "plan_version", "slo_met")
    ENGINE_ID_FIELD_NUMBER: _ClassVar[int]
    POOL_FIELD_NUMBER: _ClassVar[int]
    TTFT_S_FIELD_NUMBER: _ClassVar[int]
    TPOT_S_FIELD_NUMBER: _ClassVar[int]
    E2E_S_FIELD_NUMBER: _ClassVar[int]
    PROMPT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    CACHED_PROMPT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    COMPLETION_TOKENS_FIELD_NUMBER: _ClassVar[int]
    ENERGY_KWH_FIELD_NUMBER: _ClassVar[int]
    CI_G_PER_KWH_FIELD_NUMBER: _ClassVar[int]
    CARBON_FIELD_NUMBER: _ClassVar[int]
    PLAN_VERSION_FIELD_NUMBER: _ClassVar[int]
    SLO_MET_FIELD_NUMBER: _ClassVar[int]
    engine_id: str
    pool: str
    ttft_s: float
    tpot_s: float
    e2e_s: float
    prompt_tokens: int
    cached_prompt_tokens: int
    completion_tokens: int
    energy_kwh: float
    ci_g_per_kwh: float
    carbon: _common_pb2.CarbonBreakdown
    plan_version: int
    slo_met: bool
    def __init__(self, engine_id: _Optional[str] = ..., pool: _Optional[str] = ..., ttft_s: _Optional[float] = ..., tpot_s: _Optional[float] = ..., e2e_s: _Optional[float] = ..., prompt_tokens: _Optional[int] = ..., cached_prompt_tokens: _Optional[int] = ..., completion_tokens: _Optional[int] = ..., energy_kwh: _Optional[float] = ..., ci_g_per_kwh: _Optional[float] = ..., carbon: _Optional[_Union[_common_pb2.CarbonBreakdown, _Mapping]] = ..., plan_version: _Optional[int] = ..., slo_met: _Optional[bool] = ...) -> None: ...

class RouteRequest(_message.Message):
    __slots__ = ("request",)
    REQUEST_FIELD_NUMBER: _ClassVar[int]
    request: RequestDescriptor
    def __init__(self, request: _Optional[_Union[RequestDescriptor, _Mapping]] = ...) -> None: ...

class RouteResponse(_message.Message):
    __slots__ = ("engine", "reason", "plan_version", "expected_cached_prompt_tokens")
    ENGINE_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    PLAN_VERSION_FIELD_NUMBER: _ClassVar[int]
    EXPECTED_CACHED_PROMPT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    engine: _common_pb2.Engine
    reason: str
    plan_version: int
    expected_cached_prompt_tokens: int
    def __init__(self, engine: _Optional[_Union[_common_pb2.Engine, _Mapping]] = ..., reason: _Optional[str] = ..., plan_version: _Optional[int] = ..., expected_cached_prompt_tokens: _Optional[int] = ...) -> None: ...

class RegisterEngineRequest(_message.Message):
    __slots__ = ("engine",)
    ENGINE_FIELD_NUMBER: _ClassVar[int]
    engine: _common_pb2.Engine
    def __init__(self, engine: _Optional[_Union[_common_pb2.Engine, _Mapping]] = ...) -> None: ...

class RegisterEngineResponse(_message.Message):
    __slots__ = ("engine", "created")
    ENGINE_FIELD_NUMBER: _ClassVar[int]
    CREATED_FIELD_NUMBER: _ClassVar[int]
    engine: _common_pb2.Engine
    created: bool
    def __init__(self, engine: _Optional[_Union[_common_pb2.Engine, _Mapping]] = ..., created: _Optional[bool] = ...) -> None: ...

class DeregisterEngineRequest(_message.Message):
    __slots__ = ("engine_id",)
    ENGINE_ID_FIELD_NUMBER: _ClassVar[int]
    engine_id: str
    def __init__(self, engine_id: _Optional[str] = ...) -> None: ...

class DeregisterEngineResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ListEnginesRequest(_message.Message):
    __slots__ = ("pool",)
    POOL_FIELD_NUMBER: _ClassVar[int]
    pool: str
    def __init__(self, pool: _Optional[str] = ...) -> None: ...

class EngineStatus(_message.Message):
    __slots__ = ("engine", "running_requests", "waiting_requests", "router_in_flight_requests", "kv_cache_usage_fraction", "metrics_scraped_at", "consecutive_failures", "recent_ttft_s", "recent_tpot_s")
    ENGINE_FIELD_NUMBER: _ClassVar[int]
    RUNNING_REQUESTS_FIELD_NUMBER: _ClassVar[int]
    WAITING_REQUESTS_FIELD_NUMBER: _ClassVar[int]
    ROUTER_IN_FLIGHT_REQUESTS_FIELD_NUMBER: _ClassVar[int]
    KV_CACHE_USAGE_FRACTION_FIELD_NUMBER: _ClassVar[int]
    METRICS_SCRAPED_AT_FIELD_NUMBER: _ClassVar[int]
    CONSECUTIVE_FAILURES_FIELD_NUMBER: _ClassVar[int]
    RECENT_TTFT_S_FIELD_NUMBER: _ClassVar[int]
    RECENT_TPOT_S_FIELD_NUMBER: _ClassVar[int]
    engine: _common_pb2.Engine
    running_requests: int
    waiting_requests: int
    router_in_flight_requests: int
    kv_cache_usage_fraction: float
    metrics_scraped_at: _timestamp_pb2.Timestamp
    consecutive_failures: int
    recent_ttft_s: float
    recent_tpot_s: float
    def __init__(self, engine: _Optional[_Union[_common_pb2.Engine, _Mapping]] = ..., running_requests: _Optional[int] = ..., waiting_requests: _Optional[int] = ..., router_in_flight_requests: _Optional[int] = ..., kv_cache_usage_fraction: _Optional[float] = ..., metrics_scraped_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., consecutive_failures: _Optional[int] = ..., recent_ttft_s: _Optional[float] = ..., recent_tpot_s: _Optional[float] = ...) -> None: ...

class RouterReplica(_message.Message):
    __slots__ = ("replica_id", "plan_version", "state_version", "seen_at")
    REPLICA_ID_FIELD_NUMBER: _ClassVar[int]
    PLAN_VERSION_FIELD_NUMBER: _ClassVar[int]
    STATE_VERSION_FIELD_NUMBER: _ClassVar[int]
    SEEN_AT_FIELD_NUMBER: _ClassVar[int]
    replica_id: str
    plan_version: int
    state_version: int
    seen_at: _timestamp_pb2.Timestamp
    def __init__(self, replica_id: _Optional[str] = ..., plan_version: _Optional[int] = ..., state_version: _Optional[int] = ..., seen_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ...) -> None: ...

class ListEnginesResponse(_message.Message):
    __slots__ = ("engines", "replicas", "state_version")
    ENGINES_FIELD_NUMBER: _ClassVar[int]
    REPLICAS_FIELD_NUMBER: _ClassVar[int]
    STATE_VERSION_FIELD_NUMBER: _ClassVar[int]
    engines: _containers.RepeatedCompositeFieldContainer[EngineStatus]
    replicas: _containers.RepeatedCompositeFieldContainer[RouterReplica]
    state_version: int
    def __init__(self, engines: _Optional[_Iterable[_Union[EngineStatus, _Mapping]]] = ..., replicas: _Optional[_Iterable[_Union[RouterReplica, _Mapping]]] = ..., state_version: _Optional[int] = ...) -> None: ...

class DrainRequest(_message.Message):
    __slots__ = ("engine_ids", "wait", "timeout_s")
    ENGINE_IDS_FIELD_NUMBER: _ClassVar[int]
    WAIT_FIELD_NUMBER: _ClassVar[int]
    TIMEOUT_S_FIELD_NUMBER: _ClassVar[int]
    engine_ids: _containers.RepeatedScalarFieldContainer[str]
    wait: bool
    timeout_s: float
    def __init__(self, engine_ids: _Optional[_Iterable[str]] = ..., wait: _Optional[bool] = ..., timeout_s: _Optional[float] = ...) -> None: ...

class DrainResponse(_message.Message):
    __slots__ = ("idle_engine_ids", "busy_engine_ids")
    IDLE_ENGINE_IDS_FIELD_NUMBER: _ClassVar[int]
    BUSY_ENGINE_IDS_FIELD_NUMBER: _ClassVar[int]
    idle_engine_ids: _containers.RepeatedScalarFieldContainer[str]
    busy_engine_ids: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, idle_engine_ids: _Optional[_Iterable[str]] = ..., busy_engine_ids: _Optional[_Iterable[str]] = ...) -> None: ...

class UndrainRequest(_message.Message):
    __slots__ = ("engine_ids",)
    ENGINE_IDS_FIELD_NUMBER: _ClassVar[int]
    engine_ids: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, engine_ids: _Optional[_Iterable[str]] = ...) -> None: ...

class UndrainResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...
