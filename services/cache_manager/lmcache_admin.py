"""HTTP adapter for one LMCache 0.5.6 MP server (`lmcache server --http-port P`), read from its source.

Endpoints used (module `lmcache/v1/multiprocess/http_apis/*` of lmcache 0.5.6):

- `GET /healthcheck` -> 200 `{"status": "healthy"}` / 503.
- `GET /status` -> `storage_manager.l1_manager.{memory_total_bytes, memory_used_bytes, total_object_count}`,
  `storage_manager.l1_eviction_controller.eviction_policy`, `storage_manager.l2_adapters`.
- `GET /quota` -> `{"users": {salt: {"limit_gb", "current_usage_gb"}}}`; `PUT /quota/{salt}` body
  `{"limit_gb": float}`; `DELETE /quota/{salt}`. Salt "" is written `_default` in the path. Quotas are
  enforced on L2 adapters (usage is summed over L2; with `--eviction-policy IsolatedLRU`).
- `DELETE /cache/objects` body `{"keys": [{"chunk_hash_hex", "model_name", "kv_rank", "object_group_id",
  "cache_salt"}], "tier": "l1"|"l2"|"all", "force": bool}` -> `{"deleted", "skipped", "ok"}`.
- `POST /cache/clear` body `{"tier": "l1", "force": bool}`.

What LMCache cannot do at run time: the L1 (DRAM) size is fixed by `--l1-size-gb` at start; only
Device-DAX arenas (`/reconfigure/dax/l1/...`, `/reconfigure/{backend}/l2/...` for the `dax` adapter) can be
resized live, which needs a /dev/dax device. So an L1 resize is a controlled restart (resize.py).

Entry keys. The index's entry key for an LMCache object is `chunk_hash_hex@model_name@kv_rank@cache_salt`
(`@` cannot occur in a salt, LMCache forbids it); a bare hex key means model "", rank 0, no salt.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import httpx

GIB = 1024**3
DEFAULT_TIMEOUT_S = 5.0


class LmcacheError(RuntimeError):
    """An LMCache admin call failed (unreachable, or a non-2xx answer); the message says which and why."""


@dataclass(frozen=True)
class LmcacheState:
    """What one server reports about itself."""

    healthy: bool
    l1_total_bytes: int
    l1_used_bytes: int
    l1_objects: int
    eviction_policy: str
    l2_adapters: int


def salt_path(salt: str) -> str:
    return "_default" if salt == "" else salt


def encode_key(entry_key: str) -> dict[str, Any]:
    """LMCache EncodedObjectKey for an entry key (see module doc)."""
    parts = entry_key.split("@")
    if len(parts) == 1:
        return {"chunk_hash_hex": parts[0], "model_name": "", "kv_rank": 0, "object_group_id": 0, "cache_salt": ""}
    if len(parts) != 4:
        raise ValueError(f"entry key {entry_key!r} is not HASH or HASH@MODEL@RANK@SALT")
    chunk, model, rank, salt = parts
    return {"chunk_hash_hex": chunk, "model_name": model, "kv_rank": int(rank), "object_group_id": 0,
            "cache_salt": salt}


class LmcacheAdmin:
    """Async client of one server's admin API."""

    def __init__(self, url: str, *, timeout_s: float = DEFAULT_TIMEOUT_S,
                 client: httpx.AsyncClient | None = None) -> None:
        self.url = url.rstrip("/")
        self._client = client or httpx.AsyncClient(timeout=timeout_s)
        self._own = client is None

    async def aclose(self) -> None:
        if self._own:
            await self._client.aclose()

    async def _call(self, method: str, path: str, **kwargs: Any) -> Any:
        try:
            resp = await self._client.request(method, self.url + path, **kwargs)
        except httpx.HTTPError as exc:
            raise LmcacheError(f"{method} {self.url}{path}: {type(exc).__name__}: {exc}") from exc
        if resp.status_code >= 300:
            raise LmcacheError(f"{method} {self.url}{path}: HTTP {resp.status_code}: {resp.text[:300]}")
        return resp.json() if resp.content else None

    async def healthy(self) -> bool:
        try:
            await self._call("GET", "/healthcheck")
            return True
        except LmcacheError:
            return False

    async def state(self) -> LmcacheState:
        body = await self._call("GET", "/status")
        sm = body.get("storage_manager", {})
        l1 = sm.get("l1_manager", {})
        ev = sm.get("l1_eviction_controller", {})
        return LmcacheState(
            healthy=bool(body.get("is_healthy", False)),
            l1_total_bytes=int(l1.get("memory_total_bytes", 0)),
            l1_used_bytes=int(l1.get("memory_used_bytes", 0)),
            l1_objects=int(l1.get("total_object_count", 0)),
            eviction_policy=str(ev.get("eviction_policy", "")),
            l2_adapters=int(sm.get("num_l2_adapters", 0)),
        )

    async def quotas(self) -> dict[str, dict[str, float]]:
        body = await self._call("GET", "/quota")
        return {("" if k == "_default" else k): v for k, v in body.get("users", {}).items()}

    async def set_quota(self, salt: str, quota_bytes: int) -> None:
        """Set a salt's quota; 0 removes it (LMCache then treats the salt as limit 0 on L2)."""
        if quota_bytes == 0:
            await self._call("DELETE", f"/quota/{salt_path(salt)}")
        else:
            await self._call("PUT", f"/quota/{salt_path(salt)}", json={"limit_gb": quota_bytes / GIB})

    async def delete_objects(self, entry_keys: list[str], *, tier: str = "all", force: bool = False) -> tuple[int, int]:
        """Delete objects by key; returns (deleted, skipped-as-locked) as LMCache counts them."""
        if not entry_keys:
            return 0, 0
        keys = [encode_key(k) for k in entry_keys]
        if tier == "all":
            state = await self.state()
            if state.l2_adapters == 0:
                tier = "l1"  # "all" would fail with 503 on a server without L2 adapters
        body = await self._call("DELETE", "/cache/objects", json={"keys": keys, "tier": tier, "force": force})
        if not body.get("ok", True):
            raise LmcacheError(f"DELETE {self.url}/cache/objects: {body.get('error')}")
        return int(body.get("deleted", 0)), int(body.get("skipped", 0))

    async def clear_l1(self, *, force: bool = False) -> None:
        await self._call("POST", "/cache/clear", json={"tier": "l1", "force": force})
