"""MkDocs hooks (mkdocs.yml): the command-line reference page is written from the app on every build."""

from __future__ import annotations

import sys
from pathlib import Path

from mkdocs.structure.files import File

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE.parent / "src"), str(HERE)]  # document the source the site is built from

import cli_reference  # noqa: E402


def on_files(files, config):
    files.append(File.generated(config, "cli.md", content=cli_reference.render()))
    return files
