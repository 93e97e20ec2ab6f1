"""Activations: what ``matmul_bias_act`` applies and a feed-forward layer
names, each declared once with everything every target needs to know of it.

An activation is an elementwise op (with fixed attributes) that a GEMM may
apply to its biased sum. Its row says how each target spells it: the IR op
(the reference, the decomposition, the CUDA tiled kernel's epilogue through
the op's own C expression), ONNX Runtime's ``com.microsoft`` op taking the
sum and the bias (``contrib``; None: that encoding declines it and writes a
function), cuBLASLt's bias epilogue (``epilogue``; None: the bias epilogue
and one pass of the op over the output), the ``torch.nn.functional``
function, the title reports and kernel comments show, and the names Hugging
Face configs give it (``hidden_act``). Every list of activations elsewhere is
read from ``ACTIVATIONS``; ``declare`` adds one.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Mapping


@dataclass(frozen=True)
class Activation:
    """One activation (see the module docstring for each field's reader)."""

    name: str                          # matmul_bias_act's `activation`, a layer's `activation=`
    op: str                            # the IR op that applies it ...
    title: str                         # "tanh-GELU": reports, kernel comments, refusals
    torch: str                         # torch.nn.functional's function, called with `attrs`
    attrs: Mapping = field(default_factory=dict)   # ... with these attributes
    contrib: str | None = None         # com.microsoft op computing act(x + bias), or None
    epilogue: str | None = None        # cuBLASLt epilogue computing act(A B + bias), or None
    hf_names: tuple[str, ...] = ()     # Hugging Face's names for the same function

    def applies(self, node) -> bool:
        """Whether ``node`` computes this activation."""
        return node.op == self.op and all(node.attrs.get(k) == v for k, v in self.attrs.items())


_DECLARED: dict[str, Activation] = {}
ACTIVATIONS: Mapping[str, Activation] = MappingProxyType(_DECLARED)   # by name, in declaration order


def declare(activation: Activation) -> Activation:
    """Add ``activation`` to ``ACTIVATIONS`` (a name declared twice is a mistake, as an op's is)."""
    if activation.name in _DECLARED:
        raise AssertionError(f"activation {activation.name} declared twice")
    _DECLARED[activation.name] = activation
    return activation


def activation_of(node) -> Activation | None:
    """The activation ``node`` computes, or None."""
    return next((a for a in ACTIVATIONS.values() if a.applies(node)), None)


def activation_ops() -> tuple[str, ...]:
    """The IR ops some activation applies (what a fusion pattern matches)."""
    return tuple(dict.fromkeys(a.op for a in ACTIVATIONS.values()))


# cuBLASLt's GELU epilogue is the tanh approximation (XLA fuses only that form into it:
# CublasLtGemmRewriteTest.ApproxGeluActivation), so erf-GELU takes the plain bias epilogue.
# com.microsoft has no bias + ReLU op (FusedMatMul takes no bias, FusedGemm is 2-D only)
# and no bias + SiLU op; BiasGelu is the erf form, FastGelu the tanh one.
declare(Activation("relu", "relu", "ReLU", "relu", epilogue="CUBLASLT_EPILOGUE_RELU_BIAS", hf_names=("relu",)))
declare(Activation("gelu", "gelu", "GELU", "gelu", {"approximate": "none"}, contrib="BiasGelu", hf_names=("gelu",)))
# gelu_new, gelu_fast and gelu_pytorch_tanh are all 0.5x(1 + tanh(sqrt(2/pi)(x + 0.044715x^3)));
# "gelu" is the erf form (the two differ by up to ~1e-3, enough to fail a parity check).
declare(Activation("gelu_tanh", "gelu", "tanh-GELU", "gelu", {"approximate": "tanh"}, contrib="FastGelu",
                   epilogue="CUBLASLT_EPILOGUE_GELU_BIAS", hf_names=("gelu_new", "gelu_pytorch_tanh", "gelu_fast")))
declare(Activation("silu", "silu", "SiLU", "silu", hf_names=("silu", "swish")))
