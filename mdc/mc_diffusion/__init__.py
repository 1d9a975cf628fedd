"""MC-Diffusion's extensions of MDC: classifier-free and MCS guidance (:mod:`.guidance`), the mask-and-replace
(D3PM) noise process (:mod:`.mask_replace`) and VQ-VAE image tokens (:mod:`.vqvae`). The core never imports
them; :mod:`mdc.factory` wires them in (docs/guidance.md)."""
