"""fuse_rotary: golden IR for each form the DSL emits (rotate-half,
interleaved, partial rotation, [batch, seq] and [seq] positions), the
decomposition traced back into the same fused op, rows computed where they
are used (Hugging Face's, through torch.onnx), and a rotary written
differently rejected with its reason, in the pass and in the fusion report."""
import pytest

from blockc import parse_graph
from blockc.passes.decompose import decompose
from blockc.passes.fuse_rotary import fuse_rotary
from blockc.passes.manager import label_origins, optimize
from blockc.report.fusions import build_report, format_report
from pass_testing import assert_same_numbers, check_golden, ir, nodes_of, run_pass


def header(rd: int = 16, dtype: str = "f64", x: str = "[b,4,s,16]", rows: str = "[0,1,-1,{rd}]",
           rows_type: str = "[b,1,s,{rd}]") -> str:
    """A graph's inputs, its cos/sin tables of ``rd`` columns and their rows
    at the positions, as %0..%3: what every rotation below reads."""
    rows, rows_type = rows.format(rd=rd), rows_type.format(rd=rd)
    return (f"graph g(%x: {dtype}{x}, %pos: i64[b,s]) {{\n"
            f"  param @cos: {dtype}[32,{rd}]\n  param @sin: {dtype}[32,{rd}]\n"
            f"  %0:{dtype}[b,s,{rd}] = gather @cos, %pos {{axis=0}}\n"
            f"  %1:{dtype}[b,s,{rd}] = gather @sin, %pos {{axis=0}}\n"
            f"  %2:{dtype}{rows_type} = reshape %0 {{shape={rows}}}\n"
            f"  %3:{dtype}{rows_type} = reshape %1 {{shape={rows}}}\n")


def fused(rd: int, interleaved: bool) -> str:
    return header(rd) + (f"  %4:f64[b,4,s,16] = rotary %x, @cos, @sin, %pos {{interleaved={str(interleaved).lower()}}}\n"
                         "  return y=%4\n}\n")


def rotate_half(cos: int, sin: int) -> str:
    """x turned by the rows %cos and %sin, rotate-half, as the lines after them."""
    n = max(cos, sin) + 1
    return (f"  %{n}:f64[b,4,s,8], %{n + 1}:f64[b,4,s,8] = split %x {{axis=-1, sizes=[8,8]}}\n"
            f"  %{n + 2}:f64[b,4,s,8] = neg %{n + 1}\n"
            f"  %{n + 3}:f64[b,4,s,16] = concat %{n + 2}, %{n} {{axis=-1}}\n"
            f"  %{n + 4}:f64[b,4,s,16] = mul %x, %{cos}\n"
            f"  %{n + 5}:f64[b,4,s,16] = mul %{n + 3}, %{sin}\n"
            f"  %{n + 6}:f64[b,4,s,16] = add %{n + 4}, %{n + 5}\n"
            f"  return y=%{n + 6}\n}}\n")


def test_golden_rotate_half():
    r = check_golden(fuse_rotary, header() + rotate_half(2, 3), fused(16, False))
    (site,) = [s for s in r.sites if s.fused]
    assert site.kind == "rotary" and site.ops == ["split", "neg", "concat", "mul", "mul", "add"]


def test_golden_interleaved_partial_with_operands_swapped():
    # GPT-J's pairs over the first 8 of 16 dims; the muls and the add written the other way round
    check_golden(fuse_rotary, header(8) + """\
  %4:f64[b,4,s,8], %5:f64[b,4,s,8] = split %x {axis=-1, sizes=[8,8]}
  %6:f64[b,4,s,4,2] = reshape %4 {shape=[0,0,0,4,2]}
  %7:f64[b,4,s,4,1], %8:f64[b,4,s,4,1] = split %6 {axis=-1, sizes=[1,1]}
  %9:f64[b,4,s,4,1] = neg %8
  %10:f64[b,4,s,4,2] = concat %9, %7 {axis=-1}
  %11:f64[b,4,s,8] = reshape %10 {shape=[0,0,0,8]}
  %12:f64[b,4,s,8] = mul %2, %4
  %13:f64[b,4,s,8] = mul %3, %11
  %14:f64[b,4,s,8] = add %13, %12
  %15:f64[b,4,s,16] = concat %14, %5 {axis=-1}
  return y=%15
}
""", fused(8, True))


