"""The "keep the current configuration" solver of a knob: every interval keeps what the plan in force has."""

from __future__ import annotations

from greenserve.optimizer.planning import KNOB_LABELS, KnobPlan, PlanningInputs, keep_current_messages


class KeepCurrent:
    """Answers the knob's part of the plan in force, unchanged (nothing when no plan is in force)."""

    def __init__(self, knob: str) -> None:
        if knob not in KNOB_LABELS:
            raise ValueError(f"knob: must be one of {sorted(KNOB_LABELS)}, got {knob!r}")
        self.knob = knob
        self.name = f"{KNOB_LABELS[knob].lower()}.keep_current"

    def solve(self, inputs: PlanningInputs) -> KnobPlan:
        messages = keep_current_messages(inputs, self.knob)
        held = sum(len(m) for m in messages)
        detail = (f"{KNOB_LABELS[self.knob]} kept as in force ({held} targets over the horizon)" if held
                  else f"{KNOB_LABELS[self.knob]} not planned (no solver configured; nothing in force to keep)")
        return KnobPlan(messages, detail=detail, status="kept")
