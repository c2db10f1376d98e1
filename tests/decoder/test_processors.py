"""The generation config's rules in numpy (:mod:`onnxport.core.greedy`) against transformers' own logits
processors on random scores and histories, the rules read from generation configs (what cannot be applied is
named), and generate()'s end-of-sequence handling (stop, pad after the end)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from transformers import GenerationConfig
from transformers.generation import logits_process as lp

from onnxport.core.greedy import PLAIN, GreedyRules, rules_from_config, whisper_prompt

VOCAB = 40


def _hf_scores(processors: list, ids: np.ndarray, logits: np.ndarray) -> np.ndarray:
    scores = torch.from_numpy(logits.copy())
    for p in processors:
        scores = p(torch.from_numpy(ids), scores)
    return scores.numpy()


def _history(seed: int, batch: int = 3, length: int = 9) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    ids = rng.integers(0, 12, (batch, length))  # few distinct tokens: n-grams and repeats occur
    return ids, rng.standard_normal((batch, VOCAB)).astype(np.float32) * 3


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize(("rules", "hf"), [
    (GreedyRules(repetition_penalty=1.7), lambda r, n, m: [lp.RepetitionPenaltyLogitsProcessor(1.7)]),
    (GreedyRules(no_repeat_ngram_size=2), lambda r, n, m: [lp.NoRepeatNGramLogitsProcessor(2)]),
    (GreedyRules(no_repeat_ngram_size=1), lambda r, n, m: [lp.NoRepeatNGramLogitsProcessor(1)]),
    (GreedyRules(bad_words_ids=((5,), (3, 4), (7, 7, 9)), eos_token_ids=(2,)),
     lambda r, n, m: [lp.NoBadWordsLogitsProcessor([[5], [3, 4], [7, 7, 9]], torch.tensor([2]))]),
    (GreedyRules(min_length=12, eos_token_ids=(2, 6)), lambda r, n, m: [lp.MinLengthLogitsProcessor(12, [2, 6])]),
    (GreedyRules(forced_eos_token_ids=(2,)), lambda r, n, m: [lp.ForcedEOSTokenLogitsProcessor(m, [2])]),
    (GreedyRules(suppress_tokens=(0, 1, 39)), lambda r, n, m: [lp.SuppressTokensLogitsProcessor([0, 1, 39])]),
    (GreedyRules(begin_suppress_tokens=(4, 8)),
     lambda r, n, m: [lp.SuppressTokensAtBeginLogitsProcessor([4, 8], n)]),
    (GreedyRules(repetition_penalty=0.8, no_repeat_ngram_size=3, min_new_tokens=2, eos_token_ids=(3,),
                 forced_eos_token_ids=(3,), suppress_tokens=(11,)),
     lambda r, n, m: [lp.RepetitionPenaltyLogitsProcessor(0.8), lp.NoRepeatNGramLogitsProcessor(3),
                      lp.MinNewTokensLengthLogitsProcessor(n, 2, [3]), lp.ForcedEOSTokenLogitsProcessor(m, [3]),
                      lp.SuppressTokensLogitsProcessor([11])]),
])
def test_scores_equal_transformers_processors(rules, hf, seed):
    """Every step of a decoding: the processed scores equal transformers' (the -inf entries too)."""
    ids, _ = _history(seed)
    prompt = 5
    decoding = rules.start(ids[:, :prompt], max_new_tokens=ids.shape[1] - prompt + 1)
    processors = hf(rules, prompt, decoding.max_length)
    rng = np.random.default_rng(100 + seed)
    for k in range(prompt, ids.shape[1] + 1):
        decoding.ids = ids[:, :k]
        logits = rng.standard_normal((ids.shape[0], VOCAB)).astype(np.float32) * 3
        want = _hf_scores(processors, ids[:, :k], logits)
        got = decoding.scores(logits)
        np.testing.assert_array_equal(np.isneginf(got), np.isneginf(want))
        np.testing.assert_allclose(got[np.isfinite(got)], want[np.isfinite(want)], rtol=1e-6)


