"""Scene sampling of the synthetic world: scene graphs of 1-4 objects on a background.

Each object has a shape, a colour, a size, a texture and a position; shapes and colours are
unique within a scene, so "the red circle" or "the circle" names one object. Positions are
sampled so that objects never overlap and every pair is clearly side by side or clearly one
above the other (the larger offset is at least ``AXIS_RATIO`` times the smaller), which makes
each relation (left of / right of / above / below) well defined.
"""
from __future__ import annotations

import numpy as np

from mdc.world.render import BACKGROUNDS, COLOURS, SHAPES, SIZES, TEXTURES, pixel_bbox
from mdc.world.text import MAX_OBJECTS

P_LARGE = 0.4  # probability that an object is large
AXIS_RATIO = 1.5  # every pair: larger axis offset >= AXIS_RATIO * smaller axis offset
GAP = 0.03  # minimum gap between object discs, fraction of the image side


def _distinct(rng, values, n: int, first=None) -> list:
    """``n`` distinct values in random order; ``first`` (if given) is forced into position 0."""
    rest = [v for v in values if v != first]
    picked = [rest[i] for i in rng.permutation(len(rest))[: n if first is None else n - 1]]
    return picked if first is None else [first, *picked]


def relation(a: dict, b: dict) -> str:
    """Relation of object ``a`` to object ``b`` from their centres (y grows downwards)."""
    dx, dy = a["x"] - b["x"], a["y"] - b["y"]
    if abs(dx) >= abs(dy):
        return "left of" if dx < 0 else "right of"
    return "above" if dy < 0 else "below"


def _fits(x, y, r, placed) -> bool:
    for o in placed:
        dx, dy = abs(x - o["x"]), abs(y - o["y"])
        if dx * dx + dy * dy < (r + o["radius"] + GAP) ** 2 or max(dx, dy) < AXIS_RATIO * min(dx, dy):
            return False
    return True


def _place(rng, radii: list[float], tries: int = 60) -> list[tuple[float, float]]:
    """Non-overlapping, unambiguously related centres (restarts when an object finds no spot)."""
    while True:
        placed = []
        for r in radii:
            lo, hi = r + 0.02, 1.0 - r - 0.02
            for _ in range(tries):
                x, y = rng.uniform(lo, hi, 2).tolist()
                x, y = round(x, 4), round(y, 4)
                if _fits(x, y, r, placed):
                    placed.append({"x": x, "y": y, "radius": r})
                    break
            else:
                break
        if len(placed) == len(radii):
            return [(o["x"], o["y"]) for o in placed]


def sample_scene(rng: np.random.Generator, *, n_objects: int | None = None, sizes: list[str] | None = None,
                 first: dict | None = None, background: str | None = None) -> dict:
    """A random scene graph.

    Keyword constraints (for the evaluation sets) fix the object count, the object sizes, some
    attributes of object 0 (``first``: any of ``shape``, ``colour``, ``texture``) or the background
    kind. Returns ``{"objects": [...], "relations": [...], "background": {...}}`` where an object is
    ``{shape, colour, size, texture, x, y, radius, rgb}`` (centre and radius as fractions of the
    image side) and ``relations`` lists ``{subject, relation, object}`` for every ordered pair.
    """
    first = first or {}
    n = n_objects if n_objects is not None else int(rng.integers(1, MAX_OBJECTS + 1))
    if not 1 <= n <= MAX_OBJECTS:
        raise ValueError(f"n_objects must be in [1, {MAX_OBJECTS}]; got {n}")
    sizes = sizes or ["large" if rng.random() < P_LARGE else "small" for _ in range(n)]
    shapes = _distinct(rng, list(SHAPES), n, first.get("shape"))
    colours = _distinct(rng, list(COLOURS), n, first.get("colour"))
    textures = [TEXTURES[int(rng.integers(len(TEXTURES)))] for _ in range(n)]
    if "texture" in first:
        textures[0] = first["texture"]
    radii = [round(float(rng.uniform(*SIZES[s])), 4) for s in sizes]
    objects = []
    for k, (x, y) in enumerate(_place(rng, radii)):
        jitter = rng.integers(-12, 13, 3)
        rgb = [min(255, max(0, c + j)) for c, j in zip(COLOURS[colours[k]], jitter.tolist())]
        objects.append({"shape": shapes[k], "colour": colours[k], "size": sizes[k], "texture": textures[k],
                        "x": x, "y": y, "radius": radii[k], "rgb": rgb})
    kind = background or BACKGROUNDS[int(rng.integers(len(BACKGROUNDS)))]
    bg = {"kind": kind}
    if kind == "noisy":
        bg["seed"] = int(rng.integers(2**31))
    elif kind == "gradient":
        bg["angle"] = round(float(rng.uniform(0, 2 * np.pi)), 4)
    rels = [{"subject": i, "relation": relation(a, b), "object": j}
            for i, a in enumerate(objects) for j, b in enumerate(objects) if i != j]
    return {"objects": objects, "relations": rels, "background": bg}


def scene_record(scene: dict, image_size: int, **fields) -> dict:
    """The sample's JSON record: the scene graph with pixel bboxes ``[x, y, w, h]``, plus ``fields``."""
    objects = [{**o, "bbox": pixel_bbox(o, image_size)} for o in scene["objects"]]
    return {**fields, "image_size": image_size, "objects": objects, "relations": scene["relations"],
            "background": scene["background"]}
