"""Unit tests for onnxport.spec: --input / --dim parsing and dimension resolution."""

from __future__ import annotations

import pytest

from onnxport.core.errors import EXIT_USAGE, UsageError
from onnxport.core.spec import Dim, InputSpec, merge_dims, normalize_dtype, parse_dim, parse_input


def _usage_error(excinfo: pytest.ExceptionInfo) -> UsageError:
    err = excinfo.value
    assert type(err) is UsageError
    assert err.exit_code == EXIT_USAGE == 2
    assert err.message
    assert err.hint and err.hint.strip()
    return err


# --------------------------------------------------------------------------- parse_input


def test_parse_input_symbolic_and_fixed_dims():
    spec = parse_input("image:float32[batch,3,224,224]")
    assert spec == InputSpec("image", "float32", ("batch", 3, 224, 224), None)
    assert spec.symbols == ["batch"]
    assert str(spec) == "image:float32[batch,3,224,224]"


def test_parse_input_value_range_and_whitespace():
    spec = parse_input("  input_ids : int64 [ batch , seq ] { 0 .. 29999 } ")
    assert spec.name == "input_ids"
    assert spec.dtype == "int64"
    assert spec.shape == ("batch", "seq")
    assert spec.value_range == (0, 29999)
    assert str(spec) == "input_ids:int64[batch,seq]{0..29999}"


def test_parse_input_negative_range_and_single_value_range():
    assert parse_input("t:int32[4]{-5..5}").value_range == (-5, 5)
    assert parse_input("t:int64[4]{7..7}").value_range == (7, 7)


def test_parse_input_scalar_and_dotted_name():
    spec = parse_input("input.1:float[]")
    assert spec.name == "input.1"
    assert spec.shape == ()
    assert spec.symbols == []


def test_parse_input_repeated_symbol_listed_once_per_axis():
    spec = parse_input("x:float32[n,n,_k2]")
    assert spec.shape == ("n", "n", "_k2")
    assert spec.symbols == ["n", "n", "_k2"]


@pytest.mark.parametrize(
    ("alias", "canonical"),
    [
        ("float", "float32"), ("fp32", "float32"), ("f32", "float32"), ("FLOAT32", "float32"),
        ("half", "float16"), ("fp16", "float16"), ("double", "float64"), ("bfloat16", "bfloat16"),
        ("long", "int64"), ("int", "int64"), ("i64", "int64"), ("i32", "int32"), ("int8", "int8"),
        ("uint8", "uint8"), ("bool", "bool"), ("bool_", "bool"),
    ],
)
def test_parse_input_dtype_aliases(alias, canonical):
    assert parse_input(f"x:{alias}[2]").dtype == canonical


@pytest.mark.parametrize(("text", "canonical"), [("torch.float16", "float16"), ("np.int32", "int32"),
                                                 (" Int64 ", "int64")])
def test_normalize_dtype_prefixes_and_case(text, canonical):
    assert normalize_dtype(text) == canonical


@pytest.mark.parametrize(
    "text",
    [
        "",
        "x",
        "x:float32",
        "x:float32[2",
        "float32[2,3]",
        ":float32[2]",
        "x:float32[2]{0..}",
        "x:int64[2]{0..5",
        "x:int64[2]{a..b}",
        "x:int64[2] trailing",
        "x y:float32[2]",
    ],
)
def test_parse_input_malformed(text):
    with pytest.raises(UsageError) as excinfo:
        parse_input(text)
    err = _usage_error(excinfo)
    assert "malformed" in err.message


@pytest.mark.parametrize("dims", ["2,-3", "2,3.5", "1seq", "a-b", "2,,3", "2,"])
def test_parse_input_malformed_dimension(dims):
    with pytest.raises(UsageError) as excinfo:
        parse_input(f"x:float32[{dims}]")
    err = _usage_error(excinfo)
    assert "malformed dimension" in err.message


def test_parse_input_unicode_digit_dimension_is_usage_error():
    with pytest.raises(UsageError):
        parse_input("x:float32[²]")


