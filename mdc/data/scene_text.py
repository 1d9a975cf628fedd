"""Moved to :mod:`mdc.world.text`; this old path is kept for one release."""
from mdc.world import text as _moved
from mdc.world.text import *  # noqa: F401,F403


def __getattr__(name: str):
    """Every other name of the old module, from where it lives now."""
    return getattr(_moved, name)
