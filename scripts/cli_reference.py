"""The command-line reference page (docs/cli.md on the site), written from the Typer app itself so that it cannot
drift from what ``onnxport COMMAND --help`` shows. The MkDocs hook (scripts/docs_hooks.py) builds the page on
every site build; ``python scripts/cli_reference.py`` prints it."""

from __future__ import annotations

import inspect
from typing import Any

import typer
import typer.core
import typer.main
from rich.text import Text

from onnxport.cli import app, helptexts

INTRO = """# Command line

Every command, its options grouped as `onnxport COMMAND --help` groups them, and its examples. This page is
written from the command-line app itself on every build of the site.

Exit codes: `0` proven · `1` exported but not proven (written as `model.unverified.onnx`) · `2` bad usage or
input · `3` export impossible · `4` environment problem (a missing dependency or device, no space left) ·
`130` / `143` stopped by SIGINT / SIGTERM · `70` internal error (rerun with `ONNXPORT_DEBUG=1` and report the
traceback).
"""


def _plain(markup: str) -> str:
    return Text.from_markup(inspect.cleandoc(markup)).plain


def _cell(text: str) -> str:
    text = " ".join(text.split())
    for char in "\\|*_[":  # literal in a Markdown table cell
        text = text.replace(char, "\\" + char)
    return text.replace("<", "&lt;")


def _usage(cmd: Any, ctx: Any) -> str:
    pieces = cmd.collect_usage_pieces(ctx)
    return " ".join(["onnxport", cmd.name or "", *pieces])


def _option_row(param: Any, ctx: Any) -> str:
    names = ", ".join(f"`{o}`" for o in [*param.opts, *param.secondary_opts])
    is_flag = getattr(param, "is_flag", False)
    value = "" if is_flag else param.display_type_rich(ctx=ctx)
    default = param.default
    shown = "" if default is None or is_flag or default == () or callable(default) else f"`{default}`"
    help_text = _plain(getattr(param, "help", None) or "")
    value = f"`{value}`" if value else ""
    return f"| {names} | {value} | {shown} | {_cell(help_text)} |"


def command_section(name: str, cmd: Any, parent: Any) -> str:
    ctx = typer.Context(cmd, info_name=name, parent=parent)
    lines = [f"## `{name}`", "", _plain(cmd.help or ""), "", "```text", _usage(cmd, ctx), "```", ""]
    args = [p for p in cmd.params if isinstance(p, typer.core.TyperArgument)]
    if args:
        lines += ["| argument | meaning |", "| --- | --- |"]
        lines += [f"| `{a.name.upper()}` | {_cell(_plain(getattr(a, 'help', '') or ''))} |" for a in args]
        lines.append("")
    options = [p for p in cmd.params if isinstance(p, typer.core.TyperOption)]
    panels: dict[str, list[Any]] = {}
    for opt in options:
        panels.setdefault(getattr(opt, "rich_help_panel", None) or "Options", []).append(opt)
    order = [p for p in helptexts.PANELS if p in panels] + [p for p in panels if p not in helptexts.PANELS]
    for panel in order:
        lines += [f"**{panel}**", "", "| option | value | default | meaning |", "| --- | --- | --- | --- |"]
        lines += [_option_row(opt, ctx) for opt in panels[panel]]
        lines.append("")
    if cmd.epilog:
        example_lines = _plain(cmd.epilog).splitlines()[1:]  # the first line is the "Examples" title
        lines += ["Examples:", "", "```console", *("$ " + ln.strip() if not ln.startswith("    ") else ln
                                                   for ln in example_lines), "```", ""]
    return "\n".join(lines)


def render() -> str:
    """The whole page."""
    group = typer.main.get_command(app)
    root = typer.Context(group, info_name="onnxport")
    sections = [INTRO, "| command | does |", "| --- | --- |"]
    for name in group.list_commands(root):
        cmd = group.get_command(root, name)
        sections.append(f"| [`{name}`](#{name}) | {_cell(_plain(cmd.help or '').split(chr(10) + chr(10))[0])} |")
    sections.append("")
    for name in group.list_commands(root):
        sections.append(command_section(name, group.get_command(root, name), root))
    return "\n".join(sections)


if __name__ == "__main__":
    print(render())
