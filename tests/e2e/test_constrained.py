"""A dim that takes some sizes only: proven at the sizes that run, the rule named (a warning); --strict-dims
refuses, naming the sizes that run and fail."""

from __future__ import annotations

import pytest

from onnxport.core.errors import UsageError
from onnxport.core.samples import validation_cases
from onnxport.core.spec import Dim, merge_dims, parse_dim, parse_input
from onnxport.sources.finish import _pattern
from tests.conftest import FIXTURES, load_report

FX = FIXTURES / "constrained.py"


def test_listed_sizes_parse_and_snap():
    d = parse_dim("n=16, 4,9")
    assert (d.min, d.max, d.sizes, str(d)) == (4, 16, (4, 9, 16), "n=4,9,16")
    assert d.allows(9) and not d.allows(8) and d.snap(12) == 9 and d.snap(13) == 16
    with pytest.raises(UsageError):
        parse_dim("n=0,4")
    with pytest.raises(UsageError, match="sizes it takes"):
        parse_dim("n=4;9")
    dims = merge_dims([parse_input("x:float32[batch,n,8]")], [d])
    assert dims["n"].example in (4, 9, 16)
    assert all(c.sizes["n"] in (4, 9, 16) for c in validation_cases(dims))
    assert Dim("n", 1, 8).snap(20) == 8


def test_patterns_are_named_only_when_they_fit_every_probe():
    assert _pattern((4, 8, 12), (1, 2, 3, 5, 6, 7, 9)) == " (multiples of 4)"
    assert _pattern((1, 4, 9, 16), (2, 3, 5, 8)) == " (perfect squares)"
    assert _pattern((1, 2, 4, 8), (3, 5, 6, 7)) == " (powers of two)"
    assert _pattern((4, 8, 9), (1, 2, 3, 5)) == ""
    assert _pattern((64, 81, 100, 512), (32, 40, 48, 49, 56)) == " (at least 64)"  # AlexNet's sides
    assert _pattern((64, 90, 100), (32, 70)) == ""


def test_strict_dims_lists_the_sizes_that_run_and_writes_nothing(tmp_path, cli):
    out = tmp_path / "o"
    proc = cli("export", f"{FX}:Fours", "-i", "x:float32[batch,n,8]", "-d", "n=1..64", "--strict-dims",
                   "-o", str(out))
    assert proc.returncode == 2
    line = proc.stderr.strip()
    assert len(line.splitlines()) == 1 and "Traceback" not in proc.stderr
    assert "n: runs at 4, 8, 12, 16" in line and "fails at 1, 2, 3, 5" in line and "(multiples of 4)" in line
    assert "--strict-dims" in line and "-d n=4,8,12" in line
    assert not out.exists()


def test_a_square_grid_is_named(tmp_path, cli):
    proc = cli("export", f"{FX}:Grid", "-i", "x:float32[batch,n,8]", "-d", "n=1..100", "--strict-dims",
                   "-o", str(tmp_path / "o"))
    assert proc.returncode == 2 and "runs at 1, 4, 9, 16, 25" in proc.stderr and "(perfect squares)" in proc.stderr


def test_by_default_it_is_proven_at_the_sizes_that_run_and_the_rule_named(tmp_path, cli):
    out = tmp_path / "o"
    proc = cli("export", f"{FX}:Fours", "-i", "x:float32[batch,n,8]", "-d", "n=1..64", "-o", str(out))
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "constrained-dim" in proc.stdout + proc.stderr and "multiples of 4" in proc.stdout + proc.stderr
    rep = load_report(out)
    sizes = {c["sizes"]["n"] for c in rep["validation"]["cases"]}
    assert len(sizes) >= 3 and all(n % 4 == 0 for n in sizes)
    assert {d["symbol"] for d in rep["check"]["dynamic_dims"] if d["proven"]} == {"batch", "n"}
    assert any(d["code"] == "constrained-dim" and d["severity"] == "warning" and "multiples of 4" in d["message"]
               for d in rep["diagnostics"])
    assert rep["model"]["dims"]["n"]["rule"] == "multiples of 4"
    assert rep["model"]["dims"]["n"]["sizes"] == list(range(4, 65, 4))  # every multiple in range, not only probed
    flagged = cli("export", f"{FX}:Fours", "-i", "x:float32[batch,n,8]", "-d", "n=1..64", "--working-sizes",
                      "--exporter", "torchscript", "-o", str(tmp_path / "flagged"))
    assert flagged.returncode == 0  # the old spelling still works
    again = cli("export", f"{FX}:Fours", "-i", "x:float32[batch,n,8]", "-d", "n=4,12,32",
                    "--exporter", "torchscript", "-o", str(tmp_path / "declared"))
    assert again.returncode == 0  # the sizes declared by hand work the same way
    assert {c["sizes"]["n"] for c in load_report(tmp_path / "declared")["validation"]["cases"]} <= {4, 12, 32}


def test_every_constrained_dim_is_found_windows_in_h_and_w(tmp_path, cli):
    out = tmp_path / "o"
    proc = cli("export", f"{FX}:Windows", "-i", "x:float32[batch,3,h,w]", "-d", "h=8..64", "-d", "w=8..64",
                   "-o", str(out))
    assert proc.returncode == 0, proc.stderr[-2000:]
    rep = load_report(out)
    assert rep["model"]["dims"]["h"]["rule"] == rep["model"]["dims"]["w"]["rule"] == "multiples of 8"
    assert all(c["sizes"]["h"] % 8 == 0 and c["sizes"]["w"] % 8 == 0 for c in rep["validation"]["cases"])
    assert rep["status"] == "ok"


def test_an_example_size_that_fails_is_moved_to_sizes_that_run(tmp_path, cli):
    out = tmp_path / "o"  # h=64 and w=63 at export: the example itself fails, as a strided model's would
    proc = cli("export", f"{FX}:Windows", "-i", "x:float32[batch,3,h,w]", "-d", "h=16..64", "-d", "w=16..64",
                   "--exporter", "torchscript", "-o", str(out))
    assert proc.returncode == 0, proc.stderr[-2000:]
    dims = load_report(out)["model"]["dims"]
    assert dims["h"]["rule"] == dims["w"]["rule"] == "multiples of 8" and dims["w"]["export"] % 8 == 0


def test_the_torchscript_exporter_runs_a_constrained_model_at_sizes_it_takes(tmp_path, cli):
    """The TorchScript exporter finds which output axes follow which dim by running the model at a second size:
    a constrained dim's second size is one the model runs at (it was export+1, which a strided model refuses)."""
    out = tmp_path / "o"
    proc = cli("export", f"{FX}:Windows", "-i", "x:float32[batch,3,h,w]", "-d", "h=8..64", "-d", "w=8..64",
                   "--exporter", "torchscript", "-o", str(out))
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    rep = load_report(out)
    assert rep["status"] == "ok" and rep["export"]["exporter"] == "torchscript"
    assert {d["symbol"] for d in rep["check"]["dynamic_dims"] if d["proven"]} >= {"h", "w"}


def test_a_dim_too_small_for_the_strides_is_narrowed_to_a_range():
    """Every size from 15 runs: the dim becomes 15..64 (a range, not the probed sizes listed), rule named."""
    from onnxport.api import load_model

    loaded = load_model(f"{FX}:Strided", inputs=["x:float32[batch,n,8]"], dims=["n=4..64"])
    n = loaded.dims["n"]
    assert (n.min, n.max, n.sizes, n.rule) == (15, 64, None, "at least 15")
    (note,) = [d for d in loaded.diagnostics if d.code == "constrained-dim"]
    assert "at least 15 (15..64)" in note.message
