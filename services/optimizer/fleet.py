"""The fleet inventory the optimizer plans over: what the operator declares, merged with the GPUs that the
gpu-partitioners report for their nodes.

* ``validate_fleet`` checks a declared inventory and names the first bad field (``pools[1].slo.tpot_s``);
  references must resolve: an engine's pool, variant and GPU, a GPU's pool.
* ``merge_fleet`` overlays the reports: a reported GPU's physical facts (model, memory, MIG mode, instances, node)
  come from its gpu-partitioner, its assignment (pool, hardware name) from the operator. A GPU the operator
  places on another node than the one that reports it is a conflict (``gpus[i].node``).
* ``FleetStore`` persists both (one row for the declaration, one per reporting node) and answers the merged view.
"""

from __future__ import annotations

import math
import re
import threading
from collections.abc import Collection, Mapping
from datetime import datetime
from urllib.parse import urlsplit

from greenserve.common.carbon_params import DISK_MEDIA
from greenserve.common.errors import InvalidArgument, ResourceExhausted
from greenserve.common.mig_geometry import instance_engine_ids
from greenserve.common.orm_conventions import utcnow
from greenserve.common.persistence import Database
from greenserve.optimizer.models import Fleet, ReportedGpus
from greenserve.simulator.engine_profile import list_profiles
from greenserve.v1 import common_pb2, optimizer_pb2

FLEET_ROW_ID = 1
# Pool names key files, series and metrics: letters, digits, '.', '_', '-', starting alnum, at most 64.
POOL_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")
# Ids and variant names may also hold ':' and '/'.
ID_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:/@-]{0,127}")
# MIG profile names as NVML gives them ("3g.40gb", "1g.10gb+me").
MIG_PROFILE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9.+_-]{0,63}")
MAX_POOLS = 1024
MAX_GPUS = 65536
MAX_ENGINES = 65536
# Engines on one MIG instance in a report (the gpu-partitioner runs one, with a DPD pair's decoder two).
MAX_ENGINES_PER_INSTANCE = 8
# MIG instances on one GPU, declared or reported (7 is the most any GPU holds; a report may list a few more
# while a layout changes).
MAX_INSTANCES_PER_GPU = 7 * 8
# Reports are kept in memory per node: at most this many nodes, and MAX_GPUS reported GPUs in all.
MAX_REPORTING_NODES = 65536
MAX_CACHE_BYTES = 1 << 60
GPU_HARDWARE = {
    common_pb2.GPU_MODEL_A100_40GB: "A100-40GB",
    common_pb2.GPU_MODEL_A100_80GB: "A100-80GB",
    common_pb2.GPU_MODEL_H100_80GB: "H100-80GB",
    common_pb2.GPU_MODEL_H200_141GB: "H200-141GB",
}


def _name(field: str, value: str, pattern: re.Pattern[str] = ID_NAME) -> str:
    if not pattern.fullmatch(value):
        shown = value if len(value) <= 64 else value[:64] + "..."
        raise InvalidArgument(field, f"must match {pattern.pattern}, got {shown!r}")
    return value


def _positive(field: str, value: float, upper: float = 1e9) -> None:
    if not math.isfinite(value) or value <= 0 or value > upper:
        raise InvalidArgument(field, f"must be a finite number in (0, {upper:g}], got {value!r}")


def _fraction(field: str, value: float) -> None:
    if not math.isfinite(value) or not 0 < value <= 1:
        raise InvalidArgument(field, f"must be in (0, 1], got {value!r}")


def validate_slo(field: str, slo: common_pb2.Slo) -> None:
    _positive(f"{field}.ttft_s", slo.ttft_s, 3600.0)
    _positive(f"{field}.tpot_s", slo.tpot_s, 60.0)
    _fraction(f"{field}.attainment_fraction", slo.attainment_fraction)


