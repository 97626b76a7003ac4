"""Envoy's bootstrap for a gateway whose endpoint picker is the greenserve router.

One HTTP listener; every request passes the ext_proc filter (headers, then the buffered body, to the picker)
and goes to an ORIGINAL_DST cluster that sends it to the ``ip:port`` in ``x-gateway-destination-endpoint``, the
header the picker sets (the Gateway API Inference Extension's reference configuration does the same with the
``envoy.lb`` metadata). The response streams back without the picker: ext_proc skips the response; a Lua
filter (usage_filter.py) reads the engine's usage and first-token time on the way, in Envoy (by default). The
HTTP gRPC access log sends one entry per request to the router (buffer 0: at once), which closes the request's
carbon receipt (ledger.py). Envoy returns ``x-request-id`` on every response: the receipt's key.
"""

from __future__ import annotations

import json
import sys
from typing import Any

from greenserve.router.envoy.addresses import is_ip
from greenserve.router.envoy.picker import DESTINATION_HEADER
from greenserve.router.envoy.usage_filter import READER_METADATA_KEY, READERS, lua_filter

PICKER_CLUSTER = "greenserve_picker"
ENGINES_CLUSTER = "greenserve_engines"


def _socket(host: str, port: int) -> dict[str, Any]:
    return {"socket_address": {"address": host, "port_value": port}}


def _grpc_service(token: str | None, timeout_s: float, **metadata: str) -> dict[str, Any]:
    service: dict[str, Any] = {"envoy_grpc": {"cluster_name": PICKER_CLUSTER}, "timeout": f"{timeout_s}s"}
    sent = [{"key": "authorization", "value": f"Bearer {token}"}] if token else []
    sent += [{"key": key, "value": value} for key, value in metadata.items()]
    if sent:
        service["initial_metadata"] = sent
    return service


