"""DLPlacer's placement MILP in Pyomo (Pal et al. 2019), solved by GLPK, CBC or HiGHS.

- `max_load`: the pipelined max-load model; `makespan`: the step-time model and its
  coarse-to-fine solve loop; `backends`: the checked solve step per solver;
  `solve.solve_plan`: the whole pipeline, registered in `placement.planner.SOLVERS`
  as 'glpk', 'cbc', 'highs' and 'auto'.
"""
