"""Fixtures of the integration tests: the real LMCache server of the cache-manager tests."""

from tests.cache_manager.conftest import lmcache_server  # noqa: F401
