"""Performance model, discrete-event trace replay and engine emulator (DESIGN.md: the simulator)."""
