"""A Hugging Face model folder checked before anything is built from it: ``config.json`` and
``generation_config.json`` read (JSON, nesting), the values onnxport or transformers reads checked for type and
range with the file and field named, what the config asks for sized against the weights on disk and this
machine's memory, and what transformers, safetensors, tokenizers or the JSON parser raise while loading turned
into one line (exit 2; ``ONNXPORT_DEBUG=1`` keeps the traceback)."""

from __future__ import annotations

import contextlib
import json
import math
import os
import struct
from collections.abc import Iterator
from pathlib import Path

from onnxport.core import signals
from onnxport.core.errors import EnvironmentProblem, OnnxportError, SourceError, one_line

MAX_DEPTH = 32  # levels of nesting a config has (a few sub-configs deep)
MAX_LAYERS = 4096
MAX_POSITIONS = 1 << 26
MAX_WIDTH = 1 << 20  # hidden sizes, vocabularies and the like stay far below
MAX_VOCAB = 1 << 24
TOWERS = ("text_config", "vision_config", "audio_config", "encoder", "decoder", "speech_config", "qformer_config")
FIX = "fix the value in the file, or save the model again with save_pretrained()"

POSITIVE = {  # integers >= 1 (None allowed: the model's default)
    "vocab_size": MAX_VOCAB, "hidden_size": MAX_WIDTH, "num_hidden_layers": MAX_LAYERS,
    "num_attention_heads": 4096, "num_key_value_heads": 4096, "intermediate_size": MAX_WIDTH * 4,
    "max_position_embeddings": MAX_POSITIONS, "n_positions": MAX_POSITIONS, "n_ctx": MAX_POSITIONS,
    "n_embd": MAX_WIDTH, "n_layer": MAX_LAYERS, "n_head": 4096, "n_inner": MAX_WIDTH * 4, "d_model": MAX_WIDTH,
    "d_kv": MAX_WIDTH, "d_ff": MAX_WIDTH * 4, "num_layers": MAX_LAYERS,
    "num_heads": 4096, "patch_size": 4096, "num_channels": 4096,
    "encoder_attention_heads": 4096,
    "decoder_attention_heads": 4096, "encoder_ffn_dim": MAX_WIDTH * 4, "decoder_ffn_dim": MAX_WIDTH * 4,
    "head_dim": MAX_WIDTH, "max_source_positions": MAX_POSITIONS, "max_target_positions": MAX_POSITIONS,
    "num_mel_bins": 4096, "max_2d_position_embeddings": MAX_POSITIONS,
    "relative_attention_num_buckets": MAX_POSITIONS, "relative_attention_max_distance": MAX_POSITIONS,
    "embedding_size": MAX_WIDTH, "num_labels": MAX_VOCAB, "ffn_dim": MAX_WIDTH * 4, "rotary_dim": MAX_WIDTH,
    "moe_intermediate_size":
    MAX_WIDTH * 4, "conv_dim": None, "image_size": 1 << 16, "num_beams": 4096, "num_return_sequences": 4096,
    "max_length": MAX_POSITIONS, "input_feat_per_channel": 4096, "num_frames": 1 << 16,
}
NON_NEGATIVE = {"min_length": MAX_POSITIONS, "max_new_tokens": MAX_POSITIONS, "min_new_tokens": MAX_POSITIONS,
                "top_k": MAX_VOCAB, "no_repeat_ngram_size": MAX_POSITIONS, "num_beam_groups": 4096,
                "encoder_no_repeat_ngram_size": MAX_POSITIONS, "type_vocab_size": MAX_VOCAB,  # DeBERTa-v2: 0
                "sliding_window": MAX_POSITIONS, "num_experts": 65536, "num_local_experts": 65536,
                "num_experts_per_tok": 65536,
                # a decoder used alone keeps its encoder-decoder config with no encoder (Donut's mBART: 0)
                "encoder_layers": MAX_LAYERS, "decoder_layers": MAX_LAYERS, "num_decoder_layers": MAX_LAYERS}
POSITIVE_REAL = ("repetition_penalty", "encoder_repetition_penalty", "rope_theta")
REAL = ("length_penalty", "diversity_penalty", "temperature", "logit_scale_init_value", "layer_norm_eps",
        "rms_norm_eps", "layer_norm_epsilon", "initializer_range", "initializer_factor")
UNIT = ("top_p", "typical_p", "epsilon_cutoff", "eta_cutoff", "hidden_dropout_prob", "attention_probs_dropout_prob",
        "dropout", "attention_dropout", "activation_dropout", "dropout_rate", "classifier_dropout", "min_p")
