"""Experiments run on the simulator (mrc.sim): the MRC paper's figures, the multipath
scenarios, incast, and permutations at fabric scale. Each runner is a module with a command line:

- `python -m mrc.experiments.paper` (`make paper`, `make paper-large`): the paper's experiments,
  MRC beside the RoCE baseline (paper.py: command line, pool, table; paper_run.py: one run;
  paper_experiments.py: the faults and measures; paper_verdict.py: the paper's claims).
- `python -m mrc.experiments.scenarios`: the multipath failure and congestion scenarios under
  each spray policy (scenarios.py, which also holds the verified `Transfer` other experiments
  and tests use).
- `python -m mrc.experiments.incast`: 7 → 1 incast with a victim flow, NSCC against none
  (incast.py).
- `python -m mrc.experiments.permutation` (`make scale`): a permutation on the MRC fabric
  shape, with the simulator's own cost (permutation.py; tools/htsim runs it beside htsim).

What it leaves to others: the network, links, switches, fabric shapes and the RoCE-like
baseline (mrc.sim), the protocol (mrc.core). Nothing in mrc.sim imports from here.
"""
