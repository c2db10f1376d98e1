"""The environment variables onnxport reads are checked and named where they are wrong, and a signal after the
run changes nothing (issue 49)."""

from __future__ import annotations

import pytest

from onnxport.core.errors import UsageError
from onnxport.runtime import environment


@pytest.mark.parametrize("value", ["garbage!!", "", "☃,é", "avx2,bogus"])
def test_bad_cpu_flags_are_named(monkeypatch, value):
    monkeypatch.setenv("ONNXPORT_CPU_FLAGS", value)
    with pytest.raises(UsageError, match="ONNXPORT_CPU_FLAGS=") as e:
        environment.cpu()
    assert "\n" not in str(e.value)


def test_good_cpu_flags_plan_as_given(monkeypatch):
    monkeypatch.setenv("ONNXPORT_CPU_FLAGS", " AVX2, fma ")
    assert environment.cpu()["flags"] == ["avx2", "fma"]
    monkeypatch.delenv("ONNXPORT_CPU_FLAGS")
    assert environment.forced_cpu_flags() is None


def test_cli_names_the_variable_before_any_work(monkeypatch, tmp_path):
    from typer.testing import CliRunner

    from onnxport.cli import app

    monkeypatch.setenv("ONNXPORT_CPU_FLAGS", "garbage!!")
    got = CliRunner().invoke(app, ["export", "torchvision:resnet18", "-o", str(tmp_path / "out")])
    assert got.exit_code == 2 and "ONNXPORT_CPU_FLAGS" in got.output
    assert not (tmp_path / "out").exists()


def test_after_the_run_a_signal_changes_nothing(monkeypatch, capsys):
    import signal
    import sys

    from onnxport.cli import main

    monkeypatch.setattr(sys, "argv", ["onnxport", "check", "/nonexistent.onnx"])
    with pytest.raises(SystemExit) as done:
        main()
    assert done.value.code == 2
    assert signal.getsignal(signal.SIGTERM) == signal.SIG_IGN and signal.getsignal(signal.SIGINT) == signal.SIG_IGN
