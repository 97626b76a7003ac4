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

class AccessKind(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    ACCESS_KIND_UNSPECIFIED: _ClassVar[AccessKind]
    ACCESS_KIND_HIT: _ClassVar[AccessKind]
    ACCESS_KIND_MISS: _ClassVar[AccessKind]
    ACCESS_KIND_STORE: _ClassVar[AccessKind]
    ACCESS_KIND_EVICT: _ClassVar[AccessKind]

class ChunkAction(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    CHUNK_ACTION_UNSPECIFIED: _ClassVar[ChunkAction]
    CHUNK_ACTION_READ: _ClassVar[ChunkAction]
    CHUNK_ACTION_RECOMPUTE: _ClassVar[ChunkAction]
ACCESS_KIND_UNSPECIFIED: AccessKind
ACCESS_KIND_HIT: AccessKind
ACCESS_KIND_MISS: AccessKind
ACCESS_KIND_STORE: AccessKind
ACCESS_KIND_EVICT: AccessKind
CHUNK_ACTION_UNSPECIFIED: ChunkAction
CHUNK_ACTION_READ: ChunkAction
CHUNK_ACTION_RECOMPUTE: ChunkAction

class CacheServer(_message.Message):
    __slots__ = ("id", "pool", "url", "dram_bytes", "disk_bytes", "dram_used_bytes", "reachable", "applied_plan_version")
    ID_FIELD_NUMBER: _ClassVar[int]
    POOL_FIELD_NUMBER: _ClassVar[int]
    URL_FIELD_NUMBER: _ClassVar[int]
    DRAM_BYTES_FIELD_NUMBER: _ClassVar[int]
    DISK_BYTES_FIELD_NUMBER: _ClassVar[int]
    DRAM_USED_BYTES_FIELD_NUMBER: _ClassVar[int]
    REACHABLE_FIELD_NUMBER: _ClassVar[int]
    APPLIED_PLAN_VERSION_FIELD_NUMBER: _ClassVar[int]
    id: str
    pool: str
    url: str
    dram_bytes: int
    disk_bytes: int
    dram_used_bytes: int
    reachable: bool
    applied_plan_version: int
    def __init__(self, id: _Optional[str] = ..., pool: _Optional[str] = ..., url: _Optional[str] = ..., dram_bytes: _Optional[int] = ..., disk_bytes: _Optional[int] = ..., dram_used_bytes: _Optional[int] = ..., reachable: _Optional[bool] = ..., applied_plan_version: _Optional[int] = ...) -> None: ...

class RegisterCacheServerRequest(_message.Message):
    __slots__ = ("server",)
    SERVER_FIELD_NUMBER: _ClassVar[int]
    server: CacheServer
    def __init__(self, server: _Optional[_Union[CacheServer, _Mapping]] = ...) -> None: ...

class RegisterCacheServerResponse(_message.Message):
    __slots__ = ("server",)
    SERVER_FIELD_NUMBER: _ClassVar[int]
    server: CacheServer
    def __init__(self, server: _Optional[_Union[CacheServer, _Mapping]] = ...) -> None: ...

class DeregisterCacheServerRequest(_message.Message):
    __slots__ = ("server_id",)
    SERVER_ID_FIELD_NUMBER: _ClassVar[int]
    server_id: str
    def __init__(self, server_id: _Optional[str] = ...) -> None: ...

class DeregisterCacheServerResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ListCacheServersRequest(_message.Message):
    __slots__ = ("pool",)
    POOL_FIELD_NUMBER: _ClassVar[int]
    pool: str
    def __init__(self, pool: _Optional[str] = ...) -> None: ...

class ListCacheServersResponse(_message.Message):
    __slots__ = ("servers",)
    SERVERS_FIELD_NUMBER: _ClassVar[int]
    servers: _containers.RepeatedCompositeFieldContainer[CacheServer]
    def __init__(self, servers: _Optional[_Iterable[_Union[CacheServer, _Mapping]]] = ...) -> None: ...

class CacheApplyResult(_message.Message):
    __slots__ = ("server_id", "applied", "detail", "dram_bytes", "disk_bytes")
    SERVER_ID_FIELD_NUMBER: _ClassVar[int]
    APPLIED_FIELD_NUMBER: _ClassVar[int]
    DETAIL_FIELD_NUMBER: _ClassVar[int]
    DRAM_BYTES_FIELD_NUMBER: _ClassVar[int]
    DISK_BYTES_FIELD_NUMBER: _ClassVar[int]
    server_id: str
    applied: bool
    detail: str
    dram_bytes: int
    disk_bytes: int
    def __init__(self, server_id: _Optional[str] = ..., applied: _Optional[bool] = ..., detail: _Optional[str] = ..., dram_bytes: _Optional[int] = ..., disk_bytes: _Optional[int] = ...) -> None: ...

class ApplyCachePlanRequest(_message.Message):
    __slots__ = ("plan_version", "targets")
    PLAN_VERSION_FIELD_NUMBER: _ClassVar[int]
    TARGETS_FIELD_NUMBER: _ClassVar[int]
    plan_version: int
    targets: _containers.RepeatedCompositeFieldContainer[_common_pb2.CacheTarget]
    def __init__(self, plan_version: _Optional[int] = ..., targets: _Optional[_Iterable[_Union[_common_pb2.CacheTarget, _Mapping]]] = ...) -> None: ...

class ApplyCachePlanResponse(_message.Message):
    __slots__ = ("results",)
    RESULTS_FIELD_NUMBER: _ClassVar[int]
    results: _containers.RepeatedCompositeFieldContainer[CacheApplyResult]
    def __init__(self, results: _Optional[_Iterable[_Union[CacheApplyResult, _Mapping]]] = ...) -> None: ...

class ResizeCacheRequest(_message.Message):
    __slots__ = ("server_id", "dram_bytes", "disk_bytes")
    SERVER_ID_FIELD_NUMBER: _ClassVar[int]
    DRAM_BYTES_FIELD_NUMBER: _ClassVar[int]
    DISK_BYTES_FIELD_NUMBER: _ClassVar[int]
    server_id: str
    dram_bytes: int
    disk_bytes: int
    def __init__(self, server_id: _Optional[str] = ..., dram_bytes: _Optional[int] = ..., disk_bytes: _Optional[int] = ...) -> None: ...

class ResizeCacheResponse(_message.Message):
    __slots__ = ("result", "evicted_entries")
    RESULT_FIELD_NUMBER: _ClassVar[int]
    EVICTED_ENTRIES_FIELD_NUMBER: _ClassVar[int]
    result: CacheApplyResult
    evicted_entries: int
    def __init__(self, result: _Optional[_Union[CacheApplyResult, _Mapping]] = ..., evicted_entries: _Optional[int] = ...) -> None: ...

class SetQuotaRequest(_message.Message):
    __slots__ = ("server_id", "salt", "quota_bytes")
    SERVER_ID_FIELD_NUMBER: _ClassVar[int]
    SALT_FIELD_NUMBER: _ClassVar[int]
    QUOTA_BYTES_FIELD_NUMBER: _ClassVar[int]
    server_id: str
    salt: str
    quota_bytes: int
    def __init__(self, server_id: _Optional[str] = ..., salt: _Optional[str] = ..., quota_bytes: _Optional[int] = ...) -> None: ...

class SetQuotaResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ReportAccessesRequest(_message.Message):
    __slots__ = ("pool", "entry_key", "kind", "tokens", "size_bytes", "hit_tokens", "conversation_id", "turn", "document_id", "time", "tier")
    POOL_FIELD_NUMBER: _ClassVar[int]
    ENTRY_KEY_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    TOKENS_FIELD_NUMBER: _ClassVar[int]
    SIZE_BYTES_FIELD_NUMBER: _ClassVar[int]
    HIT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    CONVERSATION_ID_FIELD_NUMBER: _ClassVar[int]
    TURN_FIELD_NUMBER: _ClassVar[int]
    DOCUMENT_ID_FIELD_NUMBER: _ClassVar[int]
    TIME_FIELD_NUMBER: _ClassVar[int]
    TIER_FIELD_NUMBER: _ClassVar[int]
    pool: str
    entry_key: str
    kind: AccessKind
    tokens: int
    size_bytes: int
    hit_tokens: int
    conversation_id: str
    turn: int
    document_id: str
    time: _timestamp_pb2.Timestamp
    tier: _common_pb2.CacheTier
    def __init__(self, pool: _Optional[str] = ..., entry_key: _Optional[str] = ..., kind: _Optional[_Union[AccessKind, str]] = ..., tokens: _Optional[int] = ..., size_bytes: _Optional[int] = ..., hit_tokens: _Optional[int] = ..., conversation_id: _Optional[str] = ..., turn: _Optional[int] = ..., document_id: _Optional[str] = ..., time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., tier: _Optional[_Union[_common_pb2.CacheTier, str]] = ...) -> None: ...

class ReportAccessesResponse(_message.Message):
    __slots__ = ("accepted_events",)
    ACCEPTED_EVENTS_FIELD_NUMBER: _ClassVar[int]
    accepted_events: int
    def __init__(self, accepted_events: _Optional[int] = ...) -> None: ...

class ListEvictionCandidatesRequest(_message.Message):
    __slots__ = ("pool", "limit")
    POOL_FIELD_NUMBER: _ClassVar[int]
    LIMIT_FIELD_NUMBER: _ClassVar[int]
    pool: str
    limit: int
    def __init__(self, pool: _Optional[str] = ..., limit: _Optional[int] = ...) -> None: ...

class CacheEntryScore(_message.Message):
    __slots__ = ("entry_key", "lcs_score", "size_bytes", "hits", "age_s")
    ENTRY_KEY_FIELD_NUMBER: _ClassVar[int]
    LCS_SCORE_FIELD_NUMBER: _ClassVar[int]
    SIZE_BYTES_FIELD_NUMBER: _ClassVar[int]
    HITS_FIELD_NUMBER: _ClassVar[int]
    AGE_S_FIELD_NUMBER: _ClassVar[int]
    entry_key: str
    lcs_score: float
    size_bytes: int
    hits: int
    age_s: float
    def __init__(self, entry_key: _Optional[str] = ..., lcs_score: _Optional[float] = ..., size_bytes: _Optional[int] = ..., hits: _Optional[int] = ..., age_s: _Optional[float] = ...) -> None: ...

class ListEvictionCandidatesResponse(_message.Message):
    __slots__ = ("entries",)
    ENTRIES_FIELD_NUMBER: _ClassVar[int]
    entries: _containers.RepeatedCompositeFieldContainer[CacheEntryScore]
    def __init__(self, entries: _Optional[_Iterable[_Union[CacheEntryScore, _Mapping]]] = ...) -> None: ...

class ComputeGroupTtlsRequest(_message.Message):
    __slots__ = ("pool", "window_s", "top_k_groups", "budget_bytes", "dry_run")
    POOL_FIELD_NUMBER: _ClassVar[int]
    WINDOW_S_FIELD_NUMBER: _ClassVar[int]
    TOP_K_GROUPS_FIELD_NUMBER: _ClassVar[int]
    BUDGET_BYTES_FIELD_NUMBER: _ClassVar[int]
    DRY_RUN_FIELD_NUMBER: _ClassVar[int]
    pool: str
    window_s: float
    top_k_groups: int
    budget_bytes: int
    dry_run: bool
    def __init__(self, pool: _Optional[str] = ..., window_s: _Optional[float] = ..., top_k_groups: _Optional[int] = ..., budget_bytes: _Optional[int] = ..., dry_run: _Optional[bool] = ...) -> None: ...

class GroupTtl(_message.Message):
    __slots__ = ("group_id", "ttl_s", "expected_hit_fraction", "expected_bytes")
    GROUP_ID_FIELD_NUMBER: _ClassVar[int]
    TTL_S_FIELD_NUMBER: _ClassVar[int]
    EXPECTED_HIT_FRACTION_FIELD_NUMBER: _ClassVar[int]
    EXPECTED_BYTES_FIELD_NUMBER: _ClassVar[int]
    group_id: str
    ttl_s: float
    expected_hit_fraction: float
    expected_bytes: int
    def __init__(self, group_id: _Optional[str] = ..., ttl_s: _Optional[float] = ..., expected_hit_fraction: _Optional[float] = ..., expected_bytes: _Optional[int] = ...) -> None: ...

class ComputeGroupTtlsResponse(_message.Message):
    __slots__ = ("groups", "applied")
    GROUPS_FIELD_NUMBER: _ClassVar[int]
    APPLIED_FIELD_NUMBER: _ClassVar[int]
    groups: _containers.RepeatedCompositeFieldContainer[GroupTtl]
    applied: bool
    def __init__(self, groups: _Optional[_Iterable[_Union[GroupTtl, _Mapping]]] = ..., applied: _Optional[bool] = ...) -> None: ...

class CachedChunk(_message.Message):
    __slots__ = ("tier", "tokens", "read_s", "read_energy_j", "recompute_s", "recompute_energy_j")
    TIER_FIELD_NUMBER: _ClassVar[int]
    TOKENS_FIELD_NUMBER: _ClassVar[int]
    READ_S_FIELD_NUMBER: _ClassVar[int]
    READ_ENERGY_J_FIELD_NUMBER: _ClassVar[int]
    RECOMPUTE_S_FIELD_NUMBER: _ClassVar[int]
    RECOMPUTE_ENERGY_J_FIELD_NUMBER: _ClassVar[int]
    tier: _common_pb2.CacheTier
    tokens: int
    read_s: float
    read_energy_j: float
    recompute_s: float
    recompute_energy_j: float
    def __init__(self, tier: _Optional[_Union[_common_pb2.CacheTier, str]] = ..., tokens: _Optional[int] = ..., read_s: _Optional[float] = ..., read_energy_j: _Optional[float] = ..., recompute_s: _Optional[float] = ..., recompute_energy_j: _Optional[float] = ...) -> None: ...

class DecideReadOrRecomputeRequest(_message.Message):
    __slots__ = ("chunks", "delay_budget_s", "queue_wait_s")
    CHUNKS_FIELD_NUMBER: _ClassVar[int]
    DELAY_BUDGET_S_FIELD_NUMBER: _ClassVar[int]
    QUEUE_WAIT_S_FIELD_NUMBER: _ClassVar[int]
    chunks: _containers.RepeatedCompositeFieldContainer[CachedChunk]
    delay_budget_s: float
    queue_wait_s: float
    def __init__(self, chunks: _Optional[_Iterable[_Union[CachedChunk, _Mapping]]] = ..., delay_budget_s: _Optional[float] = ..., queue_wait_s: _Optional[float] = ...) -> None: ...

class DecideReadOrRecomputeResponse(_message.Message):
    __slots__ = ("actions", "energy_j", "time_s")
    ACTIONS_FIELD_NUMBER: _ClassVar[int]
    ENERGY_J_FIELD_NUMBER: _ClassVar[int]
    TIME_S_FIELD_NUMBER: _ClassVar[int]
    actions: _containers.RepeatedScalarFieldContainer[ChunkAction]
    energy_j: float
    time_s: float
    def __init__(self, actions: _Optional[_Iterable[_Union[ChunkAction, str]]] = ..., energy_j: _Optional[float] = ..., time_s: _Optional[float] = ...) -> None: ...

class GetAccessWindowRequest(_message.Message):
    __slots__ = ("pool", "start", "end", "limit")
    POOL_FIELD_NUMBER: _ClassVar[int]
    START_FIELD_NUMBER: _ClassVar[int]
    END_FIELD_NUMBER: _ClassVar[int]
    LIMIT_FIELD_NUMBER: _ClassVar[int]
    pool: str
    start: _timestamp_pb2.Timestamp
    end: _timestamp_pb2.Timestamp
    limit: int
    def __init__(self, pool: _Optional[str] = ..., start: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., end: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., limit: _Optional[int] = ...) -> None: ...

class AccessRecord(_message.Message):
    __slots__ = ("entry_key", "kind", "tokens", "hit_tokens", "conversation_id", "document_id", "time")
    ENTRY_KEY_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    TOKENS_FIELD_NUMBER: _ClassVar[int]
    HIT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    CONVERSATION_ID_FIELD_NUMBER: _ClassVar[int]
    DOCUMENT_ID_FIELD_NUMBER: _ClassVar[int]
    TIME_FIELD_NUMBER: _ClassVar[int]
    entry_key: str
    kind: AccessKind
    tokens: int
    hit_tokens: int
    conversation_id: str
    document_id: str
    time: _timestamp_pb2.Timestamp
    def __init__(self, entry_key: _Optional[str] = ..., kind: _Optional[_Union[AccessKind, str]] = ..., tokens: _Optional[int] = ..., hit_tokens: _Optional[int] = ..., conversation_id: _Optional[str] = ..., document_id: _Optional[str] = ..., time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ...) -> None: ...

class GetAccessWindowResponse(_message.Message):
    __slots__ = ("accesses", "truncated", "latest_time", "capped_hours")
    ACCESSES_FIELD_NUMBER: _ClassVar[int]
    TRUNCATED_FIELD_NUMBER: _ClassVar[int]
    LATEST_TIME_FIELD_NUMBER: _ClassVar[int]
    CAPPED_HOURS_FIELD_NUMBER: _ClassVar[int]
    accesses: _containers.RepeatedCompositeFieldContainer[AccessRecord]
    truncated: bool
    latest_time: _timestamp_pb2.Timestamp
    capped_hours: int
    def __init__(self, accesses: _Optional[_Iterable[_Union[AccessRecord, _Mapping]]] = ..., truncated: _Optional[bool] = ..., latest_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., capped_hours: _Optional[int] = ...) -> None: ...
