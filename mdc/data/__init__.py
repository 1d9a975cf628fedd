"""Data: the synthetic scene world, the webdataset training pipeline, real benchmark loaders."""
