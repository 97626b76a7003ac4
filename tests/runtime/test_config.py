"""Flags and GREENSERVE_* env vars come from one definition; flags win; bad values are clear errors."""

from __future__ import annotations

from pathlib import Path

import pytest
from greenserve.common.config import load_settings
from greenserve.router.front.service import RouterSettings


def test_env_then_flags(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("GREENSERVE_PORT", "6001")
    monkeypatch.setenv("GREENSERVE_DB_URL", "sqlite:///from-env.db")
    monkeypatch.setenv("GREENSERVE_OPTIMIZER_ADDR", "opt:1")
    s = load_settings(RouterSettings, [])
    assert (s.bind_port, s.database_url, s.optimizer_addr) == (6001, "sqlite:///from-env.db", "opt:1")
    s = load_settings(RouterSettings, ["--port", "6002", "--db-url", "postgresql+psycopg://u@h/db"])
    assert (s.bind_port, s.database_url) == (6002, "postgresql+psycopg://u@h/db")


def test_defaults(monkeypatch: pytest.MonkeyPatch) -> None:
    for var in ("GREENSERVE_PORT", "GREENSERVE_DB_URL", "GREENSERVE_DATA_DIR"):
        monkeypatch.delenv(var, raising=False)
    s = load_settings(RouterSettings, [])
    assert s.bind_port == 50056 and s.host == "127.0.0.1"
    assert s.database_url == "sqlite:///.greenserve/router.db"
    assert s.token() is None


def test_token_file_wins_and_empty_file_is_an_error(tmp_path: Path) -> None:
    token_file = tmp_path / "token"
    token_file.write_text("from-file\n")
    s = load_settings(RouterSettings, ["--auth-token", "inline", "--auth-token-file", str(token_file)])
    assert s.token() == "from-file"
    token_file.write_text("  \n")
    with pytest.raises(ValueError, match="empty"):
        s.token()


@pytest.mark.parametrize(
    "argv, flag",
    [(["--port", "-1"], "--port"), (["--log-level", "LOUD"], "--log-level"), (["--max-message-bytes", "1"], "--max-message-bytes")],
)
def test_bad_values_exit_2_naming_flag_and_env(argv: list[str], flag: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        load_settings(RouterSettings, argv, prog="greenserve-router")
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert flag in err and "GREENSERVE_" in err


def test_gpu_partitioner_reads_greenserve_env_vars(monkeypatch: pytest.MonkeyPatch) -> None:
    """Its plan-following mixin, listed last, used to bring BaseSettings' own configuration: no env prefix, so
    compose's GREENSERVE_DB_URL was ignored and a bare SIM_GPUS read instead."""
    from greenserve.gpu_partitioner.service import GpuPartitionerSettings

    monkeypatch.setenv("GREENSERVE_SIM_GPUS", "H100-80GB")
    monkeypatch.setenv("SIM_GPUS", "T4")
    monkeypatch.setenv("GREENSERVE_FOLLOW_PLANS", "false")
    s = load_settings(GpuPartitionerSettings, ["--no-log-json"])
    assert (s.sim_gpus, s.follow_plans, s.log_json) == ("H100-80GB", False, False)


def test_unknown_flag_is_one_line_naming_the_closest(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        load_settings(RouterSettings, ["--prot", "6001"], prog="greenserve-router")
    assert exc.value.code == 2
    assert capsys.readouterr().err.splitlines() == [
        "greenserve-router: error: unknown flag --prot (did you mean --port?)"]
