"""The records of an encoder-decoder export with its cache: the layout of the three files, the export, each
step case, and the whole outcome (frozen dataclasses with ``to_dict`` for the report). Greedy generations are
the decoder's :class:`~onnxport.decoder.records.GenerationCheck`."""

from __future__ import annotations

from dataclasses import dataclass, fields
from pathlib import Path

from onnxport.core.greedy import GreedyRules
from onnxport.decoder.records import DecoderProof, DecoderVariants

ENCODER_FILE = "encoder_model.onnx"
DECODER_FILE = "decoder_model.onnx"
WITH_PAST_FILE = "decoder_with_past_model.onnx"
FILES = (ENCODER_FILE, DECODER_FILE, WITH_PAST_FILE)
FEATURE_EXTRACTOR_FILE = "preprocessor_config.json"  # Whisper's feature extractor (log-mel from 16 kHz audio)
KINDS = ("decoder", "encoder")  # self-attention cache, cross-attention cache


@dataclass(frozen=True)
class Seq2SeqLayout:
    """The three files' inputs and outputs: ``past_key_values.{i}.decoder.key`` is [batch, heads, past, head_dim]
    (the self-attention cache) and ``.encoder.key`` [batch, heads, source, head_dim] (the cross-attention cache,
    computed once on the first step). The encoder's input is ``source_input`` [batch, *source_dims] (a dim named
    ``source`` is the dynamic length, the others fixed: token ids ``("source",)``, Whisper's log-mel
    ``(mel_bins, frames)``, Speech2Text's ``("source", features)``, pixels ``(channels, height, width)``), with
    ``attention_mask`` [batch, source] beside it when ``source_mask`` (the decoders then take it as
    ``encoder_attention_mask``) and ``global_attention_mask`` when ``global_attention`` (LED). ``subsampled``: the
    encoder's output is shorter than its input (Speech2Text's convolutions), so the cross-attention cache has a
    length of its own. ``speech``: Whisper's fixed-length log-mel input, which serve also takes as audio."""

    architecture: str
    model_type: str
    layers: int  # decoder layers
    heads: int
    head_dim: int
    hidden: int  # the encoder's output width (d_model)
    vocab: int
    start_token: int  # decoder_start_token_id
    max_length: int  # the most decoder tokens the self-attention cache holds
    max_source: int  # the longest source (tokens, or frames for speech)
    speech: bool = False
    mel_bins: int = 0
    frames: int = 0  # speech: the one input length the encoder takes
    eos_token: int | None = None  # the generation config's end-of-sequence token (its first, when it names several)
    generation: GreedyRules | None = None  # the generation config's rules for greedy decoding (None: plain argmax)
    source_input: str = ""  # the encoder's main input ("": input_ids, or input_features when speech)
    source_dims: tuple = ()  # its dims after batch ("source": the dynamic length)
    source_mask: bool | None = None  # attention_mask beside it (None: when the length is dynamic)
    global_attention: bool = False  # global_attention_mask beside it (LED)
    subsampled: bool = False  # the encoder's output length is not its input's

    def __post_init__(self) -> None:
        name = self.source_input or ("input_features" if self.speech else "input_ids")
        dims = tuple(self.source_dims) or ((self.mel_bins, self.frames) if self.speech else ("source",))
        object.__setattr__(self, "source_input", name)
        object.__setattr__(self, "source_dims", dims)
        if self.source_mask is None:
            object.__setattr__(self, "source_mask", "source" in dims)

    @property
    def dynamic(self) -> bool:
        """Whether the source's length varies (tokens, Speech2Text's frames), else one size (Whisper, images)."""
        return "source" in self.source_dims

    def source_shape(self, batch: int, source: int) -> tuple[int, ...]:
        """The encoder input's shape for ``batch`` rows of ``source`` long (fixed dims as they are)."""
        return (batch, *(source if d == "source" else int(d) for d in self.source_dims))

    @classmethod
    def from_dict(cls, data: dict) -> Seq2SeqLayout:
        """The layout :meth:`to_dict` wrote (report.json's ``seq2seq.layout``); keys it does not know are left
        out. A missing or malformed field is a TypeError, KeyError or ValueError."""
        names = {f.name for f in fields(cls)} - {"start_token", "eos_token", "generation"}
        eos = data.get("eos_token_id")
        rules = data.get("generation")
        return cls(**{k: v for k, v in data.items() if k in names}, start_token=int(data["decoder_start_token_id"]),
                   eos_token=int(eos) if eos is not None else None,
                   generation=GreedyRules.from_dict(rules) if isinstance(rules, dict) else None)

    @property
    def encoder_inputs(self) -> tuple[str, ...]:
        return ((self.source_input,) + (("attention_mask",) if self.source_mask else ())
                + (("global_attention_mask",) if self.global_attention else ()))

    @property
    def encoder_mask(self) -> bool:
        """Whether the decoders take ``encoder_attention_mask`` (a source of one length, as Whisper's and an
        image's, has none)."""
        return bool(self.source_mask)

    def past_names(self, prefix: str, kinds: tuple[str, ...] = KINDS) -> tuple[str, ...]:
        return tuple(f"{prefix}.{i}.{kind}.{kv}" for i in range(self.layers) for kind in kinds for kv in ("key", "value"))

    @property
    def decoder_inputs(self) -> tuple[str, ...]:
        return ("input_ids", "encoder_hidden_states") + (("encoder_attention_mask",) if self.encoder_mask else ())

    @property
    def decoder_outputs(self) -> tuple[str, ...]:
        return ("logits",) + self.past_names("present")

    @property
    def with_past_inputs(self) -> tuple[str, ...]:
        return (("input_ids",) + (("encoder_attention_mask",) if self.encoder_mask else ())
                + self.past_names("past_key_values"))

    @property
    def with_past_outputs(self) -> tuple[str, ...]:
        return ("logits",) + self.past_names("present", ("decoder",))

    def past_shape(self, batch: int, tokens: int) -> tuple[int, int, int, int]:
        return (batch, self.heads, tokens, self.head_dim)

    def to_dict(self) -> dict:
        return {"architecture": self.architecture, "model_type": self.model_type, "layers": self.layers,
                "heads": self.heads, "head_dim": self.head_dim, "hidden": self.hidden, "vocab": self.vocab,
                "decoder_start_token_id": self.start_token, "max_length": self.max_length,
                "max_source": self.max_source, "speech": self.speech, "mel_bins": self.mel_bins or None,
                "frames": self.frames or None, "eos_token_id": self.eos_token, "files": list(FILES),
                "source_input": self.source_input, "source_dims": list(self.source_dims),
                "source_mask": self.source_mask, "global_attention": self.global_attention,
                "subsampled": self.subsampled,
                **({"generation": self.generation.to_dict()} if self.generation is not None else {})}

    @property
    def rules(self) -> GreedyRules:
        """The rules greedy decoding follows: the recorded generation config's, else a stop at ``eos_token``."""
        if self.generation is not None:
            return self.generation
        return GreedyRules(eos_token_ids=(self.eos_token,) if self.eos_token is not None else ())


