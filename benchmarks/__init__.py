"""Benchmarks of mdc side by side with its peers, in one process: ``python -m benchmarks``.

Sections (``--only NAME``): ``train`` (training step per objective beside open_clip's CoCa),
``sampling`` (cached MDC unmasking, KV-cached ARC beam search vs CoCa's), ``scoring`` (ELBO
and heuristic throughput, ELBO variance by sampling scheme), ``data`` (shard writing, loader
decode and resume, what training consumes) and ``gpu`` (bf16 throughput and MFU; CUDA only).
"""
