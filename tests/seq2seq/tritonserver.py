"""A real Triton Inference Server for the tests: the ``tritonserver`` binary and python backend of the PyPI wheel
nvidia-pytriton (version pinned in constraints.txt), started on 127.0.0.1 with the python backend's stub in an
environment of its own (a venv with numpy < 2 and onnxruntime, docs/seq2seq.md → Triton). Both are installed
from PyPI once into ``.triton/`` at the repository root and reused."""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import signal
import socket
import subprocess
import sys
import sysconfig
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from onnxport.serve.triton_env import NUMPY_REQUIREMENT

ROOT = Path(__file__).resolve().parents[2]
CACHE = ROOT / ".triton"
CONSTRAINTS = ROOT / "constraints.txt"
PYTHON = f"{sys.version_info.major}.{sys.version_info.minor}"
READY_TIMEOUT_S = 180.0


def pinned(package: str) -> str:
    """The version constraints.txt pins ``package`` to."""
    for line in CONSTRAINTS.read_text(encoding="utf-8").splitlines():
        name, _, version = line.split("#")[0].strip().partition("==")
        if name.strip().lower() == package and version:
            return version.strip()
    raise AssertionError(f"constraints.txt pins no {package}")


def _pip(*args: str, python: Path | None = None) -> None:
    """pip install ``args`` under constraints.txt (into the venv of ``python`` when given)."""
    target = ["--python", str(python)] if python else []
    done = subprocess.run([sys.executable, "-m", "pip", *target, "install", "--quiet", "--disable-pip-version-check",
                           "-c", str(CONSTRAINTS), *args], capture_output=True, text=True, timeout=900)
    if done.returncode:
        raise AssertionError(f"pip install {' '.join(args)} failed: {(done.stderr or done.stdout)[-2000:]}")


@contextlib.contextmanager
def _locked(folder: Path) -> Iterator[bool]:
    """Hold ``.triton/<folder>.lock``; True when ``folder`` is complete (its ``.done`` marker exists), else the
    folder is emptied for the caller to build it and mark it with :func:`_done`."""
    CACHE.mkdir(exist_ok=True)
    with open(CACHE / f"{folder.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        ready = (folder / ".done").is_file()
        if not ready:
            shutil.rmtree(folder, ignore_errors=True)
        yield ready


def _done(folder: Path) -> None:
    (folder / ".done").write_text("", encoding="utf-8")


def server_dir() -> Path:
    """nvidia-pytriton's files (``pip install --target --no-deps``: only its binaries are run), the stub of this
    Python copied into ``backends/python/`` as the python backend looks for it there."""
    folder = CACHE / f"nvidia-pytriton-{pinned('nvidia-pytriton')}"
    with _locked(folder) as ready:
        if not ready:
            _pip("--no-deps", "--target", str(folder), "nvidia-pytriton")
            dist = folder / "pytriton" / "tritonserver"
            stub = dist / "python_backend_stubs" / PYTHON / "triton_python_backend_stub"
            if not stub.is_file():
                raise AssertionError(f"nvidia-pytriton ships no python backend stub for Python {PYTHON}")
            shutil.copy2(stub, dist / "backends" / "python" / stub.name)
            _done(folder)
    return folder / "pytriton" / "tritonserver"


def stub_env() -> Path:
    """A venv of this Python with numpy < 2 and onnxruntime (the version constraints.txt pins, the one the tests'
    files are made with): the stub's environment once its ``bin/`` leads the server's PATH."""
    folder = CACHE / f"stub-py{PYTHON}-onnxruntime-{pinned('onnxruntime')}"
    with _locked(folder) as ready:
        if not ready:
            subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(folder)], check=True, timeout=300)
            _pip(NUMPY_REQUIREMENT, "onnxruntime", python=folder / "bin" / "python")
            _done(folder)
    return folder


def libpython_dir() -> Path:
    """The folder of this Python's ``libpython3.X.so``, which the stub embeds."""
    libdir = sysconfig.get_config_var("LIBDIR")
    name = sysconfig.get_config_var("INSTSONAME") or ""
    if not sysconfig.get_config_var("Py_ENABLE_SHARED") or not libdir or not (Path(libdir) / name).exists():
        raise AssertionError(f"{sys.executable} has no shared libpython{PYTHON} (built without --enable-shared): "
                             "the python backend's stub cannot embed it")
    return Path(libdir)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass(frozen=True)
class Server:
    """A running tritonserver: its HTTP and gRPC addresses (host:port) and its log file."""

    http: str
    grpc: str
    log: Path

    def log_tail(self, chars: int = 6000) -> str:
        return self.log.read_text(encoding="utf-8", errors="replace")[-chars:]


def _ready(http: str) -> bool:
    try:
        with urllib.request.urlopen(f"http://{http}/v2/health/ready", timeout=2) as r:
            return r.status == 200
    except OSError:
        return False


@contextlib.contextmanager
def tritonserver(repo: Path, log: Path, timeout_s: float = READY_TIMEOUT_S) -> Iterator[Server]:
    """Start tritonserver on ``repo`` (HTTP and gRPC on free ports of 127.0.0.1, metrics off, stdout and stderr
    to ``log``), wait until it is ready, and stop it on exit. AssertionError with the log when it does not start."""
    dist, env_dir = server_dir(), stub_env()
    env = dict(os.environ)
    env["PATH"] = f"{env_dir / 'bin'}{os.pathsep}{env.get('PATH', '')}"  # the stub's Python finds its venv here
    env["LD_LIBRARY_PATH"] = os.pathsep.join(p for p in (str(libpython_dir()), env.get("LD_LIBRARY_PATH")) if p)
    http, grpc = f"127.0.0.1:{_free_port()}", f"127.0.0.1:{_free_port()}"
    command = [str(dist / "bin" / "tritonserver"), f"--model-repository={repo}",
               f"--backend-directory={dist / 'backends'}", "--http-address=127.0.0.1",
               f"--http-port={http.rsplit(':', 1)[1]}", "--grpc-address=127.0.0.1",
               f"--grpc-port={grpc.rsplit(':', 1)[1]}", "--allow-metrics=false", "--exit-timeout-secs=10",
               f"--backend-config=python,shm-region-prefix-name=onnxport{os.getpid()}_"]
    server = Server(http, grpc, log)
    with open(log, "wb") as out:
        process = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, env=env, cwd=log.parent,
                                   start_new_session=True)
    try:
        deadline = time.monotonic() + timeout_s
        while not _ready(http):
            if process.poll() is not None:
                raise AssertionError(f"tritonserver exited with {process.returncode} before it was ready; "
                                     f"its log ({log}):\n{server.log_tail()}")
            if time.monotonic() > deadline:
                raise AssertionError(f"tritonserver was not ready after {timeout_s:.0f} s; its log ({log}):\n"
                                     f"{server.log_tail()}")
            time.sleep(0.25)
        yield server
    finally:
        process.terminate()
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)  # the server and its stubs: the session it was started in
            process.wait(timeout=30)
