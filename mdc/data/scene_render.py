"""Moved to :mod:`mdc.world.render`; this old path is kept for one release."""
from mdc.world import render as _moved
from mdc.world.render import *  # noqa: F401,F403


def __getattr__(name: str):
    """Every other name of the old module, from where it lives now."""
    return getattr(_moved, name)
