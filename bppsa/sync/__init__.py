"""Elastic synchronization for parameter-server training: policies, ZipLine, a simulator, a Ray runtime. ::

    from bppsa import sync
    idx, rng = sync.zipline(times)                    # times (n, R), rows sorted
    pol = sync.make_policy("dssp", 4, s_L=3, r_max=12)
    d = pol.push(worker, time)                        # Decision(kind, until, at, release)
    log = sync.simulate({"name": "digits_cnn"}, "elasticbsp", sync.heterogeneous(4, 2.5),
                        policy_options={"R": 30}, max_time=100)

Tasks (a model and its data) are built by :mod:`bppsa.tasks` from a spec such as
``{"name": "digits_cnn"}``; the simulator and the Ray runtime take that spec (or a built task).
The Ray runtime is in :mod:`bppsa.sync.ray_runtime` (imported on demand: it needs ``ray``).
"""

from bppsa.sync.policies import (
    ASP,
    BSP,
    DSSP,
    POLICIES,
    SSP,
    Decision,
    ElasticBSP,
    Policy,
    dssp_controller,
    make_policy,
)
from bppsa.sync.simulator import (
    ComputeModel,
    check_simulation,
    heterogeneous,
    policy_label,
    simulate,
    time_to_accuracy,
)
from bppsa.sync.zipline import (
    ZIPLINE_METHODS,
    brute_force,
    full_grid_scan,
    grid_scan,
    selection_range,
    zipline,
    zipline_bsearch,
    zipline_opt,
    zipline_paper,
    zipline_window,
)

__all__ = [
    "Decision", "Policy", "BSP", "ASP", "SSP", "DSSP", "ElasticBSP", "POLICIES", "make_policy", "dssp_controller",
    "ComputeModel", "heterogeneous", "simulate", "check_simulation", "time_to_accuracy", "policy_label",
    "zipline", "zipline_paper", "zipline_opt", "zipline_bsearch", "zipline_window", "brute_force",
    "grid_scan", "full_grid_scan", "selection_range", "ZIPLINE_METHODS",
]
