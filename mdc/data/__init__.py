"""Real-data I/O: the webdataset training pipeline, shard reading and writing, dataset and
benchmark readers, caption statistics. The synthetic world that writes the default data lives
in :mod:`mdc.world`; nothing here imports it."""
