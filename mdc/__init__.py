"""Masked diffusion captioning (MDC) for visual feature learning.

    model = mdc.create_model("tiny", objective="mdc")
    model = mdc.create_model("mini", objective="mdc", pretrained="synthetic")  # mdc.list_pretrained()
    loss = model.loss(images, tokens)
    captions = mdc.generate(model, images, length=15)  # decoder="margin": mdc.list_decoders()
    scores = mdc.score(model, images, captions, method="heuristic")
"""
from mdc.api import generate, score, score_candidates
from mdc.factory import (create_model, create_model_and_transforms, get_tokenizer, image_transform, list_models,
                         list_pretrained, load, model_config)
from mdc.model import CLIP, Captioner, ModelConfig
from mdc.sampler import list_decoders

__all__ = ["CLIP", "Captioner", "ModelConfig", "create_model", "create_model_and_transforms", "generate",
           "get_tokenizer", "image_transform", "list_decoders", "list_models", "list_pretrained", "load",
           "model_config", "score", "score_candidates"]