def test_forced_bos_and_begin_index():
    """Forced BOS at the first step after a one-token start; begin-suppress moves one step later with it."""
    rules = GreedyRules(forced_bos_token_id=7, begin_suppress_tokens=(9,))
    decoding = rules.start(np.array([[2], [2]]), 4)
    logits = np.zeros((2, VOCAB), np.float32)
    logits[:, 9] = 5
    assert decoding.step(logits).tolist() == [7, 7]
    assert decoding.begin_index == 2 and decoding.step(logits).tolist() != [9, 9]
    assert decoding.step(logits).tolist() == [9, 9]


def test_repetition_penalty_leaves_left_padding_out():
    """The padded positions of a left-padded prompt are not penalised (generate's prompt_ignore_length)."""
    rules = GreedyRules(repetition_penalty=100.0)
    ids, mask = np.array([[5, 5, 6], [5, 5, 6]]), np.array([[0, 0, 1], [1, 1, 1]])
    logits = np.zeros((2, VOCAB), np.float32)
    logits[:, 5] = 2.0
    logits[:, 8] = 1.0
    got = rules.start(ids, 2, mask).step(logits)
    assert got.tolist() == [5, 8]  # row 0's 5s are padding; row 1's 5 is penalised (2/100) below token 8


def test_finished_rows_get_the_pad_token_and_the_decoding_ends():
    rules = GreedyRules(eos_token_ids=(3, 4), pad_token_id=0)
    decoding = rules.start(np.array([[1], [1]]), 5)
    first, second = np.zeros((2, VOCAB), np.float32), np.zeros((2, VOCAB), np.float32)
    first[0, 3], first[1, 8] = 1, 1
    second[:, 4] = 1
    assert decoding.step(first).tolist() == [3, 8] and not decoding.finished
    assert decoding.step(second).tolist() == [0, 4] and decoding.finished
    assert GreedyRules(eos_token_ids=(3,)).pad == 3 and PLAIN.pad == 0


def test_rules_read_from_a_generation_config_name_what_they_cannot_apply():
    config = GenerationConfig(do_sample=True, num_beams=4, repetition_penalty=1.2, no_repeat_ngram_size=3,
                              eos_token_id=[2, 5], pad_token_id=1, forced_bos_token_id=9, forced_eos_token_id=2,
                              min_new_tokens=3, suppress_tokens=[4], begin_suppress_tokens=[6],
                              sequence_bias={(7,): -2.0}, encoder_no_repeat_ngram_size=2)
    rules = rules_from_config(config, encoder_decoder=True)
    assert rules.eos_token_ids == (2, 5) and rules.pad == 1 and rules.forced_bos_token_id == 9
    assert rules.forced_eos_token_ids == (2,) and rules.min_new_tokens == 3 and rules.repetition_penalty == 1.2
    named = " ".join(rules.not_applied)
    for name in ("do_sample=True", "num_beams=4", "sequence_bias", "encoder_no_repeat_ngram_size=2"):
        assert name in named
    assert set(rules.applied) >= {"eos_token_ids", "repetition_penalty", "no_repeat_ngram_size", "min_new_tokens",
                                  "forced_bos_token_id", "forced_eos_token_ids", "suppress_tokens",
                                  "begin_suppress_tokens"}
    assert GreedyRules.from_dict(rules.to_dict()) == rules
    assert GreedyRules.from_dict(None) == PLAIN and PLAIN.applied == () and rules.without_eos().eos_token_ids == ()
    plain = rules_from_config(GenerationConfig(), encoder_decoder=False)
    assert plain.not_applied == () and plain.applied == ()


def test_whisper_prompt_from_language_task_and_forced_decoder_ids():
    config = GenerationConfig(lang_to_id={"<|en|>": 50, "<|de|>": 51}, task_to_id={"transcribe": 60,
                                                                                   "translate": 61},
                              no_timestamps_token_id=70, language="de", task="translate")
    assert whisper_prompt(config) == (51, 61, 70)
    assert rules_from_config(config, encoder_decoder=True).decoder_prompt == (51, 61, 70)
    assert rules_from_config(config, encoder_decoder=False).decoder_prompt == ()
    forced = GenerationConfig(forced_decoder_ids=[[1, 50], [2, 60]])
    assert rules_from_config(forced, encoder_decoder=True).decoder_prompt == (50, 60)
    gaps = rules_from_config(GenerationConfig(forced_decoder_ids=[[2, 60]]), encoder_decoder=True)
    assert gaps.decoder_prompt == () and "forced_decoder_ids" in gaps.not_applied[0]
