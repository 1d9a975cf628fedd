"""Studies that fix settings before methods are compared (e.g. the `mini` operating point)."""
