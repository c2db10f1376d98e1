"""Whether the native libraries behind the GPU providers load in this process.

onnxruntime-gpu lists ``TensorrtExecutionProvider`` whenever it was built with TensorRT, whether TensorRT's
libraries (libnvinfer) are installed or not; asking for it without them makes onnxruntime print an "EP Error"
block and fall back. The probe loads the library the way onnxruntime will (``ctypes.CDLL``) before anything
asks for the provider. ``probe`` arguments take a simulated probe in tests: a callable telling whether a
library name (or path) loads.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import importlib.util
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

Probe = Callable[[str], bool]

# candidate names, newest first; a name that loads is the answer
TENSORRT_LIBRARIES = ("libnvinfer.so.10", "libnvinfer.so.8", "libnvinfer.so", "nvinfer_10.dll", "nvinfer.dll")
CUDNN_LIBRARIES = ("libcudnn.so.9", "libcudnn.so.8", "libcudnn.so", "cudnn64_9.dll", "cudnn64_8.dll")
# where pip wheels put them (tensorrt-cu12-libs, nvidia-cudnn-cu12): not on the loader's path by default
_WHEEL_DIRS = {"tensorrt": ("tensorrt_libs",), "cudnn": ("nvidia.cudnn",)}
_STEMS = {"tensorrt": "nvinfer", "cudnn": "cudnn"}
_NAMES = {"tensorrt": TENSORRT_LIBRARIES, "cudnn": CUDNN_LIBRARIES}
_TITLES = {"tensorrt": "TensorRT", "cudnn": "cuDNN"}


@dataclass(frozen=True)
class LibraryStatus:
    """Whether one native library loads: the name or path that loaded, else every candidate tried."""

    name: str  # "tensorrt" | "cudnn"
    loads: bool
    library: str | None = None
    tried: tuple[str, ...] = ()

    def line(self) -> str:
        """One line for the doctor and the diagnostics."""
        title = _TITLES.get(self.name, self.name)
        if self.loads:
            return f"{title}: loads ({self.library})"
        return f"{title}: does not load (tried {', '.join(self.tried)})"

    def to_dict(self) -> dict:
        return {"loads": self.loads, "library": self.library, "tried": list(self.tried)}


@functools.cache
def loads(library: str) -> bool:
    """The real probe: whether ``ctypes.CDLL(library)`` succeeds (cached; a loaded library stays loaded)."""
    try:
        ctypes.CDLL(library)
    except OSError:
        return False
    return True


def _wheel_files(kind: str) -> list[str]:
    """The library files pip wheels installed for ``kind`` (found without importing them)."""
    out: list[str] = []
    for module in _WHEEL_DIRS[kind]:
        try:
            spec = importlib.util.find_spec(module)
        except (ImportError, ValueError):
            continue
        for folder in (spec.submodule_search_locations or []) if spec else []:
            for sub in (Path(folder), Path(folder) / "lib"):
                out += [str(sub / n) for n in _NAMES[kind] if (sub / n).is_file()]
    return out


def status(kind: str, probe: Probe | None = None) -> LibraryStatus:
    """Whether ``kind``'s library ("tensorrt" or "cudnn") loads: the candidate names first, then what
    ``ctypes.util.find_library`` and the pip wheels offer (those two only with the real probe)."""
    candidates = [n for n in _NAMES[kind] if (n.endswith(".dll")) == (sys.platform == "win32")]
    if probe is None:
        probe = loads
        found = ctypes.util.find_library(_STEMS[kind])
        candidates += [c for c in [found, *_wheel_files(kind)] if c and c not in candidates]
    for name in candidates:
        if probe(name):
            return LibraryStatus(kind, True, name, tuple(candidates))
    return LibraryStatus(kind, False, None, tuple(candidates))


def tensorrt_loadable(probe: Probe | None = None) -> bool:
    """Whether TensorRT's library loads here, so that onnxruntime's TensorRT provider can start: gate anything
    that asks for ``TensorrtExecutionProvider`` on it."""
    return status("tensorrt", probe).loads


def cudnn_loadable(probe: Probe | None = None) -> bool:
    """Whether cuDNN's library loads here (the CUDA provider needs it for convolutions)."""
    return status("cudnn", probe).loads


def gpu_libraries(probe: Probe | None = None) -> dict[str, LibraryStatus]:
    """TensorRT's and cuDNN's status, for the doctor."""
    return {kind: status(kind, probe) for kind in ("tensorrt", "cudnn")}
