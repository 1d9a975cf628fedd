"""Rendering of synthetic scenes with vectorised numpy masks.

This module also fixes the world's ontology, i.e. what can be drawn: the shapes, the colours
(name -> RGB), the two sizes (radius ranges as fractions of the image side), the textures and
the background kinds. Geometry in a scene is resolution-free (centres and radii are fractions of
the image side), so one scene renders at any ``image_size``.

Each object is drawn inside its bounding box only: the box's pixel centres are turned into
coordinates relative to the object's centre, divided by the radius (``u`` to the right, ``v``
downwards, the shape fits the unit disc), and a boolean mask selects the shape. A texture mask,
anchored to the object's centre so that it moves with the object, selects the secondary shade.
"""
from __future__ import annotations

import math

import numpy as np
from PIL import Image

#: Object colours: name -> base RGB (each object jitters its own copy slightly).
COLOURS = {
    "red": (220, 35, 35),
    "orange": (245, 140, 20),
    "yellow": (240, 220, 40),
    "green": (40, 165, 55),
    "blue": (40, 85, 225),
    "purple": (135, 50, 190),
    "pink": (245, 135, 195),
    "brown": (125, 75, 35),
}
#: Object sizes: name -> (min, max) radius as a fraction of the image side.
SIZES = {"small": (0.07, 0.09), "large": (0.14, 0.17)}
#: Textures: plain, or a secondary shade on a pattern (dark stripes/checks, light dots).
TEXTURES = ("plain", "striped", "dotted", "checked")
#: Background kinds (all neutral grey levels, so that every object colour stands out).
BACKGROUNDS = ("gray", "white", "black", "noisy", "gradient")
_PLAIN_LEVELS = {"gray": 128, "white": 236, "black": 22}


def _circle(u, v):
    return u * u + v * v <= 1.0


def _square(u, v):
    return np.maximum(np.abs(u), np.abs(v)) <= 0.8


def _triangle(u, v):  # apex up at v = -1, base at v = 0.75
    return (v <= 0.75) & (v >= -1.0 + 1.84 * np.abs(u))


_STAR_INNER, _COS36, _SIN36 = 0.45, np.cos(np.pi / 5), np.sin(np.pi / 5)


def _star(u, v):  # five points (radius 1), one up; straight edges to inner corners (radius 0.45)
    a = np.abs((np.arctan2(v, u) + np.pi / 2 + np.pi / 5) % (2 * np.pi / 5) - np.pi / 5)  # angle to nearest point
    edge = _STAR_INNER * _SIN36 * np.cos(a) + (1 - _STAR_INNER * _COS36) * np.sin(a)
    return np.sqrt(u * u + v * v) * edge <= _STAR_INNER * _SIN36


def _cross(u, v):
    au, av = np.abs(u), np.abs(v)
    return ((au <= 0.3) & (av <= 0.95)) | ((av <= 0.3) & (au <= 0.95))


def _diamond(u, v):
    return np.abs(u) + np.abs(v) <= 1.0


def _heart(u, v):  # the implicit curve (x^2 + y^2 - 1)^3 <= x^2 y^3, y up
    x, y = 1.15 * u, 0.15 - 1.15 * v
    q = x * x + y * y - 1.0
    return q * q * q <= x * x * y * y * y


def _crescent(u, v):  # a disc minus a shifted disc: opens to the right
    return (u * u + v * v <= 1.0) & ((u - 0.5) ** 2 + v * v > 0.75**2)


#: Shapes: name -> mask function of the normalised coordinates (u, v).
SHAPES = {
    "circle": _circle,
    "square": _square,
    "triangle": _triangle,
    "star": _star,
    "cross": _cross,
    "diamond": _diamond,
    "heart": _heart,
    "crescent": _crescent,
}


def _pattern(texture: str, x, y, period: float):
    """Boolean mask of the secondary shade for pixel offsets (x, y) from the object centre."""
    half = period / 2
    if texture == "striped":
        return (np.floor(y / half) % 2) == 1
    if texture == "checked":
        return ((np.floor(x / half) + np.floor(y / half)) % 2) == 1
    if texture == "dotted":
        dx, dy = x % period - half, y % period - half
        return dx * dx + dy * dy <= (0.3 * period) ** 2
    raise ValueError(f"unknown texture {texture!r}")


def _background(bg: dict, size: int) -> np.ndarray:
    """The [size, size, 3] uint8 background."""
    kind = bg["kind"]
    if kind in _PLAIN_LEVELS:
        return np.full((size, size, 3), _PLAIN_LEVELS[kind], dtype=np.uint8)
    if kind == "noisy":
        grey = np.random.default_rng(bg["seed"]).integers(60, 200, (size, size, 1), dtype=np.uint8)
        return np.repeat(grey, 3, axis=2)
    if kind == "gradient":
        c = (np.arange(size, dtype=np.float32) + 0.5) / size - 0.5
        ramp = np.cos(bg["angle"]) * c[None, :] + np.sin(bg["angle"]) * c[:, None]
        grey = (128 + 150 * ramp).clip(0, 255).astype(np.uint8)
        return np.repeat(grey[:, :, None], 3, axis=2)
    raise ValueError(f"unknown background kind {kind!r}")


def pixel_bbox(obj: dict, image_size: int) -> list[int]:
    """``[x, y, w, h]`` in pixels of the object's bounding square, clipped to the image."""
    x0 = max(0, math.floor((obj["x"] - obj["radius"]) * image_size))
    y0 = max(0, math.floor((obj["y"] - obj["radius"]) * image_size))
    x1 = min(image_size, math.ceil((obj["x"] + obj["radius"]) * image_size))
    y1 = min(image_size, math.ceil((obj["y"] + obj["radius"]) * image_size))
    return [x0, y0, x1 - x0, y1 - y0]


def render_array(scene: dict, image_size: int = 64) -> np.ndarray:
    """The scene as a [image_size, image_size, 3] uint8 array (objects drawn in list order)."""
    img = _background(scene["background"], image_size)
    period = max(3.0, image_size / 10)
    for obj in scene["objects"]:
        x0, y0, w, h = pixel_bbox(obj, image_size)
        cx, cy, r = obj["x"] * image_size, obj["y"] * image_size, obj["radius"] * image_size
        x = np.arange(x0, x0 + w, dtype=np.float32)[None, :] + 0.5 - cx  # [1, w]
        y = np.arange(y0, y0 + h, dtype=np.float32)[:, None] + 0.5 - cy  # [h, 1]
        mask = SHAPES[obj["shape"]](x / r, y / r)  # [h, w]
        region = img[y0 : y0 + h, x0 : x0 + w]
        rgb = np.asarray(obj["rgb"], dtype=np.float32)
        region[mask] = rgb.astype(np.uint8)
        if obj["texture"] != "plain":
            shade = rgb * 0.45 if obj["texture"] != "dotted" else rgb + (255 - rgb) * 0.7
            region[mask & _pattern(obj["texture"], x, y, period)] = shade.astype(np.uint8)
    return img


def render(scene: dict, image_size: int = 64) -> Image.Image:
    """The scene as an RGB PIL image of side ``image_size``."""
    return Image.fromarray(render_array(scene, image_size))