FLAGS = ("do_sample", "use_cache", "is_encoder_decoder", "tie_word_embeddings", "early_stopping", "return_dict")
TOKENS = ("pad_token_id", "bos_token_id", "eos_token_id", "decoder_start_token_id", "forced_bos_token_id",
          "forced_eos_token_id", "sep_token_id", "cls_token_id", "mask_token_id")
TOKEN_LISTS = ("suppress_tokens", "begin_suppress_tokens")
DTYPES = ("float32", "float16", "bfloat16", "float64", "float", "half", "double", "auto", "int8", "uint8",
          "float8_e4m3fn", "float8_e5m2")


def read_json(file: Path) -> object:
    """The JSON in ``file``; one that is unreadable, not JSON or nested too deep is a SourceError naming it."""
    try:
        text = file.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise SourceError(f"cannot read {file} ({one_line(e, 120)})", FIX) from None
    try:
        found = json.loads(text)
    except RecursionError:
        raise SourceError(f"{file} is nested too deep to be a model's config", FIX) from None
    except ValueError as e:
        raise SourceError(f"{file} is not JSON ({one_line(e, 120)})", FIX) from None
    if _depth(found) > MAX_DEPTH:
        raise SourceError(f"{file} is nested more than {MAX_DEPTH} levels deep, more than a model's config is", FIX)
    return found


def readable(path: Path) -> None:
    """The ``config.json`` of the folder ``path``, where there is one, readable JSON not nested too deep."""
    if (path / "config.json").is_file():
        read_json(path / "config.json")


def _depth(value, level: int = 0) -> int:
    if level > MAX_DEPTH:
        return level
    if isinstance(value, dict):
        return max((_depth(v, level + 1) for v in value.values()), default=level + 1)
    if isinstance(value, list):
        return max((_depth(v, level + 1) for v in value), default=level + 1)
    return level


def check_folder(path: Path) -> None:
    """``config.json`` and ``generation_config.json`` of the folder ``path`` read and checked (values, then the
    sizes they ask for against the weights on disk and the memory): a SourceError (exit 2) or an
    EnvironmentProblem (exit 4) naming the file and field, before anything is built."""
    config = read_json(path / "config.json")
    if isinstance(config, dict) and "_diffusers_version" in config:
        return  # a diffusers model's config: its own fields (docs/diffusion.md)
    if isinstance(config, dict):
        check_values(config, path / "config.json")
    second = path / "generation_config.json"
    if second.is_file():
        found = read_json(second)
        if not isinstance(found, dict):
            raise SourceError(f"{second} holds no JSON object", FIX)
        check_values(found, second)
    if isinstance(config, dict):
        check_sizes(config, path)


def _bad(file: Path, field: str, value, want: str) -> SourceError:
    shown = one_line(json.dumps(value) if not isinstance(value, str) else repr(value), 60)
    return SourceError(f"{file.name}: {field} = {shown} is not valid ({want})", f"{FIX}: {file}")


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_real(value) -> bool:
    return (_is_int(value) or isinstance(value, float)) and math.isfinite(value)


def check_values(config: dict, file: Path, prefix: str = "") -> None:
    """Each value onnxport or transformers reads checked for type and range (sub-configs by their key)."""
    for key, value in config.items():
        field = f"{prefix}{key}"
        if isinstance(value, dict) and key in TOWERS:
            check_values(value, file, f"{field}.")
        else:
            _check_value(key, value, file, field)
    _check_heads(config, file, prefix)


