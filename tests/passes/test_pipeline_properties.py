"""Property tests: random small graphs, and random transformer blocks from the
DSL, keep their outputs (float64 reference) through the whole pipeline, and
through the pipeline after decomposition; every result verifies."""
import numpy as np
import pytest

from blockc import init_weights, trace, verify
from blockc.errors import BlockcError
from blockc.frontends import BlockConfig, BlockModel
from blockc.ir.dtypes import DType
from blockc.ir.graph import Graph
from blockc.ir.types import TensorType
from blockc.passes.decompose import decompose
from blockc.passes.manager import optimize
from pass_testing import assert_same_numbers, random_feeds, random_weights

pytest.importorskip("hypothesis")
from hypothesis import HealthCheck, given, note, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

SETTINGS = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
F64 = DType.float64


def _t(*shape) -> TensorType:
    return TensorType(F64, shape)


class _Builder:
    """Grows a random float64 graph; every op that does not type-check is skipped."""

    def __init__(self, draw):
        self.draw, self.g, self.params = draw, Graph("random"), 0
        self.values = [self.g.add_input("x0", _t(2, 3, 4))]
        for i in range(1, draw(st.integers(1, 3))):
            shape = draw(st.sampled_from([(2, 3, 4), (2, 3, 4), (3, 4)]))
            self.values.append(self.g.add_input(f"x{i}", _t(*shape)))

    def pick(self):
        return self.draw(st.sampled_from(self.values))

    def param(self, *shape):
        self.params += 1
        return self.g.add_param(f"p{self.params}", _t(*shape))

    def const(self, value):
        return self.g.op("constant", value=np.array(value, np.float64))

    def op(self, name, *inputs, **attrs):
        return self.g.op(name, *inputs, **attrs)

    # -- the building blocks ------------------------------------------------------
    def binary(self):
        op = self.draw(st.sampled_from(["add", "mul", "sub"]))
        return self.op(op, self.pick(), self.pick())

    def with_constant(self):
        v, c = self.pick(), self.const(self.draw(st.sampled_from([0.5, 2.0, -1.5, 0.125])))
        op = self.draw(st.sampled_from(["add", "mul", "div", "sub"]))
        return self.op(op, v, c) if op == "div" or self.draw(st.booleans()) else self.op(op, c, v)

    def unary(self):
        op = self.draw(st.sampled_from(["tanh", "relu", "neg", "exp"]))
        v = self.pick()
        return self.op("exp", self.op("tanh", v)) if op == "exp" else self.op(op, v)

    def linear(self):
        x = self.pick()
        k = self.draw(st.sampled_from([4, 8]))
        y = self.op("matmul", x, self.param(x.shape[-1], k))
        if self.draw(st.booleans()):
            b = self.param(k)
            y = self.op("add", y, b) if self.draw(st.booleans()) else self.op("add", b, y)
            act = self.draw(st.sampled_from([None, "relu", "gelu", "gelu_tanh"]))
            if act == "relu":
                y = self.op("relu", y)
            elif act:
                y = self.op("gelu", y, approximate="tanh" if act == "gelu_tanh" else "none")
        return y

    def siblings(self):
        """Two or three projections of one value (the QKV shape), with or without biases."""
        x, bias = self.pick(), self.draw(st.booleans())
        outs = []
        for _ in range(self.draw(st.integers(2, 3))):
            y = self.op("matmul", x, self.param(x.shape[-1], 4))
            outs.append(self.op("add", y, self.param(4)) if bias else y)
        self.values += outs[:-1]
        return outs[-1]

    def scores(self, s):
        """An optional scale and an optional mask on scores ``s``."""
        scale = self.draw(st.sampled_from([None, "mul", "div"]))
        if scale:
            s = self.op(scale, s, self.const(0.5 if scale == "mul" else 2.0))
        mask = self.draw(st.sampled_from([None, "additive", "causal"]))
        if mask == "additive":
            s = self.op("add", s, self.pick())
        elif mask == "causal":
            causal = self.op("causal_mask", rows=s.shape[-2], cols=s.shape[-1])
            s = self.op("where", causal, s, self.const(-1e9))
        return s

    def softmax(self):
        s = self.scores(self.pick())
        axis = self.draw(st.sampled_from([-1, -1, 0, 1]))
        return self.op("softmax", s, axis=axis % len(s.shape) - len(s.shape) if axis == -1 else axis)

    def attention(self):
        q, k, v = self.pick(), self.pick(), self.pick()
        perm = list(range(len(k.shape)))
        perm[-2], perm[-1] = perm[-1], perm[-2]
        probs = self.op("softmax", self.scores(self.op("matmul", q, self.op("transpose", k, perm=perm))), axis=-1)
        return self.op("matmul", probs, v)

    def norm(self):
        x = self.pick()
        if self.draw(st.booleans()):  # a residual add first; its sum may be read again later
            x = self.op("add", x, self.pick())
            self.values.append(x)
        d = x.shape[-1]
        if self.draw(st.booleans()):
            return self.op("layernorm", x, self.param(d), self.param(d), eps=1e-5)
        return self.op("rmsnorm", x, self.param(d), eps=1e-6)

    def shuffle(self):
        x = self.pick()
        if self.draw(st.booleans()):
            y = self.op("transpose", x, perm=self.draw(st.permutations(range(len(x.shape)))))
            if self.draw(st.booleans()):
                y = self.op("transpose", y, perm=self.draw(st.permutations(range(len(y.shape)))))
            return y
        y = self.op("reshape", x, shape=[0] * (len(x.shape) - 1) + [2, -1])
        return self.op("reshape", y, shape=list(x.shape)) if self.draw(st.booleans()) else y

    STEPS = ("binary", "with_constant", "unary", "linear", "siblings", "softmax", "attention", "norm", "shuffle")


