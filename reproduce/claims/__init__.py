"""The paper's claims judged from the records: the claim rows and their verdicts, their statistics (paired
intervals, p-values, Holm) and claim 8's caption rows. They read records only (pyproject's contracts)."""
