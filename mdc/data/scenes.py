"""Moved to :mod:`mdc.world.scenes` (stream names in :mod:`mdc.world.streams`, shard writing in
:mod:`mdc.data.writer`); this old path is kept for one release."""
from mdc.world import scenes as _moved
from mdc.world.scenes import *  # noqa: F401,F403


def __getattr__(name: str):
    """Every other name of the old module, from where it lives now."""
    return getattr(_moved, name)


if __name__ == "__main__":  # python -m mdc.data.scenes ... keeps working
    _moved.main()
