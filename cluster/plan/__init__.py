"""`testbed plan`: from a workload and SLO targets to a recommended design.

space.py     candidates: the source's designs x the axes varied, within the GPU budget
search.py    each candidate's goodput: bisection on the load grid, successive halving over seeds,
             latency floors dropping the hopeless first; every run a virtual replay in a worker
verdict.py   what each candidate's runs say: rank, binding SLO, bottleneck pool, handoff share,
             the explanation, and the answer when no candidate meets the target
outputs.py   the ranked table, plan.json, Pareto plots, the recommended design's YAML
cli.py       the command
"""
