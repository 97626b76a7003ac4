"""Performance model, discrete-event trace replay and engine emulator: what stands in for vLLM engines without a
GPU (docs/simulator.md)."""
