"""Flags are never abbreviated (`--grid ES` is not `--grids ES`), an unknown flag is answered in one line naming the
closest real one of the command that read it, and a missing input file is named by its whole path (issue 35)."""

from __future__ import annotations

import contextlib
import subprocess
import sys
from pathlib import Path

import pytest
from greenserve_client.cli import main


def _refused(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    with pytest.raises(SystemExit) as info:
        main(argv)
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert len(err.splitlines()) == 1, err  # no usage block
    return err.strip()


@pytest.mark.parametrize(("argv", "line"), [
    (["evaluate", "--grid", "ES", "--hours", "1"], "greenserve evaluate: error: unknown flag --grid (did you mean --grids?)"),
    (["evaluate", "--csv", "x.csv"], "greenserve evaluate: error: unknown flag --csv (did you mean --ci-csv?)"),
    (["forecast", "backtest", "--ci-csv=x.csv"],
     "greenserve forecast backtest: error: unknown flag --ci-csv (did you mean --csv?)"),
    (["plan", "status", "--optimizer-adr", "h:1"],
     "greenserve plan status: error: unknown flag --optimizer-adr (did you mean --optimizer-addr?)"),
    (["up", "--engins", "3"], "greenserve up: error: unknown flag --engins (did you mean --engines?)"),
    (["status", "--zzz"], "greenserve status: error: unknown flag --zzz (greenserve status --help lists the flags)"),
])
def test_unknown_flag_gets_one_line_and_the_closest_flag(argv: list[str], line: str,
                                                         capsys: pytest.CaptureFixture[str]) -> None:
    assert _refused(argv, capsys) == line


@pytest.mark.parametrize(("argv", "hint"), [(["plan", "statsu"], "'status'"),
                                            # the flags after NAME are the benchmark's, not unknown to `bench`
                                            (["bench", "simulater", "--quick"], "'simulator'")])
def test_a_mistyped_command_is_suggested(argv: list[str], hint: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        main(argv)
    assert info.value.code == 2
    assert capsys.readouterr().err.rstrip().endswith(f"did you mean {hint}?")


@pytest.mark.parametrize("flag", ["--ci-csv", "--scenario"])
def test_a_missing_file_is_named_by_its_whole_path(flag: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.chdir(tmp_path)
    argv = ["evaluate", flag, "nope/absent.file", "--time-column", "t", "--value-column", "v", "--grids", "ES"]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert f"{tmp_path / 'nope' / 'absent.file'}: cannot read: No such file or directory" in err


@pytest.mark.parametrize("argv", [
    ["forecast", "backtest", "--csv", "nope/absent.file", "--time-column", "t", "--value-column", "v"],
    ["forecast", "ingest", "--csv", "nope/absent.file", "--time-column", "t", "--value-column", "v", "--region",
     "ES", "--addr", "127.0.0.1:1"],
    ["fleet", "set", "nope/absent.file", "--optimizer-addr", "127.0.0.1:1"],
    ["profile", "import", "nope/absent.file", "--profiler-addr", "127.0.0.1:1"],
    ["plan", "status", "--tls-ca", "nope/absent.file", "--optimizer-addr", "127.0.0.1:1"],
    ["evaluate", "--profile", "nope/absent.file", "--grids", "ES", "--hours", "1"],
])
def test_every_command_names_a_missing_file_by_its_whole_path(argv: list[str], tmp_path: Path,
                                                               monkeypatch: pytest.MonkeyPatch,
                                                               capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.chdir(tmp_path)
    with contextlib.suppress(SystemExit):
        assert main(argv) != 0
    err = capsys.readouterr().err
    assert f"{tmp_path / 'nope' / 'absent.file'}: cannot read: No such file or directory" in err, err


@pytest.mark.parametrize("flags", [["--auth-token-file", "nope/absent.file"],
                                   ["--tls-cert", "nope/absent.file", "--tls-key", "nope/absent.file"]])
def test_a_service_names_a_missing_file_by_its_whole_path(flags: list[str], tmp_path: Path) -> None:
    done = subprocess.run([sys.executable, "-m", "greenserve.optimizer", "--port", "0", "--data-dir", str(tmp_path),
                           *flags], capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert done.returncode == 1
    assert done.stderr.strip().endswith(f"error: {tmp_path / 'nope' / 'absent.file'}: No such file or directory"), \
        done.stderr
