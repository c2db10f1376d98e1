"""Code outside a family's package names no family (docs/architecture.md, "Model families"): the identifiers
and attribute names that name a family's concepts (decoder, seq2seq, past_key_values, encoder_model,
generate, with_past) are counted outside the family packages, comments and strings left out."""

from __future__ import annotations

import io
import re
import tokenize
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[2] / "src" / "onnxport"
FAMILY_PACKAGES = ("decoder", "seq2seq", "diffusion")
NAMES = re.compile(r"decoder|seq2seq|past_key|encoder_model|generat|with_past", re.IGNORECASE)
# What is left, per file (a file not named: none). Not a family's concept, though the words match: torch's and
# typing's Generator (bench/peak.py, core/samples.py, exporters/chain.py), NNCF's generated calibration inputs
# (optimize/nncf_int8.py), degenerate boxes (prove/detections.py), prometheus_client's generate_latest
# (serve/app.py), transformers' names (core/greedy.py's generation config, sources/hf.py's encoder-decoder
# inputs). Lower a number when a change removes names.
MOST = {
    "bench/peak.py": 9, "core/samples.py": 5, "exporters/chain.py": 2, "optimize/nncf_int8.py": 4,
    "prove/detections.py": 2, "serve/app.py": 1, "core/greedy.py": 4, "sources/hf.py": 3,
}


def family_tokens(text: str) -> list[str]:
    """The NAME tokens of `text` (Python source) that name a family's concept."""
    return [tok.string for tok in tokenize.generate_tokens(io.StringIO(text).readline)
            if tok.type == tokenize.NAME and NAMES.search(tok.string)]


def counts() -> dict[str, int]:
    found = {}
    for path in sorted(SRC.rglob("*.py")):
        rel = path.relative_to(SRC)
        if rel.parts[0] in FAMILY_PACKAGES:
            continue
        n = len(family_tokens(path.read_text()))
        if n:
            found[str(rel)] = n
    return found


def test_the_counter_counts_names_and_skips_comments_and_strings():
    snippet = ('"""A decoder docstring."""\n# seq2seq comment\nx = "with_past"\n'
               'def f(decoder_layout):\n    return decoder_layout.past_key_values, generate(Seq2SeqThing)\n')
    assert family_tokens(snippet) == ["decoder_layout", "decoder_layout", "past_key_values", "generate",
                                      "Seq2SeqThing"]


def test_code_outside_the_family_packages_names_no_family():
    over = {name: (n, MOST.get(name, 0)) for name, n in counts().items() if n > MOST.get(name, 0)}
    assert not over, f"names of a family's concepts outside its package (file: (found, allowed)): {over}"


def test_a_new_name_outside_the_family_packages_is_counted(tmp_path, monkeypatch):
    module = tmp_path / "serve" / "extra.py"
    module.parent.mkdir()
    module.write_text("def answer(seq2seq_layout):\n    return seq2seq_layout.with_past  # decoder\n")
    monkeypatch.setattr(__import__(__name__, fromlist=["SRC"]), "SRC", tmp_path)
    assert counts() == {"serve/extra.py": 3}
    with pytest.raises(AssertionError, match="serve/extra.py"):
        test_code_outside_the_family_packages_names_no_family()


if __name__ == "__main__":
    for name, n in counts().items():
        print(f"{n:4d}  {name}")
    print(f"{sum(counts().values()):4d}  total")
