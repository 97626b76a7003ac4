"""RouterSettings: the flags and GREENSERVE_* env vars of greenserve-router, and the configs built from them."""

from __future__ import annotations

from typing import ClassVar
from urllib.parse import urlparse

from greenserve.common.client import ChannelConfig
from greenserve.common.config import (
    DEFAULT_ROUTER_HTTP_PORT,
    MIB,
    DependencyAddresses,
    ServiceSettings,
)
from greenserve.router.core import CoreConfig
from greenserve.router.front.http_guard import HttpLimits, default_max_connections
from greenserve.router.routing.engine_sleep import SleepSettings
from greenserve.router.routing.engines import engine_url_problem
from greenserve.router.routing.policy import PolicyConfig
from greenserve.router.upstream.engine_pool import STREAM_IDLE_TIMEOUT_S
from pydantic import Field, model_validator


class RouterSettings(ServiceSettings, DependencyAddresses):
    """Flags and GREENSERVE_* env vars of greenserve-router (defaults explained in docs/router.md)."""

    service_name: ClassVar[str] = "router"

    engines: str = Field("", description="comma-separated engine base URLs (http://host:port) routed to from start")
    default_pool: str = Field("default", description="pool of engines given by --engines")
    http_port: int = Field(DEFAULT_ROUTER_HTTP_PORT, ge=-1, le=65535,
                           description="port of the OpenAI-compatible HTTP front; 0 picks a free port, -1 disables it")
    http_host: str | None = Field(None, description="address of the HTTP front (default: --host)")
    http_max_body_bytes: int = Field(16 * MIB, ge=1024, le=1024 * MIB,
                                     description="largest HTTP request body; larger ones get 413 before being read")
    http_max_body_bytes_in_flight: int = Field(
        256 * MIB, ge=1024, le=1024 * 1024 * MIB,
        description="request body bytes held at once by the HTTP requests in flight; above it new ones get 429")
    http_max_connections: int | None = Field(
        None, ge=1, le=1_000_000,
        description="open HTTP connections above which new ones get 503 and are closed (default: half the file "
        "descriptor limit less 64, at most 4096)")
    http_header_timeout_s: float = Field(
        10.0, gt=0, le=3600, description="seconds a new HTTP connection gets to send a complete request head")
    http_body_timeout_s: float = Field(30.0, gt=0, le=3600,
                                       description="seconds an HTTP request body gets to arrive in full (408 after)")
    http_keepalive_timeout_s: float = Field(
        75.0, gt=0, le=3600,
        description="seconds an idle HTTP keep-alive connection is kept open (longer than the idle timeouts of "
        "client pools, 5-60 s, so that a client never reuses a connection the router is closing)")
    http_max_requests_per_connection: int = Field(1000, ge=1, le=10_000_000,
                                                  description="requests one HTTP keep-alive connection may carry")
    scrape_interval_s: float = Field(0.5, gt=0, le=60, description="seconds between /metrics scrapes of each engine")
    stale_after_s: float = Field(2.0, gt=0, le=600, description="metrics older than this make an engine STALE")
    health_interval_s: float = Field(1.0, gt=0, le=60, description="seconds between /health probes of each engine")
    probe_timeout_s: float = Field(1.0, gt=0, le=60, description="timeout of one probe or scrape")
    eject_after_failures: int = Field(3, ge=1, le=100, description="consecutive failures that eject an engine")
    eject_base_s: float = Field(1.0, gt=0, le=600, description="first ejection time; doubles per re-ejection")
    eject_max_s: float = Field(30.0, gt=0, le=3600, description="longest ejection time")
    max_in_flight: int = Field(4096, ge=1, le=1_000_000,
                               description="requests in flight above which new ones get 429 / RESOURCE_EXHAUSTED")
    max_attempts: int = Field(3, ge=1, le=10, description="engines tried per request before the first token")
    first_token_timeout_s: float = Field(60.0, gt=0, le=3600,
                                         description="an attempt without a first token by then is retried elsewhere")
    engine_stream_idle_timeout_s: float = Field(
        STREAM_IDLE_TIMEOUT_S, ge=0, le=86400,
        description="an engine that sends nothing for this many seconds in the middle of a response is cut: the "
        "stream ends with an error and the connection closes, which aborts the request in vLLM (whose gaps "
        "between tokens reach tens of seconds under preemption); 0: never")
    prefix_block_chars: int = Field(256, ge=16, le=65536, description="characters per prefix-hash block")
    prefix_index_max_bytes: int = Field(64 * MIB, ge=1024, le=64 * 1024 * MIB,
                                        description="memory cap of the whole prefix index")
    plan_weight: float = Field(1.0, ge=0, allow_inf_nan=False, description="weight of the plan scorer")
    load_weight: float = Field(2.0, ge=0, allow_inf_nan=False, description="weight of the load scorer")
    prefix_weight: float = Field(3.0, ge=0, allow_inf_nan=False, description="weight of the prefix-affinity scorer")
    session_weight: float = Field(10.0, ge=0, allow_inf_nan=False, description="weight of session stickiness")
    bounded_load_factor: float = Field(1.25, ge=1.0, allow_inf_nan=False,
                                       description="c of the bounded-load filter (load <= c x mean)")
    bounded_load_slack: float = Field(8.0, ge=0, allow_inf_nan=False,
                                      description="absolute slack of the bounded-load filter, requests")
    decode_load_weight: float = Field(0.0, ge=0, le=1,
                                      description="load of a decoding request relative to one awaiting its first token")
    max_sessions: int = Field(100_000, ge=1, description="session keys remembered (LRU)")
    grpc_stream_interval_s: float = Field(
        0.05, ge=0, le=1.0,
        description="Generate: after the first token (always sent at once), at most one message per this many "
        "seconds, carrying every token that arrived meanwhile (a gRPC message costs the router several times "
        "what a token costs over HTTP); 0: one message per read of the engine's stream")
    grpc_stream_messages_per_s: float = Field(
        500.0, ge=0, allow_inf_nan=False,
        description="Generate: messages per second all streams may send together; when the streams in flight "
        "would send more at --grpc-stream-interval-s, each stream's interval widens to its share (streams / "
        "this), up to --grpc-stream-max-interval-s, so the router's gRPC message CPU stays bounded as "
        "concurrency grows; 0: no budget")
    grpc_stream_max_interval_s: float = Field(
        1.0, ge=0, le=5.0, description="Generate: the widest interval the message budget may set (seconds)")
    workers: int | None = Field(
        None, ge=1, le=64,
        description="worker processes serving both ports (SO_REUSEPORT, Linux) under a supervisor that restarts a "
        "dead one; default: one per CPU the process may use, at most 8; 1: one process, no supervisor (workers.py)")
    affinity_weight: float = Field(3.0, ge=0, allow_inf_nan=False,
                                   description="weight of the deterministic prefix affinity (rendezvous "
                                   "hashing of the conversation's key over the engines; 0 turns it off)")
    affinity_queue_slack: float = Field(3.0, ge=0, allow_inf_nan=False,
                                        description="the affinity holds while its engine has at most this "
                                        "many more requests awaiting a first token than the least queued one")
    replica_id: str = Field("", max_length=128,
                            description="this replica's name in the shared database (default: host:pid)")
    state_poll_interval_s: float = Field(0.25, gt=0, le=1.0,
                                         description="seconds between reads of the shared state's change counter")
    region: str = Field("", description="grid region of the engines when the fleet inventory names none")
    fallback_ci_g_per_kwh: float | None = Field(None, ge=0, le=1e4, allow_inf_nan=False,
                                                description="CI until the forecaster answers (default: data file)")
    ci_refresh_s: float = Field(60.0, gt=0, allow_inf_nan=False,
                                description="seconds between CI refreshes from the forecaster")
    default_busy_power_w: float | None = Field(None, ge=0, le=1e6, allow_inf_nan=False,
                                               description="engine power when serving (default: data file)")
    default_idle_power_w: float | None = Field(None, ge=0, le=1e6, allow_inf_nan=False,
                                               description="engine idle power (default: data file)")
    watch_plans: bool = Field(True, description="subscribe to the optimizer's WatchPlans")
    sleep_drain_timeout_s: float = Field(
        120.0, gt=0, le=3600, description="an engine the plan puts to sleep gets this long to finish its requests "
        "before POST /sleep; still busy: not put to sleep yet (it gets no new request) and tried again later")
    wake_timeout_s: float = Field(
        120.0, gt=0, le=3600, description="an engine the plan wakes must be awake (GET /is_sleeping false) and "
        "healthy within this long after POST /wake_up; else it stays out of routing and is tried again with back-off")
    sleep_retry_max_s: float = Field(
        300.0, ge=1, le=86400, description="longest back-off between two tries to put an engine to sleep or wake it "
        "(doubling from 5 s)")
    slo_window_s: float = Field(300.0, ge=10, le=86400,
                                description="SLO attainment per pool over this window is reported to the optimizer")
    slo_report_interval_s: float = Field(60.0, ge=1, le=3600, description="how often that report is sent")
    feeds: bool = Field(True, description="send load to the forecaster and prefix accesses to the cache-manager")
    envoy_picker: bool = Field(False, description="also serve Envoy's ext_proc endpoint picker and gRPC access log service on the gRPC port, for Envoy-based gateways (router/envoy/)")
    load_feed_interval_s: float = Field(10.0, gt=0, allow_inf_nan=False,
                                        description="load window sent to the forecaster, seconds")
    access_feed_interval_s: float = Field(1.0, gt=0, allow_inf_nan=False,
                                          description="seconds between access-event batches")

    @model_validator(mode="after")
    def _consistent(self) -> RouterSettings:
        # A staleness limit below two scrape intervals marks healthy engines stale between scrapes
        # (llm-d-router #2514: 15 s refresh vs 200 ms staleness, 11-13 s added latency).
        if self.stale_after_s < 2 * self.scrape_interval_s:
            raise ValueError(f"stale_after_s ({self.stale_after_s:g}) must be >= 2 x scrape_interval_s "
                             f"({self.scrape_interval_s:g})")
        if self.http_max_body_bytes_in_flight < self.http_max_body_bytes:
            raise ValueError("http_max_body_bytes_in_flight must be >= http_max_body_bytes")
        if self.eject_max_s < self.eject_base_s:
            raise ValueError("eject_max_s must be >= eject_base_s")
        for url in filter(None, (u.strip() for u in self.engines.split(","))):
            parsed = urlparse(url)
            if parsed.scheme not in ("http", "https") or not parsed.netloc:
                raise ValueError(f"engines: {url!r} is not an http(s)://host:port URL")
            if (problem := engine_url_problem(url)) is not None:
                raise ValueError(f"engines: {url!r} {problem}")
        return self

    def core_config(self) -> CoreConfig:
        return CoreConfig(
            scrape_interval_s=self.scrape_interval_s, stale_after_s=self.stale_after_s,
            health_interval_s=self.health_interval_s, probe_timeout_s=self.probe_timeout_s,
            eject_after_failures=self.eject_after_failures, eject_base_s=self.eject_base_s,
            eject_max_s=self.eject_max_s, max_in_flight=self.max_in_flight, max_attempts=self.max_attempts,
            first_token_timeout_s=self.first_token_timeout_s, prefix_block_chars=self.prefix_block_chars,
            engine_stream_idle_timeout_s=self.engine_stream_idle_timeout_s,
            prefix_index_max_bytes=self.prefix_index_max_bytes,
            policy=PolicyConfig(self.plan_weight, self.load_weight, self.prefix_weight, self.session_weight,
                                self.bounded_load_factor, self.bounded_load_slack, self.max_sessions,
                                self.decode_load_weight, self.affinity_weight, self.affinity_queue_slack),
            default_pool=self.default_pool, region=self.region, fallback_ci_g_per_kwh=self.fallback_ci_g_per_kwh,
            ci_refresh_s=self.ci_refresh_s, default_busy_power_w=self.default_busy_power_w,
            default_idle_power_w=self.default_idle_power_w, watch_plans=self.watch_plans, feeds=self.feeds,
            slo_window_s=self.slo_window_s, slo_report_interval_s=self.slo_report_interval_s,
            load_feed_interval_s=self.load_feed_interval_s, access_feed_interval_s=self.access_feed_interval_s,
            replica_id=self.replica_id, state_poll_interval_s=self.state_poll_interval_s,
            sleep=SleepSettings(drain_timeout_s=self.sleep_drain_timeout_s, wake_timeout_s=self.wake_timeout_s,
                                retry_first_s=min(5.0, self.sleep_retry_max_s), retry_max_s=self.sleep_retry_max_s),
        )

    def http_limits(self) -> HttpLimits:
        return HttpLimits(
            max_body_bytes=self.http_max_body_bytes, max_body_bytes_in_flight=self.http_max_body_bytes_in_flight,
            header_timeout_s=self.http_header_timeout_s,
            body_timeout_s=self.http_body_timeout_s, keepalive_timeout_s=self.http_keepalive_timeout_s,
            max_connections=self.http_max_connections or default_max_connections(),
            max_requests_per_connection=self.http_max_requests_per_connection)

    def channel_config(self, address: str) -> ChannelConfig:
        return ChannelConfig(address=address, token=self.token(), tls_ca=self.tls_ca,
                             tls_cert=self.tls_cert if self.tls_client_ca else None,
                             tls_key=self.tls_key if self.tls_client_ca else None)
