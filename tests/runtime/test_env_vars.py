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

    from onnxport import cli
    from onnxport.cli import main

    # the end of main() ends the process outright when a thread lingers (one left by an earlier test in this
    # worker would end the test run with it): exit by SystemExit here, what this test checks is the signals
    monkeypatch.setattr(cli, "_exit", sys.exit)
    monkeypatch.setattr(sys, "argv", ["onnxport", "check", "/nonexistent.onnx"])
    with pytest.raises(SystemExit) as done:
        main()
    assert done.value.code == 2
    assert signal.getsignal(signal.SIGTERM) == signal.SIG_IGN and signal.getsignal(signal.SIGINT) == signal.SIG_IGN


def test_the_plan_names_the_variable_its_cpu_features_came_from(monkeypatch):
    """The features given by $ONNXPORT_CPU_FLAGS are named as such, never as what /proc/cpuinfo holds."""
    from onnxport.optimize.plan import _openvino_plan
    from onnxport.runtime.openvino import bf16_missing

    monkeypatch.setenv("ONNXPORT_CPU_FLAGS", "avx2,fma")
    said = bf16_missing(["avx2", "fma"])
    assert "ONNXPORT_CPU_FLAGS='avx2,fma'" in said and "/proc/cpuinfo" not in said
    why: dict[str, str] = {}
    _openvino_plan(why, "attention", ["avx2", "fma"], calibrated=False)
    assert any("ONNXPORT_CPU_FLAGS='avx2,fma'" in w for w in why.values()), why
    assert not any("/proc/cpuinfo" in w or "this CPU" in w for w in why.values()), why
    monkeypatch.setenv("ONNXPORT_CPU_FLAGS", "avx512f,avx512_bf16")
    why = {}
    _openvino_plan(why, "attention", ["avx512f", "avx512_bf16"], calibrated=False)
    assert not any("this CPU" in w for w in why.values()), why
    monkeypatch.delenv("ONNXPORT_CPU_FLAGS")
    assert "in /proc/cpuinfo" in bf16_missing(["avx2"]) and bf16_missing(["avx2"]).startswith("this CPU")
