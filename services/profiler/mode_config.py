"""Serving-mode configurations of a sweep (GreenLLM SpecDecode, DPD, DSD): what each mode needs from the
``ProfileConfig`` and the simulator unit it is measured on (``greenserve.simulator.mode_units``, the path the
optimizer's serving-modes solver evaluates modes with).

SPEC_DECODE needs ``draft``; DISAGGREGATED needs ``old_hardware`` and ``link_bandwidth_bytes_per_s``;
DISAGGREGATED_SPEC_DECODE needs all three. The draft's simulator model is ``draft.simulator_model``, else
``draft.model`` when that is a simulator model name or the served name of one of its profiles.
"""

from __future__ import annotations

from greenserve.simulator import mode_units
from greenserve.simulator.engine_profile import EngineProfile, list_profiles, load_profile
from greenserve.v1 import common_pb2

MODE_CONFIGS = (common_pb2.SERVING_MODE_SPEC_DECODE, common_pb2.SERVING_MODE_DISAGGREGATED,
                common_pb2.SERVING_MODE_DISAGGREGATED_SPEC_DECODE)
_SPECULATIVE = (common_pb2.SERVING_MODE_SPEC_DECODE, common_pb2.SERVING_MODE_DISAGGREGATED_SPEC_DECODE)
_DISAGGREGATED = (common_pb2.SERVING_MODE_DISAGGREGATED, common_pb2.SERVING_MODE_DISAGGREGATED_SPEC_DECODE)
_SETTING_FIELDS = {"hardware": "hardware", "draft": "draft.simulator_model", "old_hardware": "old_hardware",
                   "link_bandwidth": "link_bandwidth_bytes_per_s"}


def is_mode_config(config: common_pb2.ProfileConfig) -> bool:
    return config.serving_mode in MODE_CONFIGS


def _mode(config: common_pb2.ProfileConfig) -> str:
    return common_pb2.ServingMode.Name(config.serving_mode)


def draft_simulator_model(config: common_pb2.ProfileConfig, field: str = "config") -> str:
    """The draft's simulator model name; ValueError naming the field when the simulator does not know it."""
    d = config.draft
    shorts = sorted({n.split("@", 1)[0] for n in list_profiles()})
    if d.simulator_model:
        if d.simulator_model not in shorts:
            raise ValueError(f"{field}.draft.simulator_model: unknown simulator model {d.simulator_model!r} "
                             f"(known: {', '.join(shorts)})")
        return d.simulator_model
    if d.model in shorts:
        return d.model
    served = {load_profile(n).model: n.split("@", 1)[0] for n in list_profiles()}
    if d.model in served:
        return served[d.model]
    raise ValueError(f"{field}.draft.simulator_model: required, {d.model!r} is not a simulator model "
                     f"(known: {', '.join(shorts)})")


def check_mode(config: common_pb2.ProfileConfig, field: str = "config") -> None:
    """ValueError("<field>.<name>: ...") when a mode configuration lacks what its mode needs."""
    if config.serving_mode in _SPECULATIVE:
        if not config.HasField("draft"):
            raise ValueError(f"{field}.draft: {_mode(config)} needs the draft model (simulator_model, "
                             "acceptance_fraction, num_speculative_tokens)")
        draft_simulator_model(config, field)
    elif config.HasField("draft"):
        raise ValueError(f"{field}.draft: only SPEC_DECODE and DISAGGREGATED_SPEC_DECODE use a draft")
    if config.serving_mode in _DISAGGREGATED:
        if not config.old_hardware:
            raise ValueError(f"{field}.old_hardware: {_mode(config)} needs the older GPU it pairs with")
        if config.link_bandwidth_bytes_per_s <= 0:
            raise ValueError(f"{field}.link_bandwidth_bytes_per_s: {_mode(config)} needs the link's bandwidth "
                             "(GreenLLM: 2e9 bytes/s, 16 Gbps)")
    elif config.old_hardware or config.link_bandwidth_bytes_per_s:
        name = "old_hardware" if config.old_hardware else "link_bandwidth_bytes_per_s"
        raise ValueError(f"{field}.{name}: only DISAGGREGATED and DISAGGREGATED_SPEC_DECODE use an older GPU "
                         "and a link")


def unit(config: common_pb2.ProfileConfig, profile_name: str, target: EngineProfile,
         field: str = "config") -> mode_units.ModeUnit:
    """The replay unit of a mode configuration whose target runs on ``profile_name``'s GPU with ``target``;
    ValueError naming the field when the simulator cannot build it."""
    check_mode(config, field)
    target_model, _, hardware = profile_name.partition("@")
    draft = draft_simulator_model(config, field) if config.serving_mode in _SPECULATIVE else ""
    built = mode_units.mode_unit(config.serving_mode, target_model, hardware, draft_model=draft,
                                 old_hardware=config.old_hardware,
                                 acceptance_fraction=config.draft.acceptance_fraction,
                                 num_speculative_tokens=config.draft.num_speculative_tokens
                                 or mode_units.DEFAULT_SPEC_TOKENS,
                                 link_bandwidth_bytes_per_s=config.link_bandwidth_bytes_per_s, target=target)
    if isinstance(built, mode_units.ModeUnit):
        return built
    raise ValueError(f"{field}.{_SETTING_FIELDS[built.setting]}: {built.reason}")
