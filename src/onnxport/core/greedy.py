"""The generation config's rules for greedy decoding, in numpy: the logits processors of transformers'
``generate`` that change greedy tokens (applied in its order), its end-of-sequence stop and padding of finished
rows, and Whisper's decoder prompt (language, task, no-timestamps tokens). What a rule cannot be applied to greedy
tokens (sampling, beams, biases on the source, ...) is named in :attr:`GreedyRules.not_applied`, never dropped
silently.

This file imports numpy and the standard library only: the export's proof, ``serve``'s generate and the Triton
python-backend model (``onnxport triton`` copies it beside ``model.py`` as ``greedy_processors.py``) all decode
with it."""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields

import numpy as np

PROCESSORS_FILE = "greedy_processors.py"
NEG_INF = -np.inf


def _ints(value: object) -> tuple[int, ...]:
    """An int or a list of ints (None: empty)."""
    if value is None:
        return ()
    if isinstance(value, (int, np.integer)) and not isinstance(value, bool):
        return (int(value),)
    return tuple(int(v) for v in value)  # type: ignore[union-attr]


@dataclass(frozen=True)
class GreedyRules:
    """What the model's generation config asks of greedy decoding, as plain values (``to_dict`` / ``from_dict``
    for report.json and the served configs). ``decoder_prompt``: tokens an encoder-decoder's decoder starts with
    after its start token (Whisper's language, task and no-timestamps tokens)."""

    eos_token_ids: tuple[int, ...] = ()
    pad_token_id: int | None = None
    repetition_penalty: float = 1.0
    no_repeat_ngram_size: int = 0
    bad_words_ids: tuple[tuple[int, ...], ...] = ()
    min_length: int = 0
    min_new_tokens: int = 0
    forced_bos_token_id: int | None = None
    forced_eos_token_ids: tuple[int, ...] = ()
    remove_invalid_values: bool = False
    suppress_tokens: tuple[int, ...] = ()
    begin_suppress_tokens: tuple[int, ...] = ()
    decoder_prompt: tuple[int, ...] = ()
    not_applied: tuple[str, ...] = ()

    @property
    def applied(self) -> tuple[str, ...]:
        """The names of the rules that change tokens here (the end-of-sequence stop included)."""
        names = []
        for f in fields(self):
            value = getattr(self, f.name)
            if f.name in ("pad_token_id", "not_applied") or value in ((), None, 0, False) or (
                    f.name == "repetition_penalty" and value == 1.0):
                continue
            names.append(f.name)
        return tuple(names)

    @property
    def argmax_only(self) -> bool:
        """Whether the rules leave the scores as they are (at most the end-of-sequence stop): the next token is
        the raw argmax, so a loop need not see the scores."""
        return set(self.applied) <= {"eos_token_ids"}

    @property
    def pad(self) -> int:
        """The token finished rows are filled with (``pad_token_id``, else the first end-of-sequence token)."""
        if self.pad_token_id is not None:
            return self.pad_token_id
        return self.eos_token_ids[0] if self.eos_token_ids else 0

    def to_dict(self) -> dict:
        data = asdict(self)
        return {k: ([list(w) for w in v] if k == "bad_words_ids" else list(v) if isinstance(v, tuple) else v)
                for k, v in data.items()}

    @classmethod
    def from_dict(cls, data: dict | None) -> GreedyRules:
        """The rules :meth:`to_dict` wrote (None or {}: plain greedy); unknown keys are left out."""
        data = data or {}
        out: dict = {}
        for f in fields(cls):
            if f.name not in data or data[f.name] is None:
                continue
            value = data[f.name]
            if f.name == "bad_words_ids":
                value = tuple(tuple(int(t) for t in w) for w in value)
            elif f.name == "not_applied":
                value = tuple(str(v) for v in value)
            elif f.name in ("eos_token_ids", "forced_eos_token_ids", "suppress_tokens", "begin_suppress_tokens",
                            "decoder_prompt"):
                value = _ints(value)
            elif f.name == "repetition_penalty":
                value = float(value)
            elif f.name == "remove_invalid_values":
                value = bool(value)
            else:
                value = int(value)
            out[f.name] = value
        return cls(**out)

    @classmethod
    def of_layout(cls, layout: dict) -> GreedyRules:
        """The rules a layout dict records (report.json's ``seq2seq.layout``, ``seq2seq.json``): its
        ``generation``, else a stop at its ``eos_token_id``."""
        if isinstance(layout.get("generation"), dict):
            return cls.from_dict(layout["generation"])
        eos = layout.get("eos_token_id")
        return cls(eos_token_ids=(int(eos),) if eos is not None else ())

    def config_parameters(self) -> dict[str, str]:
        """The served config's parameters naming the rules applied and those not."""
        return {"onnxport_generation_applied": ", ".join(self.applied) or "none (plain greedy)",
                "onnxport_generation_not_applied": ", ".join(self.not_applied) or "none"}

    def without_eos(self) -> GreedyRules:
        """These rules with no end-of-sequence stop (a request that asks to ignore it)."""
        return GreedyRules(**{**{f.name: getattr(self, f.name) for f in fields(self)}, "eos_token_ids": ()})

    def start(self, history: np.ndarray, max_new_tokens: int, attention_mask: np.ndarray | None = None) -> Decoding:
        """A decoding of ``max_new_tokens`` tokens after ``history`` ([batch, n] ids: a decoder's prompt, or an
        encoder-decoder's start token and decoder prompt); ``attention_mask``: the prompt's (left padding is
        left out of the repetition penalty, as ``generate`` does)."""
        return Decoding(self, history, max_new_tokens, attention_mask)


