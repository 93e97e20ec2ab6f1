"""The one reader of the JSON files beside a model (``frontends/json_files.py``):
what is wrong is named with the file and, for a field, the field."""
from __future__ import annotations

import re

import pytest

from blockc.errors import ModelError, OnnxFileError, WeightsError
from blockc.frontends.json_files import json_field, read_json


@pytest.mark.parametrize("text, says", [("{bad", "is not valid JSON: Expecting property name"),
                                        ("[1, 2]", "holds a JSON list, not an object of settings"),
                                        (b"\xff\xfe{}", "is not valid JSON: ")])
def test_a_file_that_is_not_a_json_object_is_named(tmp_path, text, says):
    file = tmp_path / "c.json"
    file.write_bytes(text if isinstance(text, bytes) else text.encode())
    with pytest.raises(WeightsError, match=rf"^{file}.* {says}"):
        read_json(file, "settings", WeightsError)
    with pytest.raises(ModelError, match=f"cannot read {tmp_path / 'none.json'}: No such file"):
        read_json(tmp_path / "none.json", "settings")


CONFIG = {"model": {"decoder": {"num_hidden_layers": "2", "inputs": [], "flag": True}, "n": 3}}


@pytest.mark.parametrize("dotted, kind, says", [
    ("model.decoder.head_size", int, "F has no field model.decoder.head_size"),
    ("model.decoder.num_hidden_layers", int, "F: model.decoder.num_hidden_layers is a string ('2'), not an integer"),
    ("model.decoder.flag", int, "F: model.decoder.flag is true or false (True), not an integer"),
    ("model.decoder.inputs", dict, "F: model.decoder.inputs is a list, not an object"),
    ("model.n.past", str, "F: model.n is an integer (3), not an object (reading model.n.past)"),
])
def test_a_field_that_is_missing_or_of_another_kind_is_named_with_its_file(dotted, kind, says):
    with pytest.raises(OnnxFileError, match=f"^{re.escape(says)}$"):
        json_field(CONFIG, dotted, kind, file="F", error=OnnxFileError)


def test_a_field_is_returned_or_its_default():
    assert json_field(CONFIG, "model.n", int, file="F") == 3
    assert json_field(CONFIG, "model.decoder.flag", bool, file="F") is True
    assert json_field(CONFIG, "model.context_length", int, file="F", default=None) is None