def _url(field: str, url: str) -> None:
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError:
        raise InvalidArgument(field, "must be an http(s) URL with a host") from None
    if parts.scheme not in ("http", "https") or not parts.hostname or len(url) > 2048 or any(c.isspace() for c in url):
        raise InvalidArgument(field, "must be an http(s) URL with a host")
    del port


def gpu_hardware(gpu: common_pb2.Gpu) -> str:
    """The hardware name profiles use for a whole GPU ("A100-80GB"); the operator's name wins."""
    return gpu.hardware or GPU_HARDWARE.get(gpu.model, gpu.name.replace("NVIDIA ", "").replace(" ", "-"))


def validate_disk_tiers(path: str, pool: common_pb2.Pool) -> None:
    """A pool's declared disk tiers: a known medium each, once; an absolute folder; a size within its disk limit."""
    media: set[str] = set()
    for j, tier in enumerate(pool.disk_tiers):
        tpath = f"{path}.disk_tiers[{j}]"
        if tier.medium not in DISK_MEDIA:
            raise InvalidArgument(f"{tpath}.medium", f"unknown disk medium {tier.medium!r}; known: "
                                  f"{', '.join(DISK_MEDIA)}")
        if tier.medium in media:
            raise InvalidArgument(f"{tpath}.medium", f"medium {tier.medium} is listed twice in pool {pool.name}")
        media.add(tier.medium)
        if not tier.path.startswith("/") or len(tier.path) > 1024 or any(c in tier.path for c in "\x00\n\r"):
            raise InvalidArgument(f"{tpath}.path", "must be the absolute folder of the LMCache fs L2 adapter on "
                                  "that disk (at most 1024 characters, no newline)")
        if not pool.max_cache_disk_bytes:
            raise InvalidArgument(f"{path}.max_cache_disk_bytes", "a pool declaring disk_tiers needs a disk limit "
                                  "(the largest disk size on any of them)")
        if tier.max_bytes > pool.max_cache_disk_bytes:
            raise InvalidArgument(f"{tpath}.max_bytes", f"must be <= the pool's max_cache_disk_bytes "
                                  f"({pool.max_cache_disk_bytes}); 0 means that limit")


