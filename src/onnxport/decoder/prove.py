"""The proof of a decoder with its cache: each step case (batch × past × new tokens) against PyTorch, then
greedy generation by onnxruntime (presents fed back as past) against ``model.generate`` token for token."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
from torch import nn

from onnxport.core.errors import UsageError, one_line
from onnxport.core.records import FP32, Tolerance
from onnxport.decoder.generation import generate_greedy
from onnxport.decoder.layout import CachedDecoder, step_inputs
from onnxport.decoder.records import CacheLayout, DecoderProof, GenerationCheck, StepCase
from onnxport.runtime.sessions import session

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


def prove_decoder(model: nn.Module, layout: CacheLayout, path: str | Path, *, tolerance: Tolerance = FP32,
                  new_tokens: int = NEW_TOKENS, seed: int = 0) -> DecoderProof:
    """Every :func:`step_matrix` case, then greedy generation (one unpadded row; a batch with left padding)."""
    sess = session(path, providers=["CPUExecutionProvider"])
    wrapper = CachedDecoder(model, layout).eval()
    cases = tuple(step_case(sess, wrapper, layout, b, p, n, tolerance, seed + i)
                  for i, (b, p, n) in enumerate(step_matrix(layout.max_length)))
    gen = torch.Generator().manual_seed(seed)
    prompt = min(5, layout.max_length - new_tokens)
    if prompt < 1:
        raise UsageError(f"--max-length {layout.max_length} leaves no room for {new_tokens} generated tokens",
                         f"give --max-length {new_tokens + 5} or more")
    single = torch.randint(0, layout.vocab, (1, prompt), generator=gen)
    lengths = (prompt, 1, max(1, prompt - 2))
    batch = torch.randint(0, layout.vocab, (len(lengths), prompt), generator=gen)
    mask = torch.tensor([[0] * (prompt - n) + [1] * n for n in lengths])
    gens = (generation_check("one row", sess, model, layout, single, torch.ones_like(single), new_tokens),
            generation_check("left-padded batch", sess, model, layout, batch, mask, new_tokens))
    return DecoderProof(tolerance, cases, gens)


def step_case(sess, wrapper: nn.Module, layout: CacheLayout, batch: int, past: int, new: int,
              tolerance: Tolerance, seed: int) -> StepCase:
    """One step with random tokens and a random cache, onnxruntime against the PyTorch model."""
    feeds = step_inputs(layout, batch=batch, past=past, new=new, seed=seed)
    with torch.inference_mode():
        want = [t.float().numpy() for t in wrapper(*feeds)]
    try:
        got = sess.run(list(layout.output_names), {n: t.numpy() for n, t in zip(layout.input_names, feeds)})
    except Exception as e:  # noqa: BLE001 - recorded as the case's failure
        return StepCase(batch, past, new, float("inf"), float("inf"), float("inf"), False,
                        one_line(e, 240))
    abs_errs, rel, ok = [], 0.0, True
    for g, w in zip(got, want):
        if g.shape != w.shape:
            return StepCase(batch, past, new, float("inf"), float("inf"), float("inf"), False,
                            f"shape {list(g.shape)} where PyTorch gives {list(w.shape)}")
        diff = np.abs(g.astype(np.float64) - w)
        abs_errs.append(float(diff.max(initial=0.0)))
        rel = max(rel, float((diff / np.maximum(np.abs(w), 1e-12)).max(initial=0.0)))
        ok = ok and bool(np.all(diff <= tolerance.atol + tolerance.rtol * np.abs(w)))
    return StepCase(batch, past, new, abs_errs[0], max(abs_errs[1:], default=0.0), rel, ok)


def generation_check(name: str, sess, model: nn.Module, layout: CacheLayout, input_ids: torch.Tensor,
                     attention_mask: torch.Tensor, new_tokens: int) -> GenerationCheck:
    """``new_tokens`` greedy tokens by :func:`greedy` against ``model.generate(do_sample=False)``."""
    lengths = tuple(int(n) for n in attention_mask.sum(-1))
    return GenerationCheck.of(name, lengths, new_tokens, lambda: (
        greedy(sess, layout, input_ids.numpy(), attention_mask.numpy(), new_tokens),
        reference_generate(model, input_ids, attention_mask, new_tokens)))


def greedy(sess, layout: CacheLayout, input_ids: np.ndarray, attention_mask: np.ndarray,
           new_tokens: int) -> np.ndarray:
    """Greedy generation with the exported model: the prompt on an empty cache, then one token per step with
    the presents fed back as past, the mask extended by one and position ids from the mask's cumsum (as
    transformers does for left padding). Returns [batch, new_tokens] token ids; a prompt that leaves no room
    for them is a UsageError."""
    return generate_greedy(sess, layout, input_ids, attention_mask, new_tokens)


def reference_generate(model: nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                       new_tokens: int) -> np.ndarray:
    """``model.generate`` greedy, exactly ``new_tokens`` tokens: [batch, new_tokens]. The model's own
    end-of-sequence token does not stop it (``generate`` would fill the rest of a stopped row with padding,
    and a correct export would look diverged), so the model's generation config is swapped for one without
    it for the call."""
    import copy

    config = copy.deepcopy(model.generation_config)
    config.update(do_sample=False, num_beams=1, max_new_tokens=new_tokens, min_new_tokens=0, use_cache=True,
                  eos_token_id=None, pad_token_id=0, bos_token_id=None, temperature=None, top_p=None, top_k=None)
    saved = model.generation_config
    model.generation_config = config  # unset fields fall back to the model's: its eos must not be there
    try:
        with torch.inference_mode():
            out = model.generate(input_ids=input_ids, attention_mask=attention_mask, generation_config=config)
    finally:
        model.generation_config = saved
    return out[:, input_ids.shape[1]:].numpy()
