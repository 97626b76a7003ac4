"""Configuration of every greenserve process: one definition gives both the flags and the env vars.

A field `db_url` is the flag `--db-url` and the env var `GREENSERVE_DB_URL`; flags win over env vars,
env vars over defaults (pydantic-settings does the parsing). Each service subclasses `ServiceSettings`
and adds its own fields; `load_settings` turns a bad value into a one-line error and exit status 2.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, TypeVar

from pydantic import Field, ValidationError, field_validator
from pydantic_settings import BaseSettings, CliApp, CliSettingsSource, SettingsConfigDict

from greenserve.common.cli_parser import Parser
from greenserve.common.clock import Clock, make_clock

if TYPE_CHECKING:
    from greenserve.common.client import ChannelConfig

ENV_PREFIX = "GREENSERVE_"

# Default gRPC ports, one per service, in the order of the loop (README's services table).
DEFAULT_PORTS: dict[str, int] = {
    "forecaster": 50051,
    "profiler": 50052,
    "optimizer": 50053,
    "cache_manager": 50054,
    "gpu_partitioner": 50055,
    "router": 50056,
}
DEFAULT_ROUTER_HTTP_PORT = 8080
MIB = 1024 * 1024


_SETTINGS_CONFIG = SettingsConfigDict(
    env_prefix=ENV_PREFIX,
    cli_kebab_case=True,
    cli_implicit_flags=True,
    cli_exit_on_error=True,
    cli_hide_none_type=True,  # `--port int`, not `--port {int,null}`
    extra="ignore",
)


class ServiceSettings(BaseSettings):
    """Settings shared by every service process."""

    model_config = _SETTINGS_CONFIG

    service_name: ClassVar[str] = ""

    host: str = Field("127.0.0.1", description="address to bind the gRPC server to (0.0.0.0 in containers)")
    port: int | None = Field(
        None, ge=0, le=65535, description="gRPC port (default: the service's own, 50051-50056); 0 picks a free port"
    )
    data_dir: Path = Field(Path(".greenserve"), description="directory for the default SQLite file")
    db_url: str | None = Field(
        None,
        description="SQLAlchemy URL of the service's database (sqlite:///FILE or postgresql+psycopg://...); "
        "default: a SQLite file in --data-dir",
    )
    auth_token: str | None = Field(
        None,
        description="bearer token every call must carry (off when unset); a comma-separated list accepts each of "
        "them (token rotation) and this process sends the first on its own calls",
    )
    auth_token_file: Path | None = Field(
        None, description="file holding the bearer token(s), one per line or comma-separated (wins over --auth-token)"
    )
    tls_cert: Path | None = Field(None, description="PEM server certificate; enables TLS with --tls-key")
    tls_key: Path | None = Field(None, description="PEM private key of --tls-cert")
    tls_client_ca: Path | None = Field(None, description="PEM CA bundle; when set, clients must present a certificate (mTLS)")
    tls_ca: Path | None = Field(None, description="PEM CA bundle this process trusts when it calls other services")
    max_message_bytes: int = Field(16 * MIB, ge=1024, le=1024 * MIB, description="largest gRPC message sent or received")
    shutdown_grace_s: float = Field(10.0, ge=0, le=600, description="seconds in-flight RPCs get to finish on SIGTERM")
    shutdown_delay_s: float = Field(
        0.0, ge=0, le=300,
        description="seconds between reporting NOT_SERVING and refusing new calls on SIGTERM, while the service still "
        "serves, so that health-checking gateways and load balancers stop sending first (0: refuse at once)",
    )
    log_level: str = Field("INFO", description="DEBUG, INFO, WARNING or ERROR")
    log_json: bool = Field(True, description="log one JSON object per line (false: plain text)")
    clock_start: str | None = Field(
        None, description="virtual clock: the instant it starts at (ISO-8601 or Unix seconds); default: wall clock"
    )
    clock_speed: float | None = Field(
        None, gt=0, le=100_000, description="virtual clock: clock seconds per real second (default 1)"
    )
    clock_anchor_s: float | None = Field(
        None, description="virtual clock: real Unix instant at which it reads --clock-start (default: process start); "
        "give every process of a fleet the same one"
    )

    @field_validator("log_level")
    @classmethod
    def _known_level(cls, value: str) -> str:
        level = value.upper()
        if level not in {"DEBUG", "INFO", "WARNING", "ERROR"}:
            raise ValueError(f"log_level must be DEBUG, INFO, WARNING or ERROR, got {value!r}")
        return level

    @property
    def bind_port(self) -> int:
        return DEFAULT_PORTS[self.service_name] if self.port is None else self.port

    @property
    def database_url(self) -> str:
        """The configured URL, or a SQLite file named after the service inside data_dir."""
        if self.db_url:
            return self.db_url
        return f"sqlite:///{(self.data_dir / f'{self.service_name}.db').as_posix()}"

    def channel_config(self, address: str) -> ChannelConfig:
        """How this process calls another greenserve service: its token, CA, and its certificate under mTLS."""
        from greenserve.common.client import ChannelConfig

        return ChannelConfig(address=address, token=self.token(), tls_ca=self.tls_ca,
                             tls_cert=self.tls_cert if self.tls_client_ca else None,
                             tls_key=self.tls_key if self.tls_client_ca else None)

    def make_clock(self) -> Clock:
        """The clock these settings describe (the wall clock unless a virtual one is configured)."""
        return make_clock(self.clock_start, self.clock_speed, self.clock_anchor_s)

    def tokens(self) -> list[str]:
        """Every accepted bearer token, in order (empty: auth off). From the file when one is given, else from
        --auth-token; both take several tokens, comma- or newline-separated, so a token can be rotated without
        downtime (docs/security.md)."""
        if self.auth_token_file is not None:
            found = split_tokens(self.auth_token_file.read_text())
            if not found:
                raise ValueError(f"auth_token_file {self.auth_token_file} is empty")
            return found
        return split_tokens(self.auth_token or "")

    def token(self) -> str | None:
        """The bearer token this process sends on its own calls (the first accepted one), or None when auth is off."""
        found = self.tokens()
        return found[0] if found else None


def split_tokens(text: str) -> list[str]:
    """Tokens of a comma- or newline-separated list, stripped, empty entries and repeats dropped."""
    out: list[str] = []
    for part in text.replace("\n", ",").split(","):
        part = part.strip()
        if part and part not in out:
            out.append(part)
    return out


class DependencyAddresses(BaseSettings):
    """Addresses (host:port) of the other services, for services that call them."""

    model_config = _SETTINGS_CONFIG
    # default= by keyword: type checkers read a field specifier's default only from that keyword

    forecaster_addr: str = Field(default=f"127.0.0.1:{DEFAULT_PORTS['forecaster']}", description="forecaster address")
    profiler_addr: str = Field(default=f"127.0.0.1:{DEFAULT_PORTS['profiler']}", description="profiler address")
    optimizer_addr: str = Field(default=f"127.0.0.1:{DEFAULT_PORTS['optimizer']}", description="optimizer address")
    cache_manager_addr: str = Field(default=f"127.0.0.1:{DEFAULT_PORTS['cache_manager']}", description="cache-manager address")
    gpu_partitioner_addr: str = Field(
        default=f"127.0.0.1:{DEFAULT_PORTS['gpu_partitioner']}", description="gpu-partitioner address"
    )
    router_addr: str = Field(default=f"127.0.0.1:{DEFAULT_PORTS['router']}", description="router address")


S = TypeVar("S", bound=BaseSettings)


def _root_parser(cls: type[BaseSettings], prog: str) -> Parser:
    """The parser the settings' flags go on: greenserve's (no abbreviations; an unknown flag gets one line naming the
    closest real one), the class docstring as it is written."""
    return Parser(prog=prog, description=cls.__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)


def _plain_defaults(parser: argparse.ArgumentParser) -> None:
    """Drop pydantic's "(default: null)" from the help of optional fields: "null" is no value a user types, and
    each such field's description says what leaving it unset means."""
    for action in parser._actions:
        if action.help:
            action.help = action.help.replace(" (default: null)", "").replace("(default: null)", "")


def load_settings(cls: type[S], argv: list[str] | None = None, prog: str | None = None) -> S:
    """Parse flags (argv, default sys.argv[1:]) and GREENSERVE_* env vars into `cls`.

    A value that fails validation prints `prog: error: FIELD: reason` and exits with status 2, like argparse.
    """
    args = sys.argv[1:] if argv is None else argv
    name = prog or getattr(cls, "service_name", "") or "greenserve"
    try:
        source: CliSettingsSource[Any] = CliSettingsSource(cls, cli_prog_name=name, cli_kebab_case=True,
                                                            root_parser=_root_parser(cls, name))
        _plain_defaults(source.root_parser)
        return CliApp.run(cls, cli_args=args, cli_settings_source=source)
    except ValidationError as exc:
        for err in exc.errors():
            field = ".".join(str(p) for p in err["loc"]) or "settings"
            flag = "--" + field.replace("_", "-")
            print(f"{name}: error: {flag} (env {ENV_PREFIX}{field.upper()}): {err['msg']}", file=sys.stderr)
        raise SystemExit(2) from None

