"""The synthetic scene world: the embedded default dataset and its held-out evaluation sets.

- :mod:`mdc.world.render`: what can be drawn (shapes, colours, sizes, textures, backgrounds) and
  how a scene graph becomes pixels;
- :mod:`mdc.world.text`: the word lists, templates and caption styles, and the vocabulary;
- :mod:`mdc.world.graphs`: scene graphs (objects, positions, relations);
- :mod:`mdc.world.scenes`: the training shards (``python -m mdc.world.scenes``);
- :mod:`mdc.world.evalsets`: the held-out probe, ARO, SugarCrepe and captioning sets
  (``python -m mdc.world.evalsets``);
- :mod:`mdc.world.streams`: every random stream the world draws from.

The world writes its shards through :mod:`mdc.data.writer`; besides :mod:`mdc.data` it imports
only :mod:`mdc.tokenizer` from this package, and nothing in :mod:`mdc.data` imports it.
"""
