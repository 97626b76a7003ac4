"""Generate the greenserve.v1 Python stubs from protos/greenserve/v1/*.proto with grpcio-tools.

Usage: python scripts/gen_protos.py [--out DIR]

Writes *_pb2.py, *_pb2.pyi and *_pb2_grpc.py into services/v1 (imported as greenserve.v1). With --out the
stubs go to DIR/greenserve/v1 instead; the freshness test uses that to compare against the checked-in copy.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PROTO_ROOT = ROOT / "protos"
PROTO_DIR = PROTO_ROOT / "greenserve" / "v1"
STUB_DIR = ROOT / "services" / "v1"
HEADER = '"""Generated greenserve.v1 protobuf and gRPC stubs. Regenerate with: python scripts/gen_protos.py"""\n'


def generate(out_dir: Path) -> list[Path]:
    """Run protoc into a temporary tree and copy the greenserve/v1 outputs into out_dir."""
    from grpc_tools import protoc  # dev dependency; imported here so the module loads without it

    protos = sorted(PROTO_DIR.glob("*.proto"))
    if not protos:
        raise SystemExit(f"no .proto files under {PROTO_DIR.relative_to(ROOT)}")
    well_known = Path(protoc.__file__).parent / "_proto"
    with tempfile.TemporaryDirectory() as tmp:
        args = [
            "grpc_tools.protoc",
            f"-I{PROTO_ROOT}",
            f"-I{well_known}",
            f"--python_out={tmp}",
            f"--pyi_out={tmp}",
            f"--grpc_python_out={tmp}",
            *[str(p.relative_to(PROTO_ROOT)) for p in protos],
        ]
        code = protoc.main(args)
        if code != 0:
            raise SystemExit(f"protoc failed with exit code {code}")
        out_dir.mkdir(parents=True, exist_ok=True)
        for stale in out_dir.glob("*_pb2*.py*"):
            stale.unlink()
        written = []
        for src in sorted((Path(tmp) / "greenserve" / "v1").iterdir()):
            dst = out_dir / src.name
            shutil.copyfile(src, dst)
            written.append(dst)
        (out_dir / "__init__.py").write_text(HEADER)
        written.append(out_dir / "__init__.py")
        return written


def main(argv: list[str] | None = None) -> int:
    # plain argparse: this script must run before greenserve's own modules import (it generates their stubs)
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0], allow_abbrev=False)
    parser.add_argument("--out", type=Path, help="write DIR/greenserve/v1 instead of services/v1")
    ns = parser.parse_args(argv)
    out_dir = ns.out / "greenserve" / "v1" if ns.out else STUB_DIR
    written = generate(out_dir)
    print(f"wrote {len(written)} files to {out_dir}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
