"""What the Hugging Face loader tests share."""


def randomise(model, torch):
    """Every parameter of a transformers ``model`` random, in place: norm
    weights around 1, biases around 0, matrices scaled by their fan-in. HF
    starts norms at 1 and biases at 0, which would hide a wrong norm or bias
    mapping. A tied head is visited once (it is the token table). Names are
    matched case-blind: BERT's norms are ``LayerNorm``."""
    with torch.no_grad():
        for name, p in model.named_parameters():
            if ("norm" in name.lower() or "ln_" in name) and name.endswith("weight"):
                p.copy_(1.0 + 0.2 * torch.randn_like(p))
            elif p.ndim == 1:
                p.copy_(0.1 * torch.randn_like(p))
            else:
                p.copy_(torch.randn_like(p) / p.shape[-1] ** 0.5)
    return model.eval()