@dataclass(frozen=True)
class Seq2SeqExport:
    """The three files (in a work folder until proven), one opset for all; ``tried``: why newer opsets were left."""

    paths: tuple[Path, Path, Path]
    opset: int
    seconds: float
    tried: tuple[str, ...] = ()
    patches: tuple[str, ...] = ()  # library code replaced for the export only (seq2seq/patches.py)

    def to_dict(self) -> dict:
        return {"files": [p.name for p in self.paths], "opset": self.opset, "seconds": round(self.seconds, 3),
                "tried": list(self.tried), "patches": list(self.patches)}


@dataclass(frozen=True)
class Seq2SeqCase:
    """One step: ``new`` decoder tokens on a self-attention cache of ``past`` tokens (0: ``decoder_model``,
    else ``decoder_with_past_model``), for ``batch`` rows of sources up to ``source`` long (``padded``: the
    other rows shorter, masked), the encoder run first. ``max_abs_err_encoder``: its last_hidden_state."""

    batch: int
    source: int
    past: int
    new: int
    padded: bool
    max_abs_err_encoder: float
    max_abs_err_logits: float
    max_abs_err_presents: float
    passed: bool
    error: str | None = None
    max_rel_err: float = 0.0
    past_shape: tuple[int, ...] = ()  # the shape of past_key_values.0.decoder.key in this step

    @property
    def file(self) -> str:
        return DECODER_FILE if self.past == 0 else WITH_PAST_FILE

    @property
    def label(self) -> str:
        return (f"batch {self.batch}, source {self.source}{' (padded rows)' if self.padded else ''}, "
                f"past {self.past}, {self.new} new ({self.file})")

    @property
    def shapes(self) -> dict[str, list[int]]:
        return {"encoder input": [self.batch, self.source], "input_ids": [self.batch, self.new],
                "past_key_values.0.decoder.key": list(self.past_shape)}

    @property
    def sizes(self) -> dict[str, int]:
        return {"batch": self.batch, "source": self.source, "past": self.past, "seq": self.new}

    @property
    def errors(self) -> dict[str, float]:
        return {"last_hidden_state": self.max_abs_err_encoder, "logits": self.max_abs_err_logits,
                "presents": self.max_abs_err_presents}

    @property
    def max_abs_err(self) -> float:
        """The largest error of this step: encoder output, logits or presents."""
        return max(self.max_abs_err_encoder, self.max_abs_err_logits, self.max_abs_err_presents)

    def to_dict(self) -> dict:
        return {"batch": self.batch, "source": self.source, "past": self.past, "new": self.new,
                "padded": self.padded, "file": self.file, "max_abs_err_encoder": self.max_abs_err_encoder,
                "max_abs_err_logits": self.max_abs_err_logits, "max_abs_err_presents": self.max_abs_err_presents,
                "passed": self.passed, "error": self.error}


@dataclass(frozen=True)
class Seq2SeqProof(DecoderProof):
    """Every step case (encoder run first) and every generation, judged with ``tolerance``: a decoder's proof
    record over :class:`Seq2SeqCase` steps."""

    cases: tuple[Seq2SeqCase, ...]


@dataclass(frozen=True)
class Seq2SeqOutcome:
    """What :func:`onnxport.seq2seq.run_model` did: ``folder`` holds the three files when proven (else each
    is written as ``*.unverified.onnx``)."""

    folder: Path
    layout: Seq2SeqLayout
    export: Seq2SeqExport
    proof: Seq2SeqProof
    variants: DecoderVariants | None = None  # built only when asked for and the proof passed

    @property
    def passed(self) -> bool:
        return self.proof.passed

    @property
    def paths(self) -> tuple[Path, ...]:
        return tuple(self.folder / final_name(name, self.passed) for name in FILES)

    def to_dict(self) -> dict:
        return {"files": [p.name for p in self.paths], "passed": self.passed, "layout": self.layout.to_dict(),
                "export": self.export.to_dict(), "proof": self.proof.to_dict(),
                "variants": None if self.variants is None else self.variants.to_dict()}


def final_name(name: str, proven: bool) -> str:
    """``decoder_model.onnx`` when proven, else ``decoder_model.unverified.onnx``."""
    return name if proven else name.replace(".onnx", ".unverified.onnx")
