"""What several benchmark scripts share (a helper module, not a script: no smoke test of its own)."""

from __future__ import annotations

import sys
from pathlib import Path


def export_here(source: str, out: Path, **options) -> Path:
    """``onnxport export SOURCE`` into ``out`` through the API in this process (no second interpreter to start
    and import torch for it); ``options``: the API's keywords (``inputs``, ``dims``, ``model_args``). Anything
    short of proven ends the script with one line."""
    from onnxport import api
    from onnxport.core.errors import OnnxportError

    try:
        status = api.export(source, out, force=True, **options)["status"]
    except OnnxportError as e:
        status = f"{type(e).__name__}: {e}"
    if status != "ok":
        sys.exit(f"onnxport export {source} failed: {status}")
    return out


def write_results(path: Path, script: str, argv: list[str], record: dict) -> None:
    """Write ``record`` as a results file: the command that made it, when, the machine (CPU model and the
    flags that decide the kernels, cores) and the versions of what was timed, then the record's own keys."""
    import datetime
    import json
    import os
    import platform
    from importlib import metadata

    from onnxport.runtime import environment

    cpu = environment.cpu()
    versions = {}
    for dist in ("torch", "onnxruntime", "onnx", "openvino", "transformers"):
        try:
            versions[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            continue
    head = {"command": " ".join(["python", f"benchmarks/{script}", *argv]),
            "created_at": datetime.date.today().isoformat(),
            "machine": {"cpu": cpu.get("model"), "cores": os.cpu_count(), "arch": platform.machine(),
                        "flags": [f for f in cpu.get("flags", []) if f.startswith(("avx", "amx", "fma"))]},
            "versions": versions}
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({**head, **record}, indent=2) + "\n")
    print(f"wrote {path}")
