"""A Triton Inference Server python-backend model for an encoder-decoder exported by onnxport (docs/seq2seq.md):
the greedy loop over ``encoder_model.onnx``, ``decoder_model.onnx`` and ``decoder_with_past_model.onnx`` with
onnxruntime. ``onnxport triton OUT/ --repo R`` copies this file to ``R/<name>/1/model.py`` beside the three files
and ``seq2seq.json`` (the layout the export recorded). It imports numpy, onnxruntime and the backend's
``triton_python_backend_utils``, ``greedy_processors.py`` (the generation config's rules, written beside it
from :mod:`onnxport.core.greedy`) and ``greedy_loop.py`` (the greedy loop onnxport runs itself, written beside it
from :mod:`onnxport.seq2seq.greedy_loop`) only, so that it runs in Triton's python backend without onnxport;
onnxport itself never imports it.

Inputs (``max_batch_size: 0``: the batch is the first dim of each tensor): ``input_ids`` INT64 [batch, source]
and the optional ``attention_mask`` INT64 [batch, source] (1 for tokens, 0 for right padding) of a text model
(and LED's optional ``global_attention_mask``, none global when left out), ``input_features`` FP32 [batch,
mel_bins, frames] of Whisper, or another encoder's input as the export recorded it (``source_input`` FP32 [batch,
*source_dims]: Speech2Text's frames-first features with their optional ``attention_mask``, pixels); the optional
``max_tokens`` INT32 [1] (default 16). Output: ``output_ids`` INT64 [batch, steps], the greedy tokens after ``decoder_start_token_id`` and the
decoder prompt (the end-of-sequence token included; a row that ended before the others is filled with the pad
token), as ``model.generate`` returns them with the generation config's rules, without its prompt."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import onnxruntime as ort
import triton_python_backend_utils as pb_utils

sys.path.insert(0, str(Path(__file__).resolve().parent))  # greedy_processors.py, greedy_loop.py lie beside it
import greedy_loop  # noqa: E402 - the greedy loop, copied from onnxport.seq2seq.greedy_loop
import greedy_processors  # noqa: E402 - the generation config's rules, copied from onnxport.core.greedy

LAYOUT_FILE = "seq2seq.json"
FILES = ("encoder_model.onnx", "decoder_model.onnx", "decoder_with_past_model.onnx")
DEFAULT_MAX_TOKENS = 16


def rules_of(layout: dict):
    """The generation config's rules the export recorded (``greedy_processors.GreedyRules``), else a stop at the
    recorded end-of-sequence token."""
    return greedy_processors.GreedyRules.of_layout(layout)


def greedy(sessions: list, layout: dict, feeds: dict, max_tokens: int) -> np.ndarray:
    """[batch, steps] greedy tokens under the generation config's rules, by the loop onnxport runs itself
    (``greedy_loop.generate``): the encoder once, the first decoder step on the start token and the decoder
    prompt, then one step per token on the cache; stops after the step where every row has produced an
    end-of-sequence token (rows that ended earlier get the pad token)."""
    return greedy_loop.generate(sessions, int(layout["layers"]), int(layout["decoder_start_token_id"]),
                                rules_of(layout), feeds, max_tokens)


def _tensor(request, name: str) -> np.ndarray | None:
    tensor = pb_utils.get_input_tensor_by_name(request, name)
    return None if tensor is None else tensor.as_numpy()


def source_of(layout: dict) -> tuple[str, list, bool, bool]:
    """(the encoder's main input, its dims after the batch ("source": any length), whether attention_mask and
    global_attention_mask go beside it), as the export recorded them; an older export: token ids, or Whisper's."""
    if layout.get("source_input"):
        return (str(layout["source_input"]), list(layout.get("source_dims") or []), bool(layout.get("source_mask")),
                bool(layout.get("global_attention")))
    if layout.get("speech"):
        return "input_features", [int(layout["mel_bins"]), int(layout["frames"])], False, False
    return "input_ids", ["source"], True, False


def encoder_feeds(layout: dict, request) -> dict:
    """The encoder's feeds from a request; ValueError naming what is wrong."""
    name, dims, masked, marks = source_of(layout)
    if layout.get("speech"):
        return _whisper_feeds(layout, request)
    if name != "input_ids":
        return _tensor_feeds(layout, request, name, dims, masked)
    ids = _tensor(request, "input_ids")
    if ids is None or ids.ndim != 2 or 0 in ids.shape:
        raise ValueError(f"input_ids must be INT64 [batch, source], got {None if ids is None else list(ids.shape)}")
    if ids.shape[1] > int(layout["max_source"]):
        raise ValueError(f"a source of {ids.shape[1]} tokens exceeds the maximum of {layout['max_source']}")
    vocab = int(layout.get("vocab") or 0)
    if ids.min() < 0 or (vocab and ids.max() >= vocab):
        raise ValueError(f"input_ids holds a token id outside the vocabulary 0..{vocab - 1}")
    feeds = {"input_ids": ids.astype(np.int64), "attention_mask": _mask(request, "attention_mask", ids.shape, 1)}
    if marks:  # LED: no global token unless given, as generate without a global_attention_mask
        feeds["global_attention_mask"] = _mask(request, "global_attention_mask", ids.shape, 0)
    return feeds


