"""Helpers of the tutorials (``notebooks/tutorials``): a small world, a small model, seconds of CPU.

The tutorials show the method at work in a minute or two each, so everything here is sized
for a laptop CPU and deterministic for a fixed thread count (:func:`setup` fixes one thread):

- :func:`setup` (one thread, seeded) and :func:`workdir` (a temporary folder);
- :data:`TUTORIAL_CONFIG`: ``tiny`` made smaller (32 px, patch 8, 2 + 2 layers of width 64,
  40-token context), the synthetic world's compact vocabulary; :data:`QUICKSTART_CONFIG`: the
  same with the ``mini`` profile's encoder (a convolutional stem at 64 px);
- :func:`scene_data`: one- and two-object scenes of the synthetic world (fewer objects are
  learnt faster), rendered and captioned in memory, training and held-out streams disjoint;
- :func:`train_tiny`: the training loop of Alg. 1 on such data, a few hundred steps;
- :func:`caption_variants`: a scene's true caption and ARO / SugarCrepe-style perturbations, written
  by the world's own caption writer; :func:`describes`: whether a caption names what a scene holds;
- :func:`elbo_spread`: how the Monte-Carlo ELBO estimate (Eq. 8) scatters with its sample
  count under i.i.d., stratified and paired noise.
"""
from __future__ import annotations

import copy
import tempfile
import warnings
from dataclasses import dataclass

import numpy as np
import torch

import mdc
from mdc.base import optim
from mdc.data.transforms import CLIP_MEAN, CLIP_STD
from mdc.world.render import COLOURS, SHAPES, render_array
from mdc.world.scenes import sample_scene
from mdc.world.streams import (STREAM_TUTORIAL_HELD_OUT as STREAM_HELD_OUT, STREAM_TUTORIAL_TRAIN as STREAM_TRAIN,
                               stream_rng)
from mdc.world.text import BACKGROUND_WORDS, INVERSE, SIZE_WORDS, TEXTURE_ADJ, caption, references, word_tokens

#: ``tiny`` overrides for the tutorials: a model of ~0.3 M parameters that trains at ~10 steps/s.
TUTORIAL_CONFIG = dict(image_size=32, patch_size=8, vision_width=64, vision_layers=2, vision_heads=2,
                       text_width=64, text_layers=2, text_heads=2, embed_dim=64, context_length=40)
#: The quickstart's model: the encoder that the ``mini`` profile chose by its supervised ceiling
#: (``vision_stem="conv"`` at 64 px: 64 image tokens), at the tutorials' width and depth.
QUICKSTART_CONFIG = dict(TUTORIAL_CONFIG, image_size=64, vision_stem="conv")


_WORKDIRS: list = []  # kept alive until the process (the notebook's kernel) exits


def setup(seed: int = 0, threads: int = 1) -> None:
    """One torch thread and a seeded global RNG: a re-run gives the same numbers on a CPU."""
    torch.set_num_threads(threads)
    torch.manual_seed(seed)
    # tqdm.auto (imported by timm's dependencies) warns once without ipywidgets; text bars are fine here
    warnings.filterwarnings("ignore", message="IProgress not found")


def workdir(prefix: str = "mdc-tutorial-") -> str:
    """A new temporary folder for a tutorial's files, removed when the Python process exits."""
    folder = tempfile.TemporaryDirectory(prefix=prefix)
    _WORKDIRS.append(folder)
    return folder.name


@dataclass
class SceneData:
    """Rendered, captioned scenes held in memory."""
    scenes: list  # [N] scene graphs (mdc.world.scenes.sample_scene)
    pixels: np.ndarray  # [N, S, S, 3] uint8, for display
    images: torch.Tensor  # [N, 3, S, S] float, CLIP-normalised: the model's input
    captions: list  # [N] str

    def __len__(self) -> int:
        return len(self.scenes)


def normalise(pixels: np.ndarray) -> torch.Tensor:
    """uint8 [N, S, S, 3] -> CLIP-normalised float [N, 3, S, S] (the eval transform at size S)."""
    x = torch.from_numpy(np.ascontiguousarray(pixels)).permute(0, 3, 1, 2).float() / 255
    return (x - torch.tensor(CLIP_MEAN).view(3, 1, 1)) / torch.tensor(CLIP_STD).view(3, 1, 1)


