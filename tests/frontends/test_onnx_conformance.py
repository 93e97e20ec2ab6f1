"""ONNX's own operator tests (the node cases of ``onnx.backend.test``) through
blockc: each case's model is written to a file, imported by blockc's ONNX
frontend, run on the reference interpreter, and its outputs compared with the
ones ONNX ships (an outside oracle).

Which cases: every case whose nodes all have a rule in the importer's table at
the case's opset (``missing_operators`` finds none) -- so a rule added to
``rules.TABLE`` brings its cases in, and nothing here lists operators.

A case the importer cannot express must be refused with a ``BlockcError``,
never answered wrongly. Those cases are ``REFUSED``: one row per family, with
the refusal's message and the reason. The rows are strict: a case in a row
that imports and matches fails the test, so the table only ever shrinks.

Newer onnx releases (onnx PR #7959) build the node cases in memory instead
of shipping ``node/test_*/model.onnx`` and ``test_data_set_*/*.pb``;
``load_model_tests(kind="node")`` gives them either way, and ``_case_data``
reads the files where an older onnx still has them (``_node_cases`` makes
them in memory without the generators of cases no rule could select).
"""
from __future__ import annotations

import glob
import importlib
import os
import pkgutil
import re
import warnings
from dataclasses import dataclass
from fnmatch import fnmatchcase

import numpy as np
import onnx
import onnx.defs
import pytest
from onnx import numpy_helper
from onnx.backend.test.case.utils import import_recursive
from onnx.backend.test.loader import DATA_DIR, load_model_tests

from blockc import BlockcError
from blockc.frontends.onnx import load_onnx
from blockc.frontends.onnx.functions import default_opset, inline_functions, opset_versions
from blockc.frontends.onnx.model import missing_operators
from blockc.frontends.onnx.safe_load import OnnxFile
from blockc.ir.dtypes import DType
from blockc.runtime.backend import make_backend


@dataclass(frozen=True)
class Refusal:
    cases: tuple[str, ...]   # case names, as globs
    says: str                # a regex the BlockcError's message must hold
    why: str


REFUSED = [
    Refusal(("test_*_int8*", "test_*_int16*", "test_*_uint8*", "test_*_uint16*", "test_*_uint32*", "test_*_uint64*"),
            r"element type U?INT(8|16|32|64),",
            "blockc's integer element types are int32 and int64 (and bool)"),
    Refusal(("test_equal_string*",), r"element type STRING,", "blockc has no string tensors"),
    Refusal(("test_cast*FLOAT8*", "test_cast*INT4*", "test_cast*INT2*", "test_cast*FLOAT4E2M1*", "test_cast_e8m0_*"),
            r"element type (FLOAT8\w*|U?INT4|U?INT2|FLOAT4E2M1)\b",
            "blockc's floats are float32, float16, bfloat16 and float64: no float8, float4, or 4- and 2-bit integers"),
    Refusal(("test_identity_sequence", "test_identity_opt"), r"has no tensor type with a shape",
            "a sequence or optional value: blockc's values are tensors"),
    Refusal(("test_dropout_default_ratio", "test_dropout_default_mask_ratio", "test_training_dropout*"),
            r"Dropout whose ratio or training mode is computed at run time",
            "the case feeds Dropout's ratio and training mode as graph inputs (exporters write constants); "
            "blockc imports inference only, and training-mode dropout draws random numbers"),
    Refusal(("test_gather_negative_indices",), r"ids out of range \[0, 10\)",
            "ONNX counts a negative index from the end; blockc's gather takes indices in [0, rows), and its "
            "input check refuses others rather than read out of bounds"),
    Refusal(("test_pow_types_int*_float32",), r"Pow of a int(32|64) base with a float32 exponent",
            "an integer power with a float exponent: blockc's pow takes one element type"),
    Refusal(("test_range_*", "test_*window_expanded", "test_*window_symmetric_expanded"),
            r"Range whose bounds are computed at run time",
            "the case feeds Range's bounds as graph inputs (not shape arguments by the schema, so not folded); blockc "
            "sizes tensors when the graph is built, and folds the bounds exporters compute from Shape"),
    Refusal(("test_reshape_allowzero_reordered",), r"allowzero=1 and a 0 in the shape",
            "a zero-size result: blockc's dims are at least 1"),
    Refusal(("test_slice_neg_steps", "test_rotary_embedding_*interleaved*_expanded"), r"Slice of a tensor with step",
            "blockc's slice takes a contiguous range: no strided or reversed slice of a traced tensor"),
    Refusal(("test_gathernd_example_int32_batch_dim1",), r"GatherND with batch_dims=1",
            "GatherND is imported for batch_dims=0, the form exporters write for a mask lookup"),
    Refusal(("test_split_zero_size_splits_*", "test_tril_zero", "test_triu_zero", "test_reduce_max_empty_set*"),
            r"do not add up to dim|symbolic matrix dims|zero-size array",
            "a zero-size input: blockc reads a dim_value of 0 as an unknown size (its dims are at least 1), "
            "refused where the size matters"),
    Refusal(("test_attention_*nonpad*", "test_attention_*padded_kv*", "test_attention_local_window_ext_cache_*"),
            r"Attention with nonpad_kv_seqlen",
            "opset 24's external KV cache (valid lengths per row, and a causal frontier per row from them): "
            "blockc's attention takes masks, not lengths"),
    Refusal(("test_attention_local_window", "test_attention_local_window_[!d]*", "test_attention_3d_local_window",
             "test_attention_bidirectional_window"), r"Attention with (left|right)_window_size=",
            "opset 25's sliding-window attention: blockc's attention masks by a mask input and a causal flag only"),
    Refusal(("test_attention_*softcap*",), r"Attention with softcap=",
            "blockc's attention has no soft cap of the scores (softcap * tanh(scores / softcap))"),
    Refusal(("test_attention_*qk_matmul*",), r"Attention's qk_matmul_output \(qk_matmul_output_mode=\d\)",
            "the scores or probabilities as a fourth output (a debugging aid): blockc's attention keeps them inside"),
]
# The onnx release whose cases the rows were written against: a row that
# matches none of them is stale (checked only there, since releases add and
# rename cases).
REFUSED_WRITTEN_FOR = "1.23."