def validate_fleet(fleet: common_pb2.FleetInventory, known_gpus: Collection[str] = frozenset(),
                   reported_models: Mapping[str, common_pb2.GpuModel] | None = None) -> None:
    """InvalidArgument naming the first bad field; ``known_gpus`` are the UUIDs reported by gpu-partitioners,
    ``reported_models`` their models (a declared MIG layout is checked against the GPU's model, declared or
    reported)."""
    if len(fleet.pools) > MAX_POOLS:
        raise InvalidArgument("fleet.pools", f"at most {MAX_POOLS} pools")
    if len(fleet.gpus) > MAX_GPUS:
        raise InvalidArgument("fleet.gpus", f"at most {MAX_GPUS} GPUs")
    if fleet.max_cache_storage_bytes > MAX_CACHE_BYTES:
        raise InvalidArgument("fleet.max_cache_storage_bytes", f"must be <= {MAX_CACHE_BYTES}")
    pools: dict[str, common_pb2.Pool] = {}
    engines: set[str] = set()
    gpu_ids: set[str] = set(known_gpus)
    declared_gpus: set[str] = set()  # one set, not one per GPU: the check stays linear up to MAX_GPUS
    for i, gpu in enumerate(fleet.gpus):
        path = f"fleet.gpus[{i}]"
        _name(f"{path}.uuid", gpu.uuid)
        if gpu.uuid in declared_gpus:
            raise InvalidArgument(f"{path}.uuid", f"GPU {gpu.uuid} is listed twice")
        declared_gpus.add(gpu.uuid)
        if gpu.node:
            _name(f"{path}.node", gpu.node)
        _declared_instances(path, gpu)
        gpu_ids.add(gpu.uuid)
    n_engines = 0
    for i, pool in enumerate(fleet.pools):
        path = f"fleet.pools[{i}]"
        _name(f"{path}.name", pool.name, POOL_NAME)
        if pool.name in pools:
            raise InvalidArgument(f"{path}.name", f"pool {pool.name} is listed twice")
        if not pool.model or len(pool.model) > 256:
            raise InvalidArgument(f"{path}.model", "must name the served model (1..256 characters)")
        if not pool.HasField("slo"):
            raise InvalidArgument(f"{path}.slo", "is required (ttft_s, tpot_s, attainment_fraction)")
        validate_slo(f"{path}.slo", pool.slo)
        _name(f"{path}.region", pool.region)
        if pool.load_series_key:
            _name(f"{path}.load_series_key", pool.load_series_key)
        for name in ("max_cache_dram_bytes", "max_cache_disk_bytes", "cache_step_bytes"):
            if getattr(pool, name) > MAX_CACHE_BYTES:
                raise InvalidArgument(f"{path}.{name}", f"must be <= {MAX_CACHE_BYTES}")
        validate_disk_tiers(path, pool)
        if pool.mean_prompt_tokens > 1_000_000 or pool.mean_output_tokens > 1_000_000:
            field = "mean_prompt_tokens" if pool.mean_prompt_tokens > 1_000_000 else "mean_output_tokens"
            raise InvalidArgument(f"{path}.{field}", "must be <= 1000000")
        variants: set[str] = set()
        for j, variant in enumerate(pool.variants):
            vpath = f"{path}.variants[{j}]"
            _name(f"{vpath}.name", variant.name)
            if variant.name in variants:
                raise InvalidArgument(f"{vpath}.name", f"variant {variant.name} is listed twice")
            variants.add(variant.name)
            if not variant.model or len(variant.model) > 256:
                raise InvalidArgument(f"{vpath}.model", "must name the model to serve (1..256 characters)")
            _fraction(f"{vpath}.quality_fraction", variant.quality_fraction)
            if variant.simulator_model:
                _name(f"{vpath}.simulator_model", variant.simulator_model)
                _simulator_model(f"{vpath}.simulator_model", variant.simulator_model)
            if len(variant.vllm_args) > 64 or any(len(a) > 256 or "\n" in a or "\x00" in a for a in variant.vllm_args):
                raise InvalidArgument(f"{vpath}.vllm_args", "at most 64 arguments of 256 characters, no newline")
        for j, engine in enumerate(pool.engines):
            epath = f"{path}.engines[{j}]"
            n_engines += 1
            _name(f"{epath}.id", engine.id)
            if engine.id in engines:
                raise InvalidArgument(f"{epath}.id", f"engine {engine.id} is listed twice in the fleet")
            engines.add(engine.id)
            if engine.url:
                _url(f"{epath}.url", engine.url)
            if engine.pool and engine.pool != pool.name:
                raise InvalidArgument(f"{epath}.pool", f"engine is listed under pool {pool.name} but names {engine.pool}")
            if engine.model_variant and engine.model_variant not in variants:
                raise InvalidArgument(f"{epath}.model_variant", f"unknown variant {engine.model_variant} of pool {pool.name}")
            if engine.gpu_uuid and engine.gpu_uuid not in gpu_ids:
                raise InvalidArgument(f"{epath}.gpu_uuid", f"unknown GPU {engine.gpu_uuid}")
            for name in ("idle_power_w", "busy_power_w"):
                value = getattr(engine, name)
                if not math.isfinite(value) or value < 0 or value > 100_000:
                    raise InvalidArgument(f"{epath}.{name}", f"must be in [0, 100000], got {value!r}")
        pools[pool.name] = pool
    if n_engines > MAX_ENGINES:
        raise InvalidArgument("fleet.pools", f"at most {MAX_ENGINES} engines")
    for i, gpu in enumerate(fleet.gpus):
        if gpu.pool and gpu.pool not in pools:
            raise InvalidArgument(f"fleet.gpus[{i}].pool", f"unknown pool {gpu.pool}")
        _mig_layout(f"fleet.gpus[{i}]", gpu, gpu.model or (reported_models or {}).get(gpu.uuid, common_pb2.GPU_MODEL_UNSPECIFIED))
    validate_modes(fleet)


