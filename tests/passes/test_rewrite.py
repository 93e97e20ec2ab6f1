"""The rewrite engine on its own: what each pattern form matches and what it
says when it does not, what the engine refuses to rewrite, how a rewrite
declines, and the check of a rule's op names when it is built."""
import numpy as np
import pytest

from blockc import parse_graph, verify
from blockc.errors import BlockcError
from blockc.passes.manager import label_origins
from blockc.passes.rewrite import Const, Decline, Op, Or, Rule, Var, apply_rules, matches
from pass_testing import ir, nodes_of, run_pass


def _match_y(pattern, body: str):
    """Match ``pattern`` at the last result of ``body`` (nodes over inputs %a and %b):
    the graph, every match, and the reason when there is none."""
    lines = ir(body).splitlines()
    g = parse_graph("graph g(%a: f64[3,4], %b: f64[3,4]) {\n" + "".join(f"  {line}\n" for line in lines)
                    + f"  return y={lines[-1].split(':')[0]}\n}}\n")
    found, reason = matches(pattern, g.output("y"))
    return g, found, reason


# ---- the matcher ------------------------------------------------------------------------
def test_a_var_named_twice_must_be_the_same_value():
    pattern = Op("mul", Var("x"), Var("x"))
    g, (m,), _ = _match_y(pattern, "%0:f64[3,4] = mul %a, %a")
    assert m["x"] is g.inputs[0]

    _, found, reason = _match_y(pattern, "%0:f64[3,4] = mul %a, %b")
    assert found == [] and reason == "x must be the same value in both places"


def test_const_binds_the_array_and_holds_to_single_values_unless_told():
    scalar = """
        %0:f64[] = constant {value=dense<f64[]: [2.0]>}
        %1:f64[3,4] = mul %a, %0
    """
    row = """
        %0:f64[4] = constant {value=dense<f64[4]: [1.0, 2.0, 3.0, 4.0]>}
        %1:f64[3,4] = mul %a, %0
    """
    _, (m,), _ = _match_y(Op("mul", Var("x"), Const("c")), scalar)
    assert isinstance(m["c"], np.ndarray) and m["c"] == 2.0

    _, found, reason = _match_y(Op("mul", Var("x"), Const("c")), row)
    assert found == [] and reason == "c must be a single value, found shape [4]"

    _, (m,), _ = _match_y(Op("mul", Var("x"), Const("c", scalar=False)), row)
    assert m["c"].tolist() == [1.0, 2.0, 3.0, 4.0]

    _, found, reason = _match_y(Op("mul", Var("x"), Const("c")), "%0:f64[3,4] = mul %a, %b")
    assert found == [] and reason == "expected a constant for c, found a input 'b'"


def test_const_named_twice_must_be_the_same_constant():
    pattern = Op("add", Op("mul", Var("x"), Const("c")), Const("c"))
    same = """
        %0:f64[] = constant {value=dense<f64[]: [2.0]>}
        %1:f64[3,4] = mul %a, %0
        %2:f64[] = constant {value=dense<f64[]: [2.0]>}
        %3:f64[3,4] = add %1, %2
    """
    assert len(_match_y(pattern, same)[1]) == 1
    _, found, reason = _match_y(pattern, same.replace("[2.0]>}\n        %3", "[3.0]>}\n        %3"))
    assert found == [] and reason == "c must be the same constant in both places"


@pytest.mark.parametrize("operands", ["%0, %b", "%b, %0"])
def test_commutative_tries_both_operand_orders(operands):
    body = f"""
        %0:f64[3,4] = tanh %a
        %1:f64[3,4] = add {operands}
    """
    g, (m,), _ = _match_y(Op("add", Op("tanh", Var("x")), Var("r"), commutative=True), body)
    assert (m["x"].name, m["r"].name) == ("a", "b")

    _, found, _ = _match_y(Op("add", Op("tanh", Var("x")), Var("r")), body)
    assert len(found) == (operands == "%0, %b")


