"""Benchmarks of the greenserve services and the bench-only solvers they compare against.

Each module is run by ``greenserve bench <name>`` (clients/python/greenserve_client/commands/bench.py maps the
names) or with ``python -m greenserve.bench.<module>``. The service packages never import this package: it
measures the product and is not part of it.
"""