def _simulator_model(field: str, name: str) -> None:
    """A variant's simulator architecture must be one the simulator has (else its capacity cannot be predicted)."""
    known = simulator_models()
    if name not in known:
        raise InvalidArgument(field, f"unknown simulator model {name!r} (known: {', '.join(known)}); without a "
                                     f"stored profile the variant's capacity could not be predicted")


def _mig_layout(path: str, gpu: common_pb2.Gpu, model: common_pb2.GpuModel) -> None:
    """A declared MIG layout must be one the GPU can hold (the gpu-partitioner's geometry rules). A GPU whose model
    is neither declared nor reported yet is checked when its gpu-partitioner reports it (the enforcer refuses a
    layout the device cannot hold)."""
    if not gpu.instances or model == common_pb2.GPU_MODEL_UNSPECIFIED:
        return
    from greenserve.common.mig_geometry import LayoutError, Placement, geometry

    name = GPU_HARDWARE.get(model)
    if name is None:
        raise InvalidArgument(f"{path}.instances", "MIG instances on a GPU whose model has no MIG")
    geo = geometry(name)
    placed = []
    for j, inst in enumerate(gpu.instances):
        if not geo.has_profile(inst.profile):
            raise InvalidArgument(f"{path}.instances[{j}].profile", f"{name} has no MIG profile {inst.profile!r}")
        size = inst.placement_size or geo.profile(inst.profile).memory_slices
        placed.append(Placement(start=inst.placement_start, size=size, profile=inst.profile))
    try:
        geo.validate(placed)
    except LayoutError as exc:
        raise InvalidArgument(f"{path}.instances[{max(exc.index, 0)}]", f"a layout {name} cannot hold: {exc}") from None


def _declared_instances(path: str, gpu: common_pb2.Gpu) -> None:
    """A declared GPU's MIG instances follow a report's rules (``validate_gpu_report``), an instance id being
    optional: their ids and engines are names, whatever the GPU's model (``_mig_layout`` checks the layout only
    when the model is known)."""
    if len(gpu.instances) > MAX_INSTANCES_PER_GPU:
        raise InvalidArgument(f"{path}.instances", f"at most {MAX_INSTANCES_PER_GPU} MIG instances on one GPU")
    _instance_names(path, gpu, uuid_required=False)


def _instance_names(path: str, gpu: common_pb2.Gpu, *, uuid_required: bool) -> None:
    """Each MIG instance's id, profile and engines are names (InvalidArgument naming the first that is not)."""
    for j, inst in enumerate(gpu.instances):
        ipath = f"{path}.instances[{j}]"
        if uuid_required or inst.uuid:
            _name(f"{ipath}.uuid", inst.uuid)
        _name(f"{ipath}.profile", inst.profile, MIG_PROFILE_NAME)
        _instance_engines(ipath, inst)