def test_or_tries_its_options_in_order_and_backtracks_into_the_next():
    # Taking the tanh binds x = %a, which the second operand (%0) then
    # contradicts; the engine backs up and takes the bare Var instead.
    pattern = Op("mul", Or(Op("tanh", Var("x"), name="t"), Var("x")), Var("x"))
    g, (m,), _ = _match_y(pattern, """
        %0:f64[3,4] = tanh %a
        %1:f64[3,4] = mul %0, %0
    """)
    assert "t" not in m and m["x"] is nodes_of(g, "tanh")[0].output
    assert [n.op for n in m.consumed] == ["mul"]

    # Where both options fit, both matches come back, the first option's first.
    g, found, _ = _match_y(Op("neg", Or(Op("tanh", Var("x")), Var("x"))), """
        %0:f64[3,4] = tanh %a
        %1:f64[3,4] = neg %0
    """)
    assert [m["x"] is g.inputs[0] for m in found] == [True, False]
    assert [[n.op for n in m.consumed] for m in found] == [["neg", "tanh"], ["neg"]]


def test_attrs_are_compared_or_tested_by_a_predicate():
    body = "%0:f64[4,3] = transpose %a {perm=[1,0]}"
    assert len(_match_y(Op("transpose", Var("x"), attrs={"perm": (1, 0)}), body)[1]) == 1
    assert len(_match_y(Op("transpose", Var("x"), attrs={"perm": lambda p: p[0] == 1}), body)[1]) == 1
    _, found, reason = _match_y(Op("transpose", Var("x"), attrs={"perm": lambda p: p[0] == 0}), body)
    assert found == [] and reason == "transpose has perm=(1, 0)"


def test_index_picks_one_output_of_a_multi_output_node():
    body = """
        %0:f64[3,2], %1:f64[3,2] = split %a {axis=-1, sizes=[2,2]}
        %2:f64[3,2] = tanh %OUT
    """
    pattern = Op("tanh", Op("split", Var("x"), index=1, name="s"))
    g, (m,), _ = _match_y(pattern, body.replace("OUT", "1"))
    assert m["s"] is nodes_of(g, "split")[0]
    _, found, reason = _match_y(pattern, body.replace("OUT", "0"))
    assert found == [] and reason == "expected output 1 of split"


@pytest.mark.parametrize("deep_first", [True, False])
def test_the_reason_is_from_the_attempt_that_got_furthest(deep_first):
    deep, shallow = Op("exp", Op("tanh", Var("x"))), Op("relu", Var("x"))
    options = (deep, shallow) if deep_first else (shallow, deep)
    _, found, reason = _match_y(Op("add", Or(*options), Var("y")), """
        %0:f64[3,4] = sqrt %a
        %1:f64[3,4] = exp %0
        %2:f64[3,4] = add %1, %b
    """)
    assert found == [] and reason == "expected tanh, found a sqrt result"


# ---- the engine ---------------------------------------------------------------------------
def _neg_tanh(consume=True, returns_t=False):
    """neg(tanh(x)) -> sub(0, tanh(x)) rebuilt: a rule whose inner tanh may escape."""

    def rewrite(b, m):
        seen.append(dict(m.escaping))
        t = b.op("tanh", m["x"])
        out = {"root": b.op("sub", b.const(0.0, t.dtype), t)}
        return dict(out, t=t) if returns_t else out

    seen = []
    rule = Rule("neg∘tanh", Op("neg", Op("tanh", Var("x"), name="t", consume=consume), name="root"), rewrite)
    return rule, seen


TANH_USED_TWICE = """
    graph g(%a: f64[3,4]) {
      %0:f64[3,4] = tanh %a
      %1:f64[3,4] = neg %0
      return y=%1, t=%0
    }
"""


def _apply(rules, text):
    g = label_origins(parse_graph(ir(text)))
    r = run_pass(lambda graph: apply_rules(graph, rules), g)
    return g, r


def test_an_escaping_intermediate_rejects_the_site_unless_the_rewrite_returns_it():
    rule, seen = _neg_tanh()
    g, r = _apply([rule], TANH_USED_TWICE)
    (site,) = r.sites
    assert not r.changed and str(r.graph) == str(g) and not site.fused
    assert site.reason == "the tanh result (%0) is used elsewhere and the fused op does not return it"
    assert [list(e) for e in seen] == [["t"]]

    rule, _ = _neg_tanh(returns_t=True)
    g, r = _apply([rule], TANH_USED_TWICE)
    assert r.changed and r.sites[0].fused
    assert sorted(n.op for n in r.graph.nodes) == ["constant", "sub", "tanh"]


