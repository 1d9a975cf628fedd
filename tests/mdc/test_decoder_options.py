"""The decoder options of the neighbouring-words study: the recorded self-attention, rotary positions
(``ModelConfig.positions``) and a hidden caption length (``ModelConfig.length_visible``)."""
import pytest
import torch

from conftest import CAPTIONS, small_model
from mdc.tokenizer import valid_mask
from mdc.transformer import recording_attention


# ---------------------------------------------------------------------------- recording the attention
@pytest.mark.parametrize("objective", ("mdc", "arc", "clip"))
def test_recorded_attention_is_a_distribution_per_block_and_leaves_the_outputs_alone(objective):
    torch.manual_seed(0)
    model = small_model(objective).eval()
    text = model.text if objective == "clip" else model.decoder
    images, tokens = torch.randn(4, 3, 32, 32), model.tokenizer(CAPTIONS)[:, :12]
    run = (lambda: text(tokens, causal=True)) if objective == "clip" else (lambda: model(images, tokens))
    with torch.no_grad():
        plain = run()
        with recording_attention(text) as probs:
            recorded = run()
            run()  # a second forward call appends its own entries
    assert torch.equal(plain, recorded)
    assert len(probs) == 2 * len(text.blocks)
    assert all(p.dtype == torch.float32 and p.shape == (4, text.blocks[0].self_attn.heads, 12, 12) for p in probs)
    assert all(torch.allclose(p.sum(-1), torch.ones(p.shape[:-1])) for p in probs)
    if objective != "mdc":  # causal: nothing above the diagonal
        assert all((p.triu(1) == 0).all() for p in probs)
    else:  # bidirectional: nothing on the padding after [EOT]
        pad = ~valid_mask(tokens, model.tokenizer.eot_id)  # [B, L]
        assert all((p.transpose(1, 3)[pad] == 0).all() for p in probs)
    with torch.no_grad():
        run()
    assert len(probs) == 2 * len(text.blocks)  # nothing recorded once the context has closed
