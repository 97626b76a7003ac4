"""Logging and OpenTelemetry set-up shared by every process.

Traces and metrics go to an OTLP endpoint when OTEL_EXPORTER_OTLP_ENDPOINT is set (the standard OTel env
vars configure it); otherwise spans are recorded but not exported. Tests pass their own in-memory exporter.
"""

from __future__ import annotations

import json
import logging
import os
import sys
import time
from typing import Any

from opentelemetry import metrics, trace
from opentelemetry.metrics import Meter, NoOpMeter
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import MetricReader, PeriodicExportingMetricReader
from opentelemetry.sdk.resources import SERVICE_NAME, Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SimpleSpanProcessor, SpanExporter

OTLP_ENDPOINT_ENV = "OTEL_EXPORTER_OTLP_ENDPOINT"
_STD_ATTRS = set(logging.LogRecord("", 0, "", 0, "", None, None).__dict__) | {"message", "asctime"}


class JsonFormatter(logging.Formatter):
    """One JSON object per line: time, level, logger, message and any `extra=` fields."""

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "ts": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created)) + f".{int(record.msecs):03d}Z",
            "level": record.levelname,
            "logger": record.name,
            "msg": record.getMessage(),
        }
        for key, value in record.__dict__.items():
            if key not in _STD_ATTRS and not key.startswith("_"):
                entry[key] = value
        if record.exc_info:
            entry["exc"] = self.formatException(record.exc_info)
        return json.dumps(entry, default=str)


class TextFormatter(logging.Formatter):
    """Human-readable lines: time level logger message key=value ... (the `extra=` fields)."""

    def __init__(self) -> None:
        super().__init__("%(asctime)s %(levelname)s %(name)s %(message)s")

    def format(self, record: logging.LogRecord) -> str:
        extras = " ".join(f"{k}={v}" for k, v in record.__dict__.items() if k not in _STD_ATTRS and not k.startswith("_"))
        line = super().format(record)
        return f"{line} {extras}" if extras else line


def setup_logging(level: str = "INFO", json_lines: bool = True) -> None:
    """Configure the root logger to write to stderr; migration chatter is kept at WARNING."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter() if json_lines else TextFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level)
    logging.getLogger("alembic").setLevel(logging.WARNING)


class Telemetry:
    """Tracer and meter providers of one process; `shutdown()` flushes them.

    ``meter`` is a no-op meter when ``metrics_exported`` is false (the provider has no metric reader, so
    nothing can ever read what it aggregates): the SDK's instruments still validate the attributes and
    aggregate every measurement, ~3-5 us of CPU each, and services record several per request or RPC."""

    def __init__(self, tracer_provider: TracerProvider, meter_provider: MeterProvider, *,
                 metrics_exported: bool = True) -> None:
        self.tracer_provider = tracer_provider
        self.meter_provider = meter_provider
        self.metrics_exported = metrics_exported
        self.tracer = tracer_provider.get_tracer("greenserve")
        self.meter: Meter = meter_provider.get_meter("greenserve") if metrics_exported else NoOpMeter("greenserve")

    def shutdown(self) -> None:
        self.tracer_provider.shutdown()
        self.meter_provider.shutdown()


def setup_telemetry(
    service_name: str,
    *,
    span_exporter: SpanExporter | None = None,
    metric_reader: MetricReader | None = None,
    install_global: bool = True,
) -> Telemetry:
    """Create providers for `service_name`; OTLP exporters when OTEL_EXPORTER_OTLP_ENDPOINT is set.

    `span_exporter` / `metric_reader` override the exporters (tests pass in-memory ones). With neither a
    metric reader nor an OTLP endpoint, metrics are recorded nowhere (`Telemetry.meter` is a no-op meter).
    """
    resource = Resource.create({SERVICE_NAME: os.environ.get("OTEL_SERVICE_NAME", f"greenserve-{service_name}")})
    tracer_provider = TracerProvider(resource=resource)
    readers: list[MetricReader] = []
    otlp = bool(os.environ.get(OTLP_ENDPOINT_ENV))
    if span_exporter is not None:
        tracer_provider.add_span_processor(SimpleSpanProcessor(span_exporter))
    elif otlp:
        from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter

        tracer_provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
    if metric_reader is not None:
        readers.append(metric_reader)
    elif otlp:
        from opentelemetry.exporter.otlp.proto.grpc.metric_exporter import OTLPMetricExporter

        readers.append(PeriodicExportingMetricReader(OTLPMetricExporter()))
    meter_provider = MeterProvider(resource=resource, metric_readers=readers)
    if install_global:
        trace.set_tracer_provider(tracer_provider)
        metrics.set_meter_provider(meter_provider)
    return Telemetry(tracer_provider, meter_provider, metrics_exported=bool(readers))