def _mask(request, name: str, shape: tuple, fill: int) -> np.ndarray:
    mask = _tensor(request, name)
    mask = np.full(shape, fill, np.int64) if mask is None else mask
    if mask.shape != tuple(shape):
        raise ValueError(f"{name} has shape {list(mask.shape)}, the source {list(shape)}")
    return mask.astype(np.int64)


def _whisper_feeds(layout: dict, request) -> dict:
    features = _tensor(request, "input_features")
    want = [int(layout["mel_bins"]), int(layout["frames"])]
    if features is None or features.ndim != 3 or list(features.shape[1:]) != want or not features.shape[0]:
        got = None if features is None else list(features.shape)
        raise ValueError(f"input_features must be FP32 [batch, {want[0]}, {want[1]}], got {got}")
    if not np.isfinite(features).all():
        raise ValueError("input_features holds a value that is not a finite number")
    return {"input_features": features.astype(np.float32)}


def _tensor_feeds(layout: dict, request, name: str, dims: list, masked: bool) -> dict:
    """Another encoder's input (Speech2Text's frames-first features, pixels) and its mask (ones when left out)."""
    value, most = _tensor(request, name), int(layout["max_source"])
    fits = value is not None and value.ndim == len(dims) + 1 and value.shape[0] > 0 and all(
        1 <= n <= most if d == "source" else n == int(d) for n, d in zip(value.shape[1:], dims))
    if not fits:
        want = ", ".join(f"1..{most}" if d == "source" else str(d) for d in dims)
        raise ValueError(f"{name} must be FP32 [batch, {want}], got {None if value is None else list(value.shape)}")
    if not np.isfinite(value).all():
        raise ValueError(f"{name} holds a value that is not a finite number")
    feeds = {name: value.astype(np.float32)}
    if masked:
        length = value.shape[1 + dims.index("source")]
        feeds["attention_mask"] = _mask(request, "attention_mask", (value.shape[0], length), 1)
    return feeds


def max_tokens(layout: dict, request) -> int:
    """The tokens to generate (``max_tokens``, default 16); ValueError beyond the export's ``max_length`` less the
    decoder prompt."""
    room = int(layout["max_length"]) - len(rules_of(layout).decoder_prompt)
    given = _tensor(request, "max_tokens")
    count = DEFAULT_MAX_TOKENS if given is None or not given.size else int(given.reshape(-1)[0])
    count = min(count, room) if given is None else count
    if not 1 <= count <= room:
        raise ValueError(f"max_tokens must be in 1..{room} (the export's --max-length less the decoder prompt), "
                         f"got {count}")
    return count


def providers(args: dict) -> list:
    """The instance's providers: on a GPU instance (``instance_group`` KIND_GPU) the CUDA provider on the
    instance's device (TF32 off: the files were proven in fp32), then the CPU; else the CPU."""
    if str(args.get("model_instance_kind", "CPU")).upper() != "GPU":
        return ["CPUExecutionProvider"]
    device = int(args.get("model_instance_device_id") or 0)
    return [("CUDAExecutionProvider", {"device_id": device, "use_tf32": "0"}), "CPUExecutionProvider"]


class TritonPythonModel:
    """The model Triton's python backend loads: three onnxruntime sessions and the greedy loop."""

    def initialize(self, args: dict) -> None:
        """Open the three files of this version's folder (``intra_op_thread_count`` from the config)."""
        folder = Path(args["model_repository"]) / str(args["model_version"])
        self.layout = json.loads((folder / LAYOUT_FILE).read_text(encoding="utf-8"))
        params = json.loads(args.get("model_config") or "{}").get("parameters") or {}
        options = ort.SessionOptions()
        threads = str((params.get("intra_op_thread_count") or {}).get("string_value") or "0")
        options.intra_op_num_threads = int(threads) if threads.isdigit() else 0
        self.sessions = [ort.InferenceSession(str(folder / name), options, providers=providers(args))
                         for name in FILES]

    def execute(self, requests: list) -> list:
        """One response per request: ``output_ids``, or the error of a request that cannot run."""
        responses = []
        for request in requests:
            try:
                tokens = greedy(self.sessions, self.layout, encoder_feeds(self.layout, request),
                                max_tokens(self.layout, request))
                responses.append(pb_utils.InferenceResponse(output_tensors=[pb_utils.Tensor("output_ids", tokens)]))
            except ValueError as e:
                responses.append(pb_utils.InferenceResponse(output_tensors=[], error=pb_utils.TritonError(str(e))))
        return responses

    def finalize(self) -> None:
        """Close the sessions."""
        self.sessions = []
