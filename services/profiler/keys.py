"""Configuration keys of profiles and the simulator profile a configuration maps to.

A config key is stable, readable and derived only from the ``ProfileConfig`` fields that change what is
measured: ``<model>[:<variant>]@<hardware>[/<mig>]`` followed by ``|dram=<bytes>``, ``|disk=<bytes>``,
``|mode=<serving mode>``, the mode's ``|draft=<model>|acceptance=<fraction>|spec_tokens=<k>``, ``|old=<hardware>``,
``|link=<bytes/s>`` and ``|workload=<name>`` when set (a configuration without the mode fields keeps the key it
had before they existed). Every version of one configuration shares it.
"""

from __future__ import annotations

import math

from greenserve.simulator.engine_profile import EngineProfile, list_profiles, load_profile
from greenserve.v1 import common_pb2

MAX_KEY_CHARS = 255
MAX_SPEC_TOKENS = 16
MAX_LINK_BANDWIDTH_BYTES_PER_S = 1e13  # 80 Tb/s: beyond any NIC or NVLink


def _number(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else repr(float(value))


def _mode_name(mode: int) -> str:
    return common_pb2.ServingMode.Name(mode).removeprefix("SERVING_MODE_").lower()


def check_config(config: common_pb2.ProfileConfig, field: str = "config") -> None:
    """Raise ValueError("<field>.<name>: ...") for a configuration that cannot be keyed."""
    if not config.model.strip():
        raise ValueError(f"{field}.model: must not be empty")
    if not config.hardware.strip():
        raise ValueError(f"{field}.hardware: must not be empty")
    for name in ("model", "model_variant", "hardware", "mig_profile", "workload"):
        value = getattr(config, name)
        if value != value.strip() or any(c in "|@=\t\n" for c in value):
            raise ValueError(f"{field}.{name}: must not contain '|', '@', '=', whitespace at the ends or newlines")
    if config.serving_mode not in common_pb2.ServingMode.values():
        raise ValueError(f"{field}.serving_mode: unknown value {config.serving_mode}")
    mode_names = {"draft.model": config.draft.model, "draft.simulator_model": config.draft.simulator_model,
                  "old_hardware": config.old_hardware}
    for name, value in mode_names.items():
        if value != value.strip() or any(c in "|@=\t\n " for c in value):
            raise ValueError(f"{field}.{name}: must not contain '|', '@', '=', spaces or newlines")
    if config.HasField("draft"):
        d = config.draft
        if not (d.simulator_model or d.model):
            raise ValueError(f"{field}.draft.simulator_model: the draft needs its simulator model (or model)")
        if not math.isfinite(d.acceptance_fraction) or not 0 < d.acceptance_fraction <= 1:
            raise ValueError(f"{field}.draft.acceptance_fraction: must be in (0, 1] (accepted / proposed draft "
                             f"tokens), got {d.acceptance_fraction!r}")
        if d.num_speculative_tokens > MAX_SPEC_TOKENS:
            raise ValueError(f"{field}.draft.num_speculative_tokens: must be 0 (3) to {MAX_SPEC_TOKENS}, "
                             f"got {d.num_speculative_tokens}")
    bw = config.link_bandwidth_bytes_per_s
    if not math.isfinite(bw) or not 0 <= bw <= MAX_LINK_BANDWIDTH_BYTES_PER_S:
        raise ValueError(f"{field}.link_bandwidth_bytes_per_s: must be in [0, {MAX_LINK_BANDWIDTH_BYTES_PER_S:g}] "
                         f"bytes/s (0: none), got {bw!r}")
    if len(config_key(config)) > MAX_KEY_CHARS:
        raise ValueError(f"{field}: the configuration key would exceed {MAX_KEY_CHARS} characters")


def config_key(config: common_pb2.ProfileConfig) -> str:
    """The stable key of a configuration (see the module docstring)."""
    head = config.model + (f":{config.model_variant}" if config.model_variant else "") + f"@{config.hardware}"
    if config.mig_profile:
        head += f"/{config.mig_profile}"
    parts = [head]
    if config.cache_dram_bytes:
        parts.append(f"dram={config.cache_dram_bytes}")
    if config.cache_disk_bytes:
        parts.append(f"disk={config.cache_disk_bytes}")
    if config.serving_mode:
        parts.append(f"mode={_mode_name(config.serving_mode)}")
    if config.HasField("draft"):
        d = config.draft
        parts += [f"draft={d.simulator_model or d.model}", f"acceptance={_number(d.acceptance_fraction)}",
                  f"spec_tokens={d.num_speculative_tokens or 3}"]
    if config.old_hardware:
        parts.append(f"old={config.old_hardware}")
    if config.link_bandwidth_bytes_per_s:
        parts.append(f"link={_number(config.link_bandwidth_bytes_per_s)}")
    if config.workload:
        parts.append(f"workload={config.workload}")
    return "|".join(parts)


def simulator_profile_name(config: common_pb2.ProfileConfig, field: str = "config") -> str:
    """The ``greenserve.simulator`` performance profile of a configuration.

    ``model`` is the simulator's short model name (``llama3-8b``) or the served name of one of its profiles
    (``meta-llama/Meta-Llama-3-8B-Instruct``); ``model_variant`` picks ``<model>-<variant>@...`` when such a
    profile exists (``llama3-70b`` + ``int8`` on ``4xL40``); a MIG profile appends ``-MIG-<profile>``.
    Raises ValueError naming the field when no profile matches."""
    names = list_profiles()
    shorts = {n.split("@", 1)[0] for n in names}
    short = config.model
    if short not in shorts:
        served = {load_profile(n).model: n.split("@", 1)[0] for n in names}
        if config.model not in served:
            raise ValueError(f"{field}.model: the simulator has no model {config.model!r} "
                             f"(known: {', '.join(sorted(shorts))})")
        short = served[config.model]
    hardware = config.hardware + (f"-MIG-{config.mig_profile}" if config.mig_profile else "")
    candidates = ([f"{short}-{config.model_variant}@{hardware}"] if config.model_variant else []) + \
        [f"{short}@{hardware}"]
    for name in candidates:
        if name in names:
            return name
    raise ValueError(f"{field}.hardware: the simulator has no profile {candidates[0]!r} "
                     f"(known: {', '.join(n for n in names if n.startswith(short))})")


def simulator_profile(config: common_pb2.ProfileConfig, field: str = "config") -> EngineProfile:
    """``load_profile(simulator_profile_name(config))``."""
    return load_profile(simulator_profile_name(config, field))
