"""``greenserve-engine-sim``: run one emulated vLLM engine (OpenAI-compatible HTTP) until SIGTERM.

On start it prints exactly one line ``greenserve-engine-sim listening on http://HOST:PORT`` to
stdout (with ``--port 0`` the port is a free one), so a parent process can read where it listens.
Exit codes: 0 after SIGTERM/SIGINT, 1 after an injected crash, 2 for invalid flags.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import math
import signal
import sys
from collections.abc import Callable
from typing import Any

from greenserve.common.cli_parser import Parser
from greenserve.simulator.emulator.config import EmulatorConfig
from greenserve.simulator.emulator.modes import MODES, ModeSettings

PROG = "greenserve-engine-sim"


def _positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not math.isfinite(value) or value <= 0:
        raise argparse.ArgumentTypeError(f"must be a finite number > 0, got {text}")
    return value


def _non_negative_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not math.isfinite(value) or value < 0:
        raise argparse.ArgumentTypeError(f"must be a finite number >= 0, got {text}")
    return value


def _fraction(text: str) -> float:
    value = _non_negative_float(text)
    if value > 1:
        raise argparse.ArgumentTypeError(f"must be in [0, 1], got {text}")
    return value


def _int_at_least(lo: int) -> Callable[[str], int]:
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
        if value < lo:
            raise argparse.ArgumentTypeError(f"must be >= {lo}, got {text}")
        return value

    return parse


def _port(text: str) -> int:
    value = _int_at_least(0)(text)
    if value > 65535:
        raise argparse.ArgumentTypeError(f"must be in 0..65535, got {text}")
    return value


def build_parser() -> argparse.ArgumentParser:
    """The CLI's flags (names follow ``vllm serve`` where vLLM has the same knob)."""
    p = Parser(
        prog=PROG,
        description="Emulated vLLM engine: OpenAI-compatible HTTP API, vLLM /metrics, paced by the "
        "greenserve performance model, with a real prefix cache and fault injection.",
    )
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    p.add_argument("--port", type=_port, default=8000, help="port to bind; 0 = a free port (default 8000, as vLLM)")
    p.add_argument("--model", "--served-model-name", dest="model", default=None,
                   help="served model name clients must send (default: the profile's model)")
    p.add_argument("--profile", default=None, help="performance profile (see --list-profiles); default: the simulator's default")
    p.add_argument("--list-profiles", action="store_true", help="print the known profiles and exit")
    p.add_argument("--time-scale", type=_positive_float, default=1.0,
                   help="run the modelled engine this many times faster than real time (default 1)")
    p.add_argument("--max-num-seqs", type=_int_at_least(1), default=256, help="max running requests (vLLM default 256)")
    p.add_argument("--max-num-batched-tokens", type=_int_at_least(1), default=None,
                   help="token budget per engine step (default: the profile's)")
    p.add_argument("--max-model-len", type=_int_at_least(2), default=None, help="context length limit (default 8192)")
    p.add_argument("--num-gpu-blocks", type=_int_at_least(1), default=None,
                   help="override the KV pool size in blocks (default: from the profile's memory)")
    p.add_argument("--default-chat-max-tokens", type=_int_at_least(1), default=256,
                   help="max_tokens of chat requests that send none (default 256)")
    p.add_argument("--eos-probability", type=_fraction, default=0.0,
                   help="per-token probability of a deterministic pseudo end-of-sequence (default 0: always max_tokens)")
    faults = p.add_argument_group("fault injection (also at runtime: POST /admin/faults)")
    faults.add_argument("--hang", action="store_true", help="accept requests but never produce tokens; /health hangs")
    faults.add_argument("--slow-factor", type=_positive_float, default=1.0, help="multiply every step time (default 1)")
    faults.add_argument("--error-rate", type=_fraction, default=0.0, help="fraction of requests answered 500 before any token")
    faults.add_argument("--fault-seed", type=_int_at_least(0), default=0, help="seed of the error-rate draws (default 0)")
    faults.add_argument("--fail-after-tokens", type=_int_at_least(0), default=0,
                        help="cut every stream's connection after this many tokens (0 = off)")
    faults.add_argument("--crash-after-s", type=_non_negative_float, default=None,
                        help="crash (reset connections, exit 1) this many seconds after start")
    modes = p.add_argument_group("serving mode (GreenLLM; modes.py)")
    modes.add_argument("--mode", default="standalone", choices=list(MODES),
                       help="standalone, spec_decode (draft on this GPU), dpd (decode on an older GPU), dsd (draft on "
                            "an older GPU)")
    modes.add_argument("--draft-profile", default=None, help="the draft's profile (spec_decode, dsd)")
    modes.add_argument("--decode-profile", default=None, help="the decode GPU's profile (dpd)")
    modes.add_argument("--spec-acceptance", type=_fraction, default=0.457,
                       help="accepted / proposed draft tokens (default 0.457, GreenLLM's 1B draft)")
    modes.add_argument("--num-speculative-tokens", type=_int_at_least(1), default=3, help="draft tokens per round")
    modes.add_argument("--pd-role", default="", choices=["prefill", "decode"],
                       help="dpd as a pair of engines behind the router's proxy: prefill (one token per request) or "
                       "decode (the prompt's KV cache over the link instead of a prefill)")
    modes.add_argument("--link-bandwidth-bytes-per-s", type=_positive_float, default=2e9,
                       help="link of the disaggregated modes (default 2e9: 16 Gbps)")
    sleep = p.add_argument_group("sleep mode (vLLM's; sleep_mode.py)")
    sleep.add_argument("--enable-sleep-mode", action="store_true",
                       help="serve POST /sleep, POST /wake_up and GET /is_sleeping, as vllm serve --enable-sleep-mode")
    sleep.add_argument("--sleep-s", type=_non_negative_float, default=None,
                       help="engine seconds a sleep takes (default: the weights offloaded over the host link)")
    sleep.add_argument("--wake-up-s", type=_non_negative_float, default=None,
                       help="engine seconds a wake-up takes (default: the weights loaded back over the host link)")
    p.add_argument("--log-level", default="WARNING", choices=["DEBUG", "INFO", "WARNING", "ERROR"])
    return p


