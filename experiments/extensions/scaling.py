"""Scaling benchmark: sequence-parallel BPPSA backward time vs number of devices, per combine. ::

    bppsa reproduce scaling [--quick]      # = bppsa run experiments/extensions/configs/scaling.py[:quick]

For P in (1, 2, 4, 8) devices of a 1-D ``seq`` mesh it times, by :mod:`bppsa.host` (the
methods interleaved so they see the same load, medians):

- the sharded backward alone (phases 1–3 + parameter-gradient ``psum``) for each combine
  ("logstep", "allgather", "chain"),
- the cross-device combine alone on the chunk aggregates (Π, δ), isolating the communication step,
- the sharded forward (sequential across devices by nature),

and lists the bytes each device sends per combine level (:func:`communication_volume`). On a
CPU host the "devices" are simulated (``--xla_force_host_platform_device_count``) and share the
host's cores, so the times show overheads and work, not speed-up.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from bppsa.host import time_fn, time_interleaved
from experiments import entry
from experiments.provenance import current_command, provenance, save_json
from experiments.tables import markdown_table

__all__ = ["run_scaling", "measure", "markdown", "plot", "write_measurement"]

COMBINE_NAMES = ("logstep", "allgather", "chain")


def measure(*, devices=(1, 2, 4, 8), T=1024, B=16, I=1, H=20, cell="rnn", repeats=7, dtype="float32",
            seed=0, combines=COMBINE_NAMES, diagnostic=True, log=print) -> dict:
    """Run the measurements in this process (it needs max(devices) JAX devices); return the record."""
    import jax
    import jax.numpy as jnp
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as PS

    from bppsa import cells
    from bppsa.parallel.mesh import make_mesh, shard_map
    from bppsa.parallel.sequence import COMBINE_FNS, communication_volume, sharded_functions
    from experiments import gradient

    if len(jax.devices()) < max(devices):
        raise ValueError(f"devices={tuple(devices)} needs {max(devices)} JAX devices; "
                         f"only {len(jax.devices())} are available")
    combines = tuple(combines)
    if not combines or any(c not in COMBINE_NAMES for c in combines) or combines[0] != "logstep":
        raise ValueError(f"combines must start with 'logstep' and name only {COMBINE_NAMES}; got {combines}")
    bad = [P for P in devices if T % P]
    if bad:
        raise ValueError(f"T = {T} must be divisible by every device count; not by {bad}")
    dt = jnp.dtype(dtype)
    cls = cells.BUILTIN[cell]
    c = cls(I, H)
    S = c.state_size
    params = c.init(jax.random.key(seed), dt)
    k1, _, k3 = jax.random.split(jax.random.key(seed + 1), 3)
    xs = jax.random.normal(k1, (T, B, I), dt)
    s0 = jnp.zeros((B, S), dt)
    ct = c.flatten_state(gradient.out_cotangent(c, gradient.readout(c, T, B, dt, seed)))  # the one timed loss
    rows = []
    for P in devices:
        mesh = make_mesh(P, devices=jax.devices()[:P], batch_axis=None)
        xsh = NamedSharding(mesh, PS("seq", None, None))
        xs_p, ct_p = jax.device_put(xs, xsh), jax.device_put(ct, xsh)
        sm = {comb: sharded_functions(c, "blelloch", comb, mesh, "seq", None, T) for comb in combines}
        fns = {comb: jax.jit(sm[comb][1]) for comb in combines}
        fwd = jax.jit(sm[combines[-1]][0])
        ss = jax.block_until_ready(fwd(params, xs_p, s0))
        # the combine alone, on random (Π, δ) of the right shapes (one per device)
        Pi = jax.device_put(0.3 * jax.random.normal(k3, (P, B, S, S), dt), NamedSharding(mesh, PS("seq")))
        dl = jax.device_put(jax.random.normal(k3, (P, B, S), dt), NamedSharding(mesh, PS("seq")))
        comb_only = {}
        for comb in combines:
            f = COMBINE_FNS[comb]
            body = (lambda Pi, dl, f=f: f(Pi[0], dl[0], "seq", P)[None]) if P > 1 else (lambda Pi, dl: dl * 0)
            comb_only[comb] = jax.jit(shard_map(body, mesh, in_specs=(PS("seq"), PS("seq")), out_specs=PS("seq")))
        calls = {("fwd", None): lambda: fwd(params, xs_p, s0)}
        small = {}
        for comb in combines:
            calls[("bwd", comb)] = lambda comb=comb: fns[comb](params, xs_p, s0, ss, ct_p)
            small[("combine", comb)] = lambda comb=comb: comb_only[comb](Pi, dl)
        med = {}
        for group, n in ((calls, repeats), (small, 5 * repeats)):  # the cheap combines get more repeats
            med.update({k: v["median"] for k, v in time_interleaved(group, repeats=n).items()})
        # the combines agree (one backward, all three)
        ref = fns["logstep"](params, xs_p, s0, ss, ct_p)
        for comb in combines[1:]:
            got = fns[comb](params, xs_p, s0, ss, ct_p)
            err = max(float(jnp.max(jnp.abs(a - b))) for a, b in zip(jax.tree.leaves(ref), jax.tree.leaves(got)))
            scale = max(float(jnp.max(jnp.abs(a))) for a in jax.tree.leaves(ref))
            if not err <= 1e-4 * max(1.0, scale):
                raise AssertionError(f"combine {comb!r} disagrees with 'logstep' at P = {P}: {err:.3g}")
        row = {"devices": P, "chunk": T // P, "forward_s": med[("fwd", None)]}
        for comb in combines:
            vol = communication_volume(P, B, S, dt.itemsize, comb)
            row[f"backward_{comb}_s"] = med[("bwd", comb)]
            row[f"combine_{comb}_s"] = med[("combine", comb)]
            row[f"bytes_{comb}"] = vol["combine_bytes"]
            row[f"levels_{comb}"] = vol["levels"]
        rows.append(row)
        log(f"P={P:2d} C={T // P:5d}  fwd {row['forward_s'] * 1e3:8.2f} ms  bwd "
            + "  ".join(f"{k} {row[f'backward_{k}_s'] * 1e3:8.2f} ms" for k in combines)
            + "  | combine " + "  ".join(f"{k} {row[f'combine_{k}_s'] * 1e3:7.3f} ms" for k in combines))
    base = rows[0]["backward_logstep_s"]
    for r in rows:
        r["speedup_logstep_vs_1"] = base / r["backward_logstep_s"]
    if diagnostic:
        diagnostic = _batched_matmul_diagnostic(T, B, S, dt, repeats, pieces=T // max(devices))
        log(f"XLA:{jax.default_backend()} batched matmul, one up-sweep level of {T} matrices: one op "
            f"{diagnostic['one_op_s'] * 1e3:.2f} ms, in pieces of {diagnostic['piece']} "
            f"{diagnostic['in_pieces_s'] * 1e3:.2f} ms")
    return {"diagnostic_batched_matmul": diagnostic,
            "setup": {"cell": cell, "T": T, "B": B, "I": I, "H": H, "S": S, "dtype": str(dt),
                      "repeats": repeats, "devices": list(devices), "scan": "blelloch", "combines": list(combines),
                      "jax_devices": len(jax.devices()), "cpu_count": os.cpu_count()},
            "rows": rows}


def _batched_matmul_diagnostic(T, B, S, dt, repeats, pieces):
    """One up-sweep level (T/2 products of (B, S, S) pairs) as one batched op vs ``lax.map`` over
    pieces of ``pieces`` matrices, on one device: shows how much of a "speed-up" of smaller
    chunks is the host's batched-matmul efficiency (cache) rather than parallelism."""
    import jax
    from jax import lax
    piece = max(2, pieces - pieces % 2)
    Ms = 0.25 * jax.random.normal(jax.random.key(0), (T, B, S, S), dt)
    one = jax.jit(lambda M: M[0::2] @ M[1::2])
    split = jax.jit(lambda M: lax.map(lambda m: m[0::2] @ m[1::2], M.reshape((T // piece, piece) + M.shape[1:])))
    res = {}
    for name, f in (("one_op_s", one), ("in_pieces_s", split)):
        res[name] = time_fn(lambda f=f: f(Ms), repeats=max(5, repeats))["median"]
    res["piece"] = piece
    return res


def markdown(record) -> str:
    s = record["setup"]
    lines = [f"Sequence-parallel BPPSA backward, {s['cell'].upper()}(I={s['I']}, H={s['H']}), T = {s['T']}, "
             f"B = {s['B']}, {s['dtype']}, median of {s['repeats']}; {record['provenance']['backend']} "
             f"({record['provenance']['cpu_count']} cores, devices simulated)"
             if record["provenance"]["backend"] == "cpu"
             else f"Sequence-parallel BPPSA backward, {s['cell'].upper()}, T = {s['T']}, B = {s['B']}",
             "",
             ""]
    rows = []
    for r in record["rows"]:
        r = {**{f"{a}_{k}{b}": float("nan") for k in COMBINE_NAMES for a, b in (("backward", "_s"), ("combine", "_s"))},
             "levels_allgather": [], "bytes_allgather": 0, "levels_chain": [], **r}  # combines left out
        ls = r["levels_logstep"]
        comb = ([f"{r[f'combine_{k}_s'] * 1e3:.3f}" for k in COMBINE_NAMES] if r["devices"] > 1 else ["—"] * 3)
        rows.append([r["devices"], r["chunk"], f"{r['forward_s'] * 1e3:.2f}",
                     *(f"{r[f'backward_{k}_s'] * 1e3:.2f}" for k in COMBINE_NAMES), *comb,
                     ", ".join(f"{b}" for _, b in ls) if ls else "—", r["bytes_allgather"] or "—",
                     f"{r['levels_chain'][0][1]} × {len(r['levels_chain'])}" if r["levels_chain"] else "—"])
    lines.append(markdown_table(
        ["devices P", "chunk C", "forward ms", "backward ms: logstep", "allgather", "chain", "combine only ms: logstep",
         "allgather", "chain", "bytes sent/device per level: logstep", "allgather (one level)", "chain (per hop)"],
        rows, align="rrrrrrrrrlrl"))
    lines += ["", "Bytes are what each device sends in the backward's combine. Log-step: ⌈log₂ P⌉ "
              "rounds, each but the last sending one (Π, δ) pair (B·S² + B·S numbers), the last δ only, "
              "then one vector shift; all-gather: one collective receiving (P − 1) pairs; chain: P − 1 sequential "
              "vector hops. Simulated CPU devices share the host's cores: no parallel speed-up is "
              "possible here; the table shows overheads, per-device work and communication volume."]
    d = record.get("diagnostic_batched_matmul")
    if d:
        lines += ["", f"Why P ≥ 2 is faster than P = 1 here: on this host one batched matmul over all "
                  f"{s['T']} matrices of an up-sweep level takes {d['one_op_s'] * 1e3:.1f} ms as one XLA op "
                  f"but {d['in_pieces_s'] * 1e3:.1f} ms in pieces of {d['piece']} on one device — the "
                  f"smaller per-device chunks fit the cache; it is not parallelism."]
    return "\n".join(lines) + "\n"


def plot(record, path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    rows = record["rows"]
    P = [r["devices"] for r in rows]
    fig, ax = plt.subplots(1, 2, figsize=(10, 4))
    for comb in record["setup"].get("combines", COMBINE_NAMES):
        ax[0].plot(P, [r[f"backward_{comb}_s"] * 1e3 for r in rows], "o-", label=comb)
        multi = [r for r in rows if r["devices"] > 1]  # P = 1 has no combine
        ax[1].plot([r["devices"] for r in multi], [r[f"combine_{comb}_s"] * 1e3 for r in multi], "o-", label=comb)
    ax[0].plot(P, [r["forward_s"] * 1e3 for r in rows], "k--", label="forward")
    for a, title in zip(ax, ("backward (whole)", "cross-device combine only")):
        a.set_xscale("log", base=2)
        a.set_xticks(P, [str(p) for p in P])
        a.set_xlabel("devices P (simulated CPU)" if record["provenance"]["backend"] == "cpu" else "devices P")
        a.set_ylabel("ms")
        a.set_title(title)
        a.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def write_measurement(workdir, options: dict, name="scaling", command: str | None = None) -> dict:
    """:func:`measure` with ``options`` in this process; ``name``.{json,md,png} into ``workdir``; the record.

    ``command``: for the provenance (default: the run in progress or this process's argv).
    """
    record = measure(**options)
    record["provenance"] = provenance(command)
    record.setdefault("plot", "experiments.extensions.scaling:plot")  # `bppsa results --plots` redraws with it
    Path(workdir).mkdir(parents=True, exist_ok=True)
    save_json(entry(workdir, f"{name}.json"), record)
    entry(workdir, f"{name}.md").write_text(markdown(record))
    plot(record, entry(workdir, f"{name}.png"))
    return record


def _options(config):
    keys = ("devices", "T", "B", "I", "H", "cell", "repeats", "dtype", "seed", "combines", "diagnostic")
    return {k: (tuple(config[k]) if k in ("devices", "combines") else config[k]) for k in keys if k in config}


def run_scaling(config, workdir) -> dict:
    """The experiments task: measure (in a subprocess with enough simulated devices when this
    process has too few), write scaling.{json,md,png} into ``workdir``; return a summary."""
    import jax
    opts = _options(config)
    need = max(opts.get("devices", (1, 2, 4, 8)))
    if len(jax.devices()) >= need:
        record = write_measurement(workdir, opts)
    else:
        if jax.default_backend() != "cpu":
            raise ValueError(f"the scaling benchmark needs {need} devices; this {jax.default_backend()} "
                             f"host has {len(jax.devices())}")
        env = dict(os.environ, XLA_FLAGS=f"{os.environ.get('XLA_FLAGS', '')} "
                   f"--xla_force_host_platform_device_count={need}".strip(), JAX_PLATFORMS="cpu")
        code = ("import json, sys; from experiments.extensions.scaling import write_measurement; "
                "write_measurement(sys.argv[1], json.loads(sys.argv[2]), command=sys.argv[3])")
        command = current_command() or " ".join(sys.argv)
        for e in ("json", "md", "png"):  # the child writes these: listed as bppsa's before it starts
            entry(workdir, f"scaling.{e}")
        subprocess.run([sys.executable, "-c", code, str(workdir), json.dumps(opts), command], env=env, check=True)
        record = json.loads((Path(workdir) / "scaling.json").read_text())
    return {"rows": [{k: v for k, v in r.items() if not k.startswith("levels_")} for r in record["rows"]],
            "files": [str(Path(workdir) / f"scaling.{e}") for e in ("json", "md", "png")]}
