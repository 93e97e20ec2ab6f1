"""A model of your own, in blockc's DSL.

    blockc show examples/custom_model.py:TinyEncoder
    blockc run  examples/custom_model.py:build --set d_model=96 --check
"""
import blockc
from blockc.frontends import InputSpec, LayerNorm, Linear, Model, ModuleList, TransformerBlock, symbol
from blockc.ir.dtypes import DType

batch, seq = symbol("batch"), symbol("seq")


class TinyEncoder(Model):
    """Two pre-norm RMSNorm blocks over float features, then a projection."""

    name = "tiny_encoder"

    def __init__(self, d_model: int = 64, heads: int = 4, layers: int = 2):
        super().__init__()
        self.d_model = d_model
        self.blocks = ModuleList([TransformerBlock(d_model, heads, norm_first=True, activation="gelu",
                                                   norm="rmsnorm") for _ in range(layers)])
        self.norm = LayerNorm(d_model)
        self.head = Linear(d_model, 10)

    def inputs(self):
        return [InputSpec("features", DType.float32, (batch, seq, self.d_model))]

    def forward(self, features):
        x = features
        for block in self.blocks:
            x = block(x)
        return {"scores": self.head(self.norm(x))}


def build(d_model: int = 64, heads: int = 4, layers: int = 2) -> TinyEncoder:
    return TinyEncoder(d_model, heads, layers)


if __name__ == "__main__":
    model = build()
    print(blockc.trace(model))
