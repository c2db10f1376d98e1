"""The family contract (docs/architecture.md, "Model families"): pipeline, report and serve ask
onnxport.families and import no family package; the registry's families do not depend on what was imported."""

from __future__ import annotations

import shutil
import subprocess
import sys

from tests.architecture.test_layers import SRC, _lint_imports

ORDER = "from onnxport import families; print([f.name for f in families.families()])"


def test_a_family_import_in_the_pipeline_breaks_the_families_contract(tmp_path):
    copy = tmp_path / "onnxport"
    shutil.copytree(SRC, copy, ignore=shutil.ignore_patterns("__pycache__"))
    pipeline = copy / "pipeline.py"
    pipeline.write_text(pipeline.read_text() + "\n\ndef _late():\n    from onnxport import decoder  # a family\n")
    proc = _lint_imports(tmp_path)
    assert proc.returncode == 1, proc.stdout
    assert "Families" in proc.stdout and "onnxport.pipeline -> onnxport.decoder" in proc.stdout


def test_the_families_do_not_depend_on_what_was_imported_first():
    runs = [subprocess.run([sys.executable, "-c", f"{first}; {ORDER}"], capture_output=True, text=True, timeout=300)
            for first in ("import onnxport.decoder.family, onnxport.seq2seq", "import onnxport.serve")]
    expected = "['seq2seq', 'decoder', 'diffusion', 'model']"
    assert [r.stdout.strip() for r in runs] == [expected] * 2, [r.stderr for r in runs]


def test_the_families_add_their_server_extensions_and_repository_entries():
    """serve/ asks the families for what it serves beyond infer: the generate extension (the decoder's, bound by
    the encoder-decoder too) and the encoder-decoder's python-backend Triton entry."""
    from onnxport import families
    from onnxport.families.serving import extensions

    assert [e.name for e in extensions()] == ["generate"]
    assert [v.name for v in extensions()[0].verbs] == ["generate", "generate_stream"]
    assert [f.name for f in families.families() if f.repository is not None] == ["seq2seq"]
