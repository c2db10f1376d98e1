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
