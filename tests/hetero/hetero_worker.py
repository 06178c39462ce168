"""Worker for tests/hetero/test_hetero_distributed.py: the weighted SPMD gradient across processes.

Run by bppsa.parallel.launch.launch; argv: OUT_DIR SEED CASES, CASES = "5,0;2,7": per case one
local batch size per process. Each process builds the same data, keeps only its own rows (a
different number per process, possibly none), and writes the global gradients it receives to
OUT_DIR/grads_<case>_<id>.npz.
"""

import sys

import jax

# a process of its own, outside the test session: float64 as the session's reference uses
jax.config.update("jax_enable_x64", True)

from bppsa.parallel import initialize  # noqa: E402

initialize()
pid, nproc = jax.process_index(), jax.process_count()
import numpy as np  # noqa: E402

from bppsa.hetero import data_mesh, global_batch, make_spmd_grad, pad_local_batch  # noqa: E402

sys.path.insert(0, __file__.rsplit("/", 1)[0])
from test_hetero import make_data, mlp_params, per_sample_loss  # noqa: E402

out_dir, seed = sys.argv[1], int(sys.argv[2])
mesh = data_mesh()
assert jax.process_count() == nproc and jax.device_count() == nproc
params = jax.tree.map(np.asarray, mlp_params(jax.random.key(seed)))
grad_fns = {average: make_spmd_grad(per_sample_loss, mesh, average=average) for average in ("weighted", "mean")}
for case, spec in enumerate(sys.argv[3].split(";")):
    counts = [int(c) for c in spec.split(",")]
    assert len(counts) == nproc
    x, y = make_data(sum(counts), seed=seed)
    lo = sum(counts[:pid])
    b_max = max(max(counts), 1)  # the same for every case of one run: one compiled step per average
    xs, ys, mask = global_batch(mesh, *pad_local_batch(x[lo:lo + counts[pid]], y[lo:lo + counts[pid]], b_max))
    out = {}
    for average in ("weighted", "mean"):
        g, loss, n = grad_fns[average](params, xs, ys, mask)
        for k, v in g.items():
            out[f"{average}/{k}"] = np.asarray(v.addressable_data(0))
        out[f"{average}/loss"] = np.asarray(loss.addressable_data(0))
        out[f"{average}/count"] = np.asarray(n.addressable_data(0))
    np.savez(f"{out_dir}/grads_{case}_{pid}.npz", **out)
    print(f"process {pid}/{nproc}: local batch {counts[pid]}, global count {int(out['weighted/count'])}")
jax.distributed.shutdown()
