"""A tiny OptimizerService for the plan-following tests: WatchPlans, ReportEnforcement and GetFleet only.

The real optimizer is tested on its own; enforcers are tested against this peer, which streams the plans a
test puts and keeps every enforcement report it receives.
"""

from __future__ import annotations

import asyncio

import grpc

from greenserve.v1 import common_pb2, optimizer_pb2, optimizer_pb2_grpc


class PlanPeer(optimizer_pb2_grpc.OptimizerServiceServicer):
    def __init__(self) -> None:
        self.plans: list[common_pb2.Plan] = []
        self.reports: list[optimizer_pb2.EnforcementReport] = []
        self.fleet = common_pb2.FleetInventory()
        self.watch_requests: list[int] = []
        self._new_plan = asyncio.Condition()
        self._new_report = asyncio.Condition()

    async def publish(self, plan: common_pb2.Plan) -> None:
        async with self._new_plan:
            self.plans.append(plan)
            self._new_plan.notify_all()

    async def WatchPlans(self, request, context):
        """As the optimizer: the active (last published) plan unless the watcher holds it, then every plan
        published later whose version differs from the last sent (an older one is a rollback)."""
        self.watch_requests.append(request.after_version)
        sent = request.after_version
        seen = len(self.plans)
        if self.plans and self.plans[-1].version != sent:
            sent = self.plans[-1].version
            yield optimizer_pb2.WatchPlansResponse(plan=self.plans[-1])
        while True:
            async with self._new_plan:
                await self._new_plan.wait_for(lambda seen=seen: len(self.plans) > seen)
                later, seen = self.plans[seen:], len(self.plans)
            for plan in later:
                if plan.version != sent:
                    sent = plan.version
                    yield optimizer_pb2.WatchPlansResponse(plan=plan)

    async def ReportEnforcement(self, request, context):
        async with self._new_report:
            self.reports.append(request.report)
            self._new_report.notify_all()
        return optimizer_pb2.ReportEnforcementResponse()

    async def GetFleet(self, request, context):
        return optimizer_pb2.GetFleetResponse(fleet=self.fleet)

    async def wait_report(self, predicate, timeout_s: float = 20.0, since: int = 0) -> optimizer_pb2.EnforcementReport:
        """The first report from the ``since``-th on (already received or coming) for which ``predicate`` is true."""
        async def find() -> optimizer_pb2.EnforcementReport:
            async with self._new_report:
                await self._new_report.wait_for(lambda: any(predicate(r) for r in self.reports[since:]))
                return next(r for r in self.reports[since:] if predicate(r))
        return await asyncio.wait_for(find(), timeout_s)


async def serve(peer: PlanPeer, port: int = 0) -> tuple[grpc.aio.Server, str]:
    """Starts ``peer`` on 127.0.0.1 (``port`` 0: a free one); returns the server and its address."""
    server = grpc.aio.server()
    optimizer_pb2_grpc.add_OptimizerServiceServicer_to_server(peer, server)
    bound = server.add_insecure_port(f"127.0.0.1:{port}")
    await server.start()
    return server, f"127.0.0.1:{bound}"


def interval(start_s: float, end_s: float, **fields) -> common_pb2.PlanInterval:
    iv = common_pb2.PlanInterval(**fields)
    iv.start.FromSeconds(int(start_s))
    iv.end.FromSeconds(int(end_s))
    return iv
