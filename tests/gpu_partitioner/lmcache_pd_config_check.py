"""Check the LMCACHE_* environment of one DPD engine the way LMCache 0.5.6 reads it when its engine starts.

Runs with the LMCache virtualenv's python (it imports lmcache), not greenserve's, in the environment under test.
It builds LMCache's engine configuration from the environment (``LMCacheEngineConfig.from_env``, what the vLLM
adapter does without ``LMCACHE_CONFIG_FILE``), validates it, and builds the PD backend's ``PDConfig`` with the
backend ``pd_backend_mode`` selects (``storage_backend/__init__.py``: ``async`` -> ``pd_backend_async``, else
``pd_backend``): the assertions LMCache makes before any NIXL or CUDA work. No GPU is touched (``PDConfig`` only
names the buffer device). Prints one JSON object {"ok", "mode", "role", "error"}; exit status 0 when ok.

Usage: LMCACHE_...=... .venv-lmcache/bin/python tests/gpu_partitioner/lmcache_pd_config_check.py
"""

from __future__ import annotations

import json
import sys
import traceback
import types


def main() -> int:
    from lmcache.v1.config import LMCacheEngineConfig

    out: dict[str, object] = {"ok": False, "mode": "", "role": "", "error": ""}
    try:
        config = LMCacheEngineConfig.from_env()
        config.validate()
        out["mode"], out["role"] = config.pd_backend_mode, config.pd_role
        if config.pd_backend_mode == "async":
            from lmcache.v1.storage_backend.pd_backend_async import PDConfig
        else:
            from lmcache.v1.storage_backend.pd_backend import PDConfig
        PDConfig.from_cache_engine_config(config, types.SimpleNamespace(worker_id=0), 0)
        out["ok"] = True
    except Exception as exc:  # noqa: BLE001 - the failure is the answer (AssertionError has no message)
        frame = traceback.extract_tb(exc.__traceback__)[-1]
        out["error"] = f"{type(exc).__name__} at {frame.filename.rsplit('/', 1)[-1]}:{frame.lineno}: {frame.line}"
    print(json.dumps(out))
    return 0 if out["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
