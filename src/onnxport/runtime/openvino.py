"""OpenVINO as a variant's runtime: an ONNX file compiled by OpenVINO on the CPU, at f32 or bf16 inference
precision, used like an ONNX Runtime ``InferenceSession`` (``run(None, feeds)``, ``get_inputs``,
``get_outputs``) so that the proof, the benchmark and the server run it unchanged.

OpenVINO is an optional extra (``pip install onnxport[openvino]``): :func:`openvino_missing` says why it cannot
be used here, :func:`bf16_missing` why this CPU cannot run bf16 natively (AVX-512 BF16 or AMX-BF16 in the
/proc/cpuinfo flags). OpenVINO's own default on such a CPU *is* bf16: a variant always records the precision it
was proven at (``inference_precision``), and :class:`OpenVinoSession` always compiles with it.
"""

from __future__ import annotations

import importlib.util
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from onnxport.core.errors import UsageError
from onnxport.runtime.environment import flags_from, this_cpu

OPENVINO = "openvino"  # the ``provider`` a variant run by OpenVINO records (report ``session_options``)
BF16_FLAGS = ("avx512_bf16", "amx_bf16")  # CPU features with native bf16 arithmetic
PRECISIONS = ("f32", "bf16")
LATENCY = "LATENCY"

# OpenVINO's element types as ONNX Runtime names them (what FeedMap and the server read from get_inputs())
_ORT_TYPES = {"f32": "tensor(float)", "f16": "tensor(float16)", "bf16": "tensor(bfloat16)", "f64": "tensor(double)",
              "i64": "tensor(int64)", "i32": "tensor(int32)", "i8": "tensor(int8)", "u8": "tensor(uint8)",
              "boolean": "tensor(bool)"}


def openvino_missing() -> str | None:
    """Why OpenVINO cannot be used here (None: it can)."""
    if importlib.util.find_spec("openvino") is None:
        return "the optional package 'openvino' is not installed (pip install onnxport[openvino])"
    return None


def openvino_version() -> str | None:
    """The installed OpenVINO's version (None when it is not installed)."""
    if openvino_missing():
        return None
    import openvino as ov

    return str(ov.__version__).split("-")[0]


def bf16_missing(cpu_flags: Sequence[str]) -> str | None:
    """Why this CPU cannot run bf16 natively (None: it has AVX-512 BF16 or AMX-BF16)."""
    if any(f in cpu_flags for f in BF16_FLAGS):
        return None
    where = "in /proc/cpuinfo" if flags_from() == "/proc/cpuinfo" else "among the features it names"
    return f"{this_cpu()} has no native bf16 arithmetic (no AVX512_BF16/AMX_BF16 {where})"


@dataclass(frozen=True)
class Port:
    """An input or output as ONNX Runtime's ``NodeArg`` shows it: name, shape (symbols for dynamic dims), type."""

    name: str
    shape: list
    type: str


def _port(p: Any) -> Port:
    shape = [int(d.get_length()) if d.is_static else f"d{i}" for i, d in enumerate(p.get_partial_shape())] \
        if p.get_partial_shape().rank.is_static else []
    return Port(p.get_any_name(), shape, _ORT_TYPES.get(p.get_element_type().get_type_name(), "tensor(float)"))


def compile_config(precision: str, threads: int | None = None, hint: str = LATENCY) -> dict:
    """OpenVINO's CPU properties for ``precision`` ("f32" or "bf16"), the latency hint and ``threads``."""
    if precision not in PRECISIONS:
        raise UsageError(f"unknown OpenVINO inference precision '{precision}'", f"use one of {', '.join(PRECISIONS)}")
    config: dict = {"INFERENCE_PRECISION_HINT": precision, "PERFORMANCE_HINT": hint}
    if threads:
        config["INFERENCE_NUM_THREADS"] = int(threads)
    return config


class OpenVinoSession:
    """An ONNX file compiled by OpenVINO on the CPU, used like an ``InferenceSession``: ``run(output_names,
    feeds)`` returns numpy arrays in the graph's output order (copies: OpenVINO reuses its buffers)."""

    def __init__(self, path: str | Path, precision: str = "f32", threads: int | None = None,
                 hint: str = LATENCY) -> None:
        why = openvino_missing()
        if why:
            raise UsageError(f"cannot run {Path(path).name} on OpenVINO: {why}", "pip install onnxport[openvino]")
        import openvino as ov

        self.path, self.precision = Path(path), precision
        self.config = compile_config(precision, threads, hint)
        try:
            self.compiled = ov.Core().compile_model(str(self.path), "CPU", self.config)
        except Exception as e:  # noqa: BLE001 - an operator OpenVINO lacks, a file it cannot read
            first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
            raise UsageError(f"OpenVINO cannot compile {self.path.name}: {first}",
                             "run this file on ONNX Runtime") from None
        self.request = self.compiled.create_infer_request()
        self._lock = threading.Lock()  # one infer request: a server's threads take turns
        self._inputs = [_port(p) for p in self.compiled.inputs]
        self._outputs = [_port(p) for p in self.compiled.outputs]

    def get_inputs(self) -> list[Port]:
        return list(self._inputs)

    def get_outputs(self) -> list[Port]:
        return list(self._outputs)

    def get_providers(self) -> list[str]:
        return [OPENVINO]

    def run(self, output_names: Sequence[str] | None, feeds: Mapping[str, Any], run_options: Any = None) -> list:
        """The outputs of ``feeds`` (keyed by input name), all or those named, as numpy arrays."""
        inputs = {p.name: np.ascontiguousarray(feeds[p.name]) for p in self._inputs}
        with self._lock:
            result = self.request.infer(inputs)
            outs = [np.array(result[o]) for o in self.compiled.outputs]
        if not output_names:
            return outs
        names = [p.name for p in self._outputs]
        return [outs[names.index(n)] for n in output_names]
