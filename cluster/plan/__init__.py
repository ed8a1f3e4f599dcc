"""`testbed plan`: from a workload and SLO targets to a recommended design.

space.py     candidates: the source's designs x the axes varied, within the GPU budget
search.py    each candidate's goodput: bisection on the load grid, successive halving over seeds,
             latency floors dropping the hopeless first; every run a virtual replay in a worker
verdict.py   what each candidate's runs say: rank, binding SLO, bottleneck pool, handoff share,
             the explanation, and the answer when no candidate meets the target
load_unit.py the unit goodput is said in: the load grid's (req/s, conv/s, trace speed)
table.py     the ranked table, headers in words with units, as the terminal and the report show it
outputs.py   the terminal's table, plan.json, the plots and report, the recommended design's YAML
cli.py       the command
"""