def scene_data(n: int, style: str = "descriptive", seed: int = 0, held_out: bool = False,
               image_size: int = 32, max_objects: int = 2) -> SceneData:
    """``n`` scenes of 1..``max_objects`` objects with one ``style`` caption each ("descriptive",
    "alt" or "reference"). ``held_out`` draws from a stream the training data never uses."""
    stream = STREAM_HELD_OUT if held_out else STREAM_TRAIN
    scenes = []
    for i in range(n):
        rng = stream_rng(seed, stream, i)
        scenes.append(sample_scene(rng, n_objects=int(rng.integers(1, max_objects + 1))))
    captions = [caption(s, style, stream_rng(seed, stream + 1, i)) for i, s in enumerate(scenes)]
    pixels = np.stack([render_array(s, image_size) for s in scenes])
    return SceneData(scenes, pixels, normalise(pixels), captions)


def train_tiny(data: SceneData, objective: str = "mdc", steps: int = 600, batch_size: int = 64, lr: float = 3e-3,
               seed: int = 0, **overrides):
    """Train a :data:`TUTORIAL_CONFIG` model on ``data`` (Alg. 1 for MDC: ``model.loss`` draws t and
    masks). :func:`mdc.base.optim.fit`: AdamW with 5% warm-up and cosine decay, batches drawn with
    replacement from a seeded generator. Returns ``(model in eval mode, per-step losses)``."""
    torch.manual_seed(seed)
    model = mdc.create_model("tiny", objective, **{**TUTORIAL_CONFIG, **overrides})
    tokens = model.tokenizer(data.captions)  # [N, context]
    g = torch.Generator().manual_seed(seed)

    def next_batch() -> tuple[torch.Tensor, torch.Tensor]:
        rows = torch.randint(len(data), (batch_size,), generator=g)
        return data.images[rows], tokens[rows]

    losses = optim.fit(model, next_batch, steps, lr, weight_decay=0.1)
    return model, losses


def has_variants(scene: dict) -> bool:
    """Whether :func:`caption_variants` can perturb ``scene``: two objects of different colours and shapes."""
    objects = scene["objects"]
    return len(objects) == 2 and all(objects[0][k] != objects[1][k] for k in ("colour", "shape"))


def caption_variants(scene: dict, style: str = "descriptive", seed: int = 0) -> dict[str, str]:
    """A two-object scene's true caption in ``style`` and four false ones, the hard negatives of ARO and
    SugarCrepe: ``relation swap`` (the relation reversed, VG-Relation), ``colour swap`` (the two objects'
    colours exchanged, VG-Attribution and swap-att), ``colour replaced`` and ``shape replaced`` (a colour or
    a shape absent from the scene, replace-att and replace-obj). Each is the world's own caption writer
    (:func:`mdc.world.text.caption`) on an altered copy of the scene, with the same random stream
    (``seed``) as the true caption: the same template and words but the altered ones."""
    if not has_variants(scene):
        raise ValueError("caption_variants needs a two-object scene whose objects differ in colour and shape; "
                         f"this one has {[(o['colour'], o['shape']) for o in scene['objects']]}")
    a, b = scene["objects"]

    def write(colours=(a["colour"], b["colour"]), shapes=(a["shape"], b["shape"]), reverse=False) -> str:
        altered = copy.deepcopy(scene)
        for obj, colour, shape in zip(altered["objects"], colours, shapes):
            obj.update(colour=colour, shape=shape)
        if reverse:  # every relation now holds the other way round
            for rel in altered["relations"]:
                rel["relation"] = INVERSE[rel["relation"]]
        return caption(altered, style, np.random.default_rng(seed))

    return {"true": write(), "relation swap": write(reverse=True),
            "colour swap": write(colours=(b["colour"], a["colour"])),
            "colour replaced": write(colours=(next(c for c in COLOURS if c not in (a["colour"], b["colour"])),
                                              b["colour"])),
            "shape replaced": write(shapes=(next(s for s in SHAPES if s not in (a["shape"], b["shape"])),
                                            b["shape"]))}


def describes(scene: dict, text: str) -> bool:
    """Whether ``text`` names, for every object of ``scene``, its colour, shape, size and texture (in any of
    the world's words for them), and the background: a check of words, not of which word goes with which."""
    words = set(word_tokens(text))
    named = [any(w in words for w in BACKGROUND_WORDS[scene["background"]["kind"]])]
    for obj in scene["objects"]:
        named += [obj["colour"] in words, obj["shape"] in words, any(w in words for w in SIZE_WORDS[obj["size"]]),
                  any(w in words for w in TEXTURE_ADJ[obj["texture"]])]
    return all(named)


