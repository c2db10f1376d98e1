"""Every option family reaches the decoder path (a causal LM exported with its KV cache) or is refused there
with exit 2 naming why — never silently ignored."""

from __future__ import annotations

import pytest

from onnxport import api
from onnxport.core.errors import UsageError
from onnxport.core.records import Tolerance


@pytest.mark.parametrize(("family", "kw", "named"), [
    ("load", {"dims": ["seq=1..64"]}, "--dim"),
    ("load", {"compare": ["logits=cosine"]}, "--compare"),
    ("load", {"working_sizes": True}, "--working-sizes"),
    ("load", {"strict_dims": True}, "--strict-dims"),
    ("load", {"model_args": {"hidden": 8}}, "--model-args"),
    ("export", {"exporter": "torchscript"}, "--exporter torchscript"),
    ("proof", {"samples": "prompts.txt"}, "--samples"),
    ("optimize", {"seq": 200}, "--seq 200"),
])
def test_options_that_do_not_apply_to_a_decoder_are_refused(llama_dir, tmp_path, family, kw, named):
    out = tmp_path / "o"
    with pytest.raises(UsageError) as e:
        api.convert(f"hf:{llama_dir}", out, max_length=24, **kw)
    assert named in e.value.message and e.value.exit_code == 2, (family, e.value.message)
    assert not out.exists()  # refused before anything was written


def test_the_benchmark_command_is_refused_for_a_decoder(llama_dir, tmp_path):
    with pytest.raises(UsageError) as e:
        api.benchmark(f"hf:{llama_dir}", tmp_path / "o", bench={"batches": (1, 4), "max_seconds": 3.0})
    assert "onnxport bench (--batch, --seconds)" in e.value.message and "decode tokens/s" in e.value.message


def test_the_benchmark_command_is_refused_for_a_decoder_through_the_cli(llama_dir, tmp_path):
    from tests.conftest import run_cli

    proc = run_cli("bench", f"hf:{llama_dir}", "-o", str(tmp_path / "o"), "--batch", "4")
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert "--batch" in proc.stderr and "Traceback" not in proc.stderr and not (tmp_path / "o").exists()


@pytest.mark.slow
def test_export_proof_optimize_and_bench_options_reach_the_decoder(llama_dir, tmp_path):
    """opset (export), tolerance (proof), variants + budget + seq (optimize) and threads (bench) all show in
    the decoder's report."""
    out = tmp_path / "o"
    rep = api.convert(f"hf:{llama_dir}", out, max_length=24, opset=22, tolerance=Tolerance(2e-4, 2e-3),
                      variants=["int8", "int4"], budget=1e-3, seq=6, threads=1)
    assert rep["status"] == "ok", rep["summary"]
    assert rep["export"]["opset"] == 22
    assert rep["validation"]["tolerance"] == {"atol": 2e-4, "rtol": 2e-3}
    made = rep["decoder"]["variants"]
    assert made["threads"] == 1 and made["speed_prompt"] == 6
    names = [v["name"] for v in made["variants"]]
    assert names == ["export", "int8", "int4"]  # fused not asked for
    later = [v for v in made["variants"] if v["name"] != "export"]
    assert all(v.get("skip_reason") == "budget" and not v["passed"] for v in later), later  # the budget was spent
