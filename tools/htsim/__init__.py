"""The htsim cross-check (`python -m tools.htsim`): UEC's htsim and mrc's simulator on the same
1,024-host permutation, completion times and wall times side by side (compare.py)."""