def _check_value(key: str, value, file: Path, field: str) -> None:  # noqa: C901 - one rule per kind of field
    if value is None:
        return
    if key in POSITIVE or key in NON_NEGATIVE:
        low, high = (1, POSITIVE[key]) if key in POSITIVE else (0, NON_NEGATIVE[key])
        if isinstance(value, list) or (key == "image_size" and isinstance(value, dict)):  # per stage (Swin's heads)
            for i, v in enumerate(value.values() if isinstance(value, dict) else value):
                _check_value(key, v, file, f"{field}[{i}]")
            return
        if key == "conv_dim":
            return
        if not _is_int(value) or value < low or (high is not None and value > high):
            top = f" up to {high:,}" if high else ""
            raise _bad(file, field, value, f"an integer {'>= 1' if low else '>= 0'}{top}")
    elif key in POSITIVE_REAL and not (_is_real(value) and value > 0):
        raise _bad(file, field, value, "a number > 0")
    elif key in REAL and not _is_real(value):
        raise _bad(file, field, value, "a finite number")
    elif key in UNIT and not (_is_real(value) and 0 <= value <= 1):
        raise _bad(file, field, value, "a number from 0 to 1")
    elif key in FLAGS and not isinstance(value, bool):
        raise _bad(file, field, value, "true or false")
    elif key in TOKENS:
        listed = key in ("eos_token_id", "forced_eos_token_id")
        ids = value if listed and isinstance(value, list) else [value]
        if not ids or not all(_is_int(i) and -1 <= i < MAX_VOCAB for i in ids):
            raise _bad(file, field, value, "a token id" + (" or a list of them" if listed else ""))
    elif key in ("bad_words_ids", "forced_decoder_ids") and not _id_lists(value, 2 if key[0] == "f" else None):
        raise _bad(file, field, value, "a list of [position, token id] pairs" if key[0] == "f" else
                   "a list of lists of token ids")
    elif key in TOKEN_LISTS and not (isinstance(value, list) and all(_is_int(i) and i >= 0 for i in value)):
        raise _bad(file, field, value, "a list of token ids")
    elif key in ("dtype", "torch_dtype") and value not in DTYPES:
        raise _bad(file, field, value, "one of " + ", ".join(DTYPES[:4]))
    elif key in ("rope_scaling", "rope_parameters"):
        _check_rope(value, file, field)
    elif key in ("model_type", "hidden_act") and not isinstance(value, str):
        raise _bad(file, field, value, "a name")
    elif key == "architectures" and not (isinstance(value, list) and all(isinstance(a, str) for a in value)):
        raise _bad(file, field, value, "a list of class names")


def _id_lists(value, size: int | None) -> bool:
    return isinstance(value, list) and all(
        isinstance(ids, list) and ids and (size is None or len(ids) == size)
        and all(_is_int(i) and i >= 0 for i in ids) for ids in value)


def _check_rope(value, file: Path, field: str) -> None:
    if not isinstance(value, dict):
        raise _bad(file, field, value, "an object with rope_type")
    kind = value.get("rope_type", value.get("type"))
    if kind is None or kind == "default":
        return
    try:
        from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS
        known = ["default", *ROPE_INIT_FUNCTIONS]
    except ImportError:  # another transformers: it names a bad one itself
        return
    if kind not in known:
        raise _bad(file, f"{field}.rope_type", kind, "one of " + ", ".join(known))
    factor = value.get("factor")
    if factor is not None and not (_is_real(factor) and factor > 0):
        raise _bad(file, f"{field}.factor", factor, "a number > 0")


def _check_heads(config: dict, file: Path, prefix: str) -> None:
    heads = config.get("num_attention_heads")
    kv = config.get("num_key_value_heads")
    if _is_int(heads) and _is_int(kv) and heads % kv:
        raise SourceError(f"{file.name}: {prefix}num_key_value_heads = {kv} does not divide {prefix}"
                          f"num_attention_heads = {heads}", f"{FIX}: {file}")
    width = config.get("hidden_size")
    if _is_int(heads) and _is_int(width) and "head_dim" not in config and width % heads:
        raise SourceError(f"{file.name}: {prefix}hidden_size = {width} is not a multiple of {prefix}"
                          f"num_attention_heads = {heads}", f"{FIX}: {file}")


def _first(config: dict, *names: str) -> int:
    for name in names:
        value = config.get(name)
        if _is_int(value) and value > 0:
            return value
    for tower in TOWERS:
        sub = config.get(tower)
        if isinstance(sub, dict):
            found = _first(sub, *names)
            if found:
                return found
    return 0


def asked_parameters(config: dict, learned_positions: bool = True) -> int:
    """A lower bound of the parameters ``config`` asks for: each layer's square projection, the token and
    (``learned_positions``) position embeddings (hidden size × layers, vocabulary and positions × hidden size)."""
    width = _first(config, "hidden_size", "d_model", "n_embd")
    layers = (_first(config, "num_hidden_layers", "num_layers", "n_layer", "encoder_layers")
              + _first(config, "num_decoder_layers", "decoder_layers"))
    vocab = _first(config, "vocab_size")
    positions = _first(config, "max_position_embeddings", "n_positions") if learned_positions else 0
    return width * width * max(layers, 1) + width * (vocab + positions)


POSITION_TABLES = ("position_embeddings.weight", "wpe.weight", "embed_positions.weight")


def weights_on_disk(path: Path) -> tuple[int, int, bool]:
    """The parameters the folder's weights hold (from the safetensors headers; other files by their bytes at
    4 a parameter), their bytes, and whether they hold a learned position table; a safetensors file whose
    header cannot be read is a SourceError naming it."""
    files = sorted(path.glob("*.safetensors")) or sorted(path.glob("*.bin")) or sorted(path.glob("*.pt*"))
    total, table = 0, False
    for file in files:
        if file.suffix != ".safetensors":
            total += file.stat().st_size // 4
            continue
        shapes = _safetensors_shapes(file)
        total += sum(math.prod(shape) for shape in shapes.values())
        table = table or any(name.endswith(POSITION_TABLES) for name in shapes)
    return total, sum(f.stat().st_size for f in files), table


