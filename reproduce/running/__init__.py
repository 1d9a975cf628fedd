"""Running the registry's graph: the runner and its scheduler, one attempt per run in its own process, run
folders, the ledger's records and its bookkeeping, seed plans, torchrun and SLURM commands."""
