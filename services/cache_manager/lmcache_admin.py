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

Entry keys. The index's entry key for an LMCache object is
`chunk_hash_hex@model_name@kv_rank@cache_salt[@object_group_id]` -- exactly the fields of LMCache's
`ObjectKey` (lmcache/v1/distributed/api.py), which `DELETE /cache/objects` matches field for field:

- `chunk_hash_hex`: the chunk's TokenHasher hash (blake3 by default, chunk size 256), lowercase hex.
- `kv_rank` is NOT the worker index: it is LMCache's packed rank `ObjectKey.ComputeKVRank(world_size,
  global_rank, local_world_size, local_rank) = world_size << 24 | global_rank << 16 | local_world_size << 8
  | local_rank` (api.py `_lookup_kv_ranks`), e.g. 16777472 for the single worker of a TP=1 engine.
  Sending rank 0 (the previous encoding) matches nothing: LMCache answers `deleted: 0` (L1 deletes of
  absent keys are silent no-ops, `StorageManager.delete_l1_keys`).
- `object_group_id` defaults to 0 (models with one KV-cache group).

Keys without `@` (e.g. the router's 64-bit prefix hashes) are not LMCache objects and are never sent.
`@` cannot occur in a model name or salt (ObjectKey invariants).
"""

from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

import httpx

GIB = 1024**3
DEFAULT_TIMEOUT_S = 5.0


def gib(size_bytes: int) -> str:
    """A size in GiB for a detail line: 1.0 GiB, 0.25 GiB, 2.5 GiB."""
    text = f"{size_bytes / GIB:.3f}".rstrip("0")
    return (text + "0" if text.endswith(".") else text) + " GiB"
URL_MAX_CHARS = 512  # the lmcache_servers.url column
_HOST_RE = re.compile(r"[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?(?:\.[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?)*")
_PATH_RE = re.compile(r"(?:/[A-Za-z0-9._~-]*)*")


def check_admin_url(url: str) -> str:
    """The base URL of an LMCache HTTP admin API, normalised (no trailing '/'); ValueError saying what is
    wrong otherwise. Accepted: `http` or `https`, a DNS host name or an IP address (IPv6 in brackets), an
    optional port 1-65535, an optional path of A-Z a-z 0-9 . _ ~ - segments; no user, query or fragment,
    no whitespace or control characters, at most URL_MAX_CHARS characters."""
    if not url:
        raise ValueError("required")
    if len(url) > URL_MAX_CHARS:
        raise ValueError(f"at most {URL_MAX_CHARS} characters, got {len(url)}")
    if not url.isascii() or not url.isprintable() or any(c.isspace() for c in url):
        raise ValueError("must be printable ASCII without spaces")
    try:
        parts = urlsplit(url)
        port = parts.port  # ValueError when not a number in 0-65535
    except ValueError as exc:
        raise ValueError(f"not a URL: {exc}") from None
    if parts.scheme not in ("http", "https"):
        raise ValueError("scheme must be http or https")
    if parts.username is not None or parts.password is not None:
        raise ValueError("must not carry a user or password")
    if parts.query or parts.fragment or url.endswith(("?", "#")):
        raise ValueError("must not have a query or fragment")
    host = parts.hostname or ""
    netloc_host = parts.netloc.rsplit("@", 1)[-1]
    if netloc_host.startswith("["):
        try:
            ipaddress.IPv6Address(host)
        except ValueError:
            raise ValueError(f"bad IPv6 address {host!r}") from None
    elif not host or not _HOST_RE.fullmatch(host) or len(host) > 253:
        raise ValueError("needs a host name or IP address")
    if port is not None and not 1 <= port <= 65535:
        raise ValueError("port must be 1-65535")
    if parts.netloc.endswith(":"):
        raise ValueError("empty port")
    if not _PATH_RE.fullmatch(parts.path):
        raise ValueError("path may hold only A-Z a-z 0-9 . _ ~ - segments")
    try:
        httpx.URL(url)
    except (httpx.InvalidURL, ValueError) as exc:
        raise ValueError(f"not a URL: {exc}") from None
    return url.rstrip("/")


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


@dataclass(frozen=True)
class DiskTierState:
    """What one server reports about its L2 (disk) tier: adapters, how they evict, the salt's quota and usage."""

    adapters: int
    eviction_policies: tuple[str, ...]  # per L2 adapter with eviction configured ("IsolatedLRU", "LRU", ...)
    base_paths: tuple[str, ...]  # fs adapters' folders
    quota_bytes: int | None  # the salt's quota; None when none is registered
    used_bytes: int  # the salt's bytes on L2 (summed over adapters); every salt's when it has no quota
    total_used_bytes: int  # every salt's bytes on L2

    @property
    def quota_enforced(self) -> bool:
        """Whether LMCache enforces per-salt quotas on L2 (an adapter evicting by IsolatedLRU)."""
        return "IsolatedLRU" in self.eviction_policies


def salt_path(salt: str) -> str:
    return "_default" if salt == "" else salt


MAX_DELETE_BATCH = 10_000  # lmcache/v1/multiprocess/cache_control/object_service.py MAX_DELETE_BATCH


def kv_rank(world_size: int = 1, global_rank: int = 0, local_world_size: int | None = None,
            local_rank: int | None = None) -> int:
    """LMCache's packed kv_rank (ObjectKey.ComputeKVRank); defaults describe a single-node engine."""
    lws = world_size if local_world_size is None else local_world_size
    lr = global_rank if local_rank is None else local_rank
    return (world_size << 24) | (global_rank << 16) | (lws << 8) | lr


def entry_key(chunk_hash_hex: str, model_name: str, kv_rank: int, cache_salt: str = "",
              object_group_id: int = 0) -> str:
    """The index's entry key of an LMCache object (inverse of `encode_key`)."""
    key = f"{chunk_hash_hex}@{model_name}@{kv_rank}@{cache_salt}"
    return key + f"@{object_group_id}" if object_group_id else key


def encode_key(entry_key: str) -> dict[str, Any]:
    """LMCache EncodedObjectKey for an entry key (see module doc); ValueError when it is not one."""
    parts = entry_key.split("@")
    if len(parts) not in (4, 5):
        raise ValueError(f"entry key {entry_key!r} is not HASH@MODEL@KV_RANK@SALT[@GROUP]")
    chunk, model, rank, salt = parts[:4]
    try:
        bytes.fromhex(chunk)
        rank_i, group = int(rank), int(parts[4]) if len(parts) == 5 else 0
    except ValueError:
        raise ValueError(f"entry key {entry_key!r}: hash must be hex, kv_rank and group integers") from None
    return {"chunk_hash_hex": chunk, "model_name": model, "kv_rank": rank_i, "object_group_id": group,
            "cache_salt": salt}


def lmcache_keys(entry_keys: list[str]) -> list[dict[str, Any]]:
    """The encodable (LMCache object) keys among entry keys; others are dropped."""
    out = []
    for k in entry_keys:
        try:
            out.append(encode_key(k))
        except ValueError:
            continue
    return out


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
        except (httpx.HTTPError, httpx.InvalidURL) as exc:  # InvalidURL: a URL stored before it was checked
            raise LmcacheError(f"{method} {self.url}{path}: {type(exc).__name__}: {exc}") from exc
        if resp.status_code >= 300:
            raise LmcacheError(f"{method} {self.url}{path}: HTTP {resp.status_code}: {resp.text[:300]}")
        try:
            body = resp.json() if resp.content else None
        except ValueError as exc:
            raise LmcacheError(f"{method} {self.url}{path}: answer is not JSON: {resp.text[:100]!r}") from exc
        if body is not None and not isinstance(body, dict):
            raise LmcacheError(f"{method} {self.url}{path}: answer is not a JSON object: {resp.text[:100]!r}")
        return body

    async def healthy(self) -> bool:
        try:
            await self._call("GET", "/healthcheck")
            return True
        except LmcacheError:
            return False

    async def state(self) -> LmcacheState:
        body = await self._call("GET", "/status") or {}
        try:
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
        except (AttributeError, TypeError, ValueError) as exc:  # not LMCache's /status shape
            raise LmcacheError(f"GET {self.url}/status: unexpected answer: {type(exc).__name__}: {exc}") from exc

    async def disk_state(self, salt: str = "") -> DiskTierState:
        """The L2 tier as `/status` (l2_eviction_controller, l2_adapters) and `/quota` describe it."""
        body = await self._call("GET", "/status") or {}
        quotas = await self.quotas()
        try:
            sm = body.get("storage_manager", {})
            evictions = sm.get("l2_eviction_controller", {}).get("adapters", []) or []
            adapters = sm.get("l2_adapters", []) or []
            mine = quotas.get(salt)
            return DiskTierState(
                adapters=int(sm.get("num_l2_adapters", len(adapters))),
                eviction_policies=tuple(str(a.get("eviction_policy", "")) for a in evictions),
                base_paths=tuple(str(a["base_path"]) for a in adapters if a.get("base_path")),
                quota_bytes=None if mine is None else int(round(float(mine.get("limit_gb", 0.0)) * GIB)),
                used_bytes=(sum(int(a.get("total_bytes_used", 0)) for a in evictions) if mine is None
                            else int(round(float(mine.get("current_usage_gb", 0.0)) * GIB))),
                total_used_bytes=sum(int(a.get("total_bytes_used", 0)) for a in evictions),
            )
        except (AttributeError, TypeError, ValueError, KeyError) as exc:
            raise LmcacheError(f"GET {self.url}/status: unexpected L2 description: {type(exc).__name__}: "
                               f"{exc}") from exc

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
        """Delete objects by key; returns (deleted, skipped-as-locked) as LMCache counts them.

        Keys that are not LMCache object keys are not sent; batches hold at most MAX_DELETE_BATCH keys.
        With tier "all" on a server without L2 adapters only L1 is asked ("all" would answer 503); note
        that LMCache counts an L2 delete as the whole batch (object_service.py), found or not.
        """
        keys = lmcache_keys(entry_keys)
        if not keys:
            return 0, 0
        if tier == "all":
            state = await self.state()
            if state.l2_adapters == 0:
                tier = "l1"
        deleted = skipped = 0
        for i in range(0, len(keys), MAX_DELETE_BATCH):
            body = await self._call("DELETE", "/cache/objects", json={
                "keys": keys[i:i + MAX_DELETE_BATCH], "tier": tier, "force": force})
            if not body.get("ok", True):
                raise LmcacheError(f"DELETE {self.url}/cache/objects: {body.get('error')}")
            deleted += int(body.get("deleted", 0))
            skipped += int(body.get("skipped", 0))
        return deleted, skipped

    async def clear_l1(self, *, force: bool = False) -> None:
        await self._call("POST", "/cache/clear", json={"tier": "l1", "force": force})
