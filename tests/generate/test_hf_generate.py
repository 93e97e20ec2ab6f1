"""blockc's generation against transformers' own ``generate(do_sample=False)``
on randomly initialised Hugging Face models (nothing downloaded): the same
32 tokens, and logits within 1e-4 at every step, for GPT-2 (learned
positions, now gathered by position_ids) and Llama (RoPE, grouped-query
attention). The prompts are batched left-padded on blockc's side and run
alone on Hugging Face's, so padding is checked too."""
import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from hf_testing import randomise  # noqa: E402

from blockc.frontends import build_model  # noqa: E402
from blockc.frontends.hf_gpt2 import load_hf_gpt2_state_dict  # noqa: E402
from blockc.frontends.hf_llama import llama_config_from_hf, load_hf_llama_state_dict  # noqa: E402
from blockc.frontends.models import DecoderLM  # noqa: E402
from blockc.generate import generate, greedy  # noqa: E402

VOCAB, POSITIONS, NEW = 100, 64, 32
PROMPTS = [[11, 42, 7, 99, 3, 58, 20, 1], [64, 5, 33]]


def hf_generate(hf, prompt):
    """Hugging Face's greedy tokens and the raw logits of each step, for one prompt alone."""
    ids = torch.tensor([prompt])
    with torch.no_grad():
        out = hf.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=NEW, min_new_tokens=NEW,
                          do_sample=False, output_logits=True, return_dict_in_generate=True, pad_token_id=0)
    return out.sequences[0, len(prompt):].tolist(), np.stack([s[0].numpy() for s in out.logits])


def blockc_generate(model, weights, backend="ort-cpu"):
    steps = []

    def pick(logits, history):
        steps.append(logits.copy())
        return greedy(logits, history)

    got = generate(model, weights, PROMPTS, NEW, backend=backend, pick=pick)
    return got.tokens, np.stack(steps)   # [step, row, vocab]


def check_against(hf, model, weights, backend="ort-cpu"):
    tokens, logits = blockc_generate(model, weights, backend)
    for row, prompt in enumerate(PROMPTS):
        expected_tokens, expected_logits = hf_generate(hf, prompt)
        assert len(set(expected_tokens)) >= 3   # greedy on these weights does not just repeat one token
        assert tokens[row] == expected_tokens
        err = np.abs(logits[:, row] - expected_logits).max()
        assert err <= 1e-4, f"prompt {row}: max abs logit error {err:.3g}"


def test_gpt2_generates_as_transformers():
    torch.manual_seed(0)
    config = transformers.GPT2Config(n_layer=2, n_embd=64, n_head=4, vocab_size=VOCAB, n_positions=POSITIONS,
                                     resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
                                     bos_token_id=None, eos_token_id=None)
    config._attn_implementation = "eager"
    hf = randomise(transformers.GPT2LMHeadModel(config), torch)
    # the built-in gpt2 at these settings, as `blockc generate gpt2 --set ...` builds it
    model = build_model("gpt2", {"layers": "2", "d_model": "64", "heads": "4", "vocab": str(VOCAB),
                                 "max_positions": str(POSITIONS)})
    check_against(hf, model, load_hf_gpt2_state_dict(hf.state_dict(), model))


def test_llama_generates_as_transformers():
    torch.manual_seed(1)
    config = transformers.LlamaConfig(vocab_size=VOCAB, hidden_size=64, intermediate_size=176, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=POSITIONS,
                                      rms_norm_eps=1e-6, rope_theta=500.0, bos_token_id=None, eos_token_id=None)
    config._attn_implementation = "eager"
    hf = randomise(transformers.LlamaForCausalLM(config), torch)
    model = DecoderLM(llama_config_from_hf(hf.config))
    cfg = model.cfg
    assert (cfg.positions, cfg.kv_heads, cfg.heads, cfg.gated_ffn, cfg.norm) == ("rope", 2, 4, True, "rmsnorm")
    check_against(hf, model, load_hf_llama_state_dict(hf.state_dict(), model))
