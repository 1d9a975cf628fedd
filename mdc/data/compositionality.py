"""Moved to :mod:`mdc.data.benchmarks` (the published ARO and SugarCrepe readers and their accuracy
rules); this old path is kept for one release."""
from mdc.data import benchmarks as _moved
from mdc.data.benchmarks import *  # noqa: F401,F403


def __getattr__(name: str):
    """Every other name of the old module, from where it lives now."""
    return getattr(_moved, name)
