"""mdc.contrastive: CLIP's symmetric InfoNCE."""
import torch
import torch.nn.functional as F

from mdc.contrastive import clip_loss


def test_clip_loss_is_symmetric_infonce():
    torch.manual_seed(0)
    img, txt = F.normalize(torch.randn(5, 8), dim=-1), F.normalize(torch.randn(5, 8), dim=-1)
    logits = 10 * img @ txt.t()
    expect = sum(-F.log_softmax(logits, 1)[i, i] - F.log_softmax(logits, 0)[i, i] for i in range(5)) / 10
    torch.testing.assert_close(clip_loss(img, txt, torch.tensor(10.0)), expect)
    assert clip_loss(img, img, torch.tensor(10.0)) < clip_loss(img, txt, torch.tensor(10.0))
