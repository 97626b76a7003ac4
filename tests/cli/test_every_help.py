"""Every `greenserve` command's --help prints and exits 0 (found by an adversarial audit of the CLI:
`greenserve evaluate --help` ended in a ValueError traceback, argparse reading the '%' of a strategy's
description, 'accuracy loss <= 4 %)', as a format directive)."""

from __future__ import annotations

import pytest
from greenserve_client.cli import DELEGATED_COMMANDS, main

COMMANDS = ["up", "demo", "status", *DELEGATED_COMMANDS]


@pytest.mark.parametrize("command", COMMANDS)
def test_help_exits_0(command: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        main([command, "--help"])
    assert info.value.code == 0
    assert "usage: greenserve" in capsys.readouterr().out
