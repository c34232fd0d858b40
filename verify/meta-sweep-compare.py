#!/usr/bin/env python3
"""verify/meta-sweep-compare.py: a shape-only sweep's DB rows against a measured sweep's
(verify/meta-sweep.sh).

  meta-sweep-compare.py REAL.db META.db [--subset] [--layers L]

REAL.db: `shardbench sweep --device cuda-emu` (results, comm); META.db: the same sweep
with --device meta (shape_runs, shape_roles, shape_comm). Configs are matched by key
(" device=cuda-emu" read as " device=meta"). For every config:
  - the status: ok is shape-only, skipped is skipped with the same reason;
  - shape-only: the role of rank 0 (shape_roles.first_rank 0) has rank 0's memory
    split exactly (results.mem_*_bytes), the max over roles is the measured peak
    (results.peak_mem_bytes, the max over ranks), the roles' ranks add up to the world;
  - its comm rows summed over fqn equal rank 0's comm rows, row for row (op, mesh
    dim, phase, calls, payload and wire bytes), exactly: every group here has 2, 4 or
    8 ranks, so the ring model's (n - 1) / n is a dyadic fraction and the wire bytes
    are exact in binary whatever the order of the sums;
  - the compute ledger against an analytic count (the oracle is the config alone):
    the linear layers' GEMM FLOPs summed over every rank are 2 N_linear T forward
    and 4 N_linear T backward (Kaplan et al. 2020, sec. 2.1), T = batch x seq the
    global tokens, N_linear the linear layers' weights (TorchTitan's
    get_dense_model_nparams_and_flops less the embedding and norms); recomputed
    under --ac full: 2 (N_linear - V D) T (every block's linears again, not the
    output); none without AC; selective AC is not counted (which linears a per-op
    policy keeps is the runtime's choice: compared with the real run only).
--subset: only REAL's configs (a planted run of a few) are looked up in META.
--layers L: the analytic count for L layers (a planted wrong count must fail).
Prints one line per disagreement and a summary; exit 0 when all agree, 1 if not,
2 on bad arguments.
"""
import sqlite3
import sys

# debugmodel (TorchTitan torchtitan/models/llama3/__init__.py, llama3_configs
# "debugmodel"): dim 256, 16 heads (n_kv_heads = n_heads), vocab 2048, multiple_of 256;
# n_layers=2 from the model string. FeedForward's hidden size (model.py,
# FeedForward.__init__): int(2 * 4 * dim / 3) = 682, rounded up to multiple_of: 768.
D, H, KV, V, F = 256, 16, 16, 2048, 768


def n_linear(layers):
    hd = D // H
    per_layer = D * H * hd + 2 * D * KV * hd + H * hd * D + 3 * D * F  # wq wk wv wo w1 w2 w3
    return V * D + layers * per_layer  # the output layer, then the blocks


