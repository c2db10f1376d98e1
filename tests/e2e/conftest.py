"""The end-to-end tests run commands through the ``cli`` fixture (tests/fixtures/forked_cli.py) unless they are
about the start-up, signals or ending of ``python -m onnxport`` itself."""

from tests.fixtures.forked_cli import cli  # noqa: F401  (a fixture)