async def _serve(config: EmulatorConfig) -> int:
    from greenserve.simulator.emulator.server import EngineEmulator

    emu = EngineEmulator(config)
    await emu.start()
    sys.stdout.write(f"{PROG} listening on {emu.url}\n")
    sys.stdout.flush()
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        with contextlib.suppress(NotImplementedError):
            loop.add_signal_handler(sig, stop.set)
    assert emu.crashed is not None
    stop_wait = loop.create_task(stop.wait())
    crash_wait = loop.create_task(emu.crashed.wait())
    await asyncio.wait({stop_wait, crash_wait}, return_when=asyncio.FIRST_COMPLETED)
    crashed = emu.crashed.is_set()
    for task in (stop_wait, crash_wait):
        task.cancel()
    await emu.stop()
    if crashed:
        sys.stderr.write(f"{PROG}: injected crash, exiting\n")
        return 1
    return 0


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``greenserve-engine-sim``; returns the exit code."""
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(level=args.log_level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    from greenserve.simulator.engine_profile import list_profiles

    known = sorted(list_profiles())
    if args.list_profiles:
        print("\n".join(known))
        return 0
    for flag, value in (("--profile", args.profile), ("--draft-profile", args.draft_profile),
                        ("--decode-profile", args.decode_profile)):
        if value is not None and value not in known:
            parser.error(f"{flag}: unknown profile {value!r}; choices: {', '.join(known)}")
    config = EmulatorConfig(
        host=args.host,
        port=args.port,
        profile=args.profile,
        model=args.model,
        time_scale=args.time_scale,
        max_num_seqs=args.max_num_seqs,
        max_num_batched_tokens=args.max_num_batched_tokens,
        max_model_len=args.max_model_len,
        num_gpu_blocks=args.num_gpu_blocks,
        default_chat_max_tokens=args.default_chat_max_tokens,
        eos_probability=args.eos_probability,
        hang=args.hang,
        slow_factor=args.slow_factor,
        error_rate=args.error_rate,
        fault_seed=args.fault_seed,
        fail_after_tokens=args.fail_after_tokens,
        crash_after_s=args.crash_after_s,
        exit_on_crash=True,
        serving_mode=ModeSettings(args.mode, args.draft_profile, args.decode_profile, args.spec_acceptance,
                                  args.num_speculative_tokens, args.link_bandwidth_bytes_per_s, args.pd_role),
        enable_sleep_mode=args.enable_sleep_mode,
        sleep_s=args.sleep_s,
        wake_up_s=args.wake_up_s,
    )
    try:
        config.validate()
    except ValueError as exc:
        parser.error(str(exc))
    runner: Callable[..., Any]
    try:
        import uvloop

        runner = uvloop.run
    except ImportError:  # uvloop is optional (not on Windows)
        runner = asyncio.run
    try:
        return runner(_serve(config))
    except OSError as exc:  # e.g. the port is taken
        sys.stderr.write(f"{PROG}: cannot serve on {args.host}:{args.port}: {exc}\n")
        return 1


if __name__ == "__main__":
    sys.exit(main())
