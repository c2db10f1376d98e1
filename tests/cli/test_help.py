"""What --help shows: options grouped into panels, no value type on a flag, examples, extras' names as written."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from onnxport.cli import app, helptexts
from tests.conftest import run_cli

COMMANDS = ("convert", "export", "compare", "optimize", "bench", "check", "serve", "triton", "view", "report",
            "doctor")


def _help(*args: str) -> str:
    result = CliRunner().invoke(app, [*args, "--help"], env={"COLUMNS": "120", "NO_COLOR": "1"})
    assert result.exit_code == 0, result.output
    return result.output


def test_the_app_prints_an_extras_name_as_written():
    proc = run_cli("--help")
    assert proc.returncode == 0, proc.stderr
    assert "pip install 'onnxport[view]'" in proc.stdout
    assert "<bool>" not in proc.stdout
    for panel in (helptexts.PROVE_COMMANDS, helptexts.DEPLOY_COMMANDS, helptexts.INSPECT_COMMANDS):
        assert panel in proc.stdout


def test_convert_groups_its_options_in_panels_in_order():
    text = _help("convert")
    panels = [helptexts.SOURCE, helptexts.EXPORT, helptexts.PROOF, helptexts.OPTIMIZE, helptexts.BENCHMARK,
              helptexts.RUNTIME, helptexts.OUTPUT]
    where = [text.index(f"─ {panel} ─") for panel in panels]
    assert where == sorted(where), where
    assert "<bool>" not in text
    # a literal bracket survives (Rich markup would eat it)
    assert "NAME:DTYPE[d0,d1,...]{LO..HI}" in text
    assert "-i 'input_ids:int64[batch,seq]'" in text


@pytest.mark.parametrize("command", COMMANDS)
def test_every_command_has_examples_and_no_bool_metavar(command):
    text = _help(command)
    assert "Examples" in text and f"onnxport {command}" in text.split("Examples", 1)[1]
    assert "<bool>" not in text


def test_flags_still_parse_as_flags():
    """The layout changes what help shows, not how a flag parses: --json takes no value."""
    result = CliRunner().invoke(app, ["check", "nowhere.onnx", "--json"])
    assert "requires an argument" not in result.output