PLAIN = GreedyRules()  # argmax at every step, no stop: what the variant judges and speed loops compare


class Decoding:
    """One greedy decoding under :class:`GreedyRules`: :meth:`step` takes the logits of the last position and
    returns each row's token; rows that produced an end-of-sequence token get the pad token after it;
    :attr:`finished` once every row has."""

    def __init__(self, rules: GreedyRules, history: np.ndarray, max_new_tokens: int,
                 attention_mask: np.ndarray | None = None) -> None:
        self.rules = rules
        self.ids = np.asarray(history, np.int64)
        self.prompt = self.ids.shape[1]
        self.max_length = self.prompt + max_new_tokens
        self.done = np.zeros(self.ids.shape[0], bool)
        forced_bos_first = self.prompt <= 1 and rules.forced_bos_token_id is not None
        self.begin_index = self.prompt + 1 if forced_bos_first else self.prompt
        self.min_length = rules.min_new_tokens + self.prompt if rules.min_new_tokens else rules.min_length
        self.skip = np.zeros(self.ids.shape[0], np.int64)
        if attention_mask is not None and rules.repetition_penalty != 1.0:
            self.skip = (np.asarray(attention_mask) != 0).argmax(axis=1).astype(np.int64)
        eos = set(rules.eos_token_ids)
        self.bad_words = tuple(w for w in rules.bad_words_ids if not (len(w) == 1 and w[0] in eos))

    @property
    def finished(self) -> bool:
        return bool(self.rules.eos_token_ids) and bool(self.done.all())

    def scores(self, logits: np.ndarray) -> np.ndarray:
        """The processed scores of ``logits`` [batch, vocab] (float32), the processors in ``generate``'s order."""
        rules, scores = self.rules, np.array(logits, np.float32)
        vocab, length = scores.shape[-1], self.ids.shape[1]
        eos = [t for t in rules.eos_token_ids if 0 <= t < vocab]
        if rules.repetition_penalty != 1.0:
            for row in range(scores.shape[0]):
                seen = np.unique(self.ids[row, self.skip[row]:])
                seen = seen[(seen >= 0) & (seen < vocab)]
                picked = scores[row, seen]
                scores[row, seen] = np.where(picked < 0, picked * rules.repetition_penalty,
                                             picked / rules.repetition_penalty)
        n = rules.no_repeat_ngram_size
        if n > 0 and length >= n:
            windows = np.lib.stride_tricks.sliding_window_view(self.ids, n, axis=1)
            prefix = self.ids[:, length + 1 - n:]
            matches = (windows[..., :-1] == prefix[:, None, :]).all(-1)
            for row in range(scores.shape[0]):
                banned = windows[row, matches[row], -1]
                scores[row, banned[(banned >= 0) & (banned < vocab)]] = NEG_INF
        for word in self.bad_words:
            if word[-1] >= vocab:
                continue
            head = len(word) - 1
            if head == 0:
                scores[:, word[-1]] = NEG_INF
            elif head <= length:
                hit = (self.ids[:, length - head:] == np.asarray(word[:-1])).all(-1)
                scores[hit, word[-1]] = NEG_INF
        if eos and length < self.min_length:
            scores[:, eos] = NEG_INF
        if rules.forced_bos_token_id is not None and length == 1:
            scores[:] = NEG_INF
            scores[:, rules.forced_bos_token_id] = 0
        if rules.forced_eos_token_ids and length == self.max_length - 1:
            scores[:] = NEG_INF
            scores[:, [t for t in rules.forced_eos_token_ids if t < vocab]] = 0
        if rules.remove_invalid_values:
            info = np.finfo(np.float32)
            scores = np.nan_to_num(scores, nan=0.0, posinf=info.max, neginf=info.min)
        if rules.suppress_tokens:
            scores[:, [t for t in rules.suppress_tokens if 0 <= t < vocab]] = NEG_INF
        if rules.begin_suppress_tokens and length == self.begin_index:
            scores[:, [t for t in rules.begin_suppress_tokens if 0 <= t < vocab]] = NEG_INF
        return scores

    def step(self, logits: np.ndarray) -> np.ndarray:
        """Each row's next token ([batch] int64) from the last position's ``logits`` [batch, vocab]."""
        return self.take(self.scores(logits).argmax(-1).astype(np.int64))

    def take(self, token: np.ndarray) -> np.ndarray:
        """Each row's next token from the argmax ``token`` [batch] of scores the rules leave as they are
        (:attr:`GreedyRules.argmax_only`): finished rows get the pad token."""
        token = np.asarray(token, np.int64)
        if self.rules.eos_token_ids:
            token = np.where(self.done, self.rules.pad, token)
            self.done |= np.isin(token, self.rules.eos_token_ids)
        self.ids = np.concatenate([self.ids, token[:, None]], axis=1)
        return token