def _instance_engines(path: str, inst: common_pb2.MigInstance) -> None:
    """The engines a report puts on a MIG instance: each of ``engine_ids`` an engine id (merge_fleet makes an
    engine of each in the GPU's pool), ``engine_id`` their first (what readers before ``engine_ids`` see) or empty.
    A gpu-partitioner from before ``engine_ids`` sends only ``engine_id``, its engines joined by ','."""
    if len(inst.engine_ids) > MAX_ENGINES_PER_INSTANCE:
        raise InvalidArgument(f"{path}.engine_ids", f"at most {MAX_ENGINES_PER_INSTANCE} engines on one instance")
    for k, engine_id in enumerate(inst.engine_ids):
        _name(f"{path}.engine_ids[{k}]", engine_id)
    if inst.engine_ids:
        if inst.engine_id and inst.engine_id != inst.engine_ids[0]:
            raise InvalidArgument(f"{path}.engine_id", f"must be empty or engine_ids[0] ({inst.engine_ids[0]!r}), "
                                  f"got {inst.engine_id[:64]!r}")
    else:
        for engine_id in inst.engine_id.split(",") if inst.engine_id else ():  # an old sender's engines on it
            _name(f"{path}.engine_id", engine_id)
    ids = set(instance_engine_ids(inst))
    for engine_id, url in inst.engine_urls.items():  # each an engine of the instance, an http(s) URL
        if engine_id not in ids:
            raise InvalidArgument(f"{path}.engine_urls", f"{engine_id[:64]!r} is not an engine of the instance")
        _url(f"{path}.engine_urls[{engine_id}]", url)


def validate_gpu_report(request: optimizer_pb2.ReportGpusRequest) -> None:
    _name("node", request.node)
    if len(request.gpus) > 64:
        raise InvalidArgument("gpus", "a node reports at most 64 GPUs")
    seen: set[str] = set()
    for i, gpu in enumerate(request.gpus):
        _name(f"gpus[{i}].uuid", gpu.uuid)
        if gpu.uuid in seen:
            raise InvalidArgument(f"gpus[{i}].uuid", f"GPU {gpu.uuid} is listed twice")
        seen.add(gpu.uuid)
        if gpu.node and gpu.node != request.node:
            raise InvalidArgument(f"gpus[{i}].node", f"GPU reported by node {request.node} names node {gpu.node}")
        if len(gpu.instances) > MAX_INSTANCES_PER_GPU:
            raise InvalidArgument(f"gpus[{i}].instances", "too many MIG instances")
        # What the merge takes into the fleet the plans are computed over follows the declared fleet's rules.
        if gpu.model not in common_pb2.GpuModel.values():
            raise InvalidArgument(f"gpus[{i}].model", f"unknown GPU model {gpu.model}")
        if gpu.pool:
            _name(f"gpus[{i}].pool", gpu.pool, POOL_NAME)
        if gpu.hardware:
            _name(f"gpus[{i}].hardware", gpu.hardware)
        _instance_names(f"gpus[{i}]", gpu, uuid_required=True)


def merge_fleet(declared: common_pb2.FleetInventory,
                reports: dict[str, optimizer_pb2.ReportGpusRequest]) -> common_pb2.FleetInventory:
    """The declared inventory with every reported GPU merged in (see the module docstring)."""
    merged = common_pb2.FleetInventory()
    merged.CopyFrom(declared)
    index = {gpu.uuid: i for i, gpu in enumerate(merged.gpus)}
    for node in sorted(reports):
        for reported in reports[node].gpus:
            gpu = common_pb2.Gpu()
            gpu.CopyFrom(reported)
            gpu.node = node
            gpu.reported_by = f"gpu-partitioner/{node}"
            i = index.get(gpu.uuid)
            if i is None:
                index[gpu.uuid] = len(merged.gpus)
                merged.gpus.append(gpu)
                continue
            operator = merged.gpus[i]
            gpu.pool = operator.pool or gpu.pool
            gpu.hardware = operator.hardware or gpu.hardware
            merged.gpus[i].CopyFrom(gpu)
    for gpu in merged.gpus:
        if not gpu.reported_by:
            gpu.reported_by = "operator"
    # Engines the gpu-partitioners started on MIG instances join their GPU's pool (if the operator did not list them).
    pools = {pool.name: pool for pool in merged.pools}
    known = {engine.id for pool in merged.pools for engine in pool.engines}
    for gpu in merged.gpus:
        pool = pools.get(gpu.pool)
        if pool is None or gpu.reported_by == "operator":
            continue
        for inst in gpu.instances:
            for engine_id in instance_engine_ids(inst):
                if engine_id not in known:
                    known.add(engine_id)
                    pool.engines.add(id=engine_id, pool=pool.name, model=pool.model, gpu_uuid=gpu.uuid,
                                     mig_uuid=inst.uuid, hardware=f"{gpu_hardware(gpu)}-MIG-{inst.profile}",
                                     url=inst.engine_urls.get(engine_id, ""))
    return merged


