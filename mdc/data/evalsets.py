"""Moved to :mod:`mdc.world.evalsets`; this old path is kept for one release."""
from mdc.world import evalsets as _moved
from mdc.world.evalsets import *  # noqa: F401,F403


def __getattr__(name: str):
    """Every other name of the old module, from where it lives now."""
    return getattr(_moved, name)


if __name__ == "__main__":  # python -m mdc.data.evalsets ... keeps working
    _moved.main()
