"""A small VQ-VAE (van den Oord et al. 2017): MC-Diffusion's discrete image tokens.

Encoder: log2(f) stride-2 4x4 convolutions, a residual block and a 1x1 convolution: images
[B, 3, S, S] -> z_e [B, D, S/f, S/f]. Quantiser: the nearest of K codebook vectors (L2) ->
codes [B, (S/f)^2]; straight-through estimator z_q = z_e + sg(e - z_e). Decoder: the mirror
with transposed convolutions. Loss: MSE reconstruction (in the normalised image space of
the captioner's transform) + ||sg(z_e) - e||^2 (codebook) + beta ||z_e - sg(e)||^2
(commitment). ``ema=True`` replaces the codebook loss by exponential-moving-average updates
of the codebook (decay ``ema_decay``, Laplace-smoothed counts; single process). The codebook
starts from encoder outputs of the first training batch, and during training a code whose
running usage falls below 1/(32 K) is restarted at a random encoder output of the batch
(dead-code restart, as Jukebox): without it, short trainings collapse onto a few codes.

As the captioner's condition (the "vqvae" entry of ``ModelConfig.extensions``, :class:`VQImageTokens`,
MC-Diffusion's discrete-to-discrete setup): the VQ-VAE is frozen (no gradient, always in eval mode), its
codes [B, N] are embedded by a learned ``nn.Embedding(K, vision_width)`` plus a position
embedding [N, vision_width] and LayerNorm-ed, and ``Captioner.image_proj`` maps them to the
decoder width, where the ViT tokens would go. With MCS (``cond_mask_prob`` > 0) the embedding has
one more row, the [MASK] code K: a masked code becomes K, is embedded like any code, and its
position embedding is added, so y_i = [MASK] keeps its position i (MC-Diffusion, Eq. 11). Where the weights live (our choice): inside
the captioner's checkpoint, so ``mdc.load`` needs nothing else and a moved or retrained
VQ-VAE folder cannot silently change a captioner. ``mdc.create_model(..., vqvae=folder)``
reads the VQ-VAE's config from ``folder`` (written by :meth:`VQVAE.save`), takes its image
size unless ``image_size`` is given, and copies its weights in.

Train one with :func:`train_vqvae` on images (a tensor, e.g. :func:`synthetic_images`) or any
image folder, or ``python -m mdc.mc_diffusion.vqvae --data DIR --out DIR --steps N``.
"""
from __future__ import annotations

import argparse
import json
import math
import os
from dataclasses import asdict, dataclass, fields

import torch
import torch.nn.functional as F
from safetensors.torch import load_file, save_file
from torch import nn

from mdc.data.formats import IMAGE_SUFFIXES, load_image
from mdc.data.transforms import image_transform
from mdc.world.render import render
from mdc.world.graphs import sample_scene
from mdc.world.streams import STREAM_SCENE, stream_rng


@dataclass
class VQConfig:
    image_size: int = 64  # input resolution (square), as the captioner's
    downsample: int = 4  # f, a power of 2: codes on a (S/f) x (S/f) grid
    channels: int = 64  # convolution width
    code_dim: int = 64  # D, codebook vector width
    codebook_size: int = 512  # K
    beta: float = 0.25  # commitment loss weight
    ema: bool = False  # EMA codebook updates instead of the codebook loss
    ema_decay: float = 0.99

    def __post_init__(self):
        if self.downsample < 1 or self.downsample & (self.downsample - 1) or self.image_size % self.downsample:
            raise ValueError(f"downsample must be a power of 2 dividing image_size {self.image_size}; "
                             f"got {self.downsample}")


class _Res(nn.Module):
    def __init__(self, c: int):
        super().__init__()
        self.body = nn.Sequential(nn.ReLU(), nn.Conv2d(c, c, 3, 1, 1), nn.ReLU(), nn.Conv2d(c, c, 1))

    def forward(self, x):
        return x + self.body(x)


