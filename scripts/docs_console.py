"""Every console block of the README and of docs/ is output of this version: this script re-runs each block's
commands and writes their output into the page.

A console block is a fenced ``console`` block whose lines starting with ``$ onnxport`` are commands; the lines
after a command, up to the next one, are its output. A comment on the line before the fence trims what is kept:

    <!-- console: keep="^(✔|✘|error|  dim)" cut=200 -->

``keep``: only the output lines matching this regular expression, and any one-line ``error:`` (the run's full
output otherwise); ``cut``: lines longer than this many characters end in `` ...``. Each block's commands run in
order, in a scratch folder of the block's own where ``examples/`` and ``tests/`` are the repository's, so their
paths read as in a clone.

    python scripts/docs_console.py            # rewrite every block (minutes: real exports)
    python scripts/docs_console.py --cheap    # rewrite the cheap blocks only (--help, doctor): seconds
    python scripts/docs_console.py --check    # exit 1 when a cheap block is out of date
"""

from __future__ import annotations

import argparse
import os
import re
import shlex
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
FILES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
BLOCK = re.compile(r"(?P<directive><!-- console:(?P<args>[^>]*)-->\n)?```console\n(?P<body>.*?)```", re.S)
WIDTH = "100"  # the terminal width --help is rendered at


@dataclass
class Command:
    line: str  # as written, without the "$ "
    output: list[str] = field(default_factory=list)

    @property
    def cheap(self) -> bool:
        args = shlex.split(self.line)
        return "--help" in args or args[1:2] == ["doctor"]


@dataclass
class Block:
    path: Path
    start: int
    end: int
    keep: str | None
    cut: int | None
    commands: list[Command]


def blocks(path: Path) -> list[Block]:
    """The console blocks of ``path`` that hold onnxport commands."""
    found = []
    for m in BLOCK.finditer(path.read_text()):
        args = dict(re.findall(r'(\w+)=("[^"]*"|\S+)', m.group("args") or ""))
        commands: list[Command] = []
        for line in m.group("body").splitlines():
            if line.startswith("$ onnxport"):
                commands.append(Command(line[2:]))
            elif commands:
                commands[-1].output.append(line)
        if commands:
            keep = args.get("keep", "").strip('"') or None
            cut = int(args["cut"]) if "cut" in args else None
            found.append(Block(path, m.start("body"), m.end("body"), keep, cut, commands))
    return found


def _onnxport() -> list[str]:
    """The console script beside this Python (so that usage lines read `onnxport`), else `python -m onnxport`."""
    script = Path(sys.executable).with_name("onnxport")
    return [str(script)] if script.is_file() else [sys.executable, "-m", "onnxport"]


def run(command: Command, scratch: Path) -> list[str]:
    """The command's output as a terminal shows it (stderr and stdout, in that order)."""
    env = dict(os.environ, COLUMNS=WIDTH, NO_COLOR="1", TERM="dumb", ONNXPORT_DEBUG="")
    src = str(ROOT / "src")  # this checkout's onnxport, whichever the environment has installed
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [src, os.environ.get("PYTHONPATH")]))
    args = shlex.split(command.line)[1:]
    proc = subprocess.run([*_onnxport(), *args], capture_output=True, text=True, env=env, cwd=scratch,
                          timeout=1800)
    return [ln.rstrip() for ln in (proc.stderr + proc.stdout).splitlines()]


def trim(lines: list[str], keep: str | None, cut: int | None) -> list[str]:
    if keep:  # a one-line error is always kept: a block never hides that its command failed
        lines = [ln for ln in lines if re.search(keep, ln) or ln.startswith("error:")]
    if cut:
        lines = [ln if len(ln) <= cut else ln[:cut].rstrip() + " ..." for ln in lines]
    while lines and not lines[-1]:
        lines.pop()
    return lines


def render(block: Block, outputs: list[list[str]]) -> str:
    text: list[str] = []
    for command, output in zip(block.commands, outputs):
        text += [""] if text else []  # a blank line between two commands of one block
        text += [f"$ {command.line}", *trim(output, block.keep, block.cut)]
    return "\n".join(text) + "\n"


def scratch_folder() -> tempfile.TemporaryDirectory:
    tmp = tempfile.TemporaryDirectory(prefix="onnxport-docs-")
    for name in ("examples", "tests"):
        (Path(tmp.name) / name).symlink_to(ROOT / name)
    return tmp


def _labels(lines: list[str]) -> list[str]:
    """doctor's row names: its values (versions, CPU flags, libraries that do not load) are the machine's own."""
    names = [ln.split("│")[1].strip() for ln in lines if ln.count("│") >= 3]
    return [name for name in names if name and name != "unloadable"]


def stale(only_cheap: bool = True) -> list[str]:
    """The commands whose block differs from what this version prints (doctor: its rows' names)."""
    problems = []
    with scratch_folder() as tmp:
        for path in FILES:
            for block in blocks(path):
                for command in block.commands:
                    if only_cheap and not command.cheap:
                        continue
                    now = trim(run(command, Path(tmp)), block.keep, block.cut)
                    written = trim(command.output, None, None)
                    same = (_labels(now) == _labels(written)) if "doctor" in command.line else now == written
                    if not same:
                        problems.append(f"{path.relative_to(ROOT)}: $ {command.line}")
    return problems


def rewrite(path: Path, only_cheap: bool = False) -> None:
    """Re-run the blocks of ``path``, each in a scratch folder of its own, and write their output into it
    (``only_cheap``: the --help and doctor commands; the others keep what is written)."""
    text = path.read_text()
    for block in reversed(blocks(path)):  # from the end, so the earlier offsets stay right
        if only_cheap and not any(command.cheap for command in block.commands):
            continue
        print(f"{path.relative_to(ROOT)}: " + "; ".join(c.line for c in block.commands), file=sys.stderr)
        with scratch_folder() as tmp:
            outputs = [run(command, Path(tmp)) if command.cheap or not only_cheap else command.output
                       for command in block.commands]
        text = text[:block.start] + render(block, outputs) + text[block.end:]
    path.write_text(text)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="check the cheap blocks instead of rewriting")
    parser.add_argument("--cheap", action="store_true", help="rewrite the cheap blocks only (--help, doctor)")
    parser.add_argument("files", nargs="*", type=Path, help="pages to rewrite (default: the README and docs/)")
    args = parser.parse_args()
    if args.check:
        problems = stale()
        print("\n".join(problems) or "every cheap console block is up to date")
        return 1 if problems else 0
    for path in [p.resolve() for p in args.files] or FILES:
        rewrite(path, only_cheap=args.cheap)
    return 0


if __name__ == "__main__":
    sys.exit(main())
