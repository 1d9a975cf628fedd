"""``python -m mdc.train ...`` and ``torchrun ... -m mdc.train ...``: see :mod:`mdc.train.cli`."""
from mdc.train.cli import main

if __name__ == "__main__":
    main()
