"""The kernel-family registry (codegen/cuda/family.py) and the one CUDA
dtype table (codegen/cuda/dtypes.py): every op that names a family finds it
and its entry, every entry names an op of its family, a family the registry
does not know is an error naming the op, and each kernel definition of a
model is rendered from parameters no other definition has."""
from __future__ import annotations

import re

import pytest

import blockc
from blockc.codegen.cuda.dtypes import CUDA_DTYPES, FLOATS
from blockc.codegen.cuda.kernel import CudaCodegenError, ctype, suffix
from blockc.codegen.cuda.kernels import FAMILIES, family_of, lowers
from blockc.codegen.cuda.lower import generate
from blockc.ir.dtypes import DType
from blockc.ops import registry


def test_every_op_naming_a_family_finds_it_and_its_entry():
    named = {name: d.cuda for name, d in registry.OPS.items() if d.cuda is not None}
    assert named and all(family_of(name).name == cuda for name, cuda in named.items())
    assert {"elementwise", "row_norm", "softmax", "attention", "rotary", "gemm", "copy", "alias",
            "inline"} <= set(FAMILIES)


def test_every_entry_names_an_op_of_its_family():
    for family in FAMILIES.values():
        for op in family.entries or ():
            assert registry.get(op).cuda == family.name, (family.name, op)


def test_the_per_op_parameters_are_the_familys_entries():
    rows, gemm = FAMILIES["row_norm"], FAMILIES["gemm"]
    assert (rows.entry("add_rmsnorm").residual, rows.entry("add_rmsnorm").beta) == (True, False)
    assert (rows.entry("layernorm").residual, rows.entry("layernorm").beta) == (False, True)
    assert gemm.entry("matmul_bias_act").bias and not gemm.entry("matmul").bias
    assert set(FAMILIES["copy"].entries) == {"transpose", "slice", "split", "concat", "gather", "cache_write"}


def test_a_family_the_registry_does_not_know_is_an_error_naming_the_op():
    registry.define("mystery", ("x",), cuda="nonesuch")
    try:
        with pytest.raises(AssertionError, match="op mystery: unknown CUDA kernel family 'nonesuch'"):
            lowers(registry.get("mystery"))
    finally:
        registry.OPS.pop("mystery")


def test_an_op_without_an_entry_in_a_family_that_keeps_them_is_an_error():
    registry.define("mystery_copy", ("x",), cuda="copy")
    try:
        with pytest.raises(AssertionError, match="op mystery_copy: the CUDA kernel family copy has no entry for it"):
            family_of("mystery_copy")
    finally:
        registry.OPS.pop("mystery_copy")


def test_one_dtype_table():
    assert set(CUDA_DTYPES) == set(DType) - {DType.float64}
    assert FLOATS == {DType.float32, DType.float16, DType.bfloat16}
    assert [suffix(d) for d in CUDA_DTYPES] == ["f32", "f16", "bf16", "i64", "i32", "b8"]
    assert ctype(DType.float16) == "__half" and CUDA_DTYPES[DType.bfloat16].library == "CUDA_R_16BF"
    with pytest.raises(CudaCodegenError, match="no type for float64"):
        ctype(DType.float64)
    assert FAMILIES["gemm"].dtypes == FLOATS and FAMILIES["copy"].dtypes == set(CUDA_DTYPES)


def _definitions(layers: int):
    model = blockc.build_model("llama-tiny", {"layers": str(layers)})
    graph = blockc.to_form(blockc.trace(model.for_cache("decode")), "fused")
    return generate(graph, dict(blockc.init_weights(model)))


def test_each_definition_is_rendered_from_its_own_parameters():
    # llama-tiny's decode step: its splits, transposes, rotaries and concats
    # differ in what they are rendered from under one name (_v1, _v2, ...)
    cm = _definitions(2)
    assert any("_v" in name for name in cm.kernels)
    base = lambda name: re.sub(r"_v\d+$", "", name)   # noqa: E731
    defs = list(cm.kernels.values())
    for i, k in enumerate(defs):
        assert all(k.rendered_from != d.rendered_from or base(k.name) != base(d.name) for d in defs[:i]), k.name
    for step in cm.steps:
        assert step.rendered_from == cm.kernels[step.name].rendered_from


def test_more_layers_reuse_the_first_layers_kernels():
    one, three = _definitions(1), _definitions(3)
    assert len(three.steps) > len(one.steps)
    assert list(three.kernels) == list(one.kernels)
