"""`greenserve profile ...`: profiling sweeps and stored profiles, through the profiler.

    greenserve profile sweep --model M --hardware H [--cache-dram-gib 0,4,8] [--cache-disk-gib ...]
        --rates 1,2,4 --workload W --ttft-slo-s S --tpot-slo-s S [--attainment 0.9]
        [--backend simulator|engine --engine-url URL --cache-server-id ID] [--duration-s S] [--warmup-s S]
        [--requests-per-point N] [--full-ladder] [--seed N] [--detach] [--json]
        [--modes standalone,spec_decode,dpd,dsd --draft-model M --draft-acceptance R [--draft-spec-tokens K]
         --old-hardware H --link-bandwidth-bytes-per-s B]
        start a sweep (every cache size x serving mode is one configuration) and follow it with a progress bar on
        stderr (points done, ETA); --detach returns at once with the sweep id. Exit 1 when it fails or is
        cancelled. The draft goes to spec_decode/dsd configurations, the older GPU and link to dpd/dsd ones.
    greenserve profile sweeps [--json]            the sweeps, newest first
    greenserve profile cancel SWEEP_ID [--json]    cancel a sweep (measured points are kept)
    greenserve profile list [--model M] [--hardware H] [--source measured|simulated|published]
        [--workload W] [--latest] [--json]
    greenserve profile show CONFIG_KEY [--version N] [--json]
    greenserve profile plot CONFIG_KEY [CONFIG_KEY ...] --out FILE.png
        TTFT/TPOT percentiles, SLO attainment and power against request rate (matplotlib)
    greenserve profile calibrate CONFIG_KEY [--version N] [--json]
        fit the simulator's model to a MEASURED profile; prints the model version a sweep names in --model-version
    greenserve profile import FILE.toml [--source published|measured|simulated] [--json]
        store the profiles of a TOML file (the format of greenserve/profiler/data/published_profiles.toml)

Bad input exits 2 with a message naming the flag or field; a service error exits 1.
"""

from __future__ import annotations

import argparse
import asyncio
import math
import sys
from typing import Any

import grpc
from greenserve.common import strict_json
from greenserve.common.cli_parser import Parser
from greenserve.common.file_errors import cannot_read
from greenserve.common.config import DependencyAddresses

from greenserve_client import rpc_errors
from greenserve_client.cli import _add_connection_flags, _channel_config, print_table

GIB = 1 << 30
PROG = "greenserve profile"
LIST_PAGE_SIZE = 1000  # ListProfiles' and ListSweeps' largest page; `profile list/sweeps` follow next_page_token
SWEEP_MODES = {"standalone": "SERVING_MODE_STANDALONE", "spec_decode": "SERVING_MODE_SPEC_DECODE",
               "dpd": "SERVING_MODE_DISAGGREGATED", "dsd": "SERVING_MODE_DISAGGREGATED_SPEC_DECODE"}


