"""One Backend protocol for every runtime: open() → run(feeds) → list of arrays → close().

Parity, bench and serve all drive models through it. Each backend takes numpy feeds keyed by input
name and returns numpy outputs in its output order; ``threads`` is the intra-op thread count, the
same number for every backend in a comparison.
"""

from __future__ import annotations

import importlib.util
import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

import numpy as np

from onnxport.core.errors import EnvironmentProblem, UsageError
from onnxport.runtime.sessions import CUDA, BoundRunner, OrtOptions, session

if TYPE_CHECKING:  # a type only: running ONNX files needs no torch
    from onnxport.sources.base import LoadedModel


@dataclass(frozen=True)
class IOInfo:
    """Name, dtype (numpy name) and shape (ints, symbols or None) of one input or output."""

    name: str
    dtype: str
    shape: tuple[int | str | None, ...]


@runtime_checkable
class Backend(Protocol):
    """A runtime holding one model: ``open`` loads it, ``run`` infers, ``close`` frees it."""

    name: str

    @property
    def inputs(self) -> tuple[IOInfo, ...]: ...

    def open(self) -> None: ...

    def run(self, feeds: dict[str, np.ndarray]) -> list[np.ndarray]: ...

    def close(self) -> None: ...


def default_threads() -> int:
    """The intra-op thread count used when none is given: the CPUs this process may use."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not on Linux
        return max(1, os.cpu_count() or 1)


def _first_line(e: BaseException) -> str:
    text = str(e).strip()
    return text.splitlines()[0][:300] if text else type(e).__name__


# --------------------------------------------------------------------------- PyTorch


class TorchBackend:
    """PyTorch eager (``torch.inference_mode``) on ``LoadedModel.flat``; ``compile=True`` uses torch.compile."""

    def __init__(self, loaded: LoadedModel, *, threads: int | None = None, compile: bool = False,
                 name: str | None = None) -> None:
        self.loaded = loaded
        self.threads = threads or default_threads()
        self.compile = compile
        self.name = name or ("pytorch-compile" if compile else "pytorch")
        self._fn: Any = None
        self._saved_threads: int | None = None

    @property
    def inputs(self) -> tuple[IOInfo, ...]:
        return tuple(IOInfo(s.name, s.dtype, tuple(s.shape)) for s in self.loaded.inputs)

    def open(self) -> None:
        import torch

        self._saved_threads = torch.get_num_threads()
        torch.set_num_threads(self.threads)
        self._fn = self.loaded.flat
        if self.compile:
            try:
                self._fn = torch.compile(self.loaded.flat, dynamic=False)
            except Exception as e:  # noqa: BLE001 - compile support depends on the platform and compiler
                raise EnvironmentProblem(f"torch.compile is unavailable here: {_first_line(e)}",
                                         "leave out --compile, or install a C++ compiler for TorchInductor") from None

    def run(self, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
        import torch

        if self._fn is None:
            raise UsageError(f"backend {self.name} is not open", "call open() before run()")
        try:
            args = [torch.from_numpy(np.asarray(feeds[s.name])) for s in self.loaded.inputs]
        except KeyError as e:
            raise UsageError(f"no feed for input {e}", "give one array per model input") from None
        torch.set_num_threads(self.threads)  # another user of torch in this process may have changed it
        with torch.inference_mode():
            outs = self._fn(*args)
        return [o.float().numpy() if o.dtype == torch.bfloat16 else o.numpy() for o in outs]

    def close(self) -> None:
        import torch

        self._fn = None
        if self._saved_threads is not None:
            torch.set_num_threads(self._saved_threads)
            self._saved_threads = None


# --------------------------------------------------------------------------- ONNX Runtime

_ORT_TYPES = {"tensor(float)": "float32", "tensor(float16)": "float16", "tensor(double)": "float64",
              "tensor(int64)": "int64", "tensor(int32)": "int32", "tensor(int16)": "int16", "tensor(int8)": "int8",
              "tensor(uint8)": "uint8", "tensor(bool)": "bool", "tensor(bfloat16)": "bfloat16"}


def _bound_device(sess, providers: list | None) -> tuple[str, int]:
    """(device, device id) IO binding places a session's inputs and outputs on: CUDA's when the session really
    runs on it (the id from the asked-for ``providers``), else the CPU."""
    if CUDA not in sess.get_providers():
        return "cpu", 0
    opts = next((p[1] for p in providers or () if isinstance(p, tuple) and p[0] == CUDA), {})
    return "cuda", int(opts.get("device_id", 0))


class OrtBackend:
    """ONNX Runtime (CPU provider unless ``providers`` says otherwise) on any .onnx file."""

    def __init__(self, path: str | Path, *, threads: int | None = None, options: OrtOptions | None = None,
                 providers: list | None = None, name: str = "onnxruntime", io_binding: bool = False) -> None:
        self.path = Path(path)
        self.options = options or OrtOptions()
        self.threads = self.options.intra_op_num_threads or threads or default_threads()
        self.providers = providers
        self.name = name
        self.io_binding = io_binding
        self.session: Any = None
        self._names: list[str] = []
        self._bound: Any = None
        self._bound_feeds: tuple = ()

    @property
    def inputs(self) -> tuple[IOInfo, ...]:
        sess = self.session or self._open_session()
        return tuple(IOInfo(i.name, _ORT_TYPES.get(i.type, i.type), tuple(i.shape)) for i in sess.get_inputs())

    def _open_session(self):
        o = self.options
        return session(self.path, providers=self.providers, threads=self.threads,
                       opt_level=o.graph_optimization_level or "all", options=o)

    def open(self) -> None:
        self.session = self._open_session()
        self._names = [i.name for i in self.session.get_inputs()]

    def run(self, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
        if self.session is None:
            raise UsageError(f"backend {self.name} is not open", "call open() before run()")
        if not self.io_binding:
            return self.session.run(None, {n: feeds[n] for n in self._names})
        current = tuple(id(feeds[n]) for n in self._names)
        if self._bound is None or current != self._bound_feeds:  # the same arrays stay bound on the device
            self._bound = BoundRunner(self.session, *_bound_device(self.session, self.providers))
            self._bound.bind({n: feeds[n] for n in self._names})
            self._bound_feeds = current
        self._bound.run()
        return self._bound.outputs()

    def close(self) -> None:
        self.session = None
        self._bound = None


# --------------------------------------------------------------------------- OpenVINO


def openvino_available() -> bool:
    """Whether the optional ``openvino`` package can be imported."""
    return importlib.util.find_spec("openvino") is not None


class OpenVinoBackend:
    """OpenVINO on the CPU, reading the ONNX file directly (latency hint, ``threads`` inference threads);
    ``precision``: its INFERENCE_PRECISION_HINT ("f32", "bf16"), None: OpenVINO's default (bf16 on a CPU with
    AVX-512 BF16 or AMX, f32 elsewhere)."""

    def __init__(self, path: str | Path, *, threads: int | None = None, name: str = "openvino",
                 precision: str | None = None) -> None:
        self.path = Path(path)
        self.precision = precision
        self.threads = threads or default_threads()
        self.name = name
        self._compiled: Any = None
        self._request: Any = None
        self._model: Any = None

    @property
    def inputs(self) -> tuple[IOInfo, ...]:
        model = self._model if self._model is not None else self._read()
        out = []
        for p in model.inputs:
            shape = tuple(int(d.get_length()) if d.is_static else None for d in p.get_partial_shape())
            out.append(IOInfo(p.get_any_name(), str(p.get_element_type().to_dtype()), shape))
        return tuple(out)

    def _read(self):
        try:
            import openvino as ov
        except ImportError:
            raise EnvironmentProblem("the Python package 'openvino' is not installed", "pip install openvino",
                                     code="missing-dependency") from None
        try:
            return ov.Core().read_model(str(self.path))
        except Exception as e:  # noqa: BLE001
            raise UsageError(f"OpenVINO cannot read {self.path.name}: {_first_line(e)}",
                             "the model may use an operator OpenVINO lacks; benchmark it without OpenVINO") from None

    def open(self) -> None:
        import openvino as ov

        self._model = self._read()
        config = {"INFERENCE_NUM_THREADS": self.threads, "PERFORMANCE_HINT": "LATENCY"}
        if self.precision:
            config["INFERENCE_PRECISION_HINT"] = self.precision
        try:
            self._compiled = ov.Core().compile_model(self._model, "CPU", config)
        except Exception as e:  # noqa: BLE001
            raise UsageError(f"OpenVINO cannot compile {self.path.name}: {_first_line(e)}",
                             "benchmark it without OpenVINO") from None
        self._request = self._compiled.create_infer_request()

    def run(self, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
        if self._request is None:
            raise UsageError(f"backend {self.name} is not open", "call open() before run()")
        names = [p.get_any_name() for p in self._compiled.inputs]
        result = self._request.infer({n: feeds[n] for n in names})
        return [np.array(result[o]) for o in self._compiled.outputs]

    def close(self) -> None:
        self._request = self._compiled = None


def compare_outputs(ref: list[np.ndarray], got: list[np.ndarray]) -> float:
    """Largest absolute difference between two output lists (inf when shapes or counts differ)."""
    if len(ref) != len(got):
        return float("inf")
    worst = 0.0
    for r, g in zip(ref, got):
        r, g = np.asarray(r), np.asarray(g)
        if r.shape != g.shape:
            return float("inf")
        if r.size:
            worst = max(worst, float(np.max(np.abs(r.astype(np.float64) - g.astype(np.float64)))))
    return worst