@st.composite
def random_graphs(draw):
    b = _Builder(draw)
    for _ in range(draw(st.integers(1, 10))):
        step = draw(st.sampled_from(_Builder.STEPS))
        try:
            b.values.append(getattr(b, step)())
        except BlockcError:
            pass  # an operand pick that does not type-check: nodes already made are fine
    # Every value nothing reads is an output (so little is dead), plus maybe
    # one more that something does read (an intermediate used elsewhere).
    outs = [v for v in b.values if not v.uses] + draw(st.lists(st.sampled_from(b.values), max_size=1))
    b.g.set_outputs([(f"y{i}", v) for i, v in enumerate(outs)])
    return b.g


@SETTINGS
@given(random_graphs(), st.integers(0, 2**16))
def test_random_graphs_keep_their_numbers_through_the_pipeline(g, seed):
    note(str(g))
    verify(g)
    rng = np.random.default_rng(seed)
    weights, feeds = random_weights(g, rng), random_feeds(g, rng)
    for start in (g, decompose(g).graph):
        r = optimize(start)
        note(str(r.graph))
        verify(r.graph)
        assert_same_numbers(g, r.graph, weights=weights, feeds=feeds, atol=1e-10)


@st.composite
def block_configs(draw):
    d_model = draw(st.sampled_from([8, 16]))
    return BlockConfig(d_model=d_model, heads=draw(st.sampled_from([1, 2, 4])), d_ff=draw(st.sampled_from([0, 12])),
                       norm_first=draw(st.booleans()), activation=draw(st.sampled_from(["relu", "gelu", "gelu_tanh"])),
                       norm=draw(st.sampled_from(["layernorm", "rmsnorm"])), causal=draw(st.booleans()),
                       layers=draw(st.integers(1, 2)), dtype="float64")


@SETTINGS
@given(block_configs(), st.integers(1, 6), st.integers(0, 2**16))
def test_random_blocks_keep_their_numbers_through_the_pipeline(cfg, seq, seed):
    note(repr(cfg))
    model = BlockModel(cfg)
    g = trace(model)
    rng = np.random.default_rng(seed)
    feeds = {s.name: s.sample({"batch": 2, "seq": seq}, rng) for s in model.inputs()}
    weights = dict(init_weights(model, seed=seed))
    for start in (g, decompose(g).graph):
        r = optimize(start)
        verify(r.graph)
        counts = r.graph.op_counts()
        # The block's structure is recognised whichever form it starts in: all
        # attention (with its projection when that has a bias); every norm after
        # a residual add (pre-norm: all but the first).
        norm, plain = "add_" + cfg.norm, int(cfg.norm_first)
        assert counts.get("attention", 0) + counts.get("qkv_attention", 0) == cfg.layers, str(r.graph)
        assert "softmax" not in counts, str(r.graph)
        assert (counts.get(norm), counts.get(cfg.norm, 0)) == (2 * cfg.layers - plain, plain), str(r.graph)
        assert counts.get("matmul_bias_act") == cfg.layers
        assert_same_numbers(g, r.graph, weights=weights, feeds=feeds, atol=1e-10)
