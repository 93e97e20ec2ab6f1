"""What a model's trace depends on, said before tracing (``frontends/trace_key.py``):
equal for models that trace alike, different for any setting or step that
changes the graph, and None where only the trace can tell."""
from blockc.frontends import build_model, trace
from blockc.frontends.models import DecoderLM
from blockc.frontends.trace_key import trace_key
from blockc.ir.printer import print_graph


def tiny(**sets):
    return build_model("tiny", {"layers": "1", **sets})


def test_models_that_trace_alike_have_one_key_and_a_setting_or_step_changes_it():
    a, b = tiny(), tiny()
    assert trace_key(a) == trace_key(b) and print_graph(trace(a)) == print_graph(trace(b))
    keys = {trace_key(m) for m in (a, tiny(eps="1e-6"), tiny(dtype="float16"), a.for_cache("prefill"),
                                   a.for_cache("prefill", padded=False), a.for_cache("decode", cache_len=8),
                                   a.for_cache("decode", cache_len=9), build_model("gpt2-block", {}))}
    assert len(keys) == 8 and None not in keys


def test_a_subclass_or_a_users_model_has_none():
    class Mine(DecoderLM):   # may trace otherwise under the same config
        pass
    assert trace_key(Mine(tiny().cfg)) is None
