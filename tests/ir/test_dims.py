import pytest

from blockc.errors import BlockcError
from blockc.ir.dims import Sym, exact_div, parse_dim, substitute

pytest.importorskip("hypothesis")
from hypothesis import given, strategies as st  # noqa: E402

seq, past, batch = Sym.var("seq"), Sym.var("past"), Sym.var("batch")


def test_arithmetic_is_structural():
    assert past + seq == seq + past
    assert str(past + seq) == "past+seq"
    assert (seq + 3) - 3 == seq
    assert seq - seq == 0 and isinstance(seq - seq, int)
    assert str(2 * seq * batch) == "2*batch*seq"
    assert str(seq - past) == "seq-past"


def test_exact_division():
    assert exact_div(batch * seq * 64, 64) == batch * seq
    assert exact_div(batch * seq * 64, batch) == seq * 64
    assert exact_div(seq * 64, 3) is None
    assert exact_div(seq + past, seq) is None
    with pytest.raises(BlockcError):
        (seq + 1) // 2


def test_evaluate_and_missing_binding():
    assert (past + seq).evaluate({"past": 3, "seq": 4}) == 7
    with pytest.raises(BlockcError, match="past"):
        (past + seq).evaluate({"seq": 4})


@pytest.mark.parametrize("text", ["seq", "past+seq", "2*batch*seq", "seq-past", "-seq", "768", "2*seq+1"])
def test_parse_round_trip(text):
    d = parse_dim(text)
    assert str(d) == text
    assert parse_dim(str(d)) == d


def test_parse_rejects_garbage():
    for bad in ["", "seq+", "a/b", "2**seq", "(seq"]:
        with pytest.raises((ValueError, BlockcError)):
            parse_dim(bad)


names = st.sampled_from(["a", "b", "seq"])
polys = st.recursive(
    st.one_of(st.integers(-5, 5), names.map(Sym.var)),
    lambda inner: st.tuples(inner, inner, st.sampled_from("+-*")).map(
        lambda t: (Sym._lift(t[0]) + t[1]) if t[2] == "+" else (Sym._lift(t[0]) - t[1]) if t[2] == "-"
        else Sym._lift(t[0]) * t[1]),
    max_leaves=6)


@given(polys, st.integers(0, 9), st.integers(0, 9), st.integers(0, 9))
def test_printed_polynomials_parse_and_evaluate_alike(d, a, b, s):
    env = {"a": a, "b": b, "seq": s}
    value = d.evaluate(env) if isinstance(d, Sym) else d
    again = parse_dim(str(d))
    assert again == d
    assert (again.evaluate(env) if isinstance(again, Sym) else again) == value


def test_substitute_renames_symbols_inside_expressions():
    d0, d1 = Sym.var("d0"), Sym.var("d1")
    assert substitute(past + seq, {"past": d0, "seq": d1}) == d0 + d1
    assert substitute(2 * batch * seq + 1, {"seq": d1}) == 2 * batch * d1 + 1
    assert substitute(past + seq, {"past": seq}) == 2 * seq and substitute(7, {"seq": d0}) == 7
