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


def test_a_killed_runs_staging_folder_is_removed_by_the_next_run(tmp_path):
    """SIGKILL leaves OUT/.onnxport-run-*/ (with a report.json saying ok) behind; the next run into OUT removes it."""
    from onnxport.core.outdir import STAGE_PREFIX, output_folder

    out = tmp_path / "out"
    stale = out / f"{STAGE_PREFIX}dead"
    stale.mkdir(parents=True)
    (stale / "report.json").write_text('{"status": "ok"}')
    with output_folder(out, force=False) as stage:
        assert not stale.exists() and stage.exists()
        (stage / "report.json").write_text("{}")
    assert [p.name for p in out.iterdir() if p.name.startswith(STAGE_PREFIX)] == []
    assert (out / "report.json").read_text() == "{}"
