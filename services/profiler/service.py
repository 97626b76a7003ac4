"""ProfilerService wiring: servicer and the build function the process entry point runs (settings: settings.py)."""

from __future__ import annotations

import asyncio
import base64
import logging
from collections.abc import AsyncIterator
from typing import Any


from greenserve.common.app import ServiceContext
from greenserve.common.errors import FailedPrecondition, InvalidArgument, NotFound
from greenserve.common.server import Registration, registration
from greenserve.profiler import calibrate
from greenserve.profiler.keys import MAX_KEY_CHARS, simulator_profile_name
from greenserve.profiler.published import builtin_profiles
from greenserve.profiler.settings import ProfilerSettings
from greenserve.profiler.sim_backend import SimulatorBackend
from greenserve.profiler.store import SOURCE_NAMES, ProfileStore
from greenserve.profiler.sweeps import SweepRunner
from greenserve.v1 import common_pb2, profiler_pb2, profiler_pb2_grpc

log = logging.getLogger("greenserve.profiler")
# ListProfiles pages: a request without page_size (a client from before paging) still gets a bounded answer.
DEFAULT_PAGE_SIZE = 50
MAX_PAGE_SIZE = 1000


def _profile_page_token(last: common_pb2.Profile) -> str:
    """ListProfiles' next_page_token: the (version, config_key) of the page's last profile, base64url. A position in
    the (config_key, version) order, not an offset, so profiles stored between two pages shift nothing."""
    return base64.urlsafe_b64encode(f"{last.version}:{last.config_key}".encode()).decode("ascii")


def _profile_page_after(token: str) -> tuple[str, int]:
    """(config_key, version) a ListProfiles page_token names; INVALID_ARGUMENT for anything ListProfiles did not
    return (a version past the column's range would be the database driver's error: INTERNAL)."""
    try:  # the longest token: a key of MAX_KEY_CHARS 4-byte characters, base64 (4/3)
        text = base64.b64decode(token, altchars=b"-_", validate=True).decode() if len(token) <= 2048 else ""
    except (ValueError, UnicodeDecodeError):  # binascii.Error is a ValueError
        text = ""
    version, _, key = text.partition(":")
    if not (version.isascii() and version.isdigit() and len(version) <= 10 and 1 <= int(version) < 2**31
            and 0 < len(key) <= MAX_KEY_CHARS):
        raise InvalidArgument("page_token", "is not a token ListProfiles returned")
    return key, int(version)


def _value_error(exc: ValueError) -> InvalidArgument:
    field, _, message = str(exc).partition(": ")
    return InvalidArgument(field if message else "request", message or str(exc))


