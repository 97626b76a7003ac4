"""Settings of greenserve-optimizer: its flags and GREENSERVE_* environment variables."""

from __future__ import annotations

from typing import ClassVar

from pydantic import Field

from greenserve.common.config import DependencyAddresses, ServiceSettings


class OptimizerSettings(ServiceSettings, DependencyAddresses):
    """Flags and GREENSERVE_* env vars of greenserve-optimizer."""

    service_name: ClassVar[str] = "optimizer"

    hold_plans: bool = Field(False, description="store computed plans as proposed; they wait for ActivatePlan")
    plan_horizon_hours: int = Field(24, ge=1, le=168, description="hours each plan covers")
    plan_lead_s: float = Field(600.0, ge=0, le=3600, description="compute the next hour's plan this long before it")
    plan_debounce_s: float = Field(5.0, ge=0, le=3600, description="events within this many seconds make one plan")
    schedule_plans: bool = Field(True, description="compute plans on the schedule and on events (off: ComputePlan only)")
    ci_change_fraction: float = Field(0.05, gt=0, le=10, description="re-plan when CI moves more than this from the plan")
    ci_monitor_interval_s: float = Field(900.0, ge=0, le=86400, description="how often actual/forecast CI is checked (0: never)")
    forecast_max_age_s: float = Field(6 * 3600.0, gt=0, le=7 * 86400,
                                      description="plan on cached forecasts up to this age while the forecaster is "
                                      "down; past it the plan is the safe plan (every engine awake and weighted "
                                      "equally, cache, MIG and modes kept)")
    forecast_timeout_s: float = Field(10.0, gt=0, le=600, description="a forecaster answering later than this is "
                                      "down for the computation (its cached forecasts are used)")
    ci_change_confirm_checks: int = Field(2, ge=1, le=100, description="a CI move beyond --ci-change-fraction (but "
                                          "under twice it) re-plans once seen in this many consecutive samples")
    ci_change_cooldown_s: float = Field(3600.0, ge=0, le=86400, description="at most one CI re-plan per region and "
                                        "signal (actual, forecast) per this")
    solver_timeout_s: float = Field(10.0, gt=0, le=600, description="a solver taking longer leaves its knob as it is")
    ci_signal: str = Field("direct", pattern="^(direct|lifecycle)$", description="carbon signal of the CI series planned on")
    routing_headroom_fraction: float = Field(0.9, gt=0, le=1, description="share of an engine's SLO capacity the plan fills")
    routing_load: str = Field("upper", pattern="^(upper|mean)$",
                              description="plan routing for the forecast's upper bound or its mean")
    cache_solver: str = Field("greencache", pattern="^(greencache|kareto|keep)$",
                              description="cache sizes: the GreenCache ILP, Kareto's adaptive Pareto search over "
                              "DRAM x disk (simulator replays), or keep the sizes in force")
    cache_kareto_ttl_max_s: float = Field(0.0, ge=0, le=86400, description="Kareto search: search DRAM x the disk "
                                          "tier's TTL (0 to this many s) instead of DRAM x disk size (0: sizes)")
    cache_slo_per_hour: bool = Field(False, description="GreenCache ILP: meet the SLO in every hour, not only over "
                                     "the horizon (appendix A's global rho)")
    slo_breach_cooldown_s: float = Field(900.0, ge=0, le=86400, description="at most one SLO-breach re-plan per pool per this")
    mig_solver: str = Field("clover-exact", pattern="^(clover-exact|keep)$",
                            description="MIG layouts: variants on MIG slices by CLOVER's objective (exact), or keep")
    mig_change_s: float = Field(180.0, ge=0, le=3600, description="drain + start-up + cache warm-up of one engine "
                                "a MIG/variant change restarts (charged as idle carbon)")
    mig_max_ged_per_hour: int = Field(0, ge=0, le=100000, description="bound on the graph edit distance between "
                                      "consecutive hours' MIG configurations (0: none)")
    mig_max_accuracy_loss_fraction: float = Field(0.0, ge=0, lt=1, description="cap on the accuracy loss of the "
                                                  "variants mix (0: none)")
    mig_resolve_change_fraction: float = Field(0.05, ge=0, le=10, description="within a plan, re-solve an hour's MIG "
                                               "layouts when its CI or load moved more than this since the last "
                                               "solve (CLOVER: 5 %; 0: every hour)")
    planner: str = Field("coupled", pattern="^(coupled|per-knob)$",
                         description="coupled: engines, DRAM sizes, SM clocks and sleeping engines decided together "
                         "by one MILP per pool-hour; per-knob: one solver per knob, one after another (also what "
                         "--cache-solver kareto or keep selects)")
    attainment_floor_fraction: float = Field(0.95, gt=0, lt=1, description="coupled planner: capacity is planned "
                                             "where the predicted attainment stays at or above this (and the "
                                             "pool's target)")
    modes_solver: str = Field("greenllm", pattern="^(greenllm|keep)$",
                              description="serving modes: GreenLLM's choice per pool and hour (Standalone, SpecDecode, "
                              "DPD, DSD), or keep the modes in force")