def check_conflicts(declared: common_pb2.FleetInventory, reports: dict[str, optimizer_pb2.ReportGpusRequest]) -> None:
    """InvalidArgument when the operator puts a GPU on another node than the one reporting it."""
    where = {gpu.uuid: node for node, report in reports.items() for gpu in report.gpus}
    for i, gpu in enumerate(declared.gpus):
        node = where.get(gpu.uuid)
        if node is not None and gpu.node and gpu.node != node:
            raise InvalidArgument(f"fleet.gpus[{i}].node",
                                  f"GPU {gpu.uuid} is declared on node {gpu.node} but reported by node {node}")


def _gpu_facts(report: optimizer_pb2.ReportGpusRequest) -> set[tuple[str, int, int, bool]]:
    return {(g.uuid, g.model, g.memory_bytes, g.mig_enabled) for g in report.gpus}


class FleetStore:
    """Declared inventory + node reports, persisted; ``merged()`` is what planners see."""

    def __init__(self, db: Database) -> None:
        self.db = db
        self._lock = threading.Lock()
        # One writer at a time, from its checks to its memory update: else two writes could store one fleet and
        # leave the other in memory (the first's commit before, its memory update after, the second writer's).
        self._write = threading.Lock()
        self.declared = common_pb2.FleetInventory()
        self.updated_at: datetime | None = None
        self.reports: dict[str, optimizer_pb2.ReportGpusRequest] = {}
        self._merged: common_pb2.FleetInventory | None = None
        self.generation = 0  # bumped on every change (the scheduler's fleet-change trigger)

    def load(self) -> None:
        with self.db.session(readonly=True) as s:
            row = s.get(Fleet, FLEET_ROW_ID)
            if row is not None:
                self.declared.ParseFromString(bytes(row.body))
                self.updated_at = row.updated_at
            for rep in s.query(ReportedGpus).all():
                msg = optimizer_pb2.ReportGpusRequest()
                msg.ParseFromString(bytes(rep.body))
                self.reports[rep.node] = msg
        self._merged = None

    def merged(self) -> common_pb2.FleetInventory:
        with self._lock:
            if self._merged is None:
                self._merged = merge_fleet(self.declared, self.reports)
            return self._merged

    def set_declared(self, fleet: common_pb2.FleetInventory) -> common_pb2.FleetInventory:
        """Validates and stores the operator's inventory (blocking); returns the merged view."""
        with self._write:
            return self._set_declared(fleet)

    def _set_declared(self, fleet: common_pb2.FleetInventory) -> common_pb2.FleetInventory:
        with self._lock:
            reports = dict(self.reports)
        known = {gpu.uuid for report in reports.values() for gpu in report.gpus}
        validate_fleet(fleet, known, {gpu.uuid: gpu.model for report in reports.values() for gpu in report.gpus})
        check_conflicts(fleet, reports)
        now = utcnow()
        body = fleet.SerializeToString()
        with self.db.session() as s:
            row = s.get(Fleet, FLEET_ROW_ID)
            if row is None:
                s.add(Fleet(id=FLEET_ROW_ID, updated_at=now, body=body))
            else:
                row.updated_at, row.body = now, body
        with self._lock:
            self.declared = common_pb2.FleetInventory()
            self.declared.CopyFrom(fleet)
            self.updated_at = now
            self._merged = None
            self.generation += 1
        return self.merged()

    def report_gpus(self, request: optimizer_pb2.ReportGpusRequest) -> tuple[common_pb2.FleetInventory, bool]:
        """Stores a node's report (blocking); returns the merged view and whether the fleet changed materially:
        GPUs added, removed or changed in model, memory or MIG mode. New MIG instances and engines are what enforcing
        a plan produces, so they are stored but do not count (re-planning on them would chase its own tail)."""
        validate_gpu_report(request)
        with self._write:
            return self._report_gpus(request)

    def _report_gpus(self, request: optimizer_pb2.ReportGpusRequest) -> tuple[common_pb2.FleetInventory, bool]:
        with self._lock:
            previous = self.reports.get(request.node)
            if previous is None and len(self.reports) >= MAX_REPORTING_NODES:
                raise ResourceExhausted(f"at most {MAX_REPORTING_NODES} nodes report GPUs", field="node")
            others = sum(len(r.gpus) for node, r in self.reports.items() if node != request.node)
            if others + len(request.gpus) > MAX_GPUS:
                raise ResourceExhausted(f"at most {MAX_GPUS} reported GPUs in all ({others} on other nodes)",
                                        field="gpus")
        if previous is not None and previous.SerializeToString(deterministic=True) == request.SerializeToString(
            deterministic=True
        ):
            return self.merged(), False
        material = previous is None or _gpu_facts(previous) != _gpu_facts(request)
        # A report is reality: it is kept even when it contradicts the declared node (the merge takes its node).
        body = request.SerializeToString()
        with self.db.session() as s:
            row = s.get(ReportedGpus, request.node)
            if row is None:
                s.add(ReportedGpus(node=request.node, reported_at=utcnow(), body=body))
            else:
                row.reported_at, row.body = utcnow(), body
        with self._lock:
            self.reports[request.node] = request
            self._merged = None
            self.generation += 1
        return self.merged(), material


