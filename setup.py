"""Package discovery for the `greenserve` import namespace.

The repository keeps services under `services/` (one folder per service, README.md's layout) while code imports
them as `greenserve.<service>`; the client library lives under `clients/python/`. pyproject.toml maps the two roots
and lists the data files; this file lists the packages below them, so a new sub-package needs no registration.
Data folders (`services/*/data`, no `__init__.py`) are listed too, as namespace packages: setuptools warns about
every importable folder it is not told about ("Package would be ignored"), about 320 lines of set-up output.
"""

from setuptools import find_namespace_packages, setup


def _under(root: str, prefix: str) -> list[str]:
    return [prefix] + [f"{prefix}.{name}" for name in find_namespace_packages(where=root, exclude=["*__pycache__*"])]


setup(
    packages=_under("services", "greenserve") + _under("clients/python/greenserve_client", "greenserve_client"),
)