def _safetensors_shapes(file: Path) -> dict[str, tuple[int, ...]]:
    """Each tensor's shape in the safetensors ``file``, read from its header; a SourceError naming the file
    where the header cannot be read."""
    size = file.stat().st_size
    try:
        with file.open("rb") as f:
            (length,) = struct.unpack("<Q", f.read(8))
            if length > min(size - 8, 100 << 20):
                raise ValueError("its header is longer than the file")
            header = json.loads(f.read(length))
        return {name: tuple(int(d) for d in entry["shape"]) for name, entry in header.items()
                if name != "__metadata__"}
    except (OSError, ValueError, KeyError, TypeError, struct.error, RecursionError) as e:
        raise SourceError(f"{file} is not a readable safetensors file ({one_line(e, 80) or 'truncated'})",
                          "save the weights again with save_pretrained(), or copy the file again") from None


def _available_memory() -> int | None:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def check_sizes(config: dict, path: Path) -> None:
    """What ``config`` asks for (a lower bound of its parameters) against the weights on disk (exit 2 where
    it asks for far more than they hold) and the memory free (exit 4), before the model is built."""
    held, size, table = weights_on_disk(path)
    asked = asked_parameters(config, table)
    if size and asked > 4 * held + 1_000_000:
        raise SourceError(f"config.json asks for at least {asked:,} parameters (hidden size × layers, vocabulary "
                          f"and positions × hidden size), the weights in {path} hold {held:,}",
                          f"{FIX}: {path / 'config.json'}")
    free = _available_memory()
    need = max(2 * asked, size)  # at least: half precision, or the weights as saved
    if free is not None and need > free:
        raise EnvironmentProblem(f"the model in {path} needs at least {need / 2**30:.1f} GiB of memory, this "
                                 f"machine has {free / 2**30:.1f} GiB free",
                                 "run on a machine with more memory, or free some")


EMBEDDINGS = ("word_embeddings.weight", "embed_tokens.weight", "shared.weight", "wte.weight")


def check_vocabulary(config, path: Path) -> None:
    """The config's ``vocab_size`` (as transformers reads it: its default where the file names none) against
    the rows of the token embedding in the safetensors weights."""
    vocab = getattr(config, "vocab_size", None)
    if not _is_int(vocab):
        return
    for file in sorted(path.glob("*.safetensors")):
        for name, shape in _safetensors_shapes(file).items():
            if name.endswith(EMBEDDINGS) and "decoder" not in name and len(shape) == 2:
                if shape[0] != vocab:
                    said = " (the model's default: config.json names none)" if "vocab_size" not in _raw(path) else ""
                    raise SourceError(f"config.json: vocab_size = {vocab}{said} does not match the weights ({name} "
                                      f"in {file.name} holds {shape[0]} tokens)",
                                      f"set vocab_size to {shape[0]} in {path / 'config.json'}")
                return


def _raw(path: Path) -> dict:
    found = read_json(path / "config.json")
    return found if isinstance(found, dict) else {}


@contextlib.contextmanager
def loading(path: Path) -> Iterator[None]:
    """What the libraries raise while the folder ``path`` is read and built, as one line: a SourceError (exit
    2) naming the folder, memory an EnvironmentProblem (exit 4); ``ONNXPORT_DEBUG=1`` lets it through."""
    try:
        yield
    except (OnnxportError, KeyboardInterrupt, SystemExit):
        raise
    except MemoryError:
        raise EnvironmentProblem(f"not enough memory to load the model in {path}",
                                 "run on a machine with more memory") from None
    except Exception as e:  # noqa: BLE001 - transformers, safetensors, tokenizers, json: the folder's fault
        if os.environ.get("ONNXPORT_DEBUG") or _stopping(e):
            raise
        raise SourceError(f"cannot load the model in {path}: {_said(e)}",
                          "check config.json against the weights, or save the model again with save_pretrained()"
                          ) from None


def _stopping(exc: BaseException) -> bool:
    return signals.pending() is not None


def _said(exc: BaseException) -> str:
    """The first line of what ``exc`` says (transformers' "look at the above report" names no tensor: the
    mismatched sizes it printed are the line then), cut to 240 characters."""
    text = str(exc)
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    if "ignore_mismatched_sizes" in text:
        return "a tensor in the weights has another shape than config.json asks for (its sizes differ from theirs)"
    return f"{type(exc).__name__}: {one_line(lines[0] if lines else '', 240)}" if lines else type(exc).__name__
