"""What ``--envoy-picker`` adds to the router process: the ext_proc picker and the access-log receiver on its
gRPC server (same port, token and TLS as RouterService), and ``GET /v1/greenserve/receipts/{request_id}`` on its
HTTP front: the carbon receipt of a request routed through Envoy, by the ``x-request-id`` Envoy returned."""

from __future__ import annotations

from aiohttp import web
from envoy.service.accesslog.v3 import als_pb2, als_pb2_grpc
from envoy.service.ext_proc.v3 import external_processor_pb2 as ext_pb2
from envoy.service.ext_proc.v3 import external_processor_pb2_grpc as ext_grpc
from greenserve.common.server import Registration
from greenserve.router.core import RouterCore
from greenserve.router.envoy.ledger import AccessLogReceiver, Ledger
from greenserve.router.envoy.picker import EndpointPicker

RECEIPT_PATH = "/v1/greenserve/receipts/{request_id}"


class EnvoySurface:
    def __init__(self, core: RouterCore, max_body_bytes: int) -> None:
        self.ledger = Ledger(core)
        self.picker = EndpointPicker(core, self.ledger, max_body_bytes)
        self.access_log = AccessLogReceiver(self.ledger)

    def registrations(self) -> list[Registration]:
        return [
            Registration(self.picker, ext_grpc.add_ExternalProcessorServicer_to_server,
                         ext_pb2.DESCRIPTOR.services_by_name["ExternalProcessor"].full_name),
            Registration(self.access_log, als_pb2_grpc.add_AccessLogServiceServicer_to_server,
                         als_pb2.DESCRIPTOR.services_by_name["AccessLogService"].full_name),
        ]

    def add_routes(self, app: web.Application) -> None:
        app.router.add_get(RECEIPT_PATH, self._receipt)

    async def _receipt(self, request: web.Request) -> web.Response:
        request_id = request.match_info["request_id"]
        receipt = self.ledger.receipt(request_id)
        if receipt is None:
            pending = self.ledger.is_open(request_id)
            return web.json_response(
                {"error": {"message": f"no receipt for request {request_id!r}"
                                      + (" yet: the response is still streaming" if pending else ""),
                           "type": "NotFoundError", "param": "request_id", "code": 404}},
                status=404, headers={"Retry-After": "1"} if pending else None)
        return web.json_response({"request_id": request_id, "greenserve": receipt})
