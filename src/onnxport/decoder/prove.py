"""The proof of a decoder with its cache: each step case (batch × past × new tokens) against PyTorch, then
greedy generation by onnxruntime (presents fed back as past, tokens picked under the generation config's rules)
against ``model.generate`` token for token."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import torch
from torch import nn

from onnxport.core.errors import UsageError, one_line
from onnxport.core.greedy import PLAIN, GreedyRules
from onnxport.core.records import FP32, Tolerance
from onnxport.decoder.generation import generate_greedy
from onnxport.decoder.layout import CachedDecoder, step_inputs
from onnxport.decoder.records import CacheLayout, DecoderProof, GenerationCheck, StepCase
from onnxport.prove.judging import RunResults, compare_accuracy, run_cases
from onnxport.prove.references import Ran, run_each
from onnxport.runtime.binding import CPU_TARGET, Target
from onnxport.runtime.sessions import OnDevice, strict_fp32

NEW_TOKENS = 32


def step_matrix(max_length: int) -> list[tuple[int, int, int]]:
    """(batch, past, new) cases: prompts (past 0) of 1, an odd number and ``max_length`` tokens; one and several
    new tokens on a cache of 1, an odd number and nearly ``max_length`` tokens; batch 1 and an odd batch."""
    odd = min(7, max_length - 1) | 1
    several = min(4, max_length - 1)
    cases = [(1, 0, 1), (3, 0, odd), (1, 0, max_length), (3, 0, max_length)]
    for past in sorted({1, min(9, max_length - several), max_length - several}):
        cases += [(1, past, 1), (3, past, several), (3, past, 1)]
    cases.append((1, max_length - 1, 1))
    return list(dict.fromkeys(c for c in cases if c[1] + c[2] <= max_length))


@contextlib.contextmanager
def on_target(model: nn.Module, target: Target) -> Iterator[nn.Module]:
    """``model`` moved to ``target``'s device (TF32 off: fp32 proven as fp32) and back to the CPU afterwards;
    unchanged on the CPU."""
    if not target.gpu:
        yield model
        return
    try:
        with strict_fp32():
            yield model.to(target.torch_device)
    finally:
        model.to("cpu")


def prove_decoder(model: nn.Module, layout: CacheLayout, path: str | Path, *, tolerance: Tolerance = FP32,
                  new_tokens: int = NEW_TOKENS, seed: int = 0, target: Target = CPU_TARGET) -> DecoderProof:
    """Every :func:`step_matrix` case, then greedy generation under the generation config's rules against
    ``model.generate``: one unpadded row as configured, and a batch with left padding without the
    end-of-sequence stop (so that every step is compared even where the row ends early). Both sides run on
    ``target``'s device: onnxruntime with its providers (the greedy loop keeps the cache there through IO
    binding), PyTorch with the model moved there."""
    with on_target(model, target) as moved:
        return _proven(moved, layout, target.session(path), tolerance, new_tokens, seed, target)


def _proven(model: nn.Module, layout: CacheLayout, sess, tolerance: Tolerance, new_tokens: int, seed: int,
            target: Target) -> DecoderProof:
    wrapper = CachedDecoder(model, layout).eval()
    cases = step_cases(sess, OnDevice(wrapper, target.torch_device) if target.gpu else wrapper, layout, tolerance,
                       seed)
    gen = torch.Generator().manual_seed(seed)
    prompt = min(5, layout.max_length - new_tokens)
    if prompt < 1:
        raise UsageError(f"--max-length {layout.max_length} leaves no room for {new_tokens} generated tokens",
                         f"give --max-length {new_tokens + 5} or more")
    single = torch.randint(0, layout.vocab, (1, prompt), generator=gen)
    lengths = (prompt, 1, max(1, prompt - 2))
    batch = torch.randint(0, layout.vocab, (len(lengths), prompt), generator=gen)
    mask = torch.tensor([[0] * (prompt - n) + [1] * n for n in lengths])
    rules = layout.generation or PLAIN
    gens = (generation_check("one row", sess, model, layout, single, torch.ones_like(single), new_tokens, rules,
                             target),
            generation_check("left-padded batch", sess, model, layout, batch, mask,
                             new_tokens, rules.without_eos(), target))
    return DecoderProof(tolerance, cases, gens, device=target.device)


def step_cases(sess, wrapper: nn.Module, layout: CacheLayout, tolerance: Tolerance, seed: int
               ) -> tuple[StepCase, ...]:
    """Every :func:`step_matrix` case with random tokens and a random cache: run, then judged. PyTorch's outputs
    (:func:`~onnxport.prove.references.run_each`) and onnxruntime's (:func:`~onnxport.prove.judging.run_cases`)
    first, then each case compared by :func:`~onnxport.prove.judging.compare_accuracy`, the logits and the
    presents each (the one comparison every variant is judged by)."""
    matrix = step_matrix(layout.max_length)
    feeds = [tuple(step_inputs(layout, batch=b, past=p, new=n, seed=seed + i)) for i, (b, p, n) in enumerate(matrix)]
    want = run_each(wrapper, feeds)
    got = run_cases(lambda feed: sess.run(list(layout.output_names),
                                          {n: t.numpy() for n, t in zip(layout.input_names, feed)}), feeds, matrix)
    return tuple(judged_step(case, layout.past_shape("key", case[0], case[1]), got.outputs[i], got.error(i), want[i],
                             tolerance) for i, case in enumerate(matrix))


def judged_step(case: tuple[int, int, int], past_shape: tuple[int, ...], got: tuple[np.ndarray, ...] | None,
                why: str | None, want: Ran, tolerance: Tolerance) -> StepCase:
    """One step case judged: onnxruntime's outputs ``got`` (None: it failed, ``why``) against PyTorch's."""
    inf = float("inf")

    def failed(error: str) -> StepCase:
        return StepCase(*case, inf, inf, inf, False, one_line(error, 240), past_shape)

    if want.outputs is None:
        return failed(f"PyTorch fails on this step: {want.error}")
    if got is None:
        return failed(why or "onnxruntime fails")
    ref = want.outputs
    wrong = next(((g.shape, w.shape) for g, w in zip(got, ref) if g.shape != w.shape), None)
    if wrong is not None:
        return failed(f"shape {list(wrong[0])} where PyTorch gives {list(wrong[1])}")
    label = (", ".join(map(str, case)),)
    logits, presents = (compare_accuracy(RunResults(label, (tuple(got[part]),)), RunResults(label, (tuple(ref[part]),)),
                                         tolerance, cosine_of=None) for part in (slice(0, 1), slice(1, None)))
    return StepCase(*case, logits.max_abs_err, presents.max_abs_err, max(logits.max_rel_err, presents.max_rel_err),
                    logits.within and presents.within, None, past_shape)


def generation_check(name: str, sess, model: nn.Module, layout: CacheLayout, input_ids: torch.Tensor,
                     attention_mask: torch.Tensor, new_tokens: int, rules: GreedyRules,
                     target: Target = CPU_TARGET) -> GenerationCheck:
    """``new_tokens`` greedy tokens by :func:`greedy` under ``rules`` (the cache kept on ``target``'s device)
    against ``model.generate`` with the model's generation config (its end-of-sequence stop only when
    ``rules`` keep it), the model on the device it is on."""
    lengths = tuple(int(n) for n in attention_mask.sum(-1))
    return GenerationCheck.of(name, lengths, new_tokens, lambda: (
        greedy(sess, layout, input_ids.numpy(), attention_mask.numpy(), new_tokens, rules, target),
        reference_generate(model, input_ids, attention_mask, new_tokens, rules)))


def greedy(sess, layout: CacheLayout, input_ids: np.ndarray, attention_mask: np.ndarray,
           new_tokens: int, rules: GreedyRules | None = None, target: Target | None = None) -> np.ndarray:
    """Greedy generation with the exported model: the prompt on an empty cache, then one token per step with
    the presents fed back as past, the mask extended by one and position ids from the mask's cumsum (as
    transformers does for left padding), each token picked under ``rules`` (None: the layout's). With a
    ``target`` the cache stays on its device through IO binding. Returns [batch, steps] token ids; a prompt
    that leaves no room for them is a UsageError."""
    return generate_greedy(sess, layout, input_ids, attention_mask, new_tokens, rules, target)


# What generate() does beyond greedy decoding, turned off for the reference: the loop applies the rest
# (GreedyRules.not_applied names what a config asked of these).
GREEDY_ONLY = dict(do_sample=False, num_beams=1, num_beam_groups=1, penalty_alpha=None, dola_layers=None,
                   guidance_scale=None, sequence_bias=None, encoder_repetition_penalty=1.0,
                   encoder_no_repeat_ngram_size=0, exponential_decay_length_penalty=None, force_words_ids=None,
                   constraints=None, stop_strings=None, watermarking_config=None, forced_decoder_ids=None,
                   temperature=None, top_p=None, top_k=None, use_cache=True)
# ... and every processor as well: plain argmax without a stop (the variant judges' reference).
PLAIN_GREEDY = dict(min_length=0, min_new_tokens=0, eos_token_id=None, forced_bos_token_id=None,
                    forced_eos_token_id=None, no_repeat_ngram_size=0, repetition_penalty=1.0, bad_words_ids=None,
                    suppress_tokens=None, begin_suppress_tokens=None, renormalize_logits=False,
                    remove_invalid_values=False)


def reference_config(generation_config, new_tokens: int, rules: GreedyRules):
    """A copy of the model's generation config for ``new_tokens`` greedy tokens: sampling, beams and the other
    settings a greedy loop does not apply turned off; the end-of-sequence stop off when ``rules`` has none; every
    processor off for :data:`~onnxport.core.greedy.PLAIN` rules."""
    import copy

    from transformers import GenerationConfig

    config = copy.deepcopy(generation_config) if generation_config is not None else GenerationConfig()
    config.update(max_new_tokens=new_tokens, **GREEDY_ONLY)
    if rules == PLAIN:
        config.update(**PLAIN_GREEDY)
    elif not rules.eos_token_ids:
        config.update(eos_token_id=None)
    if config.pad_token_id is None and config.eos_token_id is None:
        config.update(pad_token_id=0)  # never used: no row ends
    return config


def reference_generate(model: nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                       new_tokens: int, rules: GreedyRules = PLAIN) -> np.ndarray:
    """``model.generate`` greedy under the model's generation config (:func:`reference_config`): [batch, steps]
    new token ids (fewer than ``new_tokens`` when every row ended)."""
    config = reference_config(getattr(model, "generation_config", None), new_tokens, rules)
    saved = model.generation_config
    model.generation_config = config  # unset fields fall back to the model's: its eos must not be there
    device = next(model.parameters()).device
    try:
        with torch.inference_mode():
            out = model.generate(input_ids=input_ids.to(device), attention_mask=attention_mask.to(device),
                                 generation_config=config)
    finally:
        model.generation_config = saved
    return out[:, input_ids.shape[1]:].cpu().numpy()
