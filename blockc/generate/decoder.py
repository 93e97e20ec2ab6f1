"""What ``generate`` drives: a ``DecoderLM``, or an ONNX decoder file that
carries its cache (``frontends/onnx/decoder.OnnxDecoder``)."""
from __future__ import annotations

from ..errors import BlockcError
from ..frontends.models import DecoderLM


def as_decoder(model):
    """``model`` as what ``generate`` drives: a ``DecoderLM``, or an ONNX
    file that carries its cache as an ``OnnxDecoder`` (its cache found by
    ``genai_config.json`` or by name); else a ``BlockcError``. The ONNX
    frontend is imported for an ONNX model alone (who made one imported it
    already): a ``DecoderLM``'s generation never loads it
    (``tests/cli/test_imports.py``)."""
    if isinstance(model, DecoderLM):
        return model
    from ..frontends.onnx.decoder import OnnxDecoder
    from ..frontends.onnx.model import OnnxModel
    if isinstance(model, OnnxModel):
        return OnnxDecoder(model.file.path)
    if not isinstance(model, OnnxDecoder):
        raise BlockcError(f"generate needs a decoder language model (a DecoderLM such as gpt2, tiny, llama-tiny, "
                          f"or an ONNX decoder file with its cache), "
                          f"not {getattr(model, 'name', type(model).__name__)!r}")
    return model
