"""The image's Python packages: wheels built (downloaded) on the host, installed offline inside.

    python infra/image/wheels.py lock  WHEEL_DIR   # resolve pyproject's pins -> requirements.lock
    python infra/image/wheels.py fetch WHEEL_DIR   # the lock's wheels into WHEEL_DIR (cached)

`lock` resolves the pinned `[project] dependencies` of pyproject.toml (and the setuptools
that installs the project itself) with the host's pip, so torch==2.13.0 comes from the CPU
wheel pip already finds (find-links), and writes every wheel it took, transitive ones too,
as `name==version` to infra/image/requirements.lock (committed: the image's exact set).
`fetch` gets exactly the lock's wheels (`--no-deps`) and skips the work when the directory
already holds the wheels of this lock (a stamp with the lock's hash).
The image installs them with `pip install --no-index`: no index, no network, inside.
"""
from __future__ import annotations

import hashlib
import re
import subprocess
import sys
import tomllib
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
LOCK = HERE / "requirements.lock"
# Debian's venv ships setuptools 66: too old for pyproject's build-system (>=68).
BUILD_REQUIREMENTS = ["setuptools==84.2.1", "wheel==0.48.0"]
STAMP = ".lock.sha256"


def project_requirements(pyproject: Path = ROOT / "pyproject.toml") -> list[str]:
    """The project's runtime dependencies; every one must be pinned with ==."""
    deps = tomllib.loads(pyproject.read_text())["project"]["dependencies"]
    loose = [d for d in deps if "==" not in d]
    if loose:
        raise SystemExit(f"pyproject.toml [project] dependencies not pinned with ==: {loose}")
    return [*deps, *BUILD_REQUIREMENTS]


def wheel_pin(filename: str) -> str:
    """`name==version` of a wheel file name (PEP 427: name-version-...whl)."""
    name, version = filename.split("-")[:2]
    return f"{re.sub(r'[-_.]+', '-', name).lower()}=={version}"


def pip_wheel(wheel_dir: Path, args: list[str]) -> None:
    wheel_dir.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, "-m", "pip", "wheel", "-q", "--only-binary=:all:", "-w", str(wheel_dir),
           *args]
    subprocess.run(cmd, check=True)


def lock(wheel_dir: Path) -> None:
    for old in wheel_dir.glob("*.whl"):  # the lock lists what this resolution took, only
        old.unlink()
    req = wheel_dir / "requirements.in"
    req.write_text("\n".join(project_requirements()) + "\n")
    pip_wheel(wheel_dir, ["-r", str(req)])
    pins = sorted(wheel_pin(w.name) for w in wheel_dir.glob("*.whl"))
    LOCK.write_text("# The image's Python packages, exactly (infra/image/wheels.py lock).\n"
                    + "\n".join(pins) + "\n")
    _stamp(wheel_dir)
    print(f"{LOCK}: {len(pins)} wheels")


def _lock_hash() -> str:
    return hashlib.sha256(LOCK.read_bytes()).hexdigest()


def _stamp(wheel_dir: Path) -> None:
    (wheel_dir / STAMP).write_text(_lock_hash())
    (wheel_dir / "requirements.lock").write_bytes(LOCK.read_bytes())


def fetch(wheel_dir: Path) -> None:
    stamp = wheel_dir / STAMP
    if stamp.exists() and stamp.read_text() == _lock_hash():
        print(f"{wheel_dir}: wheels of this lock already there")
        return
    pip_wheel(wheel_dir, ["--no-deps", "-r", str(LOCK)])
    want = {line for line in LOCK.read_text().splitlines() if line and not line.startswith("#")}
    have = {wheel_pin(w.name) for w in wheel_dir.glob("*.whl")}
    if missing := sorted(want - have):
        raise SystemExit(f"{LOCK}: no wheel fetched for {missing}")
    _stamp(wheel_dir)


def main(argv: list[str]) -> int:
    if len(argv) != 2 or argv[0] not in ("lock", "fetch"):
        print(__doc__, file=sys.stderr)
        return 2
    (lock if argv[0] == "lock" else fetch)(Path(argv[1]))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
