"""Every file under deploy/: the YAML parses, and no path of a build machine is written into any file."""

from __future__ import annotations

from tests.deploy.deploy_files import DEPLOY, ROOT, load_yaml_docs


def test_every_yaml_file_under_deploy_parses() -> None:
    files = sorted([*DEPLOY.rglob("*.yaml"), *DEPLOY.rglob("*.yml")])
    assert len(files) >= 10
    for path in files:
        docs = load_yaml_docs(path)
        assert docs, f"{path.relative_to(ROOT)} holds no document"
        for doc in docs:
            assert isinstance(doc, (dict, list)), f"{path.relative_to(ROOT)}: a mapping or a JSON patch list"


def test_no_machine_paths_in_deploy_files() -> None:
    for path in DEPLOY.rglob("*"):
        if path.is_file() and "__pycache__" not in path.parts:
            text = path.read_bytes()
            # the roots of development and CI machines' home folders, spelt in parts so that this file names none
            for bad in (b"/" + root + b"/" for root in (b"work", b"root", b"home" + b"/runner")):
                assert bad not in text, f"{path.relative_to(ROOT)} names a machine path {bad!r}"
