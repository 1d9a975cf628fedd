"""The base the method stands on, and nothing of the method: checkpoints and atomic writes, the optimizer and
its presets, command lines and their errors, keyed noise, option sets, the FLOP meter, the folder lock, process
trees and the torchvision shim (docs/layers.md)."""
