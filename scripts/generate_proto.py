"""Generate the Python code of the valka.v1 protocol into the SDK: `make proto`.

protoc names the generated modules after the .proto files' paths (`valka/v1/*.proto`), so its
output imports `valka.v1.common_pb2` and registers its classes under `valka.v1.*_pb2`. The code
lives in the SDK's package `valka_sdk.v1`, so two things are rewritten, and nothing else:

- `from valka_sdk.v1 import X` at the start of a line becomes `from valka_sdk.v1 import X`;
- the module name given to `_builder.BuildTopDescriptorsAndMessages` (the classes' `__module__`).

The proto package, the files' paths inside the descriptors and the gRPC method paths
(`/valka.v1.WorkerService/Session`) stay `valka.v1`: they are what the wire, other SDKs and
gRPC reflection see. `tests/e2e/test_protocol.py` runs this into a temporary folder and
compares the result with the committed files.

    python scripts/generate_proto.py [--out FOLDER]   # default: sdk/valka_sdk/v1
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PROTO = ROOT / "proto"
TARGET = ROOT / "sdk" / "valka_sdk" / "v1"
PACKAGE = "valka_sdk.v1"

_IMPORT = re.compile(r"^from valka\.v1 import ", re.MULTILINE)
_BUILDER = re.compile(r"(_builder\.BuildTopDescriptorsAndMessages\(DESCRIPTOR, ')valka\.v1\.")


def rewrite(text: str) -> str:
    """protoc's output for `valka/v1/*.proto`, importing and naming the modules of `valka_sdk.v1`."""
    return _BUILDER.sub(rf"\g<1>{PACKAGE}.", _IMPORT.sub(f"from {PACKAGE} import ", text))


def generate(out: Path) -> list[Path]:
    """Run protoc on every `proto/valka/v1/*.proto` and write the rewritten modules into `out`."""
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        subprocess.run([sys.executable, "-m", "grpc_tools.protoc", f"-I{PROTO}", f"--python_out={tmp}",
                        f"--pyi_out={tmp}", f"--grpc_python_out={tmp}",
                        *map(str, sorted((PROTO / "valka" / "v1").glob("*.proto")))], check=True)
        written = []
        for generated in sorted((Path(tmp) / "valka" / "v1").iterdir()):
            target = out / generated.name
            target.write_text(rewrite(generated.read_text()))
            written.append(target)
    return written


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=TARGET)
    for path in generate(parser.parse_args(argv).out):
        print(path.relative_to(ROOT) if path.is_relative_to(ROOT) else path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
