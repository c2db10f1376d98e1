"""core helpers shared by every stage: an error on one line (core/errors.py: one_line) and removing a model
file with its external data (core/onnxfile.py: remove_model)."""

from __future__ import annotations

from onnxport.core.errors import UsageError, one_line
from onnxport.core.onnxfile import remove_model


def test_one_line_joins_whitespace_and_cuts_at_the_limit():
    e = RuntimeError("shape mismatch:\n    a is [2, 3]\n\tb is [3, 2]")
    assert one_line(e) == "shape mismatch: a is [2, 3] b is [3, 2]"
    assert one_line(e, 14) == "shape mismatch"
    assert one_line(e, 14, typed=True) == "RuntimeError: shape mismatch"
    assert one_line(KeyError(), typed=True) == "KeyError" and one_line(ValueError("")) == ""
    assert one_line("  two\nlines ") == "two lines"
    assert one_line(UsageError("bad", "fix it")) == "bad (hint: fix it)"  # str() of an onnxport error
    assert len(one_line(ValueError("x" * 500))) == 300


def test_remove_model_removes_the_file_and_its_external_data(tmp_path):
    model, data, other = tmp_path / "m.onnx", tmp_path / "m.onnx.data", tmp_path / "n.onnx.data"
    for f in (model, data, other):
        f.write_bytes(b"x")
    remove_model(model)
    assert not model.exists() and not data.exists() and other.exists()
    remove_model(model)  # nothing left: no error
    (tmp_path / "alone.onnx.data").write_bytes(b"x")
    remove_model(str(tmp_path / "alone.onnx"))
    assert not (tmp_path / "alone.onnx.data").exists()
