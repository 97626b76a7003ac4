"""Settings of the fuzz harness: cases per RPC/route and the seed, from the environment.

GREENSERVE_FUZZ_N (default 200) cases per gRPC method and per HTTP route; GREENSERVE_FUZZ_SEED (default 21)
makes every run reproducible: a failure names the seed, the RPC and the case index.
"""

from __future__ import annotations

import os

DEFAULT_CASES = 200
DEFAULT_SEED = 21


def fuzz_cases() -> int:
    return max(1, int(os.environ.get("GREENSERVE_FUZZ_N", DEFAULT_CASES)))


def fuzz_seed() -> int:
    return int(os.environ.get("GREENSERVE_FUZZ_SEED", DEFAULT_SEED))
