"""The encoder-decoder's entry in a Triton repository (``onnxport triton OUT/``; the family's ``repository``,
docs/seq2seq.md): the python backend's ``1/model.py`` (:mod:`onnxport.seq2seq.triton_model`, the greedy loop with
onnxruntime), ``1/greedy_loop.py`` (that loop, :mod:`onnxport.seq2seq.greedy_loop`, the one onnxport runs) and
``1/greedy_processors.py`` (the generation config's rules, :mod:`onnxport.core.greedy`) beside the three files, ``1/seq2seq.json`` (the layout report.json recorded), the tokenizer and feature extractor, and
its config. ``serve/repository.py`` writes it without naming the family."""

from __future__ import annotations

import json
from importlib import resources
from pathlib import Path

from onnxport.core.errors import UsageError
from onnxport.core.greedy import PROCESSORS_FILE, GreedyRules
from onnxport.families.serving import RepositoryEntry, TritonEnum
from onnxport.seq2seq.outcome import SECTION
from onnxport.seq2seq.records import FEATURE_EXTRACTOR_FILE, Seq2SeqLayout

LAYOUT_FILE = f"{SECTION}.json"  # the layout beside model.py (serve REPO reads it back: Family.layout)
LOOP_FILE = "greedy_loop.py"  # the greedy loop (onnxport.seq2seq.greedy_loop), beside model.py, which imports it


def recorded_layout(out: Path, report: object) -> dict:
    """report.json's ``seq2seq.layout`` of an encoder-decoder's output folder (UsageError when missing)."""
    try:
        layout = report[SECTION]["layout"]  # type: ignore[index]
        int(layout["layers"]), int(layout["decoder_start_token_id"]), int(layout["max_length"])
    except (KeyError, TypeError, ValueError) as e:
        raise UsageError(f"{out / 'report.json'} records no encoder-decoder layout ({type(e).__name__}: "
                         f"{str(e)[:120]})", "export the model again with onnxport export/convert") from None
    return layout


def model_config(layout: dict, name: str, *, instance_count: int = 1, threads: int | None = None,
                 gpu: bool = False) -> dict:
    """Triton's configuration (JSON form) of an encoder-decoder served by the python backend (``model.py``, the
    greedy loop over its three files with onnxruntime): ``layout`` is report.json's ``seq2seq.layout``.
    ``max_batch_size`` is 0: every tensor carries its batch as its first dim. ``gpu``: GPU instances (model.py
    then opens the files on the CUDA provider of its instance's device)."""
    found = Seq2SeqLayout.from_dict(layout)
    ids = found.source_input == "input_ids"
    source = [-1, *(-1 if d == "source" else int(d) for d in found.source_dims)]
    inputs = [{"name": found.source_input, "data_type": TritonEnum("TYPE_INT64" if ids else "TYPE_FP32"),
               "dims": source}]
    for mask in found.encoder_inputs[1:]:  # attention_mask, LED's global_attention_mask
        inputs.append({"name": mask, "data_type": TritonEnum("TYPE_INT64"), "dims": [-1, -1], "optional": True})
    inputs.append({"name": "max_tokens", "data_type": TritonEnum("TYPE_INT32"), "dims": [1], "optional": True})
    return {"name": name, "backend": "python", "max_batch_size": 0,
            "input": inputs, "output": [{"name": "output_ids", "data_type": TritonEnum("TYPE_INT64"), "dims": [-1, -1]}],
            "instance_group": [{"count": instance_count, "kind": TritonEnum("KIND_GPU" if gpu else "KIND_CPU")}],
            "parameters": {"intra_op_thread_count": {"string_value": str(threads or 0)},
                           **{key: {"string_value": text} for key, text in generation_parameters(layout).items()}}}


def generation_parameters(layout: dict) -> dict[str, str]:
    """Which of the generation config's rules the greedy loop applies, and which it cannot (config parameters)."""
    return GreedyRules.of_layout(layout).config_parameters()


def config_notes(layout: dict) -> tuple[str, ...]:
    """The comments heading the config.pbtxt of :func:`model_config`: the generation loop it runs."""
    found = Seq2SeqLayout.from_dict(layout)
    dims = ", ".join(str(d) for d in found.source_dims)
    masks = " and ".join(found.encoder_inputs[1:])
    source = ("input_features FP32 [batch, mel_bins, frames] (Whisper's log-mel)" if found.speech else
              f"{found.source_input} {'INT64' if found.source_input == 'input_ids' else 'FP32'} [batch, {dims}]"
              + (f" and optionally {masks} (attention_mask: 1 = kept, 0 = right padding)" if masks else ""))
    return ("# Triton Inference Server model configuration written by onnxport: an encoder-decoder served by the",
            "# python backend. 1/model.py runs the greedy loop with onnxruntime over 1/encoder_model.onnx (once per",
            "# source), 1/decoder_model.onnx (the first step, on decoder_start_token_id "
            f"{layout.get('decoder_start_token_id')}) and",
            "# 1/decoder_with_past_model.onnx (one step per token, on the cache); 1/seq2seq.json is the layout.",
            f"# In: {source}; max_tokens INT32 [1] (default 16, at most {layout.get('max_length')}).",
            "# Out: output_ids INT64 [batch, steps], the greedy tokens after the start token (and the decoder prompt),",
            "# up to and including an end-of-sequence token (rows that ended early are filled with the pad token).",
            "# Tokens are picked under the generation config's rules (1/greedy_processors.py, the parameters",
            "# onnxport_generation_applied and onnxport_generation_not_applied below say which).")


def repository_entry(out: Path, report: object, name: str, *, instance_count: int, threads: int | None,
                     gpu: bool) -> RepositoryEntry:
    """The encoder-decoder's python-backend entry for the output folder ``out`` (its ``report.json`` read as
    ``report``); ``gpu``: GPU instances, model.py running onnxruntime's CUDA provider there."""
    layout = recorded_layout(out, report)
    text = resources.files("onnxport.seq2seq").joinpath("triton_model.py").read_text(encoding="utf-8")
    processors = resources.files("onnxport.core").joinpath("greedy.py").read_text(encoding="utf-8")
    loop = resources.files("onnxport.seq2seq").joinpath(LOOP_FILE).read_text(encoding="utf-8")
    return RepositoryEntry(model_config(layout, name, instance_count=instance_count, threads=threads, gpu=gpu),
                           config_notes(layout), text,
                           {PROCESSORS_FILE: processors, LOOP_FILE: loop, LAYOUT_FILE: json.dumps(layout, indent=2) + "\n"},
                           # serve REPO's generate takes text with the tokenizer, and audio with the extractor
                           (out / "tokenizer", out / FEATURE_EXTRACTOR_FILE))