@pytest.mark.parametrize("dtype", ["float8", "complex64", "str", "int4"])
def test_parse_input_unknown_dtype(dtype):
    with pytest.raises(UsageError) as excinfo:
        parse_input(f"x:{dtype}[2]")
    err = _usage_error(excinfo)
    assert f"unknown dtype '{dtype}'" in err.message
    assert "float32" in err.hint and "int64" in err.hint


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16", "bool"])
def test_parse_input_range_on_non_integer_input(dtype):
    with pytest.raises(UsageError) as excinfo:
        parse_input(f"x:{dtype}[batch,4]{{0..1}}")
    err = _usage_error(excinfo)
    assert "only allowed for integer inputs" in err.message


def test_parse_input_range_lo_greater_than_hi():
    with pytest.raises(UsageError) as excinfo:
        parse_input("ids:int64[batch,seq]{10..2}")
    err = _usage_error(excinfo)
    assert "{10..2}" in err.message


@pytest.mark.parametrize("text", ["x:int8[4]{0..1000}", "x:uint8[4]{-5..5}"])
def test_parse_input_range_outside_dtype_limits(text):
    with pytest.raises(UsageError):
        parse_input(text)


# --------------------------------------------------------------------------- parse_dim


@pytest.mark.parametrize(
    ("text", "expected"),
    [("seq=1..512", Dim("seq", 1, 512)), (" batch = 2 .. 2 ", Dim("batch", 2, 2)), ("_h1=32..64", Dim("_h1", 32, 64))],
)
def test_parse_dim_ok(text, expected):
    d = parse_dim(text)
    assert d == expected
    assert d.example is None
    assert str(d) == f"{expected.symbol}={expected.min}..{expected.max}"


@pytest.mark.parametrize("text", ["seq", "seq=", "seq=1", "seq=1..", "=1..5", "1seq=1..5", "seq=-1..5",
                                  "seq=1...5", "seq:1..5", "seq=a..b", "seq=1..5x"])
def test_parse_dim_malformed(text):
    with pytest.raises(UsageError) as excinfo:
        parse_dim(text)
    err = _usage_error(excinfo)
    assert "malformed --dim" in err.message
    assert "SYMBOL=MIN..MAX" in err.hint


def test_parse_dim_min_greater_than_max():
    with pytest.raises(UsageError) as excinfo:
        parse_dim("seq=10..2")
    err = _usage_error(excinfo)
    assert "empty range" in err.message


@pytest.mark.parametrize("text", ["seq=0..8", "seq=0..0"])
def test_parse_dim_min_zero(text):
    with pytest.raises(UsageError) as excinfo:
        parse_dim(text)
    err = _usage_error(excinfo)
    assert "size 0" in err.message
    assert "start at 1" in err.hint


# --------------------------------------------------------------------------- merge_dims


def _check_export_sizes(dims: dict[str, Dim]) -> None:
    sizes = [d.example for d in dims.values()]
    for d in dims.values():
        assert d.example is not None
        assert d.min <= d.example <= d.max, d
        if d.max >= 2:
            assert d.example >= 2, d
    assert len(set(sizes)) == len(sizes), dims


def test_merge_dims_generic_defaults():
    specs = [parse_input("input_ids:int64[batch,seq]"), parse_input("pixels:float32[batch,3,h,w]"),
             parse_input("z:float32[k]")]
    dims = merge_dims(specs, [])
    assert list(dims) == ["batch", "seq", "h", "w", "k"]
    assert (dims["batch"].min, dims["batch"].max, dims["batch"].example) == (1, 64, 2)
    assert (dims["seq"].min, dims["seq"].max, dims["seq"].example) == (1, 512, 16)
    assert (dims["h"].min, dims["h"].max, dims["h"].example) == (32, 512, 224)
    # h and w share the same generic default, so w must be moved off 224.
    assert (dims["w"].min, dims["w"].max) == (32, 512)
    assert dims["w"].example != 224
    assert (dims["k"].min, dims["k"].max, dims["k"].example) == (1, 64, 8)
    _check_export_sizes(dims)


