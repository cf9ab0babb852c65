"""Split-learning family: SplitFed v1/v2, FSL_AN, CSE-FSL (one module per algorithm)."""
