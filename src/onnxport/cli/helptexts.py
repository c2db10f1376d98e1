"""What ``--help`` shows beside the options themselves: the panels the options are grouped in, each command's
examples, and a help layout where a flag shows no value type (``--force``, not ``--force <bool>``).

Help texts are Rich markup: a literal ``[`` (``onnxport[view]``, ``float32[batch,8]``) is written through
:func:`literal`."""

from __future__ import annotations

from typing import Any

import typer.core
from rich.markup import escape

# option panels, in the order a command lists them
SOURCE = "Source and inputs"
EXPORT = "Export"
PROOF = "Proof"
OPTIMIZE = "Optimize"
BENCHMARK = "Benchmark"
RUNTIME = "Runtime and GPU"
SERVING = "Serving"
LIMITS = "Limits and timeouts"
OUTPUT = "Output"

# command panels of `onnxport --help`
PROVE_COMMANDS = "Export and prove"
DEPLOY_COMMANDS = "Deploy"
INSPECT_COMMANDS = "Inspect"


def literal(text: str) -> str:
    """``text`` shown as written (Rich would read ``[view]`` as a style tag and drop it)."""
    return escape(text)


PANELS = (SOURCE, EXPORT, PROOF, OPTIMIZE, BENCHMARK, SERVING, LIMITS, RUNTIME, OUTPUT)


def examples(*lines: str) -> str:
    """A command's epilog: its examples, one command line (or a ``# comment``) per line, shown literally."""
    return "[bold]Examples[/]\n" + literal("\n".join(f"  {line}" for line in lines))


def _panel_rank(param: Any) -> int:
    panel = getattr(param, "rich_help_panel", None)
    return PANELS.index(panel) if panel in PANELS else -1


class _Layout:
    """Panels in the order of :data:`PANELS`; a flag takes no value, so its row shows none (Typer would print
    ``<bool>``)."""

    def get_params(self, ctx: Any) -> list[Any]:
        params = sorted(super().get_params(ctx), key=_panel_rank)  # type: ignore[misc]
        for param in params:
            if getattr(param, "is_flag", False) and param.metavar is None:
                param.metavar = ""
        return params


class Command(_Layout, typer.core.TyperCommand):
    """Every onnxport command (``@app.command(cls=Command)``)."""


class Group(_Layout, typer.core.TyperGroup):
    """The ``onnxport`` app itself."""


CONVERT = examples(
    "onnxport convert torchvision:resnet18 -o out/resnet18",
    "onnxport convert hf:path/to/model-dir -o out/minilm --seq 128",
    "onnxport convert examples/text_classifier.py:TextClassifier \\",
    "    --model-args '{\"vocab_size\": 30000, \"embed_dim\": 256, \"num_classes\": 10}' \\",
    "    -i 'input_ids:int64[batch,seq]' -d batch=1..64 -d seq=1..512 -o out/tc",
    "onnxport convert torchvision:resnet18 --variants all --budget 300   # the full search",
)
EXPORT_EXAMPLES = examples(
    "onnxport export torchvision:resnet18 -o out/resnet18",
    "onnxport export model.py:Net -i 'x:float32[batch,16]' -d batch=1..32 -o out/net",
    "onnxport export hf:path/to/llama-dir --max-length 256 -o out/llama   # a causal LM with its KV cache",
)
COMPARE = examples(
    "onnxport compare model.py:Net other-tool.onnx -i 'x:float32[batch,16]' -o out/compare",
)
OPTIMIZE_EXAMPLES = examples(
    "onnxport optimize torchvision:resnet18 out/resnet18/model.onnx -o out/variants",
    "onnxport optimize hf:path/to/model-dir out/minilm/model.onnx --variants fused,int8 --seq 128",
)
BENCH = examples(
    "onnxport bench torchvision:resnet18 -b 1 -b 8 --seconds 5",
    "onnxport bench hf:path/to/model-dir out/minilm/model.onnx out/minilm/best.onnx --seq 16 --seq 128",
)
CHECK = examples("onnxport check out/resnet18/model.onnx", "onnxport check any.onnx --json")
SERVE = examples(
    "onnxport serve out/resnet18 --port 8000",
    "onnxport serve out/minilm --grpc-port 8001 --max-batch 16 --max-delay-ms 2",
    "curl -s localhost:8000/v2/models/resnet18   # its inputs and outputs",
)
TRITON = examples(
    "onnxport triton out/resnet18 --repo model-repo",
    "onnxport triton out/resnet18 --repo model-repo --gpu --instances 2 --max-batch 64",
)
VIEW = examples("onnxport view out/resnet18/model.onnx --port 8080")
REPORT = examples("onnxport report out/resnet18   # after editing or upgrading: report.html and report.md anew")
DOCTOR = examples("onnxport doctor", "onnxport doctor --json")