def bootstrap(*, listen_host: str, listen_port: int, picker_host: str, picker_port: int,
              token: str | None = None, picker_timeout_s: float = 5.0, connect_timeout_s: float = 2.0,
              max_body_bytes: int = 16 * 1024 * 1024, admin_port: int | None = None,
              usage_reader: str = "lua") -> dict[str, Any]:
    """The bootstrap as a dict (Envoy reads it as JSON). ``token``: the router's bearer token, sent as gRPC
    metadata on the picker's and the access log's streams. ``max_body_bytes``: the largest request body Envoy
    buffers for the picker (its per-connection buffer limit). ``usage_reader``: how the engine's token counts and
    first-token time reach the receipt (usage_filter.py): ``lua`` (a Lua filter in Envoy, the default),
    ``ext_proc`` (every response chunk through the picker) or ``none`` (receipts count no completion tokens
    and take the engine's first byte as the first token)."""
    if usage_reader not in READERS:
        raise ValueError(f"usage_reader must be one of {', '.join(READERS)}, got {usage_reader!r}")
    reader_metadata = {} if usage_reader == "none" else {READER_METADATA_KEY: usage_reader}
    hcm = {
        "@type": "type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3"
                 ".HttpConnectionManager",
        "stat_prefix": "gateway",
        "always_set_request_id_in_response": True,
        "stream_idle_timeout": "0s",  # a response may pause for long (preemption): the engine's pace rules
        "route_config": {"virtual_hosts": [{
            "name": "engines", "domains": ["*"],
            # timeout 0: a stream as long as the generation; retries are the client's
            "routes": [{"match": {"prefix": "/"}, "route": {"cluster": ENGINES_CLUSTER, "timeout": "0s"}}]}]},
        "http_filters": [
            {"name": "envoy.filters.http.ext_proc", "typed_config": {
                "@type": "type.googleapis.com/envoy.extensions.filters.http.ext_proc.v3.ExternalProcessor",
                "grpc_service": _grpc_service(token, picker_timeout_s, **reader_metadata),
                "failure_mode_allow": False,  # no pick, no request: never an engine chosen by chance
                "message_timeout": f"{picker_timeout_s}s",
                "processing_mode": {
                    "request_header_mode": "SEND", "request_body_mode": "BUFFERED",
                    "request_trailer_mode": "SKIP", "response_header_mode": "SKIP",
                    "response_body_mode": "STREAMED" if usage_reader == "ext_proc" else "NONE",
                    "response_trailer_mode": "SKIP"}}},
            *([lua_filter()] if usage_reader == "lua" else []),
            {"name": "envoy.filters.http.router", "typed_config": {
                "@type": "type.googleapis.com/envoy.extensions.filters.http.router.v3.Router"}},
        ],
        "access_log": [{"name": "envoy.access_loggers.http_grpc", "typed_config": {
            "@type": "type.googleapis.com/envoy.extensions.access_loggers.grpc.v3.HttpGrpcAccessLogConfig",
            "common_config": {"log_name": "greenserve_receipts", "transport_api_version": "V3",
                              "grpc_service": _grpc_service(token, picker_timeout_s),
                              "buffer_size_bytes": 0}}}],
    }
    h2 = {"envoy.extensions.upstreams.http.v3.HttpProtocolOptions": {
        "@type": "type.googleapis.com/envoy.extensions.upstreams.http.v3.HttpProtocolOptions",
        "explicit_http_config": {"http2_protocol_options": {}}}}
    config: dict[str, Any] = {
        "static_resources": {
            "listeners": [{
                "name": "gateway", "address": _socket(listen_host, listen_port),
                "per_connection_buffer_limit_bytes": max_body_bytes,
                "filter_chains": [{"filters": [{"name": "envoy.filters.network.http_connection_manager",
                                                "typed_config": hcm}]}]}],
            "clusters": [
                {"name": ENGINES_CLUSTER, "type": "ORIGINAL_DST", "lb_policy": "CLUSTER_PROVIDED",
                 "connect_timeout": f"{connect_timeout_s}s",
                 "original_dst_lb_config": {"use_http_header": True, "http_header_name": DESTINATION_HEADER},
                 "circuit_breakers": {"thresholds": [{"max_connections": 1_000_000, "max_pending_requests": 1_000_000,
                                                      "max_requests": 1_000_000}]}},
                # a name (a Kubernetes Service) is resolved by DNS and followed; an address is taken as is
                {"name": PICKER_CLUSTER, "type": "STATIC" if is_ip(picker_host) else "STRICT_DNS",
                 "connect_timeout": f"{connect_timeout_s}s",
                 "typed_extension_protocol_options": h2,
                 "circuit_breakers": {"thresholds": [{"max_connections": 1_000_000, "max_pending_requests": 1_000_000,
                                                      "max_requests": 1_000_000}]},
                 "load_assignment": {"cluster_name": PICKER_CLUSTER, "endpoints": [{"lb_endpoints": [
                     {"endpoint": {"address": _socket(picker_host, picker_port)}}]}]}},
            ],
        },
    }
    if admin_port is not None:
        config["admin"] = {"address": _socket("127.0.0.1", admin_port)}
    return config


def bootstrap_json(**kwargs: Any) -> str:
    return json.dumps(bootstrap(**kwargs), indent=1)


def main(argv: list[str] | None = None) -> int:
    """``python -m greenserve.router.envoy.bootstrap --picker HOST:PORT``: prints the bootstrap (for a ConfigMap)."""
    from greenserve.common.cli_parser import Parser

    parser = Parser(prog="python -m greenserve.router.envoy.bootstrap", description=main.__doc__)
    parser.add_argument("--picker", required=True, help="the router's gRPC address (HOST:PORT), run with --envoy-picker")
    parser.add_argument("--listen", default="0.0.0.0:8081", help="Envoy's HTTP listener (default 0.0.0.0:8081)")
    parser.add_argument("--admin-port", type=int, default=None, help="Envoy's admin port on 127.0.0.1 (default: none)")
    parser.add_argument("--usage-reader", choices=READERS, default="lua",
                        help="how receipts get the engine's token counts: lua (in Envoy, default), ext_proc "
                             "(every response chunk through the picker), none")
    ns = parser.parse_args(argv)
    try:
        picker_host, picker_port = ns.picker.rsplit(":", 1)
        listen_host, listen_port = ns.listen.rsplit(":", 1)
        ports = int(picker_port), int(listen_port)
    except ValueError:
        parser.error("--picker and --listen are HOST:PORT")
    if not all(0 < p < 65536 for p in ports) or (ns.admin_port is not None and not 0 < ns.admin_port < 65536):
        parser.error("ports must be in 1..65535")
    sys.stdout.write(bootstrap_json(listen_host=listen_host, listen_port=ports[1], picker_host=picker_host,
                                    picker_port=ports[0], admin_port=ns.admin_port,
                                    usage_reader=ns.usage_reader) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
