"""A served session's batched run through IO binding, for a session on the GPU.

Each input shape gets its device buffers once (OrtValues, refilled in place: one host→device copy per input per
batch, no allocation); the outputs are bound on the device and copied back once per batch. With ``buckets`` a
batch is padded to the next power of two rows, at most ``buckets`` (its last row repeated; the extra rows' outputs are dropped), so
that a few shapes serve every batch size: a few sets of buffers, and cuDNN searches its convolution algorithms
for a few shapes instead of one per batch size (the served file is batch-invariant, or it is not batched). Each
worker thread
has its own bindings, so two batches can be in flight (one computing while the next is copied in:
:class:`~onnxport.serve.batcher.Batcher`'s ``pipeline``). On a session on the CPU provider the same code binds
CPU OrtValues (what the tests run).
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Sequence
from typing import Any

import numpy as np

from onnxport.runtime.sessions import CUDA

Feeds = dict[str, np.ndarray]
Outputs = dict[str, np.ndarray]

MAX_SHAPES = 16  # input shapes whose device buffers each worker thread keeps (the least recently used go)
PIPELINE = 2  # batches in flight on a GPU session


def runs_on_cuda(sess: Any) -> bool:
    """Whether ``sess`` really runs on the CUDA provider (a CPU-only onnxruntime falls back to the CPU)."""
    get = getattr(sess, "get_providers", None)
    return get is not None and CUDA in get()


class DeviceRunner:
    """``runner(feeds) -> outputs`` of ``sess`` through IO binding on ``device`` (see the module)."""

    def __init__(self, sess: Any, output_names: Sequence[str], device: str = "cuda", device_id: int = 0,
                 max_shapes: int = MAX_SHAPES, buckets: int = 0) -> None:
        self.session, self.output_names, self.buckets = sess, list(output_names), buckets
        self.device, self.device_id, self.max_shapes = device, device_id, max_shapes
        self._local = threading.local()
        self.bound = 0  # input shapes bound (buffers allocated), over all threads

    def _slots(self) -> OrderedDict:
        slots = getattr(self._local, "slots", None)
        if slots is None:
            slots = self._local.slots = OrderedDict()
        return slots

    def _slot(self, feeds: Feeds) -> tuple[Any, dict[str, Any]]:
        """This thread's binding and input buffers for the shapes of ``feeds``, refilled with them."""
        import onnxruntime as ort

        slots = self._slots()
        key = tuple((n, a.shape, a.dtype.str) for n, a in sorted(feeds.items()))
        found = slots.get(key)
        if found is not None:
            slots.move_to_end(key)
            for name, value in found[1].items():
                value.update_inplace(np.ascontiguousarray(feeds[name]))
            return found
        binding = self.session.io_binding()
        # a copy: on the CPU an OrtValue wraps the array it is given, and the buffers are refilled later
        values = {n: ort.OrtValue.ortvalue_from_numpy(np.array(a, order="C"), self.device, self.device_id)
                  for n, a in feeds.items()}
        for name, value in values.items():
            binding.bind_ortvalue_input(name, value)
        slots[key] = (binding, values)
        self.bound += 1
        while len(slots) > self.max_shapes:
            slots.popitem(last=False)
        return slots[key]

    def __call__(self, feeds: Feeds) -> Outputs:
        rows = next(iter(feeds.values())).shape[0] if feeds and self.buckets else 0
        padded = max(rows, min(bucket(rows), self.buckets)) if rows else 0
        if padded > rows:
            feeds = {n: np.concatenate([a, np.repeat(a[-1:], padded - rows, axis=0)]) for n, a in feeds.items()}
        binding, _ = self._slot(feeds)
        binding.clear_binding_outputs()
        for name in self.output_names:
            binding.bind_output(name, self.device, self.device_id)
        self.session.run_with_iobinding(binding)
        outs = binding.copy_outputs_to_cpu()
        return dict(zip(self.output_names, [o[:rows] for o in outs] if padded > rows else outs))


def bucket(rows: int) -> int:
    """The rows a batch of ``rows`` is padded to: the next power of two."""
    return 1 << max(0, rows - 1).bit_length()