def _floats(text: str, flag: str) -> list[float]:
    try:
        values = [float(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{flag}: comma-separated numbers expected, got {text!r}") from None
    if not values:
        raise argparse.ArgumentTypeError(f"{flag}: at least one value")
    return values


def _profile_version(text: str) -> int:
    """A stored profile's version (a uint32 on the wire); 0 is the latest."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a profile version: {text!r}") from None
    if not 0 <= value < 2**32:
        raise argparse.ArgumentTypeError(f"a profile version is 0 (latest) to {2**32 - 1}, got {value}")
    return value


def _parser() -> argparse.ArgumentParser:
    parser = Parser(prog=PROG, description="profiling sweeps and stored profiles")
    sub = parser.add_subparsers(dest="action", required=True, metavar="ACTION")

    sweep = sub.add_parser("sweep", help="run a sweep (configurations x request rates) and follow it")
    sweep.add_argument("--model", required=True, help="model (simulator name like llama3-8b, or the served name)")
    sweep.add_argument("--model-variant", default="", help="variant, e.g. int8")
    sweep.add_argument("--hardware", required=True, help="hardware, e.g. H100-80GB, 4xL40")
    sweep.add_argument("--mig-profile", default="", help="MIG profile, e.g. 3g.40gb")
    sweep.add_argument("--cache-dram-gib", default="0", help="LMCache DRAM sizes, GiB, comma-separated (default 0)")
    sweep.add_argument("--cache-disk-gib", default="0", help="LMCache disk size, GiB (default 0)")
    sweep.add_argument("--modes", default="", help="serving modes, comma-separated: standalone, spec_decode, "
                       "dpd, dsd (default: the mode left unset)")
    sweep.add_argument("--draft-model", default="", help="draft's simulator model (spec_decode, dsd), e.g. llama3.2-1b")
    sweep.add_argument("--draft-acceptance", type=float, default=0.0,
                       help="draft acceptance, accepted / proposed tokens in (0, 1] (GreenLLM: 0.457)")
    sweep.add_argument("--draft-spec-tokens", type=int, default=0, help="tokens proposed per round (default 3)")
    sweep.add_argument("--old-hardware", default="", help="older GPU of dpd / dsd, e.g. A100-40GB")
    sweep.add_argument("--link-bandwidth-bytes-per-s", type=float, default=0.0,
                       help="link between the GPUs (dpd, dsd), bytes/s (GreenLLM: 2e9)")
    sweep.add_argument("--rates", required=True, help="request rates, req/s, ascending, comma-separated")
    sweep.add_argument("--workload", required=True, help="workload name (poisson, sharegpt, multiturn, zipf-docs, ...)")
    sweep.add_argument("--ttft-slo-s", type=float, required=True, help="TTFT target, seconds")
    sweep.add_argument("--tpot-slo-s", type=float, required=True, help="TPOT target, seconds")
    sweep.add_argument("--attainment", type=float, default=0.9, help="SLO attainment target (default 0.9)")
    sweep.add_argument("--backend", choices=["simulator", "engine"], default="simulator", help="default simulator")
    sweep.add_argument("--engine-url", default="", help="engine base URL (engine backend)")
    sweep.add_argument("--engine-time-scale", type=float, default=0.0, help="emulator time scale (default 1)")
    sweep.add_argument("--cache-server-id", default="", help="cache-manager server to resize (engine backend)")
    sweep.add_argument("--duration-s", type=float, default=0.0, help="seconds per point (default 120)")
    sweep.add_argument("--warmup-s", type=float, default=0.0, help="warm-up seconds per point (default: method's)")
    sweep.add_argument("--requests-per-point", type=int, default=0, help="measured requests per point")
    sweep.add_argument("--prefill-requests", type=int, default=0, help="cache pre-fill requests per point")
    sweep.add_argument("--full-ladder", action="store_true", help="measure every rate (default: stop below target)")
    sweep.add_argument("--seed", type=int, default=0, help="request sampling seed")
    sweep.add_argument("--model-version", default="", help="calibrated model version (simulator backend)")
    sweep.add_argument("--detach", action="store_true", help="print the sweep and return at once")
    sweep.add_argument("--json", action="store_true", help="print one JSON object (the sweep) last")

    sweeps = sub.add_parser("sweeps", help="list sweeps, newest first")
    sweeps.add_argument("--json", action="store_true", help="print one JSON object")
    cancel = sub.add_parser("cancel", help="cancel a sweep")
    cancel.add_argument("sweep_id")
    cancel.add_argument("--json", action="store_true", help="print one JSON object")

    lst = sub.add_parser("list", help="list stored profiles")
    lst.add_argument("--model", default="")
    lst.add_argument("--hardware", default="")
    lst.add_argument("--workload", default="")
    lst.add_argument("--source", choices=["measured", "simulated", "published"])
    lst.add_argument("--latest", action="store_true", help="only the latest version of each configuration")
    lst.add_argument("--json", action="store_true", help="print one JSON object")

    show = sub.add_parser("show", help="one profile and its points")
    show.add_argument("config_key")
    show.add_argument("--version", type=_profile_version, default=0, help="version (default latest)")
    show.add_argument("--json", action="store_true", help="print one JSON object")

    plot = sub.add_parser("plot", help="PNG of latency percentiles, attainment and power against rate")
    plot.add_argument("config_keys", nargs="+", metavar="CONFIG_KEY")
    plot.add_argument("--out", required=True, help="PNG file to write")

    cal = sub.add_parser("calibrate", help="fit the simulator's model to a measured profile")
    cal.add_argument("config_key")
    cal.add_argument("--version", type=_profile_version, default=0, help="profile version (default latest)")
    cal.add_argument("--json", action="store_true", help="print one JSON object")

    imp = sub.add_parser("import", help="store the profiles of a TOML file")
    imp.add_argument("file")
    imp.add_argument("--source", choices=["published", "measured", "simulated"], default="published")
    imp.add_argument("--json", action="store_true", help="print one JSON object")

    for remote in (sweep, sweeps, cancel, lst, show, plot, cal, imp):
        remote.add_argument("--profiler-addr", help="host:port (default env GREENSERVE_PROFILER_ADDR or 127.0.0.1:50052)")
        _add_connection_flags(remote)
    return parser


def _fail(message: str, code: int = 2) -> int:
    print(f"{PROG}: error: {message}", file=sys.stderr)
    return code


def _rpc_error(exc: grpc.aio.AioRpcError, ns: argparse.Namespace) -> int:
    return rpc_errors.report(PROG, exc, "profiler", _address(ns), "--profiler-addr",
                             (grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.NOT_FOUND))


def _address(ns: argparse.Namespace) -> str:
    return ns.profiler_addr or DependencyAddresses().profiler_addr


def _channel(ns: argparse.Namespace) -> grpc.aio.Channel:
    from greenserve.common.client import create_channel

    return create_channel(_channel_config(ns, _address(ns)))


def _dict(message: Any) -> dict[str, Any]:
    from google.protobuf.json_format import MessageToDict

    return MessageToDict(message, preserving_proto_field_name=True)


def _build_spec(ns: argparse.Namespace) -> Any:
    from greenserve.v1 import common_pb2, profiler_pb2

    dram = _floats(ns.cache_dram_gib, "--cache-dram-gib")
    disk = _floats(ns.cache_disk_gib, "--cache-disk-gib")
    if len(disk) != 1:
        raise argparse.ArgumentTypeError("--cache-disk-gib: one size (the DRAM sizes are the swept dimension)")
    for flag, values in (("--cache-dram-gib", dram), ("--cache-disk-gib", disk)):
        if any(not math.isfinite(v) or v < 0 for v in values):
            raise argparse.ArgumentTypeError(f"{flag}: sizes must be finite and >= 0")
    rates = _floats(ns.rates, "--rates")
    modes = [m.strip() for m in ns.modes.split(",")] if ns.modes.strip() else [""]
    for mode in modes:
        if mode not in ("", *SWEEP_MODES):
            raise argparse.ArgumentTypeError(f"--modes: unknown mode {mode!r} (known: {', '.join(SWEEP_MODES)})")
    if ns.draft_spec_tokens < 0:
        raise argparse.ArgumentTypeError("--draft-spec-tokens: must be >= 0 (0: 3)")
    configs = []
    for g in dram:
        for mode in modes:
            config = common_pb2.ProfileConfig(model=ns.model, model_variant=ns.model_variant, hardware=ns.hardware,
                                              mig_profile=ns.mig_profile, cache_dram_bytes=int(g * GIB),
                                              cache_disk_bytes=int(disk[0] * GIB))
            if mode:
                config.serving_mode = getattr(common_pb2, SWEEP_MODES[mode])
            if mode in ("spec_decode", "dsd"):
                config.draft.CopyFrom(common_pb2.SpeculativeDraft(
                    simulator_model=ns.draft_model, acceptance_fraction=ns.draft_acceptance,
                    num_speculative_tokens=ns.draft_spec_tokens))
            if mode in ("dpd", "dsd"):
                config.old_hardware = ns.old_hardware
                config.link_bandwidth_bytes_per_s = ns.link_bandwidth_bytes_per_s
            configs.append(config)
    method = common_pb2.ProfileMethod(
        warmup_s=ns.warmup_s, requests_per_point=max(ns.requests_per_point, 0),
        cache_prefill_requests=max(ns.prefill_requests, 0),
        stop_rule=common_pb2.LADDER_STOP_RULE_FULL_LADDER if ns.full_ladder else
        common_pb2.LADDER_STOP_RULE_STOP_BELOW_TARGET)
    backend = (profiler_pb2.SWEEP_BACKEND_ENGINE if ns.backend == "engine" else profiler_pb2.SWEEP_BACKEND_SIMULATOR)
    return profiler_pb2.SweepSpec(
        configs=configs, request_rates_per_s=rates, workload=ns.workload, backend=backend,
        slo=common_pb2.Slo(ttft_s=ns.ttft_slo_s, tpot_s=ns.tpot_slo_s, attainment_fraction=ns.attainment),
        engine_url=ns.engine_url, point_duration_s=ns.duration_s, seed=ns.seed, method=method,
        cache_server_id=ns.cache_server_id, engine_modelled_s_per_wall_s=ns.engine_time_scale,
        model_version=ns.model_version)


def _bar(done: int, skipped: int, total: int, eta_s: float) -> str:
    width = 30
    filled = int(width * (done + skipped) / total) if total else width
    eta = f"ETA {eta_s:.0f} s" if eta_s > 0 else ""
    return f"\r[{'#' * filled}{'.' * (width - filled)}] {done} measured, {skipped} skipped of {total} {eta}    "


async def _sweep(ns: argparse.Namespace, spec: Any) -> int:
    from greenserve.v1 import profiler_pb2, profiler_pb2_grpc

    channel = _channel(ns)
    try:
        stub = profiler_pb2_grpc.ProfilerServiceStub(channel)
        sweep = (await stub.StartSweep(profiler_pb2.StartSweepRequest(spec=spec))).sweep
        print(f"sweep {sweep.id}: {sweep.total_points} points", file=sys.stderr)
        if not ns.detach:
            tty = sys.stderr.isatty()
            async for event in stub.WatchSweep(profiler_pb2.WatchSweepRequest(sweep_id=sweep.id), timeout=None):
                sweep = event.sweep
                line = _bar(sweep.done_points, sweep.skipped_points, sweep.total_points, sweep.eta_s)
                print(line if tty else line.strip("\r ") + "\n", end="", file=sys.stderr, flush=True)
            print("", file=sys.stderr)
    except grpc.aio.AioRpcError as exc:
        return _rpc_error(exc, ns)
    finally:
        await channel.close()
    state = profiler_pb2.SweepState.Name(sweep.state)
    if ns.json:
        print(strict_json.dumps(_dict(sweep)))
    else:
        print(f"{sweep.id} {state}: {sweep.done_points} measured, {sweep.skipped_points} skipped")
        for note in sweep.notes:
            print(f"  {note}")
        for pid in sweep.profile_ids:
            print(f"  profile {pid}")
        if sweep.error:
            print(f"  error: {sweep.error}")
    ok = {profiler_pb2.SWEEP_STATE_SUCCEEDED, profiler_pb2.SWEEP_STATE_PENDING, profiler_pb2.SWEEP_STATE_RUNNING}
    return 0 if sweep.state in ok else 1


async def _unary(ns: argparse.Namespace, method: str, request: Any) -> Any:
    from greenserve.v1 import profiler_pb2_grpc

    channel = _channel(ns)
    try:
        return await getattr(profiler_pb2_grpc.ProfilerServiceStub(channel), method)(request)
    finally:
        await channel.close()


async def _all_pages(ns: argparse.Namespace, method: str, request: Any, field: str) -> list[Any]:
    """Every item a List RPC (ListProfiles, ListSweeps) matches, its ``field`` of the pages one after another
    (the service answers at most a page)."""
    from greenserve.v1 import profiler_pb2_grpc

    request.page_size = LIST_PAGE_SIZE
    channel = _channel(ns)
    try:
        call = getattr(profiler_pb2_grpc.ProfilerServiceStub(channel), method)
        items: list[Any] = []
        while True:
            reply = await call(request)
            items.extend(getattr(reply, field))
            if not reply.next_page_token:
                return items
            request.page_token = reply.next_page_token
    finally:
        await channel.close()


def _point_rows(profile: Any) -> list[dict[str, str]]:
    rows = []
    for p in profile.points:
        rows.append({"rate/s": f"{p.request_rate_per_s:g}", "ttft_p50_s": f"{p.ttft_p50_s:.4g}",
                     "ttft_p99_s": f"{p.ttft_p99_s:.4g}", "tpot_p50_s": f"{p.tpot_p50_s:.4g}",
                     "tpot_p99_s": f"{p.tpot_p99_s:.4g}", "e2e_p95_s": f"{p.e2e_p95_s:.4g}",
                     "slo": f"{p.slo_attainment_fraction:.3f}", "ttft_ok": f"{p.ttft_slo_attainment_fraction:.3f}",
                     "tpot_ok": f"{p.tpot_slo_attainment_fraction:.3f}", "hit": f"{p.cache_hit_fraction:.3f}",
                     "power_w": f"{p.power_w:.0f}", "gCO2/tok": f"{p.carbon_per_output_token_g:.2e}",
                     "n": str(p.requests)})
    return rows


def _plot(profiles: list[Any], out: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, 2, figsize=(12, 8))
    (ax_ttft, ax_tpot), (ax_slo, ax_power) = axes
    for profile in profiles:
        rates = [p.request_rate_per_s for p in profile.points]
        label = f"{profile.config_key} v{profile.version}"
        for ax, prefix in ((ax_ttft, "ttft"), (ax_tpot, "tpot")):
            line, = ax.plot(rates, [getattr(p, f"{prefix}_p50_s") for p in profile.points], marker="o", label=label)
            ax.plot(rates, [getattr(p, f"{prefix}_p99_s") for p in profile.points], linestyle="--",
                    color=line.get_color())
        ax_slo.plot(rates, [p.slo_attainment_fraction for p in profile.points], marker="o", label=label)
        ax_power.plot(rates, [p.power_w for p in profile.points], marker="o", label=label)
        if profile.slo.attainment_fraction:
            ax_slo.axhline(profile.slo.attainment_fraction, color="grey", linewidth=0.8)
    for ax, title, unit in ((ax_ttft, "TTFT p50 (solid) / p99 (dashed)", "s"),
                            (ax_tpot, "TPOT p50 (solid) / p99 (dashed)", "s"),
                            (ax_slo, "SLO attainment (both targets)", "fraction"), (ax_power, "mean power", "W")):
        ax.set_title(title)
        ax.set_xlabel("request rate (req/s)")
        ax.set_ylabel(unit)
        ax.grid(True, alpha=0.3)
    ax_ttft.set_yscale("log")
    ax_tpot.set_yscale("log")
    ax_slo.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(out, format="png", dpi=100)
    plt.close(fig)


def main(argv: list[str]) -> int:  # one dispatch over the actions
    from greenserve.v1 import common_pb2, profiler_pb2

    parser = _parser()
    ns = parser.parse_args(argv)
    if not 0 < ns.timeout_s <= 86400:  # also refuses nan
        parser.error(f"--timeout-s must be in (0, 86400] seconds, got {ns.timeout_s}")
    try:
        if ns.action == "sweep":
            try:
                spec = _build_spec(ns)
            except argparse.ArgumentTypeError as exc:
                return _fail(str(exc))
            return asyncio.run(_sweep(ns, spec))
        if ns.action == "sweeps":
            sweeps = asyncio.run(_all_pages(ns, "ListSweeps", profiler_pb2.ListSweepsRequest(), "sweeps"))
            if ns.json:
                print(strict_json.dumps({"sweeps": [_dict(s) for s in sweeps]}))
            else:
                print_table([{"id": s.id, "state": profiler_pb2.SweepState.Name(s.state).removeprefix("SWEEP_STATE_"),
                              "done": f"{s.done_points}+{s.skipped_points}/{s.total_points}",
                              "workload": s.spec.workload, "created": s.created_at.ToJsonString()}
                             for s in sweeps], ["id", "state", "done", "workload", "created"])
            return 0
        if ns.action == "cancel":
            reply = asyncio.run(_unary(ns, "CancelSweep", profiler_pb2.CancelSweepRequest(sweep_id=ns.sweep_id)))
            print(strict_json.dumps(_dict(reply.sweep)) if ns.json else
                  f"{reply.sweep.id} {profiler_pb2.SweepState.Name(reply.sweep.state)}: {reply.sweep.done_points} kept")
            return 0
        if ns.action == "list":
            source = common_pb2.ProfileSource.Value(f"PROFILE_SOURCE_{ns.source.upper()}") if ns.source \
                else common_pb2.PROFILE_SOURCE_UNSPECIFIED
            profiles = asyncio.run(_all_pages(ns, "ListProfiles", profiler_pb2.ListProfilesRequest(
                model=ns.model, hardware=ns.hardware, workload=ns.workload, latest_only=ns.latest, source=source),
                "profiles"))
            if ns.json:
                print(strict_json.dumps({"profiles": [_dict(p) for p in profiles]}))
            else:
                print_table([{"config_key": p.config_key, "version": str(p.version),
                              "source": common_pb2.ProfileSource.Name(p.source).removeprefix("PROFILE_SOURCE_").lower(),
                              "points": str(len(p.points)), "facts": str(len(p.facts)), "note": p.note[:60]}
                             for p in profiles], ["config_key", "version", "source", "points", "facts", "note"])
            return 0
        if ns.action == "show":
            profile = asyncio.run(_unary(ns, "GetProfile", profiler_pb2.GetProfileRequest(
                config_key=ns.config_key, version=ns.version))).profile
            if ns.json:
                print(strict_json.dumps(_dict(profile)))
                return 0
            print(f"{profile.config_key} v{profile.version} "
                  f"({common_pb2.ProfileSource.Name(profile.source).removeprefix('PROFILE_SOURCE_').lower()})")
            print(f"  {profile.note}")
            if profile.ladder_note:
                print(f"  ladder: {profile.ladder_note}")
            if profile.slo.ttft_s:
                print(f"  SLO: TTFT {profile.slo.ttft_s:g} s, TPOT {profile.slo.tpot_s:g} s, "
                      f"attainment {profile.slo.attainment_fraction:g}")
            for fact in profile.facts:
                print(f"  {fact.name} = {fact.value:g}")
            rows = _point_rows(profile)
            if rows:
                print_table(rows, list(rows[0]))
            return 0
        if ns.action == "plot":
            if not ns.out.lower().endswith(".png"):
                return _fail("--out: a .png file name")
            try:
                import matplotlib  # noqa: F401
            except ImportError:
                return _fail("plot needs matplotlib: pip install 'greenserve[plot]'")
            profiles = [asyncio.run(_unary(ns, "GetProfile", profiler_pb2.GetProfileRequest(config_key=k))).profile
                        for k in ns.config_keys]
            if not any(p.points for p in profiles):
                return _fail("those profiles have no points to plot (published facts only)")
            _plot(profiles, ns.out)
            print(ns.out)
            return 0
        if ns.action == "calibrate":
            version = asyncio.run(_unary(ns, "Calibrate", profiler_pb2.CalibrateRequest(
                config_key=ns.config_key, version=ns.version))).model_version
            if ns.json:
                print(strict_json.dumps(_dict(version)))
                return 0
            print(f"{version.name} (from {version.calibrated_from})")
            for name, value in sorted(version.parameters.items()):
                print(f"  {name} = {value:.4g}")
            print_table([{"rate/s": f"{c.request_rate_per_s:g}", "quantity": c.quantity,
                          "measured_s": f"{c.measured_s:.4g}", "default_s": f"{c.default_model_s:.4g}",
                          "calibrated_s": f"{c.calibrated_model_s:.4g}"} for c in version.checks],
                        ["rate/s", "quantity", "measured_s", "default_s", "calibrated_s"])
            return 0
        # import
        from greenserve.profiler.published import load_file

        try:
            profiles = load_file(ns.file)
        except OSError as exc:
            return _fail(cannot_read(exc, ns.file))
        except ValueError as exc:
            return _fail(f"{ns.file}: {exc}")
        source = common_pb2.ProfileSource.Value(f"PROFILE_SOURCE_{ns.source.upper()}")
        stored: list[str] = []
        for i, profile in enumerate(profiles):
            profile.source = source
            try:
                reply = asyncio.run(_unary(ns, "PutProfile", profiler_pb2.PutProfileRequest(profile=profile)))
            except grpc.aio.AioRpcError as exc:
                print(f"{PROG}: profiles[{i}] of {ns.file} (after {len(stored)} stored):", file=sys.stderr)
                return _rpc_error(exc, ns)
            stored.append(f"{reply.profile.config_key}@{reply.profile.version}")
        print(strict_json.dumps({"stored": stored}) if ns.json else "\n".join(stored))
        return 0
    except grpc.aio.AioRpcError as exc:
        return _rpc_error(exc, ns)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