def test_golden_positions_of_one_sequence():
    # position_ids [s]: the gathered rows [s, 16] broadcast over batch and heads as they are
    check_golden(fuse_rotary, """\
graph g(%x: f64[b,4,s,16], %pos: i64[s]) {
  param @cos: f64[32,16]
  param @sin: f64[32,16]
  %0:f64[s,16] = gather @cos, %pos {axis=0}
  %1:f64[s,16] = gather @sin, %pos {axis=0}
  %2:f64[b,4,s,8], %3:f64[b,4,s,8] = split %x {axis=-1, sizes=[8,8]}
  %4:f64[b,4,s,8] = neg %3
  %5:f64[b,4,s,16] = concat %4, %2 {axis=-1}
  %6:f64[b,4,s,16] = mul %x, %0
  %7:f64[b,4,s,16] = mul %5, %1
  %8:f64[b,4,s,16] = add %6, %7
  return y=%8
}
""", """\
graph g(%x: f64[b,4,s,16], %pos: i64[s]) {
  param @cos: f64[32,16]
  param @sin: f64[32,16]
  %0:f64[s,16] = gather @cos, %pos {axis=0}
  %1:f64[s,16] = gather @sin, %pos {axis=0}
  %2:f64[b,4,s,16] = rotary %x, @cos, @sin, %pos {interleaved=false}
  return y=%2
}
""")


@pytest.mark.parametrize("interleaved", [False, True])
@pytest.mark.parametrize("positions", ["i64[b,s]", "i64[s]"])
@pytest.mark.parametrize("rd", [16, 8])
def test_the_decomposition_fuses_back_into_the_same_op(interleaved, positions, rd):
    g = parse_graph(ir(f"""
        graph g(%x: f64[b,4,s,16], %pos: {positions}) {{
          param @cos: f64[32,{rd}]
          param @sin: f64[32,{rd}]
          %0:f64[b,4,s,16] = rotary %x, @cos, @sin, %pos {{interleaved={str(interleaved).lower()}}}
          return y=%0
        }}
    """))
    plain = decompose(g).graph
    assert "rotary" not in plain.op_counts()
    assert_same_numbers(g, plain)
    r = run_pass(fuse_rotary, plain)
    (node,) = nodes_of(r.graph, "rotary")
    assert node.attrs == {"interleaved": interleaved}
    assert [v.name for v in node.inputs] == ["x", "cos", "sin", "pos"]
    assert_same_numbers(g, r.graph)


# ---- rows computed where they are used (Hugging Face Llama through torch.onnx) -----------
def computed(rows: str = "1", rotation: str = "") -> str:
    """cos/sin of cat(angles, angles) times a scalar, reshaped to [rows, 1, s, 16] as %7/%8,
    and x's halves sliced; ``rotation`` replaces Hugging Face's rotate_half."""
    return ir(f"""
        graph g(%x: f64[b,4,s,16], %p: f64[{rows},s,1]) {{
          param @inv_freq: f64[8]
          %0:f64[{rows},s,8] = mul %p, @inv_freq
          %1:f64[{rows},s,16] = concat %0, %0 {{axis=-1}}
          %2:f64[{rows},s,16] = cos %1
          %3:f64[] = constant {{value=dense<f64[]: [0.5]>}}
          %4:f64[{rows},s,16] = mul %2, %3
          %5:f64[{rows},s,16] = sin %1
          %6:f64[{rows},s,16] = mul %5, %3
          %7:f64[{rows},1,s,16] = reshape %4 {{shape=[{rows},1,s,16]}}
          %8:f64[{rows},1,s,16] = reshape %6 {{shape=[{rows},1,s,16]}}
          %9:f64[b,4,s,16] = mul %x, %7
    """) + ir(rotation or """
          %10:f64[b,4,s,8] = slice %x {axis=3, start=0, end=8}
          %11:f64[b,4,s,8] = slice %x {axis=3, start=8, end=16}
          %12:f64[b,4,s,8] = neg %11
          %13:f64[b,4,s,16] = concat %12, %10 {axis=-1}
          %14:f64[b,4,s,16] = mul %13, %8
          %15:f64[b,4,s,16] = add %9, %14
          return y=%15
        }
    """)


