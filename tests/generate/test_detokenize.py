"""The incremental detokenizer against ``tokenizer.decode``: fed one id at
a time (or in chunks), the pieces it emits, joined, are exactly
transformers' ``decode`` of all the ids, on random ids, on emoji, CJK and
accented characters split byte by byte across tokens (byte-level BPE's, and
SentencePiece's ``<0xNN>`` byte-fallback tokens, whose decoder also strips
the first space), with special tokens among them, kept or skipped; and
nothing is emitted while a character is incomplete."""
import pytest

pytest.importorskip("hypothesis")
transformers = pytest.importorskip("transformers")
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from blockc.generate.detokenize import IncrementalDecoder  # noqa: E402
from blockc.generate.text import TextTokenizer  # noqa: E402

SPLIT = "🚀🙂注意力éßå"   # 4-, 3- and 2-byte characters


def byte_tokens():
    """GPT-2's byte-to-character table: the byte-level token of each single byte."""
    shown = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + \
        list(range(ord("®"), ord("ÿ") + 1))
    chars, extra = {}, 0
    for b in range(256):
        if b in shown:
            chars[b] = chr(b)
        else:
            chars[b] = chr(256 + extra)
            extra += 1
    return chars


@pytest.fixture(scope="module", params=["bytelevel", "sentencepiece"])
def tokenizers(hf_dir, request):
    path = hf_dir("llama", request.param)
    return TextTokenizer.from_dir(path), transformers.AutoTokenizer.from_pretrained(path)


def decoded_in_pieces(tokenizer, ids, chunks=1, skip=False):
    decoder = IncrementalDecoder(tokenizer, skip_special_tokens=skip)
    pieces = [decoder.push(ids[i:i + chunks]) for i in range(0, len(ids), chunks)]
    return pieces + [decoder.finish()]


def split_ids(tokenizer, text: str) -> list[int]:
    """``text`` as one token per UTF-8 byte (byte-level, or ``<0xNN>``): every character split across tokens."""
    if tokenizer.backend.token_to_id("<0x00>") is not None:
        return [tokenizer.token_id(f"<0x{b:02X}>") for b in text.encode("utf-8")]
    table = byte_tokens()
    return [tokenizer.token_id(table[b]) for b in text.encode("utf-8")]


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_random_ids_join_to_decode(tokenizers, data):
    ours, hf = tokenizers
    ids = data.draw(st.lists(st.integers(0, ours.vocab_size - 1), min_size=0, max_size=40))
    chunks, skip = data.draw(st.integers(1, 4)), data.draw(st.booleans())
    assert "".join(decoded_in_pieces(ours, ids, chunks, skip)) == hf.decode(ids, skip_special_tokens=skip)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_characters_split_across_tokens_join_to_decode(tokenizers, data):
    """Multi-byte characters cut byte by byte, mixed with whole tokens, special tokens and a stray byte."""
    ours, hf = tokenizers
    parts = data.draw(st.lists(st.one_of(
        st.text(alphabet=SPLIT, min_size=1, max_size=3).map(lambda t: split_ids(ours, t)),
        st.text(alphabet=SPLIT + "ab ", min_size=1, max_size=6).map(lambda t: ours.encode(t)),
        st.sampled_from([[0], [1], [2], [3]]),   # the special tokens
        st.sampled_from(list(SPLIT)).map(lambda c: split_ids(ours, c)[:1])), max_size=12))
    ids = [i for part in parts for i in part]
    skip = data.draw(st.booleans())
    assert "".join(decoded_in_pieces(ours, ids, skip=skip)) == hf.decode(ids, skip_special_tokens=skip)


def test_an_incomplete_character_is_held_back(tokenizers):
    ours, hf = tokenizers
    ids = split_ids(ours, "a🚀") + [ours.token_id("b")]
    pieces = decoded_in_pieces(ours, ids)
    assert "".join(pieces) == hf.decode(ids) == "a🚀b"
    assert not any("\ufffd" in p for p in pieces)


def test_a_character_that_never_completes_ends_as_decode_shows_it(tokenizers):
    ours, hf = tokenizers
    ids = split_ids(ours, "a🚀")[:-1]
    pieces = decoded_in_pieces(ours, ids)
    assert "".join(pieces) == hf.decode(ids) and hf.decode(ids).endswith("\ufffd")
    assert "\ufffd" not in "".join(pieces[:-1])   # shown only at the end, when no byte can complete it
