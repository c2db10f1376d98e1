"""Step models run on a device with their carried state kept there through IO binding.

A step model takes back what it returned (each carried output fed to its input at the next step, the tensor
one step longer along its growing axis). :class:`Target` is where such a model runs (the device, its id and the
provider chain, as data); :class:`CarriedSteps` runs it step after step with every carried tensor in two
buffers allocated once at the capacity on the session's device: the input bound as a view of one, the output
written into the other, swapped at each step (no copy, no allocation, no host round trip per step). A model
whose carried input and output are one buffer at the capacity (``shared``: onnxruntime's fused attention with a
past/present buffer) is bound to one buffer. The scores output is left on the device and a small picking model
returns each row's argmax only; :meth:`CarriedSteps.last_scores` copies the last position's scores when a
caller needs them. On the CPU provider all of it runs for real ("device" memory is the host's).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from onnxport.core.options import RuntimeOptions
from onnxport.runtime.sessions import CPU, CUDA, provider_chain, session
from onnxport.runtime.variant_sessions import SessionOptions, providers_for

PICK_OPSET = 17


@dataclass(frozen=True)
class Target:
    """Where a model's proof and variants run: ``device`` ("cpu" or "cuda"), its id and the provider chain (the
    CUDA provider's options included; TensorRT left out: the cache's lengths change at every step)."""

    device: str = "cpu"
    device_id: int = 0
    providers: tuple = (CPU,)

    @classmethod
    def of(cls, options: RuntimeOptions, *, available: Sequence[str] | None = None) -> Target:
        """The target of a run's runtime options; ``available`` simulates onnxruntime's provider list (tests).
        ``cuda`` without the CUDA provider is an EnvironmentProblem (exit 4)."""
        provider_chain(options.device, available=available)  # refuses a device this onnxruntime lacks
        recorded = SessionOptions.base(options.device)
        if options.device == "cuda":
            recorded = SessionOptions(CUDA, use_tf32=options.gpu.tf32)
        return cls(options.device, options.gpu.device_id, tuple(providers_for(recorded, device_id=options.gpu.device_id)))

    @property
    def gpu(self) -> bool:
        return self.device != "cpu"

    @property
    def torch_device(self) -> str:
        """PyTorch's name of the device ("cpu", "cuda:0")."""
        return f"cuda:{self.device_id}" if self.gpu else "cpu"

    @property
    def ort_device(self) -> str:
        """onnxruntime's OrtValue device type ("cpu", "cuda")."""
        return "cuda" if self.gpu else "cpu"

    def with_options(self, options: SessionOptions) -> Target:
        """The target running a variant recorded with ``options`` (its CUDA graph, TF32) on the same device."""
        if not self.gpu:
            return self
        return Target(self.device, self.device_id, tuple(providers_for(options, device_id=self.device_id)))

    def session(self, path: str | Path, *, threads: int | None = None):
        """An InferenceSession on ``path`` with this target's providers."""
        return session(path, providers=list(self.providers), threads=threads)

    @classmethod
    def of_session(cls, sess) -> Target:
        """The target a session runs on: the CUDA provider's device when the session has it, else the CPU."""
        if CUDA not in sess.get_providers():
            return CPU_TARGET
        device_id = int(sess.get_provider_options().get(CUDA, {}).get("device_id", 0))
        return cls("cuda", device_id, tuple(sess.get_providers()))

    def to_dict(self) -> dict:
        return {"device": self.device, "device_id": self.device_id,
                "providers": [p[0] if isinstance(p, tuple) else p for p in self.providers]}


CPU_TARGET = Target()