def refusal_for(name: str) -> Refusal | None:
    return next((r for r in REFUSED if any(fnmatchcase(name, g) for g in r.cases)), None)


# ---- the cases -------------------------------------------------------------------------------
def _read_pb(path: str) -> onnx.TensorProto:
    t = onnx.TensorProto()
    with open(path, "rb") as f:
        t.ParseFromString(f.read())
    return t


def _case_data(case) -> tuple[onnx.ModelProto, list]:
    """The case's model and its ``[(inputs, outputs)]``: in memory (newer onnx) or on disk (older)."""
    if case.model is not None:
        return case.model, list(case.data_sets)
    model = onnx.load(os.path.join(case.model_dir, "model.onnx"))   # onnx's own test data, not a user's file

    def numbered(folder, kind):
        paths = glob.glob(os.path.join(folder, f"{kind}_*.pb"))
        return [_read_pb(p) for p in sorted(paths, key=lambda p: int(re.findall(r"\d+", os.path.basename(p))[0]))]
    sets = sorted(glob.glob(os.path.join(case.model_dir, "test_data_set_*")))
    return model, [(numbered(d, "input"), numbered(d, "output")) for d in sets]


def _array(v) -> np.ndarray:
    return numpy_helper.to_array(v) if isinstance(v, onnx.TensorProto) else np.asarray(v)


def _never_selected() -> set[str]:
    """The case generator modules (each named after its operator, as
    ``averagepool``) that make only cases no rule could import: their
    operator is one of ONNX's that the importer's table lacks, and no
    version of it has a function body (so no ``_expanded`` case, written in
    other operators)."""
    from blockc.frontends.onnx.rules import DOMAINS
    known = {op.lower() for op in DOMAINS[""]}
    expandable = {}
    for schema in onnx.defs.get_all_schemas_with_history():
        if schema.domain == "":
            name = schema.name.lower()
            expandable[name] = expandable.get(name, False) or schema.has_function or \
                schema.has_context_dependent_function
    return {name for name, expands in expandable.items() if name not in known and not expands}


def _node_cases() -> list:
    """``load_model_tests(kind="node")``'s cases, less those ``_never_selected``
    leaves out unmade: an onnx that builds them in memory runs each
    generator module at import, and the pooling ones' loops were most of
    this module's collection time, paid again in every xdist worker."""
    import onnx.backend.test.case.node as generators
    made = getattr(generators, "_NodeTestCases", None)
    if os.path.isdir(os.path.join(DATA_DIR, "node")) or made is None:   # on disk, or not as onnx 1.23 builds them
        return load_model_tests(kind="node")
    never = _never_selected()
    for module in pkgutil.iter_modules(generators.__path__):
        if module.ispkg and onnx.ONNX_ML:   # ai_onnx_ml: whole, where load_model_tests makes it
            import_recursive(importlib.import_module(f"{generators.__name__}.{module.name}"))
        elif not module.ispkg and module.name.replace("_", "") not in never:
            importlib.import_module(f"{generators.__name__}.{module.name}")
    return made


def _selected() -> dict[str, tuple]:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")   # the case generators' own numpy warnings (overflowing casts)
        cases = _node_cases()
    chosen = {}
    for case in cases:
        model, data = _case_data(case)
        # as the importer sees the case: its local functions inlined (onnx 1.23's cases have none)
        if not missing_operators(inline_functions(OnnxFile(case.name, model, {}, list(model.graph.node)))):
            chosen[case.name] = (model, data)
    return chosen


CASES = _selected()


