"""Regenerate the gRPC stubs (and the messages' type stubs, .pyi) from bookie_wire.proto.

    python -m pybk_spark.wire.build            # write the stubs
    python -m pybk_spark.wire.build --check    # exit 1 if committed stubs are stale

The proto is compiled with the repository root as include path, so it is
registered as ``pybk_spark/wire/bookie_wire.proto`` in protobuf's global
registry and cannot clash with etcd's rpc.proto/kv.proto/auth.proto.
"""
from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path

WIRE_DIR = Path(__file__).resolve().parent
ROOT = WIRE_DIR.parent.parent
PROTO = "pybk_spark/wire/bookie_wire.proto"
OUTPUTS = ("bookie_wire_pb2.py", "bookie_wire_pb2.pyi", "bookie_wire_pb2_grpc.py")


def generate(out_root: Path) -> None:
    from grpc_tools import protoc  # why: grpc-tools is a dev dependency, needed only here

    rc = protoc.main([
        "grpc_tools.protoc", f"-I{ROOT}",
        f"--python_out={out_root}", f"--pyi_out={out_root}", f"--grpc_python_out={out_root}", str(ROOT / PROTO),
    ])
    if rc != 0:
        raise SystemExit(f"protoc failed with exit code {rc}")


def stale_outputs() -> list[str]:
    with tempfile.TemporaryDirectory() as tmp:
        generate(Path(tmp))
        stale = []
        for name in OUTPUTS:
            fresh = (Path(tmp) / "pybk_spark" / "wire" / name).read_text()
            current = WIRE_DIR / name
            if not current.exists() or current.read_text() != fresh:
                stale.append(name)
        return stale


def main(argv: list[str]) -> int:
    if "--check" in argv:
        stale = stale_outputs()
        if stale:
            print(f"stale generated stubs: {stale}; run `make proto`", file=sys.stderr)
            return 1
        return 0
    generate(ROOT)
    print("generated", ", ".join(os.path.join("pybk_spark/wire", n) for n in OUTPUTS))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
