"""Check that a built wheel holds every file of the package that git tracks (modules, report templates, the
report schema, the Triton model files): the files the code reads at run time come from the wheel, not a clone.

    python scripts/wheel_contents.py dist/onnxport-*.whl
"""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def missing(wheel: Path) -> list[str]:
    tracked = subprocess.run(["git", "ls-files", "src/onnxport"], capture_output=True, text=True, cwd=ROOT,
                             check=True).stdout.split()
    inside = set(zipfile.ZipFile(wheel).namelist())
    return [path for path in tracked if path.removeprefix("src/") not in inside]


if __name__ == "__main__":
    wheel = Path(sys.argv[1])
    lost = missing(wheel)
    for path in lost:
        print(f"not in {wheel.name}: {path}")
    data = [n for n in zipfile.ZipFile(wheel).namelist() if n.startswith("onnxport/") and not n.endswith(".py")]
    print(f"{wheel.name}: {len(data)} data files, {len(lost)} tracked files missing")
    sys.exit(1 if lost else 0)
