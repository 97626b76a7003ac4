"""`greenserve evaluate`: replay days of real grid CI and a real load shape through the forecaster's models, the
planner's solvers and the simulator, hour by hour, and compare strategies (docs/evaluation.md)."""