def fold_shape_arguments(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> onnx.ModelProto:
    """``model`` with the graph inputs that are shape arguments made initializers
    (and taken out of ``feeds``).

    A node case feeds every operand as a graph input, even a Reshape's target
    shape. A real model's shape arguments are constants, or Shape arithmetic
    the importer folds, and blockc needs them known when the graph is built
    (it sizes every tensor then). Which inputs are shape arguments is read off
    the operator's schema: an input that admits integer tensors only and is
    not differentiable -- Reshape's and Expand's shape, Slice's starts, ends,
    axes and steps, Split's split, the axes of (Un)Squeeze and the ReduceX,
    Trilu's k, ConstantOfShape's input. Gather's and GatherElements' indices
    fit that too but are data (a model's input_ids), so they stay inputs.
    """
    opset = default_opset(opset_versions(model.opset_import))
    fold = set()
    for node in model.graph.node:
        schema = onnx.defs.get_schema(node.op_type, opset, node.domain)
        for i, name in enumerate(node.input):
            if name in feeds and _is_shape_argument(schema, min(i, len(schema.inputs) - 1)):
                fold.add(name)
    if not fold:
        return model
    out = onnx.ModelProto()
    out.CopyFrom(model)
    kept = [v for v in out.graph.input if v.name not in fold]
    del out.graph.input[:]
    out.graph.input.extend(kept)
    out.graph.initializer.extend(numpy_helper.from_array(feeds.pop(name), name) for name in sorted(fold))
    return out


_INTEGER_TENSORS = {f"tensor({t}{n})" for t in ("int", "uint") for n in (8, 16, 32, 64)}


def _is_shape_argument(schema, index: int) -> bool:
    formal = schema.inputs[index]
    types = {c.type_param_str: set(c.allowed_type_strs) for c in schema.type_constraints}.get(
        formal.type_str, {formal.type_str})
    differentiable = formal.differentiation_category == onnx.defs.OpSchema.DifferentiationCategory.Differentiable
    return types <= _INTEGER_TENSORS and not differentiable and formal.name != "indices"


# ---- running one -----------------------------------------------------------------------------
# Tolerances by element width: blockc's interpreter computes in the model's
# dtype, as the cases' expected outputs were (numpy, mostly float32).
TOLERANCE = {8: (1e-5, 1e-6), 4: (1e-5, 1e-6), 2: (1e-2, 1e-3)}   # itemsize -> (rtol, atol)


def _check(name: str, got: np.ndarray, want: np.ndarray) -> None:
    assert got.shape == want.shape, f"{name}: shape {got.shape}, expected {want.shape}"
    assert got.dtype == want.dtype, f"{name}: dtype {got.dtype}, expected {want.dtype}"
    if DType.from_numpy(want.dtype).is_float:
        rtol, atol = TOLERANCE[want.dtype.itemsize]
        np.testing.assert_allclose(got.astype(np.float64), want.astype(np.float64), rtol=rtol, atol=atol,
                                   equal_nan=True, err_msg=name)
    else:
        np.testing.assert_array_equal(got, want, err_msg=name)   # ints and bools: exact


def _import_and_run(model: onnx.ModelProto, inputs, folder) -> tuple[list[str], dict[str, np.ndarray]]:
    feeds = {v.name: _array(x) for v, x in zip(model.graph.input, inputs)}
    model = fold_shape_arguments(model, feeds)
    path = os.path.join(folder, "model.onnx")
    onnx.save(model, path)
    graph, weights = load_onnx(path)
    return [o.name for o in model.graph.output], make_backend("reference").run(graph, weights, feeds)


@pytest.mark.parametrize("name", sorted(CASES))
def test_node_case(name, tmp_path):
    model, data = CASES[name]
    refusal = refusal_for(name)
    for inputs, expected in data:
        try:
            names, outputs = _import_and_run(model, inputs, str(tmp_path))
        except BlockcError as e:
            if refusal is None:
                raise
            assert re.search(refusal.says, str(e)), f"refused, but not as REFUSED says ({refusal.says!r}): {e}"
            pytest.xfail(refusal.why)
        for out_name, want in zip(names, expected):
            _check(out_name, outputs[out_name], _array(want))
    if refusal is not None:
        pytest.fail(f"{name} imports and matches now: take it out of REFUSED ({refusal.why})")


def test_cases_are_selected():
    """The selection finds cases, and every rule in the table has one (an op with none would be unchecked)."""
    from blockc.frontends.onnx.rules import TABLE
    covered = {n.op_type for model, _ in CASES.values() for n in model.graph.node}
    assert len(CASES) > 300
    assert set(TABLE) - covered == set()


@pytest.mark.skipif(not onnx.__version__.startswith(REFUSED_WRITTEN_FOR),
                    reason=f"REFUSED names the cases of onnx {REFUSED_WRITTEN_FOR}x")
def test_refused_rows_are_not_stale():
    for row in REFUSED:
        for pattern in row.cases:
            assert any(fnmatchcase(name, pattern) for name in CASES), f"REFUSED: {pattern!r} matches no case"