class VQVAE(nn.Module):
    def __init__(self, cfg: VQConfig):
        super().__init__()
        self.config, c, n = cfg, cfg.channels, int(math.log2(cfg.downsample))
        down = [m for i in range(n) for m in (nn.Conv2d(3 if i == 0 else c, c, 4, 2, 1), nn.ReLU())]
        self.encoder = nn.Sequential(*down, nn.Conv2d(c if n else 3, c, 3, 1, 1), _Res(c), nn.ReLU(),
                                     nn.Conv2d(c, cfg.code_dim, 1))
        up = [m for i in range(n) for m in (nn.ReLU(), nn.ConvTranspose2d(c, c if i < n - 1 else 3, 4, 2, 1))]
        self.decoder = nn.Sequential(nn.Conv2d(cfg.code_dim, c, 3, 1, 1), _Res(c), *(up or [nn.ReLU(), nn.Conv2d(c, 3, 1)]))
        K, D = cfg.codebook_size, cfg.code_dim
        self.codebook = nn.Parameter(torch.empty(K, D).uniform_(-1 / K, 1 / K), requires_grad=not cfg.ema)  # [K, D]
        self.register_buffer("initialised", torch.tensor(False))
        self.register_buffer("usage", torch.full((K,), 1.0 / K))  # running share of assignments per code
        if cfg.ema:
            self.register_buffer("cluster_size", torch.zeros(K))
            self.register_buffer("embed_avg", self.codebook.detach().clone())

    @property
    def grid(self) -> int:
        return self.config.image_size // self.config.downsample

    def quantize(self, z: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """z [B, D, h, w] -> (nearest codebook vectors [B, D, h, w], codes [B, h*w])."""
        B, D, h, w = z.shape
        flat = z.permute(0, 2, 3, 1).reshape(-1, D)  # [B*h*w, D]
        C = self.codebook
        codes = (flat.pow(2).sum(1, keepdim=True) - 2 * flat @ C.t() + C.pow(2).sum(1)).argmin(1)  # [B*h*w]
        return C[codes].view(B, h, w, D).permute(0, 3, 1, 2), codes.view(B, h * w)

    @torch.no_grad()
    def encode(self, images: torch.Tensor) -> torch.Tensor:
        """Codes [B, N] (N = (S/f)^2); never updates the codebook."""
        return self.quantize(self.encoder(images))[1]

    @torch.no_grad()
    def decode(self, codes: torch.Tensor) -> torch.Tensor:
        """Images [B, 3, S, S] from codes [B, N]."""
        q = self.codebook[codes].view(len(codes), self.grid, self.grid, -1).permute(0, 3, 1, 2)
        return self.decoder(q)

    def forward(self, images: torch.Tensor):
        """(reconstruction [B, 3, S, S], losses {loss, recon, codebook, commitment, perplexity}, codes [B, N])."""
        z = self.encoder(images)  # [B, D, h, w]
        if self.training and not self.initialised:  # codebook <- random encoder outputs (data-dependent init)
            flat = z.detach().permute(0, 2, 3, 1).reshape(-1, z.shape[1])
            pick = torch.randint(len(flat), (len(self.codebook),), device=z.device)
            self.codebook.data.copy_(flat[pick])
            if self.config.ema:
                self.embed_avg.copy_(flat[pick])
            self.initialised.fill_(True)
        q, codes = self.quantize(z)
        if self.training:
            self._update_codebook(z, codes)
        commitment = F.mse_loss(z, q.detach())
        codebook = torch.zeros((), device=z.device) if self.config.ema else F.mse_loss(q, z.detach())
        recon = self.decoder(z + (q - z).detach())  # straight-through
        rec = F.mse_loss(recon, images)
        usage = F.one_hot(codes.flatten(), len(self.codebook)).float().mean(0)
        perplexity = torch.exp(-(usage * (usage + 1e-10).log()).sum())
        losses = {"loss": rec + codebook + self.config.beta * commitment, "recon": rec, "codebook": codebook,
                  "commitment": commitment, "perplexity": perplexity}
        return recon, losses, codes

    @torch.no_grad()
    def _update_codebook(self, z, codes, eps: float = 1e-5):
        """EMA updates (``ema``) and dead-code restarts, from one training batch."""
        K, d = len(self.codebook), self.config.ema_decay
        flat = z.permute(0, 2, 3, 1).reshape(-1, z.shape[1])  # [M, D]
        onehot = F.one_hot(codes.flatten(), K).type(flat.dtype)  # [M, K]
        self.usage.mul_(0.9).add_(onehot.mean(0), alpha=0.1)  # a window of about 10 batches
        if self.config.ema:
            self.cluster_size.mul_(d).add_(onehot.sum(0), alpha=1 - d)
            self.embed_avg.mul_(d).add_(onehot.t() @ flat, alpha=1 - d)
            n = self.cluster_size.sum()
            size = (self.cluster_size + eps) / (n + K * eps) * n  # Laplace smoothing
            self.codebook.data.copy_(self.embed_avg / size[:, None])
        dead = (self.usage < 1.0 / (32 * K)).nonzero().flatten()
        if len(dead):  # restart at random encoder outputs
            fresh = flat[torch.randint(len(flat), (len(dead),), device=flat.device)]
            self.codebook.data[dead] = fresh
            self.usage[dead] = 1.0 / K
            if self.config.ema:
                self.embed_avg[dead], self.cluster_size[dead] = fresh, 1.0

    def save(self, path: str | os.PathLike) -> None:
        """``path/vqvae.safetensors`` and ``path/config.json`` (no pickle)."""
        os.makedirs(path, exist_ok=True)
        save_file({k: v.detach().contiguous().cpu() for k, v in self.state_dict().items()},
                  os.path.join(path, "vqvae.safetensors"))
        with open(os.path.join(path, "config.json"), "w") as f:
            json.dump(asdict(self.config), f, indent=1)


def read_config(path: str | os.PathLike) -> dict:
    """The VQConfig fields of a VQ-VAE folder; ValueError naming the folder if it is not one."""
    for name in ("config.json", "vqvae.safetensors"):
        if not os.path.isfile(os.path.join(path, name)):
            raise ValueError(f"vqvae = {str(path)!r}: not a VQ-VAE folder (no {name}; write one with VQVAE.save)")
    with open(os.path.join(path, "config.json")) as f:
        data = json.load(f)
    known = {f.name for f in fields(VQConfig)}
    if set(data) - known:
        raise ValueError(f"vqvae = {str(path)!r}: config.json holds unknown fields {sorted(set(data) - known)}")
    return asdict(VQConfig(**data))


def load_vqvae(path: str | os.PathLike, map_location="cpu") -> VQVAE:
    vq = VQVAE(VQConfig(**read_config(path)))
    vq.load_state_dict(load_file(os.path.join(path, "vqvae.safetensors"), device=str(map_location)))
    return vq.eval()


class VQImageTokens(nn.Module):
    """The captioner's visual module on VQ codes: frozen VQ-VAE -> embedded codes [B, N, vision_width]."""

    def __init__(self, cfg, vq_cfg: VQConfig, mask_code: bool = False):
        """``cfg``: the captioner's ModelConfig; ``vq_cfg``: the frozen VQ-VAE's; ``mask_code``: learn MCS's
        [MASK] code (a captioner trained with ``cond_mask_prob`` > 0)."""
        super().__init__()
        if vq_cfg.image_size != cfg.image_size:
            raise ValueError(f"the VQ-VAE takes {vq_cfg.image_size} px images but the model's image_size is "
                             f"{cfg.image_size}; make them equal")
        self.vq = VQVAE(vq_cfg).requires_grad_(False).eval()
        self.num_tokens = self.vq.grid ** 2  # N
        self.mask_id = vq_cfg.codebook_size if mask_code else None  # MCS's [MASK] code: K
        self.embed = nn.Embedding(vq_cfg.codebook_size + (self.mask_id is not None), cfg.vision_width)
        self.pos = nn.Parameter(0.01 * torch.randn(self.num_tokens, cfg.vision_width))
        self.norm = nn.LayerNorm(cfg.vision_width)
        nn.init.normal_(self.embed.weight, std=0.02)

    def train(self, mode: bool = True):
        super().train(mode)
        self.vq.eval()  # frozen: never in training mode
        return self

    def load_vqvae(self, path: str | os.PathLike) -> None:
        """Copy the weights of the VQ-VAE folder ``path`` in (its config must match)."""
        if read_config(path) != asdict(self.vq.config):
            raise ValueError(f"vqvae = {str(path)!r}: its config differs from the model's (ModelConfig.extensions['vqvae'])")
        self.vq.load_state_dict(load_vqvae(path).state_dict())

    def forward_features(self, images: torch.Tensor) -> torch.Tensor:
        """Embedded codes [B, N, vision_width] (the ViT tokens' place)."""
        return self.norm(self.embed(self.vq.encode(images)) + self.pos)

    def masked_features(self, images: torch.Tensor, token_mask: torch.Tensor) -> torch.Tensor:
        """:meth:`forward_features` with the codes ``token_mask`` [B, N] (bool) replaced by the [MASK]
        code before the position embedding is added (MCS's partial condition)."""
        if self.mask_id is None:
            raise ValueError("the [MASK] code needs a model trained with cond_mask_prob > 0")
        codes = self.vq.encode(images)  # [B, N]
        if tuple(token_mask.shape) != tuple(codes.shape):
            raise ValueError(f"token_mask must have shape [B, N] = {list(codes.shape)}; got {list(token_mask.shape)}")
        return self.norm(self.embed(codes.masked_fill(token_mask.to(codes.device), self.mask_id)) + self.pos)

    def forward_head(self, x: torch.Tensor, pre_logits: bool = True) -> torch.Tensor:
        return x.mean(1)  # GAP, as the captioners' probe features


# ----------------------------------------------------------------------------- training
def synthetic_images(n: int, image_size: int = 64, seed: int = 0) -> torch.Tensor:
    """[n, 3, S, S] scenes of the synthetic world (the training shards' scenes), normalised as the models'."""
    transform = image_transform(image_size, train=False)
    return torch.stack([transform(render(sample_scene(stream_rng(seed, STREAM_SCENE, i)), image_size))
                        for i in range(n)])


class _Folder(torch.utils.data.Dataset):
    """Every image under ``root`` (any depth), with the eval transform."""

    def __init__(self, root: str, image_size: int):
        self.paths = sorted(os.path.join(d, f) for d, _, fs in os.walk(root) for f in fs
                            if f.lower().endswith(IMAGE_SUFFIXES))
        if not self.paths:
            raise ValueError(f"{root!r}: no images found")
        self.transform = image_transform(image_size, train=False)

    def __len__(self):
        return len(self.paths)

    def __getitem__(self, i):
        return self.transform(load_image({"image_path": self.paths[i]}))


def train_vqvae(data, config: VQConfig | None = None, *, steps: int = 1000, batch_size: int = 32, lr: float = 2e-4,
                seed: int = 0, device: str = "cpu", workers: int = 0) -> tuple[VQVAE, dict]:
    """Train a VQ-VAE on ``data``: images [N, 3, S, S] (normalised) or an image folder. Adam,
    constant ``lr``, seeded random batches. Returns (the model in eval mode, {metric: [per step]})."""
    config = config or VQConfig()
    torch.manual_seed(seed)
    dataset = torch.utils.data.TensorDataset(data) if torch.is_tensor(data) else _Folder(str(data), config.image_size)
    loader = torch.utils.data.DataLoader(dataset, batch_size=batch_size, shuffle=True, drop_last=len(dataset) > batch_size,
                                         num_workers=workers, generator=torch.Generator().manual_seed(seed))
    vq = VQVAE(config).to(device).train()
    opt = torch.optim.Adam([p for p in vq.parameters() if p.requires_grad], lr=lr)
    log: dict[str, list] = {"loss": [], "recon": [], "perplexity": []}
    while len(log["loss"]) < steps:
        for batch in loader:
            images = (batch[0] if isinstance(batch, (list, tuple)) else batch).to(device)
            _, losses, _ = vq(images)
            opt.zero_grad(set_to_none=True)
            losses["loss"].backward()
            opt.step()
            for k in log:
                log[k].append(losses[k].item())
            if len(log["loss"]) == steps:
                break
    return vq.eval(), log


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description="Train a VQ-VAE on an image folder (or the synthetic world).")
    p.add_argument("--data", default="", help="image folder; empty: --synthetic scenes of the synthetic world")
    p.add_argument("--synthetic", type=int, default=2000, help="synthetic images when --data is empty")
    p.add_argument("--out", required=True)
    p.add_argument("--steps", type=int, default=1000)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--lr", type=float, default=2e-4)
    p.add_argument("--config", type=json.loads, default={}, help='JSON of VQConfig fields, e.g. \'{"image_size": 256}\'')
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--device", default="cpu")
    p.add_argument("--workers", type=int, default=0)
    a = p.parse_args(argv)
    config = VQConfig(**a.config)
    data = a.data or synthetic_images(a.synthetic, config.image_size, a.seed)
    vq, log = train_vqvae(data, config, steps=a.steps, batch_size=a.batch_size, lr=a.lr, seed=a.seed,
                          device=a.device, workers=a.workers)
    vq.save(a.out)
    summary = {"steps": a.steps, "final_recon": log["recon"][-1], "final_perplexity": log["perplexity"][-1]}
    print(json.dumps(summary))
    return summary


if __name__ == "__main__":
    main()
