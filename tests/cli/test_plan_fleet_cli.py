"""`greenserve fleet` and `greenserve plan` against an in-process forecaster + optimizer; `greenserve bench plan` on a
small fleet."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import grpc
import pytest

from greenserve.bench.optimizer_plan import use_solvers
from greenserve.v1 import common_pb2, optimizer_pb2, optimizer_pb2_grpc
from greenserve_client.commands import fleet as fleet_cli
from greenserve_client.commands import plan as plan_cli
from tests.optimizer.conftest import ci_ref, forecaster, ingest_daily, load_ref, optimizer  # noqa: F401 - fixtures

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "deploy" / "fleet.example.yaml"


def _last_json(out: str) -> Any:
    return json.loads(out.strip().splitlines()[-1])


async def _services(forecaster: Any, optimizer: Any) -> tuple[Any, list[str]]:  # noqa: F811
    channel = grpc.aio.insecure_channel(forecaster.address)
    for region, base in (("FR", 50.0), ("DE", 350.0)):
        await ingest_daily(channel, ci_ref(region), base, 20.0, days=3)
    for pool, base in (("chat", 1.0), ("summarize", 3.0)):
        await ingest_daily(channel, load_ref(pool), base, 0.5, days=3)
    await channel.close()
    running = await optimizer(schedule_plans=False)
    # The CLI is under test, not the knob solvers: routing weights and keep-current (fast and deterministic).
    use_solvers(running.server, "issue17")
    return running, ["--optimizer-addr", running.address]


async def _cli(module: Any, argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    code = await asyncio.to_thread(module.main, argv)
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_example_fleet_file_loads() -> None:
    fleet = fleet_cli.load_fleet_file(EXAMPLE)
    assert [p.name for p in fleet.pools] == ["chat", "summarize"]
    chat = fleet.pools[0]
    assert [v.name for v in chat.variants] == ["70b-instruct", "8b-instruct"]
    assert chat.variants[1].quality_fraction == pytest.approx(68.4 / 82.0, abs=1e-3)
    assert all(v.quality_source for p in fleet.pools for v in p.variants)
    assert chat.max_cache_disk_bytes == 4 * 10**12 and chat.max_cache_dram_bytes == 256 * 1024**3
    assert len(fleet.gpus) == 7 and fleet.gpus[4].mig_enabled and len(fleet.gpus[4].instances) == 2
    assert fleet.gpus[0].model == common_pb2.GPU_MODEL_A100_80GB


@pytest.mark.parametrize(("text", "named"), [
    ("pools:\n  - name: chat\n    nme: x\n", "pools[0].nme: unknown key"),
    ("pools:\n  - name: chat\n    slo: {ttft_s: fast}\n", "pools[0].slo.ttft_s: must be a number"),
    ("pools:\n  - name: chat\n    region: NO\n", "pools[0].region: must be a string"),
    ("gpus:\n  - {uuid: g, model: GPU_MODEL_A100}\n", "gpus[0].model: must be one of"),
    ("pools:\n  - name: chat\n    max_cache_disk_bytes: lots\n", "pools[0].max_cache_disk_bytes"),
    ("pools: {chat: 1}\n", "pools: must be a list"),
    ("pools: [\n", "not valid YAML"),
    ("", "the file is empty"),
    ("- 1\n", "must be a mapping of FleetInventory fields"),
])
def test_bad_fleet_file_exits_2_naming_the_key(tmp_path: Path, capsys: pytest.CaptureFixture[str], text: str,
                                                named: str) -> None:
    path = tmp_path / "fleet.yaml"
    path.write_text(text)
    # Nothing listens on port 9: the file is refused before any call.
    assert fleet_cli.main(["set", str(path), "--optimizer-addr", "127.0.0.1:9"]) == 2
    err = capsys.readouterr().err
    assert named in err and len(err.strip().splitlines()) == 1


async def test_fleet_set_show_and_server_refusal(forecaster: Any, optimizer: Any,  # noqa: F811
                                                 tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    _, addr = await _services(forecaster, optimizer)
    code, out, _ = await _cli(fleet_cli, ["set", str(EXAMPLE), *addr], capsys)
    assert code == 0 and "2 pools, 5 engines, 7 GPUs" in out
    code, out, _ = await _cli(fleet_cli, ["show", "--json", *addr], capsys)
    shown = _last_json(out)
    assert code == 0 and [p["name"] for p in shown["fleet"]["pools"]] == ["chat", "summarize"]
    assert shown["updated_at"]
    # show --json round-trips through set
    again = tmp_path / "again.json"
    again.write_text(json.dumps(shown))
    assert (await _cli(fleet_cli, ["set", str(again), *addr], capsys))[0] == 0
    code, out, _ = await _cli(fleet_cli, ["show", *addr], capsys)
    assert code == 0 and "chat-8b-mig-0" in out and "GPU-h100-n3-1" in out and "8b-instruct (0.834)" in out
    # The optimizer's own checks: an engine on an undeclared GPU -> INVALID_ARGUMENT naming the field, exit 2.
    bad = tmp_path / "bad.yaml"
    bad.write_text(EXAMPLE.read_text().replace("gpu_uuid: GPU-h100-n3-0", "gpu_uuid: GPU-nowhere"))
    code, _, err = await _cli(fleet_cli, ["set", str(bad), *addr], capsys)
    assert code == 2 and "INVALID_ARGUMENT" in err and "fleet.pools[1].engines[0].gpu_uuid" in err
    code, out, _ = await _cli(fleet_cli, ["show", "--json", *addr], capsys)
    assert _last_json(out)["fleet"] == shown["fleet"]  # unchanged


async def test_plan_commands(forecaster: Any, optimizer: Any, capsys: pytest.CaptureFixture[str]) -> None:  # noqa: F811
    running, addr = await _services(forecaster, optimizer)
    assert (await _cli(fleet_cli, ["set", str(EXAMPLE), *addr], capsys))[0] == 0

    code, out, _ = await _cli(plan_cli, ["compute", "--horizon-hours", "3", "--dry-run", "--json", *addr], capsys)
    assert code == 0 and _last_json(out)["dry_run"] is True
    code, out, _ = await _cli(plan_cli, ["list", "--json", *addr], capsys)
    assert _last_json(out)["plans"] == []  # a dry run stores nothing

    code, out, _ = await _cli(plan_cli, ["compute", "--horizon-hours", "3", *addr], capsys)
    assert code == 0 and out.startswith("plan v1 active") and "pool chat:" in out

    code, out, _ = await _cli(plan_cli, ["show", *addr], capsys)
    assert code == 0 and "HOUR (UTC)" in out and "CAPACITY REQ/S" in out
    assert "pool chat" in out and "weights: " in out and "chat-8b-mig-0" in out

    code, out, _ = await _cli(plan_cli, ["explain", "1", *addr], capsys)
    assert code == 0 and "routing_weights.min_carbon" in out and "inputs:" in out and "simulator" in out

    # Status: nobody has reported -> exit 3; the router reports APPLIED -> exit 0.
    code, out, _ = await _cli(plan_cli, ["status", *addr], capsys)
    assert code == plan_cli.EXIT_NOT_MATCHING and "does not match plan v1" in out
    stub = optimizer_pb2_grpc.OptimizerServiceStub(grpc.aio.insecure_channel(running.address))

    async def router_applies() -> None:
        await asyncio.sleep(0.5)
        await stub.ReportEnforcement(optimizer_pb2.ReportEnforcementRequest(report=optimizer_pb2.EnforcementReport(
            component="router", instance="r1", plan_version=1, state=optimizer_pb2.ENFORCEMENT_STATE_APPLIED,
            detail="weights of 5 engines")))

    report = asyncio.get_running_loop().create_task(router_applies())
    # --wait-s polls until the report arrives (the deadline is far beyond it: not a timing assertion)
    code, out, _ = await _cli(plan_cli, ["status", "--wait-s", "60", "--json", *addr], capsys)
    await report
    status = _last_json(out)
    assert code == 0 and status["fleet_matches_plan"] and status["reports"][0]["state"] == "applied"
    await stub.ReportEnforcement(optimizer_pb2.ReportEnforcementRequest(report=optimizer_pb2.EnforcementReport(
        component="cache-manager", instance="c1", plan_version=1, state=optimizer_pb2.ENFORCEMENT_STATE_FAILED,
        detail="LMCache unreachable")))
    code, out, _ = await _cli(plan_cli, ["status", "1", *addr], capsys)
    assert code == plan_cli.EXIT_NOT_MATCHING and "LMCache unreachable" in out and "not applied: cache-manager/c1" in out

    # Plan 2: plan 1 with other routing weights for chat in its first two hours and 500 g more carbon there.
    loop = next(r.servicer for r in running.server.registrations).loop
    v1 = loop.plans.get(1)
    v2 = common_pb2.Plan()
    v2.CopyFrom(v1)
    v2.ClearField("version")
    for iv in v2.intervals[:2]:
        for w in iv.routing_weights:
            if w.pool == "chat":
                w.weight = 1.0 if w.engine_id == "chat-70b-0" else 0.0  # the costliest engine
        iv.expected_carbon.total_g += 250.0
    v2.expected_carbon.total_g += 500.0
    await asyncio.to_thread(loop.plans.store, v2, False)

    code, out, _ = await _cli(plan_cli, ["diff", "1", "2", "--json", *addr], capsys)
    diff = _last_json(out)
    assert code == 0 and diff["common_hours"] == 3
    changed = {c["key"]: c for c in diff["changes"]}
    assert set(changed) <= {"chat/chat-70b-0", "chat/chat-8b-mig-0", "chat/chat-8b-mig-1"}
    assert changed["chat/chat-70b-0"]["b"] == "1.000" and changed["chat/chat-70b-0"]["a"] != "1.000"
    assert all(c["knob"] == "routing_weights" for c in diff["changes"])
    first, second = (iv.start.ToSeconds() for iv in v1.intervals[:2])
    assert changed["chat/chat-70b-0"]["from"] == plan_cli._iso(first)
    assert changed["chat/chat-70b-0"]["until"] == plan_cli._iso(second + 3600)
    assert diff["carbon_delta_g"] == pytest.approx(500.0) and diff["carbon_delta_common_hours_g"] == pytest.approx(500.0)
    code, out, _ = await _cli(plan_cli, ["diff", "1", "2", *addr], capsys)
    assert code == 0 and "weight chat/chat-70b-0:" in out and "-> 1.000" in out and "+0.500 kgCO2e" in out

    code, out, _ = await _cli(plan_cli, ["activate", "2", *addr], capsys)
    assert code == 0 and "plan v2 in force (was v1)" in out
    code, out, _ = await _cli(plan_cli, ["activate", "1", "--json", *addr], capsys)
    assert code == 0 and _last_json(out)["rollback"] is True
    code, out, _ = await _cli(plan_cli, ["list", *addr], capsys)
    assert code == 0 and out.splitlines()[1].split()[:2] == ["2", "superseded"] and out.splitlines()[2].split()[:2] == ["1", "active"]

    code, _, err = await _cli(plan_cli, ["show", "99", *addr], capsys)
    assert code == 1 and "NOT_FOUND" in err
    code, _, err = await _cli(plan_cli, ["compute", "--horizon-hours", "500", *addr], capsys)
    assert code == 2 and "--horizon-hours" in err


def test_plan_bad_arguments_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    for argv in (["show", "abc"], ["activate", "0"], ["diff", "1"], ["status", "--timeout-s", "0"]):
        with pytest.raises(SystemExit) as exit_:
            plan_cli.main(argv)
        assert exit_.value.code == 2, argv
    capsys.readouterr()
    # Through the top-level `greenserve` parser, which delegates both groups.
    from greenserve_client import cli

    with pytest.raises(SystemExit) as exit_:
        cli.main(["plan", "activate", "-3"])
    assert exit_.value.code == 2 and "VERSION" in capsys.readouterr().err
    assert cli.main(["fleet", "set", str(tmp_path / "missing.yaml"), "--optimizer-addr", "127.0.0.1:9"]) == 2
    assert "cannot read" in capsys.readouterr().err


def test_bench_plan_small_fleet(capsys: pytest.CaptureFixture[str]) -> None:
    from greenserve.bench import optimizer_plan as bench

    code = bench.main(["--pools", "2", "--gpus", "4", "--horizon-hours", "3", "--repetitions", "2",
                       "--activations", "4", "--watchers", "2"], prog="greenserve bench plan")
    out = _last_json(capsys.readouterr().out)
    assert code == 0
    for key in ("compute_s", "compute_first_s", "watch_delivery_ms_p99", "pools", "gpus", "engines", "watchers",
                "deliveries"):
        assert key in out, key
    assert out["pools"] == 2 and out["gpus"] == 4 and out["engines"] > 0
    assert out["deliveries"] == 4 * 2 and out["compute_s"] > 0 and out["watch_delivery_ms_p99"] >= 0