# What ``generate`` would do that a greedy loop over the exported files does not: config field -> the value that
# means "off" (a callable: whether the value is off).
_NOT_GREEDY = {
    "do_sample": lambda v: not v,
    "num_beams": lambda v: v in (None, 1),
    "num_beam_groups": lambda v: v in (None, 1),
    "penalty_alpha": lambda v: v is None,
    "dola_layers": lambda v: v is None,
    "guidance_scale": lambda v: v in (None, 1, 1.0),
    "sequence_bias": lambda v: not v,
    "encoder_repetition_penalty": lambda v: v in (None, 1, 1.0),
    "encoder_no_repeat_ngram_size": lambda v: not v,
    "exponential_decay_length_penalty": lambda v: v is None,
    "force_words_ids": lambda v: not v,
    "constraints": lambda v: not v,
    "stop_strings": lambda v: not v,
    "watermarking_config": lambda v: v is None,
    "return_timestamps": lambda v: not v,
}


def rules_from_config(config: object, *, encoder_decoder: bool) -> GreedyRules:
    """The rules of a transformers ``GenerationConfig`` (any object with its attribute names): the processors
    greedy tokens depend on, and the names of the settings a greedy loop cannot apply (with their values)."""
    def get(name: str, default: object = None) -> object:
        return getattr(config, name, default)

    not_applied = [f"{name}={get(name)!r}" for name, off in _NOT_GREEDY.items() if not off(get(name))]
    penalty = get("repetition_penalty")
    prompt = whisper_prompt(config) if encoder_decoder else ()
    forced = get("forced_decoder_ids")
    if forced and not prompt:
        pairs = sorted((int(i), int(t)) for i, t in forced)
        if [i for i, _ in pairs] == list(range(1, len(pairs) + 1)):
            prompt = tuple(t for _, t in pairs)
        else:
            not_applied.append(f"forced_decoder_ids={forced!r}")
    bad = get("bad_words_ids")
    return GreedyRules(
        eos_token_ids=_ints(get("eos_token_id")), pad_token_id=_opt_int(get("pad_token_id")),
        repetition_penalty=float(penalty) if penalty is not None else 1.0,
        no_repeat_ngram_size=int(get("no_repeat_ngram_size") or 0),
        bad_words_ids=tuple(tuple(int(t) for t in w) for w in bad) if bad else (),
        min_length=int(get("min_length") or 0), min_new_tokens=int(get("min_new_tokens") or 0),
        forced_bos_token_id=_opt_int(get("forced_bos_token_id")),
        forced_eos_token_ids=_ints(get("forced_eos_token_id")),
        remove_invalid_values=bool(get("remove_invalid_values")),
        suppress_tokens=_ints(get("suppress_tokens")), begin_suppress_tokens=_ints(get("begin_suppress_tokens")),
        decoder_prompt=prompt, not_applied=tuple(not_applied))


def _opt_int(value: object) -> int | None:
    return None if value is None else int(value)  # type: ignore[call-overload]


def whisper_prompt(config: object) -> tuple[int, ...]:
    """Whisper's decoder tokens after its start token, as its ``generate`` lays them for the configured
    ``language`` and ``task`` without timestamps: the language token, the task token, the no-timestamps token
    (each only when the config names it). Empty for a config without Whisper's token tables."""
    lang_to_id, task_to_id = getattr(config, "lang_to_id", None), getattr(config, "task_to_id", None)
    if not lang_to_id and not task_to_id:
        return ()
    out: list[int] = []
    language = getattr(config, "language", None)
    if language and lang_to_id:
        key = language if language in lang_to_id else f"<|{language}|>"
        if key in lang_to_id:
            out.append(int(lang_to_id[key]))
    task = getattr(config, "task", None)
    if task and task_to_id and task in task_to_id:
        out.append(int(task_to_id[task]))
    no_timestamps = getattr(config, "no_timestamps_token_id", None)
    if no_timestamps is not None:
        out.append(int(no_timestamps))
    return tuple(out)
