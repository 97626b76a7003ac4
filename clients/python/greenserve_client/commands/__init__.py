"""Sub-commands of `greenserve` that own their parsers: forecast, mig, bench."""
