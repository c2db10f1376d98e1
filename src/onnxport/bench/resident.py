"""Device-resident timing: what the timing loop calls for an ONNX Runtime session on a GPU.

A session is run through IO binding with its inputs bound once as OrtValues on its device and its outputs bound
to OrtValues allocated there once (by one run), so that each timed call is ``run_with_iobinding`` alone: no
host↔device copy, no output copied back per call (:meth:`ResidentRun.fetch` copies them once, when asked). A CUDA
graph's session pool (:class:`~onnxport.runtime.GraphSessions`) is replayed on the binding it captured, the way
``benchmarks/gpu.py`` times it. The same code binds OrtValues on the CPU provider where the session runs there.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from onnxport.runtime.sessions import CUDA
from onnxport.runtime.variant_sessions import GraphSessions

RESIDENT = "device-resident, io-binding"  # how report.json says a GPU timing was taken
PER_CALL = "wall time per run() call incl. numpy↔framework conversion; interleaved blocks"


class ResidentRun:
    """One session's timed call on bound device buffers; ``calls`` counts the runs (nothing else happens per
    call), ``outputs`` are the bound output OrtValues, written in place by every run."""

    def __init__(self, session: Any, binding: Any, inputs: Mapping[str, Any], outputs: list, replay: bool) -> None:
        self.session, self.binding, self.replay = session, binding, replay
        self.inputs = dict(inputs)  # held: the bound device buffers must outlive the binding's runs
        self.outputs = list(outputs)
        self.calls = 0

    def __call__(self) -> None:
        self.session.run_with_iobinding(self.binding)
        self.binding.synchronize_outputs()  # the device has written them (a replayed graph may return earlier)
        self.calls += 1

    def fetch(self) -> list[np.ndarray]:
        """The outputs of the last run, copied to the host (once: not part of a timed call)."""
        return [v.numpy() for v in self.outputs]


def session_device(sess: Any, providers: list | None = None) -> tuple[str, int]:
    """(device, device id) a session's buffers live on: CUDA's where the session really runs there (the id from
    the asked-for ``providers``), else the CPU (a CPU-only onnxruntime runs what is asked of CUDA on the CPU)."""
    if CUDA not in sess.get_providers():
        return "cpu", 0
    opts = next((p[1] for p in providers or () if isinstance(p, tuple) and p[0] == CUDA), {})
    return "cuda", int(opts.get("device_id", 0))


def resident_run(sess: Any, feeds: Mapping[str, np.ndarray], providers: list | None = None) -> ResidentRun:
    """``sess`` bound once on ``feeds`` (keyed by its input names): inputs copied to its device once, outputs
    allocated there by one run and bound as OrtValues; a :class:`GraphSessions` captures this shape's graph and
    its captured binding is replayed."""
    import onnxruntime as ort

    if isinstance(sess, GraphSessions):
        arrays = {k: np.asarray(v) for k, v in feeds.items()}
        sess.run(None, arrays)  # opens and captures this shape's graph (a regular run, then the capture)
        runner = sess.captured(arrays)
        return ResidentRun(runner.session, runner.binding, runner.inputs, runner.outputs, replay=True)
    device, device_id = session_device(sess, providers)
    binding = sess.io_binding()
    # a copy: on the CPU an OrtValue wraps the array it is given, and the bound buffers are the binding's own
    inputs = {m.name: ort.OrtValue.ortvalue_from_numpy(np.array(feeds[m.name], order="C"), device, device_id)
              for m in sess.get_inputs()}
    for name, value in inputs.items():
        binding.bind_ortvalue_input(name, value)
    names = [m.name for m in sess.get_outputs()]
    for name in names:
        binding.bind_output(name, device, device_id)
    sess.run_with_iobinding(binding)  # allocates each output once on the device
    outputs = binding.get_outputs()
    binding.clear_binding_outputs()
    for name, value in zip(names, outputs):
        binding.bind_ortvalue_output(name, value)
    return ResidentRun(sess, binding, inputs, list(outputs), replay=False)


def _session_feeds(sess: Any, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """``feeds`` keyed by the session's input names: by name, or in order when keyed otherwise (spec names)."""
    names = [i.name for i in sess.get_inputs()]
    return {n: feeds[n] for n in names} if all(n in feeds for n in names) else dict(zip(names, feeds.values()))


def timed_call(backend: Any, feeds: Mapping[str, np.ndarray], resident: bool) -> Callable[[], object]:
    """What the timing loop calls for ``backend`` on ``feeds``: with ``resident``, an ONNX Runtime session
    (``backend.session`` with IO binding, or a CUDA-graph pool) bound on its device (:func:`resident_run`); else,
    and for every other runtime (PyTorch, OpenVINO), ``backend.run(feeds)``."""
    sess = getattr(backend, "session", None)
    if resident and sess is not None and (isinstance(sess, GraphSessions) or hasattr(sess, "io_binding")):
        return resident_run(sess, _session_feeds(sess, feeds), getattr(backend, "providers", None))
    return functools.partial(backend.run, feeds)


def call_or_run(backend: Any, feeds: Mapping[str, np.ndarray], resident: bool
                ) -> tuple[Callable[[], object], str | None]:
    """(:func:`timed_call`, None), or where binding fails (backend.run(feeds), why in one line)."""
    try:
        return timed_call(backend, feeds, resident), None
    except Exception as e:  # noqa: BLE001 - a session that cannot bind is still timed, per call
        why = (str(e).strip().splitlines() or [type(e).__name__])[0][:200]
        return functools.partial(backend.run, feeds), why