def test_merge_dims_declared_beats_defaults():
    specs = [parse_input("ids:int64[batch,seq]")]
    defaults = {"batch": Dim("batch", 1, 8, 4), "seq": Dim("seq", 1, 128, 32)}
    dims = merge_dims(specs, [parse_dim("seq=4..64")], defaults)
    assert (dims["seq"].min, dims["seq"].max) == (4, 64)
    # The declared dim has no example: it takes the source default's example, which is in range.
    assert dims["seq"].example == 32
    assert dims["batch"] == Dim("batch", 1, 8, 4)
    _check_export_sizes(dims)


def test_merge_dims_source_default_beats_generic():
    dims = merge_dims([parse_input("x:float32[batch,16]")], [], {"batch": Dim("batch", 1, 32, 5)})
    assert dims["batch"] == Dim("batch", 1, 32, 5)


def test_merge_dims_declared_range_clamps_default_example():
    dims = merge_dims([parse_input("x:float32[h,w]")], [parse_dim("h=1..8"), parse_dim("w=100..120")])
    assert dims["h"] == Dim("h", 1, 8, 8)          # generic example 224 clamped to the max
    assert dims["w"] == Dim("w", 100, 120, 120)
    _check_export_sizes(dims)


def test_merge_dims_export_size_never_0_or_1_when_range_allows():
    specs = [parse_input("x:float32[a,b,c]")]
    dims = merge_dims(specs, [parse_dim("a=1..2"), parse_dim("b=1..3"), parse_dim("c=1..4")])
    assert {s: d.example for s, d in dims.items()} == {"a": 2, "b": 3, "c": 4}
    _check_export_sizes(dims)


def test_merge_dims_sizes_distinct_for_identical_ranges():
    specs = [parse_input("x:float32[p,q,r]")]
    dims = merge_dims(specs, [parse_dim(f"{s}=1..4") for s in "pqr"])
    # Only three sizes >= 2 exist in 1..4 and each dim gets a different one.
    assert sorted(d.example for d in dims.values()) == [2, 3, 4]
    _check_export_sizes(dims)


def test_merge_dims_many_dims_distinct_in_range():
    specs = [parse_input("x:float32[batch,seq,n,b,bs,len,token]")]
    dims = merge_dims(specs, [])
    _check_export_sizes(dims)


def test_merge_dims_single_value_range_kept():
    dims = merge_dims([parse_input("x:float32[one,two]")], [parse_dim("one=1..1"), parse_dim("two=2..2")])
    assert dims["one"].example == 1
    assert dims["two"].example == 2


def test_merge_dims_distinct_when_only_one_assignment_exists():
    dims = merge_dims([parse_input("x:float32[batch,k]")], [parse_dim("batch=2..3"), parse_dim("k=2..2")])
    assert dims["k"].example == 2
    assert dims["batch"].example == 3


def test_merge_dims_no_symbols():
    assert merge_dims([parse_input("x:float32[2,3]")], []) == {}


def test_merge_dims_unused_declared_dim():
    with pytest.raises(UsageError) as excinfo:
        merge_dims([parse_input("x:float32[batch,16]")], [parse_dim("seq=1..8")])
    err = _usage_error(excinfo)
    assert "seq" in err.message
    assert "batch" in err.hint


def test_merge_dims_unused_declared_dim_without_any_symbol():
    with pytest.raises(UsageError) as excinfo:
        merge_dims([parse_input("x:float32[4,16]")], [parse_dim("batch=1..8")])
    err = _usage_error(excinfo)
    assert "batch" in err.message
    assert "no symbolic dims" in err.hint


def test_merge_dims_declared_twice():
    with pytest.raises(UsageError) as excinfo:
        merge_dims([parse_input("x:float32[batch,16]")], [parse_dim("batch=1..8"), parse_dim("batch=1..4")])
    err = _usage_error(excinfo)
    assert "batch" in err.message and "twice" in err.message
