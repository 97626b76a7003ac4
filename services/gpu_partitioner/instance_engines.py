"""The engines on this node's MIG instances: started (a DPD pair: the prefiller on the instance, the decoder on
a whole older GPU), waited for and registered with the router, restarted after a failed apply, retired.

``InstanceEngines`` is a part of ``MigEnforcer`` (enforcer.py), which sets the attributes it declares.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging

from greenserve.gpu_partitioner.backend import GpuState, InstanceState, MigBackend, simulator_gpus
from greenserve.common.engine_launch import (
    EngineProcess,
    EngineSpec,
    EngineStartError,
    EngineSupervisor,
    decoder_id,
    mig_hardware,
    pd_kv_transfer_params,
)
from greenserve.common.mig_geometry import GpuGeometry, Placement
from greenserve.gpu_partitioner.layout_targets import GpuTarget, Want
from greenserve.gpu_partitioner.peer_clients import FleetPools, RouterEngines
from greenserve.v1 import common_pb2

log = logging.getLogger("greenserve.gpu_partitioner.enforcer")


def engine_id_for(node: str, mig_uuid: str) -> str:
    """Stable id of the engine this node runs on a MIG instance (at most 64 characters, as the router wants)."""
    return f"{node[:40]}-{mig_uuid.removeprefix('MIG-')[:18]}"


class InstanceEngines:
    """The enforcer's engines: start, wait for health and register, retire, restart after a failed apply."""

    backend: MigBackend
    node: str
    fleet: FleetPools
    router: RouterEngines | None
    supervisor: EngineSupervisor | None
    lmcache_servers: dict[str, str]
    health_timeout_s: float
    modes: dict[str, common_pb2.ServingModeTarget]
    whole_gpus: list[GpuState]

    async def _retire(self, engine: EngineProcess) -> None:
        """Stops one of our engines and removes it from the router."""
        assert self.supervisor is not None
        await self.supervisor.stop(engine.spec.engine_id)
        await self.supervisor.stop(decoder_id(engine.spec.engine_id))  # a DPD pair's decoder (none: no-op)
        if self.router is not None:
            try:
                await self.router.deregister(engine.spec.engine_id)
            except Exception as exc:  # noqa: BLE001 - the router drops it later as unhealthy
                log.warning("deregistering engine %s failed: %s", engine.spec.engine_id, exc)

    async def _restart_retired(self, gpu_uuid: str, retire: list[tuple[Placement, EngineProcess]]) -> list[str]:
        """After a failed apply: the engines stopped for it, started again on the (restored) instances."""
        if not retire:
            return []
        gpu = await asyncio.to_thread(self.backend.gpu, gpu_uuid)
        geo = await asyncio.to_thread(self.backend.geometry, gpu_uuid)
        by_placement = {i.placement: i for i in gpu.instances}
        notes = []
        for placement, engine in retire:
            inst = by_placement.get(placement)
            if inst is None:
                notes.append(f"engine {engine.spec.engine_id} not restarted: {placement} is not on the GPU")
                continue
            pools = await self.fleet() or {}
            pool = pools.get(engine.spec.pool)
            if pool is None:
                notes.append(f"engine {engine.spec.engine_id} not restarted: pool {engine.spec.pool!r} unknown")
                continue
            try:
                started, decoder = await self._start_engine(gpu, geo, inst, pool, engine.spec.variant)
                await self._ready(started, decoder)
                notes.append(f"engine {started.spec.engine_id} restarted on {inst.uuid}")
            except Exception as exc:  # noqa: BLE001 - reported
                notes.append(f"restarting engine {engine.spec.engine_id} failed: {exc}")
        return notes
    async def _ensure_engines(self, gpu: GpuState, target: GpuTarget) -> tuple[list[str], list[str]]:
        """Starts and registers an engine on every instance the plan gives a pool and that has none running."""
        started: list[str] = []
        errors: list[str] = []
        wanted = [(inst, target.wants[inst.placement]) for inst in gpu.instances if inst.placement in target.wants]
        if not wanted:
            return started, errors
        if self.supervisor is None:
            return [f"{len(wanted)} instance(s) want an engine but --engine-launcher is none"], errors
        pools = await self.fleet() or {}
        geo = await asyncio.to_thread(self.backend.geometry, gpu.uuid)
        owned = self.supervisor.by_mig_uuid()
        launched: list[tuple[InstanceState, EngineProcess]] = []
        launched_decoders: dict[str, EngineProcess] = {}
        for inst, want in wanted:
            engine = owned.get(inst.uuid)
            if engine is not None and engine.returncode is None and Want(*engine.spec.role) == want \
                    and self._pair_alive(engine):
                continue
            if engine is not None:  # exited, or stale: make room for the new one
                await self._retire(engine)
            pool = pools.get(want.pool)
            if pool is None:
                errors.append(f"engine for {inst.uuid}: pool {want.pool!r} unknown")
                continue
            try:
                engine, decoder = await self._start_engine(gpu, geo, inst, pool, want.variant)
                launched.append((inst, engine))
                if decoder is not None:
                    launched_decoders[engine.spec.engine_id] = decoder
            except Exception as exc:  # noqa: BLE001 - reported; the next reconcile tries again
                errors.append(f"engine on {inst.uuid} ({want.pool}/{want.variant or 'default'}) failed: {exc}")
        # all of them load at once (a vLLM engine takes minutes), then each is registered when healthy
        results = await asyncio.gather(*(self._ready(engine, launched_decoders.get(engine.spec.engine_id))
                                         for _, engine in launched), return_exceptions=True)
        for (inst, engine), result in zip(launched, results, strict=True):
            spec = engine.spec
            if isinstance(result, BaseException):
                errors.append(f"engine on {inst.uuid} ({spec.pool}/{spec.variant or 'default'}) failed: {result}")
                continue
            decoder = launched_decoders.get(spec.engine_id)
            notes = [n for n in (engine.command.note, decoder.command.note if decoder is not None else "") if n]
            pair = (f"; DPD decoder on {decoder.spec.hardware} {decoder.spec.gpu_uuid}, {decoder.spec.url}"
                    if decoder is not None else "")
            started.append(f"started engine {spec.engine_id} ({spec.pool}/{spec.variant or 'default'} on "
                           f"{inst.profile} {inst.uuid}, {spec.url}{pair})"
                           + (f" [{'; '.join(notes)}]" if notes else ""))
        return started, errors

    def _pair_alive(self, engine: EngineProcess) -> bool:
        """A DPD pair runs while both its engines do; any other engine while its own process does."""
        if engine.spec.pd_role != "prefill":
            return True
        assert self.supervisor is not None
        decoder = self.supervisor.decoder_of(engine.spec.engine_id)
        return decoder is not None and decoder.returncode is None

    async def _start_engine(self, gpu: GpuState, geo: GpuGeometry, inst: InstanceState, pool: common_pb2.Pool,
                            variant: str) -> tuple[EngineProcess, EngineProcess | None]:
        """Starts the instance's engine, or for DPD the pair: the prefiller on the instance and the decoder on a
        whole older GPU of this node that no other decoder of ours uses (not waited for: see `_ready`)."""
        assert self.supervisor is not None
        spec = self._spec(gpu, geo, inst, pool, variant)
        if spec.mode != "dpd":
            return await self.supervisor.start(spec), None
        busy = {e.spec.gpu_uuid for e in self.supervisor.engines.values()
                if e.spec.pd_role == "decode" and e.returncode is None}
        old = next((g for g in self.whole_gpus if g.hardware == spec.old_hardware and g.uuid not in busy), None)
        if old is None:
            raise EngineStartError(f"no whole {spec.old_hardware or '?'} GPU free on node {self.node} for the DPD "
                                   f"decoder of {spec.engine_id}")
        ports = [spec.port]
        for _ in range(3):  # the decoder's HTTP port, then its NIXL init and alloc ports
            ports.append(self.supervisor.next_port(also_taken=ports))
        spec = dataclasses.replace(spec, pd_role="prefill", pd_peer_host=self.supervisor.host,
                                   pd_init_port=ports[2], pd_alloc_port=ports[3])
        figures = simulator_gpus().get(old.hardware, {})
        decode_spec = dataclasses.replace(
            spec, engine_id=decoder_id(spec.engine_id), pd_role="decode", gpu_uuid=old.uuid, mig_uuid="",
            hardware=old.hardware, port=ports[1], idle_power_w=float(figures.get("idle_w", 0.0)),
            busy_power_w=float(figures.get("tdp_w", 0.0)))
        decoder = await self.supervisor.start(decode_spec)
        try:
            return await self.supervisor.start(spec), decoder
        except BaseException:
            await self.supervisor.stop(decode_spec.engine_id)
            raise

    def _spec(self, gpu: GpuState, geo: GpuGeometry, inst: InstanceState, pool: common_pb2.Pool,
              variant: str) -> EngineSpec:
        assert self.supervisor is not None
        chosen = next((v for v in pool.variants if v.name == variant), None)
        if chosen is None and not variant and pool.variants:
            chosen = pool.variants[0]  # the first variant is the pool's default
        model = chosen.model if chosen is not None and chosen.model else pool.model
        profile = geo.profile(inst.profile) if geo.has_profile(inst.profile) else None
        share = profile.compute_slices / geo.compute_slices if profile is not None and geo.compute_slices else 1.0
        mode = self.modes.get(pool.name)
        draft = pool.draft if pool.HasField("draft") else None
        return EngineSpec(
            serving_mode=mode.serving_mode if mode is not None else 0,
            draft_model=draft.model if draft is not None else "",
            draft_simulator_model=draft.simulator_model if draft is not None else "",
            num_speculative_tokens=(draft.num_speculative_tokens if draft is not None else 0) or 3,
            acceptance_fraction=draft.acceptance_fraction if draft is not None else 0.0,
            old_hardware=mode.old_hardware if mode is not None else "",
            link_bandwidth_bytes_per_s=mode.link_bandwidth_bytes_per_s if mode is not None else 0.0,
            engine_id=engine_id_for(self.node, inst.uuid), pool=pool.name, served_model=pool.model,
            variant=chosen.name if chosen is not None else "", model=model,
            simulator_model=chosen.simulator_model if chosen is not None else "",
            vllm_args=tuple(chosen.vllm_args) if chosen is not None else (), gpu_uuid=gpu.uuid, mig_uuid=inst.uuid,
            hardware=mig_hardware(gpu.model or geo.model, inst.profile), host=self.supervisor.host,
            port=self.supervisor.next_port(), lmcache_url=self.lmcache_servers.get(pool.name, ""),
            idle_power_w=round(geo.sim_idle_power_w * share, 3), busy_power_w=round(geo.max_power_w * share, 3),
        )

    async def _ready(self, engine: EngineProcess, decoder: EngineProcess | None = None) -> None:
        """Waits for a started engine's health (and its DPD decoder's) and registers it: a pair as one engine whose
        ``url`` is the decoder's and ``prefill_url`` the prefiller's, power the two GPUs' (stopped again when any of
        it fails)."""
        assert self.supervisor is not None
        spec = engine.spec
        try:
            await asyncio.gather(*(self.supervisor.wait_healthy(e, self.health_timeout_s)
                                   for e in (engine, decoder) if e is not None))
        except EngineStartError:
            await self.supervisor.stop(spec.engine_id)
            await self.supervisor.stop(decoder_id(spec.engine_id))
            raise
        if self.router is not None:
            message = common_pb2.Engine(
                id=spec.engine_id, url=spec.url, pool=spec.pool, model=spec.served_model, kind=engine.kind,
                gpu_uuid=spec.gpu_uuid, mig_uuid=spec.mig_uuid, idle_power_w=spec.idle_power_w,
                busy_power_w=spec.busy_power_w, hardware=spec.hardware, model_variant=spec.variant)
            if decoder is not None:
                message.url, message.prefill_url = decoder.spec.url, spec.url
                message.prefill_kv_transfer_params = pd_kv_transfer_params(spec)
                message.idle_power_w += decoder.spec.idle_power_w
                message.busy_power_w += decoder.spec.busy_power_w
            try:
                await self.router.register(message)
            except Exception as exc:
                await self.supervisor.stop(spec.engine_id)
                await self.supervisor.stop(decoder_id(spec.engine_id))
                raise RuntimeError(f"registering engine {spec.engine_id} with the router failed: {exc}") from exc