def test_golden_rows_computed_per_token():
    # one row per position of the sequence: they become a table read by arange(s)
    check_golden(fuse_rotary, computed(), """
        graph g(%x: f64[b,4,s,16], %p: f64[1,s,1]) {
          param @inv_freq: f64[8]
          %0:f64[1,s,8] = mul %p, @inv_freq
          %1:f64[1,s,16] = concat %0, %0 {axis=-1}
          %2:f64[1,s,16] = cos %1
          %3:f64[] = constant {value=dense<f64[]: [0.5]>}
          %4:f64[1,s,16] = mul %2, %3
          %5:f64[1,s,16] = sin %1
          %6:f64[1,s,16] = mul %5, %3
          %7:f64[1,1,s,16] = reshape %4 {shape=[1,1,s,16]}
          %8:f64[1,1,s,16] = reshape %6 {shape=[1,1,s,16]}
          %9:f64[s,16] = reshape %7 {shape=[-1,16]}
          %10:f64[s,16] = reshape %8 {shape=[-1,16]}
          %11:i64[s] = arange {n=s}
          %12:f64[b,4,s,16] = rotary %x, %9, %10, %11 {interleaved=false}
          return y=%12
        }
    """)


def test_golden_rows_paired_after_cos():
    # cat(cos(a), cos(a)): an opset-23 RotaryEmbedding's one-per-pair cache as its import writes
    # both members (dynamo's export of Llama at opset 23); the same rows as cos(cat(a, a))
    rows = """
        graph g(%x: f64[b,4,s,16], %p: f64[1,s,1]) {
          param @inv_freq: f64[8]
          %0:f64[1,s,8] = mul %p, @inv_freq
          %1:f64[1,s,8] = cos %0
          %2:f64[1,s,8] = sin %0
          %3:f64[1,s,16] = concat %1, %1 {axis=-1}
          %4:f64[1,s,16] = concat %2, %2 {axis=-1}
          %5:f64[1,1,s,16] = reshape %3 {shape=[0,1,-1,16]}
          %6:f64[1,1,s,16] = reshape %4 {shape=[0,1,-1,16]}
    """
    before = ir(rows) + rotate_half(5, 6)
    check_golden(fuse_rotary, before, ir(rows) + ir("""
          %7:f64[s,16] = reshape %5 {shape=[-1,16]}
          %8:f64[s,16] = reshape %6 {shape=[-1,16]}
          %9:i64[s] = arange {n=s}
          %10:f64[b,4,s,16] = rotary %x, %7, %8, %9 {interleaved=false}
          return y=%10
        }
    """))


def test_rows_computed_for_each_row_of_the_batch():
    # position_ids given per row: rows [b, 1, s, 16], a table of b*s rows read as arange(b*s) in [b, s]
    g = parse_graph(computed(rows="b"))
    r = run_pass(fuse_rotary, g)
    (node,) = nodes_of(r.graph, "rotary")
    assert str(node.inputs[1].type) == "f64[b*s,16]" and str(node.inputs[3].type) == "i64[b,s]"
    assert_same_numbers(g, r.graph)


