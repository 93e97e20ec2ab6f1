"""Front ends: the transformer DSL and the built-in models."""
from .catalog import BUILTINS, DEFAULT_MODEL, build_model  # noqa: F401
from .layers import (FeedForward, LayerNorm, LearnedPositionEmbedding, Linear, MultiHeadAttention,  # noqa: F401
                     RMSNorm, SinusoidalPositionEmbedding, Embedding, TransformerBlock,
                     scaled_dot_product_attention)
from .rotary import Rotary, RotaryEmbedding  # noqa: F401
from .models import (BlockConfig, BlockModel, DecoderConfig, DecoderLM, Encoder, EncoderConfig)  # noqa: F401
from .module import InputSpec, Model, Module, ModuleList, Parameter, init_weights, symbol, trace  # noqa: F401
from .tensor import Tensor, causal_mask, concat, constant, where  # noqa: F401
from .hf_bert import bert_config_from_hf, load_hf_bert_state_dict  # noqa: F401
from .hf_gpt2 import gpt2_config_from_hf, load_hf_gpt2_state_dict  # noqa: F401
from .hf_llama import llama_config_from_hf, load_hf_llama_state_dict  # noqa: F401
from .summary import Summary, summarize  # noqa: F401
from .weights import check_weights, load_weights, materialize, save_weights  # noqa: F401
