import torch

from benchmarks.model_attention_ab import use_attention
from kernels.model import TransformerLM


def test_switching_attention_changes_every_block_and_keeps_the_function():
    torch.manual_seed(0)
    model = TransformerLM(64, 32, 32, 3, 4, 64, attention="naive")
    ids = torch.randint(0, 64, (2, 32))
    want = model(ids)
    use_attention(model, "sdpa")
    assert [block.attn.attention for block in model.layers] == ["sdpa"] * 3
    assert len({block.attn._attn_fn for block in model.layers}) == 1
    torch.testing.assert_close(model(ids), want, rtol=1e-4, atol=1e-5)  # same weights, another implementation