def pick_model(scores_dtype: int) -> Any:
    """A model taking scores [batch, positions, classes] and returning the last position's argmax ``token``
    [batch] (int64) and the last position's scores ``last`` [batch, classes]."""
    from onnx import TensorProto, helper

    nodes = [helper.make_node("Constant", [], ["minus_one"], value=helper.make_tensor("m", TensorProto.INT64, [], [-1])),
             helper.make_node("Gather", ["scores", "minus_one"], ["last"], axis=1),
             helper.make_node("ArgMax", ["last"], ["token"], axis=-1, keepdims=0)]
    graph = helper.make_graph(
        nodes, "pick", [helper.make_tensor_value_info("scores", scores_dtype, ["batch", "positions", "classes"])],
        [helper.make_tensor_value_info("token", TensorProto.INT64, ["batch"]),
         helper.make_tensor_value_info("last", scores_dtype, ["batch", "classes"])])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", PICK_OPSET)], ir_version=9)


@dataclass
class CarriedSteps:
    """A step model run through IO binding with its carried tensors kept on the target's device.

    ``carried``: (input, output, shape at the capacity) of each carried tensor, its growing axis 2 (the
    capacity there); ``scores``: the output whose last position is picked; ``shared``: the model's carried
    input and output are one buffer at the capacity (their axis 2 is the capacity at every step). Buffers are
    allocated once, when made (:attr:`allocations` counts them); :meth:`step` rebinds them."""

    sess: Any
    target: Target
    carried: Sequence[tuple[str, str, tuple[int, ...]]]
    dtype: np.dtype
    scores: str = "logits"
    shared: bool = False
    graph: bool = False  # one-position steps on fixed shapes and addresses, replayed as one CUDA graph
    padded: tuple[str, ...] = ()  # inputs padded with zeros to the capacity along axis 1 on those steps
    allocations: int = 0
    length: int = 0  # the carried tensors' length along the growing axis
    addresses: list = field(default_factory=list)  # (input, output) buffer addresses bound at each step
    graph_ids: list = field(default_factory=list)  # the gpu_graph_id each step ran with (graph mode)

    def __post_init__(self) -> None:
        import onnxruntime as ort

        self._ort = ort
        self.binding = self.sess.io_binding()
        count = 1 if self.shared else 2
        self.buffers = [[self._alloc(shape) for _ in range(count)] for _, _, shape in self.carried]
        self.flip = 0
        self.fixed: dict = {}  # graph mode: the inputs and the scores at fixed addresses, allocated once
        if self.graph and not self.shared:
            raise ValueError("a CUDA graph needs the carried tensors in one buffer at the capacity (shared)")
        pick_sess = _pick_session(self.target, self._scores_type())
        self.pick = pick_sess
        self.pick_binding = pick_sess.io_binding()

    def _alloc(self, shape: tuple[int, ...]):
        return self._alloc_typed(shape, self.dtype)

    def _scores_type(self) -> int:
        from onnx import TensorProto

        kind = next(o.type for o in self.sess.get_outputs() if o.name == self.scores)
        return TensorProto.FLOAT16 if kind == "tensor(float16)" else TensorProto.FLOAT

    def _bind_view(self, bind, name: str, value, shape: tuple[int, ...]) -> None:
        bind(name, self.target.ort_device, self.target.device_id, self.dtype.type, list(shape), value.data_ptr())

    def step(self, feeds: Mapping[str, np.ndarray], new: int) -> None:
        """Run one step of ``new`` positions on the carried tensors (``feeds``: the other inputs, host arrays,
        copied to the device); the carried outputs land in the other buffers, which the next step reads."""
        b = self.binding
        b.clear_binding_inputs()
        b.clear_binding_outputs()
        fixed = self.graph and new == 1 and self.length > 0
        for name, value in feeds.items():
            if fixed:
                b.bind_ortvalue_input(name, self._fixed(name, self._padded(name, value)))
            else:
                b.bind_cpu_input(name, np.ascontiguousarray(value))
        step_addresses = []
        for (src, dst, shape), bufs in zip(self.carried, self.buffers):
            capacity = shape[2]
            before = shape[:2] + (capacity if self.shared else self.length,) + shape[3:]
            after = shape[:2] + (capacity if self.shared else self.length + new,) + shape[3:]
            read, write = (bufs[0], bufs[0]) if self.shared else (bufs[self.flip], bufs[1 - self.flip])
            self._bind_view(b.bind_input, src, read, before)
            self._bind_view(b.bind_output, dst, write, after)
            step_addresses.append((read.data_ptr(), write.data_ptr()))
        if fixed:
            b.bind_ortvalue_output(self.scores, self._fixed_scores())
        else:
            b.bind_output(self.scores, self.target.ort_device, self.target.device_id)
        self.sess.run_with_iobinding(b, self._run_options(fixed))
        self.addresses.append(tuple(step_addresses))
        self.length += new
        if not self.shared:
            self.flip = 1 - self.flip

    def _padded(self, name: str, value: np.ndarray) -> np.ndarray:
        if name not in self.padded:
            return np.ascontiguousarray(value)
        capacity = self.carried[0][2][2]
        out = np.zeros((value.shape[0], capacity, *value.shape[2:]), value.dtype)
        out[:, :value.shape[1]] = value
        return out

    def _fixed(self, name: str, value: np.ndarray):
        """The input's buffer at its fixed address on the device, ``value`` copied into it."""
        if name not in self.fixed:  # its own memory (an OrtValue made from an array would share the array's)
            self.fixed[name] = self._alloc_typed(value.shape, value.dtype)
        self.fixed[name].update_inplace(value)
        return self.fixed[name]

    def _fixed_scores(self):
        if self.scores not in self.fixed:
            classes = next(o.shape[-1] for o in self.sess.get_outputs() if o.name == self.scores)
            if not isinstance(classes, int):
                raise ValueError(f"the scores' last dim is {classes!r}: fixed shapes need a number")
            dtype = np.float16 if self._scores_type() == 10 else np.float32
            self.fixed[self.scores] = self._alloc_typed((self.carried[0][2][0], 1, classes), dtype)
        return self.fixed[self.scores]

    def _alloc_typed(self, shape: tuple[int, ...], dtype):
        self.allocations += 1
        return self._ort.OrtValue.ortvalue_from_shape_and_type(list(shape), dtype, self.target.ort_device,
                                                               self.target.device_id)

    def _run_options(self, fixed: bool):
        """Graph mode: the one-position steps run as CUDA graph 1 (captured once, then replayed), the others
        without a graph (-1); else onnxruntime's defaults."""
        if not self.graph:
            return None
        options = self._ort.RunOptions()
        graph_id = "1" if fixed else "-1"
        options.add_run_config_entry("gpu_graph_id", graph_id)
        self.graph_ids.append(int(graph_id))
        return options

    def _picked(self, output: str) -> np.ndarray:
        scores = self.binding.get_outputs()[len(self.carried)]
        p = self.pick_binding
        p.clear_binding_inputs()
        p.clear_binding_outputs()
        p.bind_ortvalue_input("scores", scores)
        p.bind_output(output, "cpu")
        self.pick.run_with_iobinding(p)
        return p.get_outputs()[0].numpy().copy()  # the output buffer is reused by the next run

    def last_token(self) -> np.ndarray:
        """Each row's argmax at the last position of the last step ([batch] int64; only these leave the device)."""
        return self._picked("token")

    def last_scores(self) -> np.ndarray:
        """The last position's scores of the last step [batch, classes], copied to the host."""
        return self._picked("last")

    def buffer_addresses(self) -> set[int]:
        """The addresses of every buffer allocated for the carried tensors."""
        return {buf.data_ptr() for bufs in self.buffers for buf in bufs}


_PICKS: dict[tuple, Any] = {}


def _pick_session(target: Target, scores_type: int):
    key = (target.device, target.device_id, scores_type)
    if key not in _PICKS:
        _PICKS[key] = session(pick_model(scores_type), providers=list(target.providers), threads=1)
    return _PICKS[key]