#: score_candidates options of the four estimators compared by :func:`elbo_spread`.
SPREAD_MODES = {"i.i.d.": dict(stratified=False, paired=False), "stratified": dict(stratified=True, paired=False),
                "i.i.d. + paired": dict(stratified=False, paired=True),
                "stratified + paired": dict(stratified=True, paired=True)}


@torch.no_grad()
def elbo_spread(model, images: torch.Tensor, pairs: list, sizes=(4, 16, 64, 256), seeds=range(16)) -> dict:
    """Standard deviation over ``seeds`` of the ELBO estimate (Eq. 8) with S = ``sizes`` samples.

    ``pairs`` [B] are (true, false) captions of ``images`` [B]. For each mode of
    :data:`SPREAD_MODES` and each S: ``"caption"``, the std of the true caption's ELBO, and
    ``"difference"``, the std of true minus false (what a matching benchmark compares); each the
    root mean square over the B items of the std over seeds. Returns
    ``{mode: {"caption": [per S], "difference": [per S]}}`` and ``"sizes"``.
    """
    def rms(x):  # [seeds, B] -> root mean square over items of the std over seeds
        return float(x.std(0).pow(2).mean().sqrt())

    out = {"sizes": list(sizes)}
    for mode, options in SPREAD_MODES.items():
        out[mode] = {"caption": [], "difference": []}
        for S in sizes:
            runs = torch.stack([mdc.score_candidates(model, images, pairs, "elbo", num_samples=S, seed=s, **options)
                                for s in seeds])  # [seeds, B, 2]
            out[mode]["caption"].append(rms(runs[..., 0]))
            out[mode]["difference"].append(rms(runs[..., 0] - runs[..., 1]))
    return out


def unmasking_steps(trace: list, tokenizer, row: int = 0) -> list[dict]:
    """The tokens of caption ``row`` in the order the sampler revealed them: ``{step, position
    (1 = first caption token), token, confidence}``, from ``mdc.generate(..., trace=trace)``."""
    out = []
    for step, record in enumerate(trace, 1):
        for pos in record["revealed"][row].nonzero().flatten().tolist():
            out.append({"step": step, "position": pos, "token": tokenizer.decode([int(record["tokens"][row, pos])]),
                        "confidence": float(record["confidence"][row, pos])})
    return out


def steps_per_caption(trace: list) -> torch.Tensor:
    """[B] decoder calls each caption of a traced batch needed (its rows revealed something)."""
    return torch.stack([record["revealed"].any(1) for record in trace]).sum(0)


def write_example_dataset(folder: str, n_train: int = 1000, n_val: int = 4, seed: int = 0, image_size: int = 64,
                          captions_per_image: int = 3) -> dict:
    """Stand-in for *your* data: JPEG photos in ``folder/images`` and COCO captions files
    ``folder/captions_train.json`` / ``captions_val.json`` (the official format: ``images`` with
    ``id`` and ``file_name``, ``annotations`` with ``image_id`` and ``caption``), several
    reference-style captions per image. Returns the three paths."""
    import json
    import os

    from PIL import Image

    os.makedirs(os.path.join(folder, "images"), exist_ok=True)
    paths = {"images": os.path.join(folder, "images")}
    for split, n, stream in (("train", n_train, STREAM_TRAIN + 50), ("val", n_val, STREAM_HELD_OUT + 50)):
        images, annotations = [], []
        for i in range(n):
            rng = stream_rng(seed, stream, i)
            scene = sample_scene(rng, n_objects=int(rng.integers(1, 3)))
            name = f"{split}_{i:06d}.jpg"
            Image.fromarray(render_array(scene, image_size)).save(os.path.join(folder, "images", name), quality=95)
            image_id = len(images) + (0 if split == "train" else 10**6)
            images.append({"id": image_id, "file_name": name, "width": image_size, "height": image_size})
            for text in references(scene, stream_rng(seed, stream + 1, i), captions_per_image):
                annotations.append({"id": len(annotations), "image_id": image_id, "caption": text})
        paths[split] = os.path.join(folder, f"captions_{split}.json")
        with open(paths[split], "w") as f:
            json.dump({"images": images, "annotations": annotations}, f)
    return paths
