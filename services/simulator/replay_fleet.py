"""The configuration of a replayed fleet (``replay.replay``): its engines, routing policy, autoscaler and PD link.

A fleet is a list of engines, each an ``EngineSpec``: a performance profile (``engine_profile.EngineProfile``) with
its own KV block pool, HBM prefix cache and optional LMCache DRAM (L1) / disk (L2) tiers (tiers.py), a role for
prefill/decode disaggregation, optional speculative decoding and the read-or-recompute rule of its DRAM/disk hits.
``FleetConfig`` adds the routing policy (replay_routing.py), an optional threshold autoscaler
(``AutoscaleConfig``), the KV-transfer link of a disaggregated fleet and the seed, and checks the whole at
construction (ValueError naming the field).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from greenserve.simulator.engine_profile import DEFAULT_PROFILE, EngineProfile, load_profile
from greenserve.simulator.mode_configs import SpecDecodeConfig
from greenserve.simulator.perf_model import REUSE_RULES
from greenserve.simulator.tiers import DISK_MEDIA, TierSpec

__all__ = ["AutoscaleConfig", "EngineSpec", "FleetConfig"]


@dataclass(frozen=True)
class EngineSpec:
    """One engine of the fleet.

    ``dram_capacity_tokens`` / ``disk_capacity_tokens``: LMCache L1 / L2 capacity in tokens (0 = tier off).
    ``role``: ``"both"`` (normal), ``"prefill"`` or ``"decode"`` (PD disaggregation).
    ``spec``: speculative decoding on this engine (draft on the same GPU or, disaggregated, elsewhere).
    ``prefix_caching``: vLLM automatic prefix caching in HBM (default on in vLLM V1).
    ``dram_policy`` / ``disk_policy``: eviction of each LMCache tier, ``LRU``, ``FIFO`` or ``LCS`` (tiers.py).
    ``disk_ttl_s`` / ``disk_group_ttls_s``: idle TTLs making the disk tier elastic (tiers.py; LRU only).
    ``disk_medium``: ``nvme``, ``sata-ssd`` or ``hdd`` (tiers.DISK_MEDIA) for the disk's bandwidth and
    latency; empty: the profile's.
    ``reuse_rule``: the read-or-recompute rule for DRAM/disk hits (``perf_model.REUSE_RULES``): ``latency``
    (default), ``always`` (LMCache: load every hit), ``energy`` (StoreLLM: read whenever it saves energy and
    the TTFT stays within ``reuse_delay_budget_s``).
    """

    profile: EngineProfile | str = DEFAULT_PROFILE
    dram_capacity_tokens: int = 0
    disk_capacity_tokens: int = 0
    role: str = "both"
    spec: SpecDecodeConfig | None = None
    prefix_caching: bool = True
    dram_policy: str = "LRU"
    disk_policy: str = "LRU"
    disk_ttl_s: float = 0.0
    disk_group_ttls_s: Mapping[int, float] | None = None
    disk_group_depth: int = 0
    disk_medium: str = ""
    reuse_rule: str = "latency"
    reuse_delay_budget_s: float = math.inf

    def resolved_profile(self) -> EngineProfile:
        """The profile object (loading it by name if needed), with the disk medium's bandwidth if one is named."""
        profile = self.profile if isinstance(self.profile, EngineProfile) else load_profile(self.profile)
        if self.disk_medium:
            bw, lat = DISK_MEDIA[self.disk_medium]
            profile = dataclasses.replace(profile, disk_bandwidth_bytes_per_s=bw, disk_latency_s=lat)
        return profile

    def tier_specs(self) -> tuple[TierSpec, TierSpec]:
        """The LMCache DRAM and disk tiers (ValueError naming the field when one is invalid)."""
        return (TierSpec(self.dram_capacity_tokens, self.dram_policy),
                TierSpec(self.disk_capacity_tokens, self.disk_policy, self.disk_ttl_s, self.disk_group_ttls_s,
                         self.disk_group_depth))


@dataclass(frozen=True)
class AutoscaleConfig:
    """Threshold autoscaler over the fleet: every ``interval_s`` it compares outstanding requests per active
    engine with the thresholds, switches one engine on (routable after ``cold_start_s``) or drains one."""

    min_engines: int = 1
    interval_s: float = 60.0
    scale_up_outstanding: float = 16.0
    scale_down_outstanding: float = 2.0
    cold_start_s: float = 60.0
    initial_engines: int | None = None

    def __post_init__(self) -> None:
        if self.min_engines < 1:
            raise ValueError("min_engines: must be >= 1")
        if self.interval_s <= 0 or self.cold_start_s < 0:
            raise ValueError("interval_s: must be > 0 (cold_start_s >= 0)")
        if self.scale_down_outstanding >= self.scale_up_outstanding:
            raise ValueError("scale_down_outstanding: must be below scale_up_outstanding")


@dataclass(frozen=True)
class FleetConfig:
    """Engines, routing policy (name or object), optional autoscaler, PD link and seed."""

    engines: tuple[EngineSpec, ...]
    policy: Any = "least_loaded"
    autoscale: AutoscaleConfig | None = None
    kv_link_bandwidth_bytes_per_s: float = 2e9
    kv_link_latency_s: float = 0.0005
    seed: int = 0

    def __post_init__(self) -> None:
        if not self.engines:
            raise ValueError("engines: a fleet needs at least one engine")
        roles = {e.role for e in self.engines}
        if not roles <= {"both", "prefill", "decode"}:
            raise ValueError(f"role: must be 'both', 'prefill' or 'decode', got {sorted(roles)}")
        if ("prefill" in roles) != ("decode" in roles):
            raise ValueError("role: a disaggregated fleet needs both prefill and decode engines")
        if "both" in roles and "prefill" in roles:
            raise ValueError("role: do not mix 'both' engines with prefill/decode engines")
        if self.kv_link_bandwidth_bytes_per_s <= 0:
            raise ValueError("kv_link_bandwidth_bytes_per_s: must be > 0")
        for e in self.engines:
            if e.dram_capacity_tokens < 0 or e.disk_capacity_tokens < 0:
                raise ValueError("dram_capacity_tokens: tier capacities must be >= 0")
            if e.disk_medium and e.disk_medium not in DISK_MEDIA:
                raise ValueError(f"disk_medium: must be one of {sorted(DISK_MEDIA)} or empty, got {e.disk_medium!r}")
            if e.reuse_rule not in REUSE_RULES:
                raise ValueError(f"reuse_rule: must be one of {', '.join(REUSE_RULES)}, got {e.reuse_rule!r}")
            if not e.reuse_delay_budget_s > 0:
                raise ValueError("reuse_delay_budget_s: must be > 0")
            e.tier_specs()

    @classmethod
    def uniform(cls, n: int, profile: EngineProfile | str = DEFAULT_PROFILE, *, policy: Any = "least_loaded",
                dram_capacity_tokens: int = 0, disk_capacity_tokens: int = 0, **kwargs: Any) -> FleetConfig:
        """``n`` identical engines."""
        if n < 1:
            raise ValueError("n: must be >= 1")
        spec = EngineSpec(profile, dram_capacity_tokens, disk_capacity_tokens)
        return cls(tuple(spec for _ in range(n)), policy, **kwargs)
