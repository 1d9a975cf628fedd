"""The paper's tables and figures rebuilt from the records: Tables 1 and 3-8, Table 2, Figs. 3-6, the
table cells and formats they share, and probe records read as the paper's columns."""