MAX_SPEC_TOKENS = 16
MAX_LINK_BANDWIDTH_BYTES_PER_S = 1e13  # 80 Tb/s: beyond any NIC or NVLink


def validate_modes(fleet: common_pb2.FleetInventory) -> None:
    """InvalidArgument naming the first bad field of what the modes read: the link and each pool's draft."""
    bw = fleet.link_bandwidth_bytes_per_s
    if not math.isfinite(bw) or not 0 <= bw <= MAX_LINK_BANDWIDTH_BYTES_PER_S:
        raise InvalidArgument("fleet.link_bandwidth_bytes_per_s",
                              f"must be in [0, {MAX_LINK_BANDWIDTH_BYTES_PER_S:g}] bytes/s (0: not declared), "
                              f"got {bw!r}")
    for i, pool in enumerate(fleet.pools):
        if not pool.HasField("draft"):
            continue
        path = f"fleet.pools[{i}].draft"
        d = pool.draft
        if not d.model or len(d.model) > 256 or any(c.isspace() for c in d.model):
            raise InvalidArgument(f"{path}.model", "must name the draft model (1..256 characters, no spaces)")
        if not math.isfinite(d.acceptance_fraction) or not 0 < d.acceptance_fraction <= 1:
            raise InvalidArgument(f"{path}.acceptance_fraction",
                                  f"must be in (0, 1] (accepted / proposed draft tokens), got "
                                  f"{d.acceptance_fraction!r}")
        if d.num_speculative_tokens > MAX_SPEC_TOKENS:
            raise InvalidArgument(f"{path}.num_speculative_tokens",
                                  f"must be 0 (3) to {MAX_SPEC_TOKENS}, got {d.num_speculative_tokens}")
        if d.simulator_model and d.simulator_model not in simulator_models():
            raise InvalidArgument(f"{path}.simulator_model", f"unknown simulator model {d.simulator_model!r} "
                                                             f"(known: {', '.join(simulator_models())})")
        if len(d.acceptance_source) > 1024:
            raise InvalidArgument(f"{path}.acceptance_source", "at most 1024 characters")


def simulator_models() -> list[str]:
    return sorted({p.split("@")[0] for p in list_profiles()})
