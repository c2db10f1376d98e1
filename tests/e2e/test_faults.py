"""Faults during a run: signals, a second run into the same folder, a full disk. The run writes into a private
staging folder and moves its results into OUT only at the end, so whatever happens the user's earlier files
stay as they were and nothing half-written looks like a result."""

from __future__ import annotations

import errno
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from onnxport.core.errors import disk_full
from onnxport.core.outdir import LOCK_NAME, STAGE_PREFIX
from tests.conftest import MODELS, ROOT, load_report

MLP = f"{MODELS}:TinyMLP"
X = ("-i", "x:float32[batch,8]")


def _start(*args: str) -> subprocess.Popen:
    env = dict(os.environ, COLUMNS="200", ONNXPORT_DEBUG="")
    return subprocess.Popen([sys.executable, "-m", "onnxport", *args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env, cwd=ROOT)


def _wait_for_stage(out: Path, proc: subprocess.Popen, timeout: float = 240) -> None:
    """Until the run has loaded the model and works in its staging folder."""
    end = time.monotonic() + timeout
    while time.monotonic() < end and proc.poll() is None:
        if out.is_dir() and any(p.name.startswith(STAGE_PREFIX) for p in out.iterdir()):
            return
        time.sleep(0.1)
    raise AssertionError(f"no staging folder in {out} (exit {proc.poll()})")


@pytest.fixture(scope="module")
def earlier(tmp_path_factory, cli) -> Path:
    """An output folder holding a finished, proven run."""
    out = tmp_path_factory.mktemp("faults") / "earlier"
    assert cli("export", MLP, *X, "-o", str(out), "--exporter", "torchscript").returncode == 0
    return out


def _snapshot(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def test_ctrl_c_while_starting_is_one_line_and_exit_130(tmp_path):
    out = tmp_path / "o"
    proc = _start("convert", MLP, *X, "-o", str(out))
    time.sleep(1.0)  # inside the imports
    proc.send_signal(signal.SIGINT)
    _, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 130, stderr
    assert "Traceback" not in stderr and stderr.strip().splitlines()[-1] == "interrupted"
    assert not out.exists()


@pytest.mark.parametrize("sig,code,word", [(signal.SIGINT, 130, "interrupted"), (signal.SIGTERM, 143, "terminated")])
def test_a_signal_mid_run_keeps_the_earlier_results_untouched(earlier, tmp_path, sig, code, word):
    out = tmp_path / "o"
    shutil.copytree(earlier, out)
    (out / "notes.txt").write_text("the user's own file")
    before = _snapshot(out)
    proc = _start("convert", MLP, *X, "-o", str(out), "--force")
    _wait_for_stage(out, proc)
    time.sleep(1.0)
    proc.send_signal(sig)
    _, stderr = proc.communicate(timeout=120)
    assert proc.returncode == code, stderr[-2000:]
    assert "Traceback" not in stderr and stderr.strip().splitlines()[-1] == word
    assert _snapshot(out) == before  # the earlier run's files, byte for byte, and the user's own
    assert not any(p.name.startswith(".onnxport") for p in out.iterdir())  # no staging folder, no lock


def test_a_signal_into_a_new_folder_leaves_no_folder(tmp_path):
    out = tmp_path / "new"
    proc = _start("convert", MLP, *X, "-o", str(out))
    _wait_for_stage(out, proc)
    proc.send_signal(signal.SIGTERM)
    proc.communicate(timeout=120)
    assert proc.returncode == 143
    assert not out.exists()


def test_a_second_run_into_the_same_folder_is_refused_naming_the_first(tmp_path, cli):
    out = tmp_path / "o"
    src = tmp_path / "slow.py"  # the first run holds the folder for seconds while using next to no CPU
    src.write_text("import time, torch\nclass Slow(torch.nn.Linear):\n    def __init__(self):\n"
                   "        super().__init__(8, 3)\n    def forward(self, x):\n        time.sleep(0.5)\n"
                   "        return super().forward(x)\n")
    first = _start("export", f"{src}:Slow", *X, "-o", str(out), "--exporter", "torchscript")
    _wait_for_stage(out, first)
    second = cli("export", MLP, *X, "-o", str(out), "--force")
    assert second.returncode == 2
    line = second.stderr.strip()
    assert len(line.splitlines()) == 1 and "in use by another onnxport run" in line and f"pid {first.pid}" in line
    first.communicate(timeout=300)
    assert first.returncode == 0
    assert load_report(out)["status"] == "ok" and not (out / LOCK_NAME).exists()


def test_results_appear_only_when_the_run_ends(earlier):
    rep = load_report(earlier)
    names = {p.name for p in earlier.iterdir()}
    assert {"model.onnx", "report.json", "report.html", "report.md", "onnxport.log"} <= names
    assert not any(n.startswith(".onnxport") for n in names)
    assert STAGE_PREFIX not in json.dumps(rep)  # the report names the published files, not the staging folder
    assert STAGE_PREFIX not in (earlier / "report.html").read_text()


def test_a_full_disk_is_its_own_error():
    assert disk_full(OSError(errno.ENOSPC, "No space left on device"))
    wrapped = RuntimeError("saving failed")
    wrapped.__cause__ = OSError(errno.ENOSPC, "No space left on device")
    assert disk_full(wrapped) and not disk_full(OSError(errno.EACCES, "denied"))


@pytest.fixture
def small_disk(tmp_path):
    """A 24 MB tmpfs (skipped where this machine cannot mount one)."""
    mount = tmp_path / "small"
    mount.mkdir()
    made = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=24m", "tmpfs", str(mount)], capture_output=True)
    if made.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {made.stderr.decode(errors='replace').strip()[:120]}")
    yield mount
    subprocess.run(["umount", str(mount)], capture_output=True)


def test_convert_onto_a_full_disk_says_so_and_keeps_nothing(small_disk, cli):
    out = small_disk / "o"
    src = small_disk.parent / "wide.py"
    src.write_text("import torch\nclass Wide(torch.nn.Module):\n    def __init__(self):\n        super().__init__()\n"
                   "        self.a = torch.nn.Linear(8, 2048)\n        self.b = torch.nn.Linear(2048, 2048)\n"
                   "    def forward(self, x):\n        return self.b(self.a(x))\n")
    proc = cli("convert", f"{src}:Wide", *X, "-o", str(out), "--exporter", "torchscript")
    assert proc.returncode == 4, proc.stderr[-2000:]
    line = proc.stderr.strip().splitlines()[-1]
    assert "no space left" in line and "Traceback" not in proc.stderr
    assert not out.exists() or not any(out.iterdir())


@pytest.fixture(scope="module")
def odd_files(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("odd")
    os.mkfifo(d / "fifo.txt")
    (d / "readonly").mkdir()
    (d / "readonly").chmod(0o555)
    (d / "dangling").symlink_to(d / "nowhere")
    hf = d / "hf"
    hf.mkdir()
    (hf / "config.json").write_text("{not json")
    import numpy as np
    np.savez(d / "nan.npz", x=np.full((4, 8), np.nan, dtype=np.float32))
    (d / "exits.py").write_text("import sys, torch\nclass Net(torch.nn.Module):\n"
                                "    def forward(self, x):\n        sys.exit(0)\n")
    (d / "os_exits.py").write_text("import os, torch\nclass Net(torch.nn.Module):\n"
                                   "    def forward(self, x):\n        os._exit(0)\n")
    return d


BAD = [
    ("zero-size axis", ["export", MLP, "-i", "x:float32[0,8]"], {}, "zero-size axis"),
    ("one-size range", ["export", MLP, *X, "-d", "batch=5..5"], {}, "one size only"),
    ("one-size list", ["export", MLP, *X, "-d", "batch=3,3,3"], {}, "one size only"),
    ("huge range", ["export", MLP, *X, "-d", "batch=1..1000000000"], {}, "machine's memory"),
    ("huge input", ["export", MLP, "-i", "x:float32[100000000000,8]"], {}, "machine's memory"),
    ("huge bench batch", ["bench", MLP, *X, "--batch", "100000000"], {}, "realistic batch"),
    ("env threshold", ["export", MLP, *X], {"ONNXPORT_EXTERNAL_DATA_THRESHOLD": "lots"}, "ONNXPORT_EXTERNAL_DATA"),
    ("samples device", ["export", MLP, *X, "--samples", "/dev/zero"], {}, "not a regular file"),
    ("samples fifo", ["export", MLP, *X, "--samples", "{d}/fifo.txt"], {}, "not a regular file"),
    ("hf config", ["export", "hf:{d}/hf"], {}, "is not JSON"),
    ("read-only out", ["export", MLP, *X, "-o", "{d}/readonly"], {}, "cannot write into"),
    ("dangling out", ["export", MLP, *X, "-o", "{d}/dangling"], {}, "does not exist"),
    ("sys.exit in forward", ["export", "{d}/exits.py:Net", *X], {}, "sys.exit(0)"),
    ("os._exit in forward", ["export", "{d}/os_exits.py:Net", *X], {}, "called os._exit(0)"),
    ("nan samples", ["export", MLP, *X, "--samples", "{d}/nan.npz"], {}, "NaN"),
    ("a folder to check", ["check", "{d}"], {}, "is a folder"),
]


@pytest.mark.parametrize("label,args,env,words", BAD, ids=[b[0] for b in BAD])
def test_bad_input_is_exit_2_in_one_line_before_any_work(odd_files, tmp_path, cli, label, args, env, words):
    if label == "read-only out" and os.geteuid() == 0:
        pytest.skip("root writes into read-only folders")
    args = [a.format(d=odd_files) for a in args]
    out = [] if "-o" in args or args[0] == "check" else ["-o", str(tmp_path / "o")]
    proc = cli(*args, *out, env=env, timeout=300)
    assert proc.returncode == 2, proc.stderr[-2000:]
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in proc.stderr and words in lines[0], proc.stderr
    assert not (tmp_path / "o").exists()


def test_a_model_thread_that_never_ends_does_not_keep_the_cli_alive(tmp_path):
    """The model's __init__ starts a non-daemon thread sleeping an hour: the CLI still ends when the proof does."""
    from tests.conftest import FIXTURES, run_cli

    t0 = time.perf_counter()
    r = run_cli("export", f"{FIXTURES / 'telling.py'}:StartsAThread", "-i", "x:float32[batch,8]",
                "--exporter", "torchscript", "-o", str(tmp_path / "o"), timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    assert (tmp_path / "o" / "model.onnx").exists() and (tmp_path / "o" / "report.json").exists()
    assert time.perf_counter() - t0 < 240