def main(argv):
    args = [a for a in argv if not a.startswith("--")]
    subset = "--subset" in argv
    layers = 2
    if "--layers" in argv:
        i = argv.index("--layers")
        try:
            layers = int(argv[i + 1])
        except (IndexError, ValueError):
            print("meta-sweep-compare: --layers needs a number", file=sys.stderr)
            return 2
        args = [a for a in args if a != argv[i + 1]]
    if len(args) != 2:
        print("usage: meta-sweep-compare.py REAL.db META.db [--subset] [--layers L]",
              file=sys.stderr)
        return 2
    real = sqlite3.connect("file:%s?mode=ro" % args[0], uri=True)
    meta = sqlite3.connect("file:%s?mode=ro" % args[1], uri=True)
    bad = []
    rr = {k.replace(" device=cuda-emu", " device=meta"): (rid, st, reason, peak, m)
          for k, rid, st, reason, peak, *m in real.execute(
              "SELECT c.key, r.id, r.status, r.reason, r.peak_mem_bytes, r.mem_params_bytes, "
              "r.mem_grads_bytes, r.mem_optimizer_bytes, r.mem_activations_bytes "
              "FROM results r JOIN configs c ON c.id = r.config_id")}
    mr = {row[1]: row for row in meta.execute(
        "SELECT id, key, status, reason, n_roles, peak_mem_bytes, batch, seq, ac, world, "
        "gemm_flops_forward, gemm_flops_backward, gemm_flops_recompute FROM shape_runs")}
    keys = sorted(rr) if subset else sorted(set(rr) | set(mr))
    nlin = n_linear(layers)
    shape = flops = 0
    for k in keys:
        if k not in rr or k not in mr:
            bad.append("%s: only in the %s sweep" % (k, "real" if k in rr else "meta"))
            continue
        rid, st, reason, peak, mem = rr[k]
        sid, _, mst, mreason, n_roles, mpeak, batch, seq, ac, world, gf, gb, gr = mr[k]
        want = {"ok": "shape-only", "skipped": "skipped"}.get(st, "(%s: not compared)" % st)
        if mst != want or (st == "skipped" and reason != mreason):
            bad.append("%s: status %s (%s), real %s (%s)" % (k, mst, mreason, st, reason))
            continue
        if st != "ok":
            continue
        shape += 1
        roles = meta.execute("SELECT role, first_rank, ranks, peak_mem_bytes, mem_params_bytes, "
                             "mem_grads_bytes, mem_optimizer_bytes, mem_activations_bytes FROM "
                             "shape_roles WHERE shape_run_id = ? ORDER BY role", (sid,)).fetchall()
        r0 = [r for r in roles if r[1] == 0]
        if len(roles) != n_roles or not r0 or sum(r[2] for r in roles) != world:
            bad.append("%s: %d roles (n_roles %d), ranks %d, world %d, role of rank 0: %s" %
                       (k, len(roles), n_roles, sum(r[2] for r in roles), world, bool(r0)))
            continue
        role0 = r0[0]
        if list(role0[4:8]) != list(mem):
            bad.append("%s: rank 0's memory split %s, real %s" % (k, list(role0[4:8]), mem))
        if mpeak != peak or max(r[3] for r in roles) != mpeak:
            bad.append("%s: peak %s (max over roles %s), real %s" %
                       (k, mpeak, max(r[3] for r in roles), peak))
        rc = real.execute("SELECT op, mesh_dim, phase, calls, payload_bytes, wire_bytes FROM comm "
                          "WHERE result_id = ? ORDER BY op, mesh_dim, phase", (rid,)).fetchall()
        mc = meta.execute("SELECT op, mesh_dim, phase, sum(calls), sum(payload_bytes), "
                          "sum(wire_bytes) FROM shape_comm WHERE shape_run_id = ? AND role = ? "
                          "GROUP BY op, mesh_dim, phase ORDER BY op, mesh_dim, phase",
                          (sid, role0[0])).fetchall()
        if rc != mc:
            extra = sorted(set(rc) ^ set(mc))
            bad.append("%s: comm rows differ (%d real, %d meta); differing: %s" %
                       (k, len(rc), len(mc), extra[:3]))
        t = batch * seq
        wr = {"none": 0.0, "full": 2.0 * (nlin - V * D) * t}.get(ac)
        if gf != 2.0 * nlin * t or gb != 4.0 * nlin * t or (wr is not None and gr != wr):
            bad.append("%s: linear GEMM FLOPs forward %.17g backward %.17g recompute %.17g, "
                       "analytic 2NT %.17g, 4NT %.17g, recompute %s" %
                       (k, gf, gb, gr, 2.0 * nlin * t, 4.0 * nlin * t, wr))
        else:
            flops += 1
    for b in bad:
        print("DIFF: " + b)
    print("compared %d configs (%d shape-only: memory, peak, comm rows; %d FLOP counts "
          "analytic): %d differ" % (len(keys), shape, flops, len(bad)))
    return 1 if bad or not keys else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