class ProfilerServicer(profiler_pb2_grpc.ProfilerServiceServicer):
    """greenserve.v1.ProfilerService."""

    def __init__(self, ctx: ServiceContext, store: ProfileStore, runner: SweepRunner) -> None:
        self.ctx = ctx
        self.store = store
        self.runner = runner

    async def StartSweep(self, request: profiler_pb2.StartSweepRequest, context: Any) -> profiler_pb2.StartSweepResponse:
        if not request.HasField("spec"):
            raise InvalidArgument("spec", "required")
        return profiler_pb2.StartSweepResponse(sweep=await self.runner.submit(request.spec))

    async def GetSweep(self, request: profiler_pb2.GetSweepRequest, context: Any) -> profiler_pb2.GetSweepResponse:
        return profiler_pb2.GetSweepResponse(sweep=await self.runner.get(request.sweep_id))

    async def WatchSweep(self, request: profiler_pb2.WatchSweepRequest,
                         context: Any) -> AsyncIterator[profiler_pb2.WatchSweepResponse]:
        async for sweep, point in self.runner.watch(request.sweep_id):
            event = profiler_pb2.WatchSweepResponse(sweep=sweep)
            if point is not None:
                event.point.CopyFrom(point)
            yield event

    async def CancelSweep(self, request: profiler_pb2.CancelSweepRequest,
                          context: Any) -> profiler_pb2.CancelSweepResponse:
        return profiler_pb2.CancelSweepResponse(sweep=await self.runner.cancel(request.sweep_id))

    async def ListSweeps(self, request: profiler_pb2.ListSweepsRequest, context: Any) -> profiler_pb2.ListSweepsResponse:
        sweeps, token = await self.runner.list(request.page_size, request.page_token)
        return profiler_pb2.ListSweepsResponse(sweeps=sweeps, next_page_token=token)

    async def GetProfile(self, request: profiler_pb2.GetProfileRequest, context: Any) -> profiler_pb2.GetProfileResponse:
        if not request.config_key:
            raise InvalidArgument("config_key", "required")
        profile = await asyncio.to_thread(self.store.get, request.config_key, request.version)
        if profile is None:
            what = f"version {request.version} of " if request.version else ""
            raise NotFound(f"no profile {what}{request.config_key!r}", field="config_key")
        return profiler_pb2.GetProfileResponse(profile=profile)

    async def ListProfiles(self, request: profiler_pb2.ListProfilesRequest,
                           context: Any) -> profiler_pb2.ListProfilesResponse:
        if request.source and request.source not in SOURCE_NAMES:
            raise InvalidArgument("source", f"unknown profile source {request.source}")
        size = request.page_size or DEFAULT_PAGE_SIZE
        if not 1 <= size <= MAX_PAGE_SIZE:
            raise InvalidArgument("page_size", f"must be in 1..{MAX_PAGE_SIZE} (0 means {DEFAULT_PAGE_SIZE})")
        after = _profile_page_after(request.page_token) if request.page_token else None
        profiles = await asyncio.to_thread(self.store.list, model=request.model, hardware=request.hardware,
                                           latest_only=request.latest_only,
                                           source=SOURCE_NAMES.get(request.source, ""), workload=request.workload,
                                           after=after, limit=size + 1)
        token = _profile_page_token(profiles[size - 1]) if len(profiles) > size else ""
        return profiler_pb2.ListProfilesResponse(profiles=profiles[:size], next_page_token=token)

    async def Calibrate(self, request: profiler_pb2.CalibrateRequest, context: Any) -> profiler_pb2.CalibrateResponse:
        if not request.config_key:
            raise InvalidArgument("config_key", "required")
        profile = await asyncio.to_thread(self.store.get, request.config_key, request.version)
        if profile is None:
            raise NotFound(f"no profile {request.config_key!r}", field="config_key")
        try:
            base = simulator_profile_name(profile.config, "config_key")
            version = await asyncio.to_thread(calibrate.fit, profile, base)
        except ValueError as exc:
            raise FailedPrecondition(str(exc).partition(": ")[2] or str(exc), field="config_key") from None
        stored = await asyncio.to_thread(calibrate.store, self.ctx.db, version)
        return profiler_pb2.CalibrateResponse(model_version=stored)

    async def ListModelVersions(self, request: profiler_pb2.ListModelVersionsRequest,
                                context: Any) -> profiler_pb2.ListModelVersionsResponse:
        versions = await asyncio.to_thread(calibrate.list_versions, self.ctx.db, request.base_profile)
        return profiler_pb2.ListModelVersionsResponse(model_versions=versions)

    async def PutProfile(self, request: profiler_pb2.PutProfileRequest, context: Any) -> profiler_pb2.PutProfileResponse:
        if not request.HasField("profile"):
            raise InvalidArgument("profile", "required")
        try:
            stored = await asyncio.to_thread(self.store.put, request.profile)
        except ValueError as exc:
            raise _value_error(exc) from None
        return profiler_pb2.PutProfileResponse(profile=stored)


def import_builtin_published(store: ProfileStore) -> int:
    """Store the shipped published tables when no PUBLISHED profile is stored yet; returns how many."""
    if store.count("published"):
        return 0
    return len(store.put_many(builtin_profiles()))


def _backends(settings: ProfilerSettings, db: Any) -> dict[int, Any]:
    def simulator() -> SimulatorBackend:
        return SimulatorBackend(db)

    backends: dict[int, Any] = {profiler_pb2.SWEEP_BACKEND_SIMULATOR: simulator}
    if settings.engine_backend:
        from greenserve.profiler.engine_backend import EngineBackend

        def engine() -> EngineBackend:
            return EngineBackend(settings)

        backends[profiler_pb2.SWEEP_BACKEND_ENGINE] = engine
    return backends


async def build(ctx: ServiceContext) -> list[Registration]:
    settings = ctx.settings
    assert isinstance(settings, ProfilerSettings)
    store = ProfileStore(ctx.db)
    if settings.import_published:
        imported = await asyncio.to_thread(import_builtin_published, store)
        if imported:
            log.info("imported published profiles", extra={"profiles": imported})
    runner = SweepRunner(ctx.db, _backends(settings, ctx.db))
    resumed = await runner.start()
    if resumed:
        log.warning("resuming sweeps left unfinished", extra={"sweep_ids": resumed})
    ctx.on_stop.append(runner.stop)
    return [registration(profiler_pb2, profiler_pb2_grpc, "ProfilerService", ProfilerServicer(ctx, store, runner))]
