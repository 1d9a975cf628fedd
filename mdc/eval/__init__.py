"""Evaluation of pretrained models (paper Sec. 4): linear probes, compositionality, captioning."""