def test_an_unnamed_intermediate_used_elsewhere_rejects_the_site():
    rule = Rule("neg∘tanh", Op("neg", Op("tanh", Var("x")), name="root"), lambda b, m: {"root": m["x"]})
    g, r = _apply([rule], TANH_USED_TWICE)
    assert not r.changed and str(r.graph) == str(g)
    assert r.sites[0].reason == "the tanh result (%0) inside the pattern is used elsewhere"


def test_a_node_not_consumed_stays_for_its_other_users():
    rule, seen = _neg_tanh(consume=False)
    g, r = _apply([rule], TANH_USED_TWICE)
    (site,) = r.sites
    assert r.changed and site.fused and site.ops == ["neg"] and seen == [{}]
    assert sorted(n.op for n in r.graph.nodes) == ["constant", "sub", "tanh", "tanh"]


def test_a_check_reason_beats_any_structural_miss():
    rule = Rule("neg∘tanh", Op("neg", Or(Op("tanh", Op("exp", Var("x"))), Var("x")), name="root"),
                lambda b, m: {"root": m["x"]}, check=lambda m: "vetoed by the check")
    g, r = _apply([rule], TANH_USED_TWICE)
    assert r.sites[0].reason == "vetoed by the check"


NEG = """
    graph g(%a: f64[3,4]) {
      %0:f64[3,4] = tanh %a
      %1:f64[3,4] = neg %0
      return y=%1
    }
"""


@pytest.mark.parametrize("decline, reason", [
    (lambda: None, "the neg∘tanh rewrite declined the match"),
    (lambda: Decline("the moon is in the wrong phase"), "the moon is in the wrong phase"),
])
def test_a_rewrite_declines_with_a_reason_and_leaves_the_graph_as_it_was(decline, reason):
    def rewrite(b, m):
        b.op("exp", m["x"])  # built before deciding: must not stay behind
        return decline()

    rule = Rule("neg∘tanh", Op("neg", Op("tanh", Var("x")), name="root"), rewrite)
    g, r = _apply([rule], NEG)
    (site,) = r.sites
    assert not r.changed and not site.fused and site.reason == reason
    assert str(r.graph) == str(g)
    verify(r.graph)


def test_a_declined_match_lets_the_next_match_at_the_same_anchor_try():
    def rewrite(b, m):
        return Decline("not this one") if "t" in m else {"root": b.op("exp", m["x"])}

    rule = Rule("neg", Op("neg", Or(Op("tanh", Var("x"), name="t"), Var("x")), name="root"), rewrite)
    _, r = _apply([rule], NEG)
    (site,) = r.sites
    assert r.changed and site.fused and site.ops == ["neg"]
    assert sorted(n.op for n in r.graph.nodes) == ["exp", "tanh"]


def test_a_rule_rooted_at_an_or_is_one_site_per_anchor():
    """Associations of one expression, each an Op at the root: one candidate
    site per anchor, whichever fits (not one per association)."""
    root = Or(Op("neg", Op("exp", Var("x")), name="root"), Op(("neg", "relu"), Op("tanh", Var("x")), name="root"))
    rule = Rule("neg∘(exp|tanh)", root, lambda b, m: {"root": m["x"]})
    assert rule.anchor_ops == {"neg", "relu"}
    _, r = _apply([rule], NEG)
    (site,) = r.sites
    assert site.fused and site.ops == ["tanh", "neg"]

    with pytest.raises(BlockcError, match="an Op, or an Or of Ops"):
        Rule("bad", Or(Op("neg", Var("x")), Var("x")), lambda b, m: None)


# ---- building a rule -------------------------------------------------------------------------
@pytest.mark.parametrize("pattern", [
    Op("layernrom", Var("x")),
    Op("add", Var("x"), Op(("tanh", "layernrom"), Var("y"))),
    Op("add", Or(Var("x"), Op("exp", Op("layernrom", Var("y")))), Var("z")),
])
def test_an_unknown_op_in_a_pattern_is_an_error_when_the_rule_is_built(pattern):
    with pytest.raises(BlockcError, match="rule 'typo'.*'layernrom'"):
        Rule("typo", pattern, lambda b, m: None)
