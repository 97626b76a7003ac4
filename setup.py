"""Package discovery for the `greenserve` import namespace.

The repository keeps services under `services/` (DESIGN.md layout) while code imports them as
`greenserve.<service>`; the client library lives under `clients/python/`. pyproject.toml maps the two
roots; this file only lists the packages below them so new sub-packages need no manual registration.
"""

from setuptools import find_packages, setup


def _under(root: str, prefix: str) -> list[str]:
    return [prefix] + [f"{prefix}.{name}" for name in find_packages(where=root)]


setup(
    packages=_under("services", "greenserve") + _under("clients/python/greenserve_client", "greenserve_client"),
)
