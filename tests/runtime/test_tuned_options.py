"""report.json's ``benchmark.tuned`` (bench's tuning) read once into runtime.OrtOptions: both shapes, the options it
leaves out unset (ONNX Runtime's defaults), None when it sets nothing, and the same UsageError as before for an
execution mode or optimization level it does not know."""

from __future__ import annotations

import pytest

from onnxport.core.errors import UsageError
from onnxport.runtime.sessions import OrtOptions

TUNED = {"intra_op_num_threads": 4, "inter_op_num_threads": 2, "execution_mode": "parallel",
         "graph_optimization_level": "extended", "enable_mem_pattern": False, "enable_cpu_mem_arena": True}
RECORD = OrtOptions(intra_op_num_threads=4, inter_op_num_threads=2, execution_mode="parallel",
                    graph_optimization_level="extended", enable_mem_pattern=False, enable_cpu_mem_arena=True)


def test_the_flat_and_the_nested_tuned_dict_read_into_the_same_record():
    assert OrtOptions.from_tuned(TUNED) == RECORD
    assert OrtOptions.from_tuned({"config": TUNED, "p50_ms": 1.5, "speedup": 1.1}) == RECORD


def test_what_the_report_leaves_out_stays_unset():
    only = OrtOptions.from_tuned({"intra_op_num_threads": 3})
    assert only == OrtOptions(intra_op_num_threads=3, execution_mode=None, graph_optimization_level=None)
    assert only.execution_mode is None and only.graph_optimization_level is None  # not OrtOptions' defaults
    odd = OrtOptions.from_tuned({"intra_op_num_threads": 0, "inter_op_num_threads": "2", "enable_mem_pattern": 0,
                                 "execution_mode": "sequential"})
    assert odd == OrtOptions(execution_mode="sequential", graph_optimization_level=None)


@pytest.mark.parametrize("tuned", [None, [1, 2], "fast", {}, {"p50_ms": 2.0}, {"intra_op_num_threads": -1},
                                   {"config": {}}, {"execution_mode": None}])
def test_nothing_tuned_is_none(tuned):
    assert OrtOptions.from_tuned(tuned) is None


@pytest.mark.parametrize(("tuned", "message", "hint"), [
    ({"execution_mode": "sideways"}, "report.json benchmark.tuned.execution_mode is 'sideways'",
     "use 'sequential' or 'parallel', or re-run the benchmark"),
    ({"config": {"execution_mode": ""}}, "report.json benchmark.tuned.execution_mode is ''",
     "use 'sequential' or 'parallel', or re-run the benchmark"),
    ({"graph_optimization_level": "max"}, "report.json benchmark.tuned.graph_optimization_level is 'max'",
     "use one of disable, basic, extended, all, or re-run the benchmark"),
    ({"execution_mode": "x", "graph_optimization_level": "y"}, "report.json benchmark.tuned.execution_mode is 'x'",
     "use 'sequential' or 'parallel', or re-run the benchmark"),
])
def test_an_unknown_mode_or_level_is_the_same_usage_error(tuned, message, hint):
    with pytest.raises(UsageError) as err:
        OrtOptions.from_tuned(tuned)
    assert err.value.hint == hint and str(err.value).startswith(message)


def test_bench_defaults_are_unchanged():
    o = OrtOptions()
    assert (o.execution_mode, o.graph_optimization_level) == ("sequential", "all")
    with pytest.raises(UsageError, match="unknown execution mode"):
        OrtOptions(execution_mode="async")
    with pytest.raises(UsageError, match="unknown graph optimization level"):
        OrtOptions(graph_optimization_level="max")
