"""One rule for the settings blockc reads from the environment (``blockc/environment.py``):
unset or blank is the default, other text is parsed, and text that does not
parse is refused by blockc's own error naming the variable."""
import pytest

from blockc.environment import env_setting, positive_float, positive_int
from blockc.errors import BlockcError, LaunchError
from blockc.files import cache_limit, CACHE_LIMIT
from blockc.parallel.launch import master_port
from blockc.parallel.worker import collective_timeout
from blockc.runtime.threads import intra_op_threads


@pytest.mark.parametrize("text", [None, "", "  "])
def test_unset_or_blank_is_the_default(monkeypatch, text):
    if text is None:
        monkeypatch.delenv("BLOCKC_X", raising=False)
    else:
        monkeypatch.setenv("BLOCKC_X", text)
    assert env_setting("BLOCKC_X", positive_int, 7, "a count") == 7


@pytest.mark.parametrize("parse, text, want", [(positive_int, " 3 ", 3), (positive_float, "0.5", 0.5)])
def test_text_is_parsed(monkeypatch, parse, text, want):
    monkeypatch.setenv("BLOCKC_X", text)
    assert env_setting("BLOCKC_X", parse, None, "a count") == want


@pytest.mark.parametrize("parse, text", [(positive_int, "0"), (positive_int, "1.5"), (positive_int, "²"),
                                         (positive_float, "inf"), (positive_float, "nan"), (positive_float, "-1")])
def test_text_outside_the_setting_is_refused_by_name(monkeypatch, parse, text):
    monkeypatch.setenv("BLOCKC_X", text)
    with pytest.raises(BlockcError, match=r"BLOCKC_X=.* is not a count"):
        env_setting("BLOCKC_X", parse, None, "a count")


@pytest.mark.parametrize("variable, text, read, error, is_default", [
    ("BLOCKC_THREADS", "²", intra_op_threads, BlockcError, lambda v: v is None),   # isdigit() took it, int() not
    ("BLOCKC_TP_TIMEOUT", "soon", collective_timeout, BlockcError, lambda v: v == 60.0),
    ("MASTER_PORT", "http", master_port, LaunchError, lambda v: isinstance(v, int) and 0 < v < 65536),  # a free one
    ("BLOCKC_CACHE_MAX", "lots", cache_limit, BlockcError, lambda v: v == CACHE_LIMIT)])
def test_every_variable_blockc_reads_follows_the_rule(monkeypatch, variable, text, read, error, is_default):
    monkeypatch.setenv(variable, text)
    with pytest.raises(error, match=variable):
        read()
    monkeypatch.setenv(variable, " ")
    assert is_default(read())
