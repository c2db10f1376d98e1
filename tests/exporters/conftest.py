"""Commands whose claim is a process of their own (an exit status, a library loaded into a fresh process) run
through the ``cli`` fixture (tests/fixtures/forked_cli.py): each its own process, without the CLI's imports
paid again."""

from tests.fixtures.forked_cli import cli  # noqa: F401  (a fixture)