def test_computed_rows_under_a_rotation_of_adjacent_pairs_are_rejected():
    g = label_origins(parse_graph(computed(rotation="""
          %10:f64[b,4,s,8,2] = reshape %x {shape=[0,0,0,8,2]}
          %11:f64[b,4,s,8,1], %12:f64[b,4,s,8,1] = split %10 {axis=-1, sizes=[1,1]}
          %13:f64[b,4,s,8,1] = neg %12
          %14:f64[b,4,s,8,2] = concat %13, %11 {axis=-1}
          %15:f64[b,4,s,16] = reshape %14 {shape=[0,0,0,16]}
          %16:f64[b,4,s,16] = mul %15, %8
          %17:f64[b,4,s,16] = add %9, %16
          return y=%17
        }""")))
    r = run_pass(fuse_rotary, g)
    assert not r.changed
    (site,) = [s for s in r.sites if s.rule == "rotary" and s.anchor_op == "add"]
    assert site.reason == ("the cos/sin rows are computed as cat(angles, angles), which pairs dims half apart, "
                           "but the rotation turns adjacent pairs")


# ---- rotations the fused op does not express ---------------------------------------------
def rejected(body: str, **layout):
    g = label_origins(parse_graph(header(**layout) + ir(body) + "}\n"))
    r = run_pass(fuse_rotary, g)
    assert not r.changed
    (site,) = [s for s in r.sites if s.rule == "rotary" and s.anchor_op == "add"]
    return site.reason


def test_the_other_sign_convention_is_rejected_with_its_reason():
    # concat(x2, -x1) * -sin is the same rotation written another way: the pattern wants concat(-x2, x1) * sin
    reason = rejected("""
          %4:f64[b,4,s,8], %5:f64[b,4,s,8] = split %x {axis=-1, sizes=[8,8]}
          %6:f64[b,4,s,8] = neg %4
          %7:f64[b,4,s,16] = concat %5, %6 {axis=-1}
          %8:f64[b,1,s,16] = neg %3
          %9:f64[b,4,s,16] = mul %x, %2
          %10:f64[b,4,s,16] = mul %7, %8
          %11:f64[b,4,s,16] = add %9, %10
          return y=%11""")
    assert reason == "expected neg, found a split result"


def test_heads_laid_out_after_the_sequence_are_rejected_with_the_layout():
    # x as [batch, seq, heads, head_dim] with rows [batch, seq, 1, 16]: right maths, another layout
    reason = rejected("""
          %4:f64[b,s,4,8], %5:f64[b,s,4,8] = split %x {axis=-1, sizes=[8,8]}
          %6:f64[b,s,4,8] = neg %5
          %7:f64[b,s,4,16] = concat %6, %4 {axis=-1}
          %8:f64[b,s,4,16] = mul %x, %2
          %9:f64[b,s,4,16] = mul %7, %3
          %10:f64[b,s,4,16] = add %8, %9
          return y=%10""", x="[b,s,4,16]", rows="[0,0,1,16]", rows_type="[b,s,1,16]")
    assert reason == ("the cos rows are f64[b,s,1,16] for x f64[b,s,4,16]: the fused op turns "
                      "[batch, heads, seq, head_dim] by rows [batch, 1, seq, rotary_dim] (or [seq, rotary_dim])")


def test_the_fusion_report_gives_the_rejected_rotary_its_reason():
    # halves of 4 and 12: not a rotation at all, but it gets far enough to be a near miss
    g = parse_graph(header(dtype="f32") + ir("""
          %4:f32[b,4,s,4], %5:f32[b,4,s,12] = split %x {axis=-1, sizes=[4,12]}
          %6:f32[b,4,s,12] = neg %5
          %7:f32[b,4,s,16] = concat %6, %4 {axis=-1}
          %8:f32[b,4,s,16] = mul %x, %2
          %9:f32[b,4,s,16] = mul %7, %3
          %10:f32[b,4,s,16] = add %8, %9
          return y=%10
    """) + "}\n")
    result = optimize(g)
    report = build_report("user", g, result, {"b": 2, "s": 5})
    assert report["counts"]["rotary"]["fused"] == 0
    text = format_report(report)
    assert "rejected rotary" in text and "the halves are split [4, 12], not [8, 8]" in text
