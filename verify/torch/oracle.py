#!/usr/bin/env python3
"""The PyTorch oracle for shardbench: the same Llama 3 training steps in PyTorch, on
shardbench's own initial weights and tokens, compared number by number; the init
distribution checked against TorchTitan's spec; PyTorch's collective counts for the
shipped tensor-parallel plans next to shardbench's; and the golden file that
`make check` compares shardbench against without PyTorch.

For each run in RUNS, RECIPE_RUNS and AC_RUNS: `shardbench run --world 1 ... --save-weights
W --save-trace T` (with the run's --max-norm, --global-batch, --lr-*, --ac), then load W
into the model of llama.py (TorchTitan v0.2.0's Llama 3, transcribed) in the run's dtype,
run the same steps (cross-entropy, backward, torch.optim.AdamW with the trace's
hyper-parameters; accumulation, clip_grad_norm_, the lr schedule; torch.utils.checkpoint
with TorchTitan's AC policy) on the trace's tokens, and compare every step's loss (and
total grad norm), every gradient of every step and every final weight with the trace.
Every run goes into the golden file, with its settings. Error = normwise
max|shardbench - pytorch| / max|pytorch| per tensor; the table shows the worst per kind.
When TorchTitan's own model imports, the f32 runs also go through it.
Exit: 0 all within tolerance, 1 a mismatch or a failed run, 2 bad input, 77 no torch.
Regenerate the golden file (a few minutes on 2 cores):
  python3 verify/torch/oracle.py --shardbench bench/shardbench --write-golden verify/golden/debugmodel.json
"""

import argparse
import fnmatch
import json
import math
import os
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))

try:
    import torch
except Exception as e:  # noqa: BLE001 (any failure to import torch means: no oracle here)
    print(f"oracle.py: SKIP: torch is not importable ({type(e).__name__}: {e})", file=sys.stderr)
    sys.exit(77)

sys.path.insert(0, HERE)
import comm  # noqa: E402
import llama  # noqa: E402
import st_io  # noqa: E402

# Batch 4 x seq 32 and 2 steps: every weight gets a gradient from 128 tokens (enough to
# touch most embedding rows and all of the others), the second step runs after one AdamW
# update, and the three runs take seconds in shardbench and in PyTorch on one core.
RUNS = [
    {"model": "debugmodel", "dtype": "f64", "batch": 4, "seq": 32, "warmup": 0, "steps": 2},
    {"model": "debugmodel", "dtype": "f32", "batch": 4, "seq": 32, "warmup": 0, "steps": 2},
    {"model": "debugmodel:n_layers=2:n_kv_heads=4", "dtype": "f64", "batch": 4, "seq": 32,
     "warmup": 0, "steps": 2},
]

# TorchTitan's training recipe: clip_grad_norm_ at a max_norm below the norm (every step
# clips; the norm is about 2), gradient accumulation over 2 microsteps of 2 sequences, and
# the lr schedule (warm-up 1, decay_ratio 0.5, cosine, min 0.1) over 3 steps; compared as
# the runs above, plus every step's total norm ("grad_norm step S"), and in the golden file.
RECIPE_RUNS = [
    {"model": "debugmodel:n_layers=2", "dtype": "f64", "batch": 2, "seq": 16, "warmup": 0,
     "steps": 3, "max_norm": 0.5, "global_batch": 4,
     "lr": {"warmup_steps": 1, "decay_ratio": 0.5, "decay_type": "cosine", "min_lr_factor": 0.1}},
    {"model": "debugmodel:n_layers=2", "dtype": "f32", "batch": 2, "seq": 16, "warmup": 0,
     "steps": 3, "max_norm": 0.5, "global_batch": 4,
     "lr": {"warmup_steps": 1, "decay_ratio": 0.5, "decay_type": "cosine", "min_lr_factor": 0.1}},
]

# Activation checkpointing (AC_MODES below), in the golden file: PyTorch runs the steps
# through torch.utils.checkpoint with TorchTitan's policy, shardbench `run --world 1 --ac
# MODE`. The trace is shardbench's reference (which runs without AC) and the run's verdict
# compares its AC'd job with that reference tensor by tensor: verify/golden.sh asks that to
# be bitwise (golden_check job), so that PyTorch's AC numbers meet shardbench's AC job.
# Two layers, batch 2 x seq 16: selective:2 checkpoints one of the two blocks, and the
# four runs cost golden.sh seconds.
AC_RUNS = [
    {"model": "debugmodel:n_layers=2", "dtype": "f64", "batch": 2, "seq": 16, "warmup": 0,
     "steps": 2, "ac": "full"},
    {"model": "debugmodel:n_layers=2", "dtype": "f64", "batch": 2, "seq": 16, "warmup": 0,
     "steps": 2, "ac": "selective:2"},
    {"model": "debugmodel:n_layers=2", "dtype": "f64", "batch": 2, "seq": 16, "warmup": 0,
     "steps": 2, "ac": "selective:op"},
    {"model": "debugmodel:n_layers=2", "dtype": "f32", "batch": 2, "seq": 16, "warmup": 0,
     "steps": 2, "ac": "selective:op"},
]


def recipe_flags(run):
    """shardbench run's flags for the run's settings beyond the shape ([] for RUNS)."""
    f = []
    if "ac" in run:
        f += ["--ac", run["ac"]]
    if "max_norm" in run:
        f += ["--max-norm", repr(run["max_norm"])]
    if "global_batch" in run:
        f += ["--global-batch", str(run["global_batch"])]
    if "lr" in run:
        lr = run["lr"]
        f += ["--lr-warmup-steps", str(lr["warmup_steps"]), "--lr-decay-ratio", repr(lr["decay_ratio"]),
              "--lr-decay-type", lr["decay_type"], "--lr-min-factor", repr(lr["min_lr_factor"])]
    return f


def lr_factor(step, training_steps, lr):
    """TorchTitan's linear_warmup_stable_decay (torchtitan/components/lr_scheduler.py
    build_lr_schedulers): the LambdaLR factor of the 0-based step."""
    warmup = min(int(lr["warmup_steps"]), training_steps)
    decay = round(training_steps * lr["decay_ratio"]) if lr["decay_ratio"] is not None else training_steps - warmup
    if warmup + decay > training_steps:
        decay = training_steps - warmup
    stable = training_steps + 1 - warmup - decay
    if step < warmup:
        return (step + 1) / warmup
    if step < warmup + stable:
        return 1.0
    progress = (step + 1 - (warmup + stable)) / decay
    adj = {"linear": 1 - progress, "sqrt": 1 - math.sqrt(progress),
           "cosine": 0.5 * (1.0 + math.cos(math.pi * progress))}[lr["decay_type"]]
    return lr["min_lr_factor"] + (1 - lr["min_lr_factor"]) * adj


# The comm configs: the shipped plans that build a 1-D tp mesh, at tp 2 and 4.
COMM_PLANS = ("torchtitan-tp-sp", "megatron-tp", "tp-no-loss-parallel")
COMM_TPS = (2, 4)
COMM_CFG = {"model": "debugmodel", "batch": 8, "seq": 32}

# Tolerances on the normwise relative error, in units of the run's rounding unit u
# (2^-53 f64, 2^-24 f32), per kind of quantity. Both sides compute the same sums of products
# in different orders, so errors are rounding errors; the measured maxima quoted here are over
# batch x seq in {2x16, 4x32, 8x32, 4x64, 8x64, 1x128}, 3 steps, debugmodel and the GQA
# variant, each dtype (shardbench vs this oracle), and each tolerance is 3x to 16x that:
# - loss (a mean of log-softmax terms, one scalar): measured <= 12 u (f64), 2 u (f32): 2^5 u.
# - gradients of step 0 (same weights, same tokens on both sides): measured <= 60 u (f64),
#   20 u (f32): 2^8 u.
# - gradients after an AdamW update and the final weights: the update is
#   lr * m / (sqrt(v) + eps), whose derivative in the gradient g is up to lr / eps = 8e4
#   where |g| is near eps (1e-8), so a rounding difference in a near-zero gradient element
#   becomes up to 8e4 times larger in that weight, and the next step's gradients inherit it.
#   Measured <= 7.2e3 u (f64), 3.9e3 u (f32) for gradients: 2^15 u; <= 4.3e4 u (f64),
#   3.4e4 u (f32) for the weights after 3 updates: 2^17 u.
GOLDEN_VERSION = 2  # 2: runs may carry settings (ac, max_norm, global_batch, lr) and grad_norm
TOL_U = {"loss": 2.0 ** 5, "grad step 0": 2.0 ** 8, "grad later": 2.0 ** 15, "param": 2.0 ** 17}
UNIT = {"f64": 2.0 ** -53, "f32": 2.0 ** -24}


def tolerance(dtype, tol_class):
    return TOL_U[tol_class] * UNIT[dtype]


# The init check's bound, in standard errors of each statistic: 6 puts a false alarm
# (two-sided normal tail 2e-9 per statistic, ~200 statistics per run) out of reach while
# a std off by 3.3% or more is caught on the smallest checked tensor (16384 elements).
INIT_Z = 6.0
# max |w| of an untruncated normal: P(|x| > 7 sigma) = 2.6e-12 per element, so over the
# largest tensor here (524288 elements) the chance of a false alarm is 1.3e-6.
INIT_MAX_SIGMAS = 7.0


def fail_line(msg):
    print(f"oracle.py: {msg}", file=sys.stderr)


# ---------------------------------------------------------------- shardbench


def run_shardbench(sb, run, out_dir, tag):
    w = os.path.join(out_dir, f"{tag}.weights.safetensors")
    t = os.path.join(out_dir, f"{tag}.trace.safetensors")
    cmd = [sb, "run", "--world", "1", "--model", run["model"], "--dtype", run["dtype"],
           "--batch", str(run["batch"]), "--seq", str(run["seq"]), "--warmup", str(run["warmup"]),
           "--steps", str(run["steps"]), "--save-weights", w, "--save-trace", t, "--no-mem-check",
           "--plans-dir", os.path.join(REPO, "plans")] + recipe_flags(run)
    if "ac" in run:
        cmd.append("--json")
    t0 = time.monotonic()
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    if p.returncode != 0:
        tail = (p.stderr.strip() or p.stdout.strip()).splitlines()[-1:] or ["(no output)"]
        raise RuntimeError(f"{' '.join(cmd)}: exit {p.returncode}: {tail[0]}")
    if "ac" in run:
        # the trace is the reference's (no AC): the AC'd job must be bitwise it
        try:
            d = json.loads(p.stdout)
        except json.JSONDecodeError as e:
            raise RuntimeError(f"{' '.join(cmd)}: --json output: {e}") from None
        if (d.get("status") != "ok" or not d.get("compared") or d.get("max_abs_err") != 0
                or f" ac={run['ac']}" not in d.get("key", "")):
            raise RuntimeError(f"{' '.join(cmd)}: the AC job is not bitwise the reference: status "
                               f"{d.get('status')}, key {d.get('key')!r}, max_abs_err {d.get('max_abs_err')}")
    return w, t, time.monotonic() - t0


def shardbench_comm(sb, plan_path, tp):
    cmd = [sb, "run", "--plan", plan_path, "--tp", str(tp), "--dtype", "f32",
           "--batch", str(COMM_CFG["batch"]), "--seq", str(COMM_CFG["seq"]), "--warmup", "0",
           "--steps", "1", "--json", "--model", COMM_CFG["model"]]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    if p.returncode != 0:
        tail = (p.stderr.strip() or p.stdout.strip()).splitlines()[-1:] or ["(no output)"]
        raise RuntimeError(f"{' '.join(cmd)}: exit {p.returncode}: {tail[0]}")
    d = json.loads(p.stdout)
    if d.get("status") != "ok":
        raise RuntimeError(f"{' '.join(cmd)}: status {d.get('status')}: {d.get('reason')}")
    counts = {}
    for row in d["comm"]:
        if row.get("mesh_dim") not in (None, "tp"):
            raise RuntimeError(f"{' '.join(cmd)}: comm row on mesh dim {row.get('mesh_dim')}")
        counts.setdefault(row["phase"], {})
        counts[row["phase"]][row["op"]] = counts[row["phase"]].get(row["op"], 0) + int(row["calls"])
    return counts


# ---------------------------------------------------------------- trace and weights


def check_trace(run, w, t, meta, a):
    """Checks that W and T hold what the run asked for; returns the list of fqns."""
    want = {"model": run["model"], "dtype": run["dtype"], "batch": str(run["batch"]),
            "seq": str(run["seq"]), "steps": str(run["steps"])}
    for k, v in want.items():
        if meta.get(k) != v:
            raise RuntimeError(f"trace metadata {k} = {meta.get(k)!r}, the run asked for {v!r}")
    model = llama.Transformer(a, torch.float64)
    shapes = {n: tuple(p.shape) for n, p in model.named_parameters()}
    if set(w) != set(shapes):
        extra, missing = sorted(set(w) - set(shapes)), sorted(set(shapes) - set(w))
        raise RuntimeError(f"weights file: unexpected {extra[:3]}, missing {missing[:3]}")
    wdt = torch.float64 if run["dtype"] == "f64" else torch.float32
    for n, s in shapes.items():
        if tuple(w[n].shape) != s or w[n].dtype != wdt:
            raise RuntimeError(f"weights file: {n} is {w[n].dtype} {tuple(w[n].shape)}, expected {wdt} {s}")
        for key in [f"grad.step{i}.{n}" for i in range(run["steps"])] + [f"param.final.{n}"]:
            if key not in t or tuple(t[key].shape) != s or t[key].dtype != torch.float64:
                raise RuntimeError(f"trace: {key} missing or not F64 {list(s)}")
    for i in range(run["steps"]):
        for key in (f"tokens.step{i}", f"targets.step{i}"):
            x = t.get(key)
            rows = run.get("global_batch", run["batch"])
            if x is None or tuple(x.shape) != (rows, run["seq"]) or x.dtype != torch.int64:
                raise RuntimeError(f"trace: {key} missing or not I64 [{rows}, {run['seq']}]")
            if x.min() < 0 or x.max() >= a.vocab:
                raise RuntimeError(f"trace: {key} has ids outside [0, {a.vocab})")
    if tuple(t.get("loss", torch.empty(0)).shape) != (run["steps"],):
        raise RuntimeError(f"trace: loss missing or not F64 [{run['steps']}]")
    return list(shapes)


# ---------------------------------------------------------------- PyTorch's steps


def torchtitan_model():
    """(Transformer, TransformerModelArgs, RoPEScalingArgs, cross_entropy_loss, version) or an error string."""
    try:
        from importlib.metadata import version
        from torchtitan.components.loss import cross_entropy_loss
        from torchtitan.models.llama3.model.args import RoPEScalingArgs, TransformerModelArgs
        from torchtitan.models.llama3.model.model import Transformer
        return Transformer, TransformerModelArgs, RoPEScalingArgs, cross_entropy_loss, version("torchtitan")
    except Exception as e:  # noqa: BLE001 (report whatever stops the import)
        return f"{type(e).__name__}: {e}"


def build_model(a, dtype, tt=None):
    if tt is None:
        return llama.Transformer(a, dtype), llama.cross_entropy_loss
    Transformer, TMA, RSA, loss_fn, _ = tt
    ta = TMA(dim=a.dim, n_layers=a.n_layers, n_heads=a.n_heads, n_kv_heads=a.n_kv_heads,
             vocab_size=a.vocab, multiple_of=a.multiple_of, ffn_dim_multiplier=a.ffn_dim_multiplier,
             norm_eps=a.norm_eps, rope_theta=a.rope_theta, max_seq_len=a.max_seq_len,
             # scaling_factor 1 makes the Llama 3.1 scaling the identity
             rope_scaling_args=RSA() if a.rope_scaling else RSA(scaling_factor=1.0))
    if dtype != torch.float32:
        raise ValueError("TorchTitan's model computes rope in float32: f32 runs only")
    with torch.device("cpu"):
        m = Transformer(ta)  # float32; Module.to() would turn the complex freqs_cis buffer real
    return m, loss_fn


# Activation checkpointing as TorchTitan applies it (torchtitan/distributed/
# activation_checkpoint.py at 8a6c9fe, _apply_ac_to_transformer_block): ptd_checkpoint_wrapper
# around every block (full), every N-th block counted from 1 (selective N), or every block
# with the op-level policy: the outputs of _save_list's ops saved except every second mm.
AC_MODES = ("full", "selective:2", "selective:op")


def _op_policy():
    from torch.utils.checkpoint import CheckpointPolicy
    aten = torch.ops.aten
    save_list = {aten.mm.default, aten._scaled_dot_product_efficient_attention.default,
                 aten._scaled_dot_product_flash_attention.default, aten.max.default}
    if hasattr(torch.ops, "_c10d_functional"):
        save_list.add(torch.ops._c10d_functional.reduce_scatter_tensor.default)
    meta = {"forward_mm_count": 0, "recompute_mm_count": 0}

    def policy(ctx, func, *args, **kwargs):
        key = ("recompute" if ctx.is_recompute else "forward") + "_mm_count"
        if func == aten.mm.default:
            meta[key] += 1
        save = func in save_list and not (func == aten.mm.default and meta[key] % 2 == 0)
        return CheckpointPolicy.MUST_SAVE if save else CheckpointPolicy.PREFER_RECOMPUTE
    return policy


def apply_ac(model, ac):
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper
    from torch.utils.checkpoint import create_selective_checkpoint_contexts
    for i, (name, block) in enumerate(list(model.layers.named_children())):
        if ac == "selective:op":
            wrapped = checkpoint_wrapper(block, preserve_rng_state=False, context_fn=lambda:
                                         create_selective_checkpoint_contexts(_op_policy()))
        elif ac == "full" or (i + 1) % int(ac.split(":")[1]) == 0:
            wrapped = checkpoint_wrapper(block, preserve_rng_state=False)
        else:
            continue
        model.layers.register_module(name, wrapped)


def pytorch_steps(run, a, w, t, meta, tt=None, ac=None):
    """The run's steps in PyTorch (ac: one of AC_MODES, or None); returns {golden quantity
    name: float64 tensor}."""
    dtype = torch.float64 if run["dtype"] == "f64" else torch.float32
    model, loss_fn = build_model(a, dtype, tt)
    model.load_state_dict(w, strict=True)
    if ac:
        apply_ac(model, ac)
    opt = torch.optim.AdamW(model.parameters(), lr=float(meta["lr"]),
                            betas=(float(meta["beta1"]), float(meta["beta2"])), eps=float(meta["eps"]),
                            weight_decay=float(meta["weight_decay"]), foreach=False)
    q = {f"loss step {s}": None for s in range(run["steps"])}  # losses first in the golden
    def named():  # the fqns without the checkpoint wrapper's prefix
        return [(n.replace("._checkpoint_wrapped_module", ""), p) for n, p in model.named_parameters()]
    names = [n for n, _ in named()]
    # the recipe (train.py train_step): accumulation over the step's rows in microsteps of
    # batch, each loss / k (rescale_accumulated_loss); clip_grad_norm_; the lr of LambdaLR
    k = run.get("global_batch", run["batch"]) // run["batch"]
    base_lr = float(meta["lr"])
    for s in range(run["steps"]):
        total = None
        for a_ in range(k):
            rows = slice(a_ * run["batch"], (a_ + 1) * run["batch"])
            logits = model(t[f"tokens.step{s}"][rows])
            loss = loss_fn(logits, t[f"targets.step{s}"][rows]) / k
            loss.backward()
            total = loss.detach() if total is None else total + loss.detach()
        q[f"loss step {s}"] = total.double().reshape(1)
        for n, p in named():
            q[f"{n} grad step {s}"] = p.grad.detach().double().clone()
        if "max_norm" in run:
            # clip_grad_norm_ = get_total_norm + clip_grads_with_norm_ (torch/nn/utils/
            # clip_grad.py); the total norm taken over the gradients widened to f64, as
            # shardbench sums: PyTorch's own f32 vector_norm of the f32 run's gradients
            # (tok_embeddings' 5e5 elements) was measured 7.6e-5 off their f64 norm, its
            # rounding, not the step's
            ps = list(model.parameters())
            norm = torch.nn.utils.get_total_norm([p_.grad.double() for p_ in ps], 2.0, foreach=False)
            torch.nn.utils.clip_grads_with_norm_(ps, run["max_norm"], norm.to(dtype), foreach=False)
            q[f"grad_norm step {s}"] = norm.detach().double().reshape(1)
        if "lr" in run:
            for g in opt.param_groups:
                g["lr"] = base_lr * lr_factor(s, run["steps"], run["lr"])
        opt.step()
        opt.zero_grad()
    last = run["steps"] - 1
    params = dict(named())
    for n in names:
        q[f"{n} param after step {last}"] = params[n].detach().double().clone()
    return q


def trace_quantity(t, name):
    """The trace tensor for a golden quantity name."""
    if name.startswith("loss step "):
        return t["loss"][int(name.rsplit(" ", 1)[1])].reshape(1)
    if name.startswith("grad_norm step "):
        return t["grad_norm"][int(name.rsplit(" ", 1)[1])].reshape(1)
    fqn, kind = name.split(" ", 1)
    if kind.startswith("grad step "):
        return t[f"grad.step{int(kind.rsplit(' ', 1)[1])}.{fqn}"]
    return t[f"param.final.{fqn}"]


def kind_of(name):
    """The table's kind ('loss step 0', 'grad step 1', 'param final') and the TOL_U class."""
    if name.startswith("loss step "):
        return name, "loss"
    if name.startswith("grad_norm step "):  # a function of that step's gradients: their class
        k = "grad_norm"
        return k, ("grad step 0" if name.endswith(" 0") else "grad later")
    if " grad step " in name:
        k = "grad step " + name.rsplit(" ", 1)[1]
        return k, ("grad step 0" if k == "grad step 0" else "grad later")
    return "param final", "param"


def rel_err(x, ref):
    m = ref.abs().max().item()
    d = (x - ref).abs().max().item()
    return d / m if m > 0 else d


def compare(q, other, run):
    """{kind: (max err, worst name, tolerance)} and the list of quantities over tolerance."""
    kinds, bad = {}, []
    for name, ref in q.items():
        k, tol_class = kind_of(name)
        tol = tolerance(run["dtype"], tol_class)
        e = rel_err(other[name], ref)
        if not math.isfinite(e) or e > tol:
            bad.append((name, e, tol))
        if k not in kinds or not (e <= kinds[k][0]):
            kinds[k] = (e, name, tol)
    return kinds, bad


# ---------------------------------------------------------------- init distribution


def _trunc_moments(c):
    """E[x^k] for k = 2, 4, 6, 8 of a standard normal truncated to [-c, c] (c may be inf).

    From I_k = int_{-c}^{c} x^k phi(x) dx = -2 c^(k-1) phi(c) + (k-1) I_{k-2}, I_0 = Z."""
    if math.isinf(c) or c > 40:
        return {2: 1.0, 4: 3.0, 6: 15.0, 8: 105.0}
    phi = math.exp(-c * c / 2) / math.sqrt(2 * math.pi)
    z = math.erf(c / math.sqrt(2))
    i = {0: z}
    for k in (2, 4, 6, 8):
        i[k] = -2 * c ** (k - 1) * phi + (k - 1) * i[k - 2]
    return {k: i[k] / z for k in (2, 4, 6, 8)}


def init_check(w, a, spec_override=None):
    """Checks each initial weight against TorchTitan's init_weights spec (llama.init_spec).

    Per tensor of n elements drawn from N(0, std^2) truncated to +-bound: the sample mean
    (standard error sqrt(m2/n)), the sample std (delta method: relative standard error
    sqrt((m4 - m2^2)/n) / (2 m2)), the sample kurtosis (delta method on M4/M2^2 with the
    truncated moments m2..m8), each within INIT_Z standard errors. With a bound within reach
    (output's 3 std): max |w| <= bound, and max |w| >= bound - 0.1 std where the chance that
    no element falls in that band is below e^-30; otherwise max |w| < INIT_MAX_SIGMAS std.
    Norm weights: exactly one.
    Returns (failures as (fqn, what, measured, expected, allowed), number of weights checked)."""
    spec = spec_override or llama.init_spec(a)
    fails, checked = [], 0
    for fqn, (std, bound) in spec.items():
        x = w[fqn].double().reshape(-1)
        n = x.numel()
        if std is None:
            if not torch.all(x == 1.0):
                fails.append((fqn, "ones", x.sub(1).abs().max().item(), 0.0, 0.0))
            checked += 1
            continue
        c = math.inf if bound is None else bound / std
        m = _trunc_moments(c)
        m2, m4, m6, m8 = m[2], m[4], m[6], m[8]
        xs = x / std
        mean = xs.mean().item()
        d = xs - mean
        s2 = d.pow(2).mean().item()
        s4 = d.pow(4).mean().item()
        kurt = s4 / (s2 * s2)
        se_mean = math.sqrt(m2 / n)
        se_std = math.sqrt((m4 - m2 * m2) / n) / (2 * m2)
        # kurtosis g = M4 / M2^2: dg/dM2 = -2 m4 / m2^3, dg/dM4 = 1 / m2^2
        g2, g4 = -2 * m4 / m2 ** 3, 1 / m2 ** 2
        var_k = (g2 * g2 * (m4 - m2 * m2) + g4 * g4 * (m8 - m4 * m4) + 2 * g2 * g4 * (m6 - m2 * m4)) / n
        exp_std, exp_kurt = math.sqrt(m2), m4 / (m2 * m2)
        checks = [("mean/std", mean, 0.0, INIT_Z * se_mean),
                  ("std/std_spec", math.sqrt(s2), exp_std, INIT_Z * se_std * exp_std),
                  ("kurtosis", kurt, exp_kurt, INIT_Z * math.sqrt(var_k))]
        for what, got, exp, allowed in checks:
            if not abs(got - exp) <= allowed:
                fails.append((fqn, what, got, exp, allowed))
        mx = xs.abs().max().item()
        if c < INIT_MAX_SIGMAS:
            # p <= P(|x| in [c - 0.1, c]) (the density is smallest at c); none of n: < e^(-n p)
            p = 2 * 0.1 * math.exp(-c * c / 2) / math.sqrt(2 * math.pi) / math.erf(c / math.sqrt(2))
            low = c - 0.1 if n * p >= 30 else 0.0
            if not (low <= mx <= c):
                fails.append((fqn, "max|w|/std", mx, c, c - low))
        elif not mx < INIT_MAX_SIGMAS:
            fails.append((fqn, "max|w|/std", mx, 0.0, INIT_MAX_SIGMAS))
        checked += 1
    return fails, checked


# ---------------------------------------------------------------- golden


def golden_stats(x, is_loss=False):
    x = x.double().reshape(-1)
    n = x.numel()
    if is_loss:
        v = x[0].item()
        return {"numel": 1, "sum": v, "sum_abs": abs(v), "sumsq": v * v, "max_abs": abs(v), "samples": [[0, v]]}
    idx = [(k * n // 8 + 5) % n for k in range(8)]
    idx.append(int(x.abs().argmax().item()))
    return {"numel": n, "sum": x.sum().item(), "sum_abs": x.abs().sum().item(),
            "sumsq": x.pow(2).sum().item(), "max_abs": x.abs().max().item(),
            "samples": [[i, x[i].item()] for i in idx]}


def golden_text(g):
    """The golden JSON, one quantity and one comm row per line (readable diffs)."""
    def d(x):
        return json.dumps(x, allow_nan=False)
    head = ",\n".join(f" {d(k)}: {d(v)}" for k, v in g.items() if k not in ("runs", "comm"))
    runs = []
    for r in g["runs"]:
        top = ", ".join(f"{d(k)}: {d(v)}" for k, v in r.items() if k not in ("quantities", "inputs"))
        ins = ",\n".join(f"    {d(n)}: {d(s)}" for n, s in r.get("inputs", {}).items())
        qs = ",\n".join(f"    {d(n)}: {d(s)}" for n, s in r["quantities"].items())
        runs.append(f"  {{{top},\n   \"inputs\": {{\n{ins}\n   }},\n"
                    f"   \"quantities\": {{\n{qs}\n   }}}}")
    comm_rows = ",\n".join(f"  {d(c)}" for c in g["comm"])
    return (f"{{\n{head},\n \"runs\": [\n" + ",\n".join(runs) + "\n ],\n"
            f" \"comm\": [\n{comm_rows}\n ]\n}}\n")


def golden_stale(old, new):
    """Quantities whose statistics moved between two golden dicts beyond the run's tolerance."""
    out = []
    def key(r):  # a run is its settings: shape, dtype, recipe, AC
        return json.dumps({k: v for k, v in r.items() if k not in ("inputs", "quantities")}, sort_keys=True)
    old_runs = {key(r): r for r in old.get("runs", [])}
    for r in new["runs"]:
        o = old_runs.get(key(r))
        what = f"{r['model']} {r['dtype']}" + "".join(f" {f}" for f in recipe_flags(r))
        if o is None:
            out.append(f"run {what}: missing or with other settings")
            continue
        for name, s in r["quantities"].items():
            os_ = o["quantities"].get(name)
            if os_ is None:
                out.append(f"{what} {name}: missing")
                continue
            tol = tolerance(r["dtype"], kind_of(name)[1])
            scale = max(s["max_abs"], 1e-300)
            vals = [(s["max_abs"], os_["max_abs"])] + list(zip([v for _, v in s["samples"]],
                                                               [v for _, v in os_["samples"]]))
            if any(abs(a - b) > tol * scale for a, b in vals) or s["numel"] != os_["numel"]:
                out.append(f"{what} {name}")
    if new["comm"]:
        key = lambda c: (c["plan"], c["tp"], c["op"], c["phase"])  # noqa: E731
        old_c = {key(c): (c["pytorch"], c["shardbench"]) for c in old.get("comm", [])}
        new_c = {key(c): (c["pytorch"], c["shardbench"]) for c in new["comm"]}
        out += [f"comm {' '.join(map(str, k))}" for k in sorted(set(old_c) | set(new_c), key=str)
                if old_c.get(k) != new_c.get(k)]
    return out


# ---------------------------------------------------------------- comm


def sp_param_count(plan, a):
    """Parameters of the modules a SequenceParallel entry matches (their gradients are Partial)."""
    model = llama.Transformer(a, torch.float32)
    n = 0
    for mod_name, mod in model.named_modules():
        for pattern, text, _ in plan["entries"]:
            toks = pattern.split(".")
            parts = mod_name.split(".")
            if (text.startswith("SequenceParallel") and len(parts) == len(toks)
                    and all(fnmatch.fnmatchcase(p, t) for p, t in zip(parts, toks))):
                n += sum(1 for _ in mod.parameters(recurse=False))
    return n


def comm_rows(plan_name, tp, pt, sb, n_sp):
    """Rows op x phase; each with a note. Returns (rows, unexplained differences)."""
    rows, bad = [], []
    ops = ("all_gather", "reduce_scatter", "all_reduce", "all_to_all", "broadcast")
    extra = {op for ph in comm.PHASES for op in list(pt.get(ph, {})) + list(sb.get(ph, {}))} - set(ops)
    for ph in comm.PHASES:
        for op in ops + tuple(sorted(extra)):
            p, s = pt.get(ph, {}).get(op, 0), sb.get(ph, {}).get(op, 0)
            if p == 0 and s == 0:
                continue
            note, per = "same", 1
            if p != s:
                if op == "all_reduce" and ph == "optimizer" and s == n_sp and p == 3 * n_sp:
                    note = (f"both keep the Partial gradients of the {n_sp} SequenceParallel norm "
                            "weights through backward and all-reduce them in the optimizer: shardbench "
                            "once each; PyTorch's _single_tensor_adam reads each grad 3 times "
                            "(exp_avg.lerp_(grad), exp_avg_sq.addcmul_(grad, grad)) and DTensor "
                            "redistributes Partial->Replicate at every read. Same sums, same update")
                    per = 3
                else:
                    note = "UNEXPLAINED difference"
                    bad.append(f"{plan_name} tp {tp}: {op} {ph}: pytorch {p}, shardbench {s}")
            row = {"plan": plan_name, "tp": tp, "op": op, "phase": ph, "pytorch": p,
                   "shardbench": s, "note": note}
            if per != 1:  # verify/golden_check.c divides PyTorch's count by it
                row["pytorch_calls_per_reduction"] = per
            rows.append(row)
    return rows, bad


# ---------------------------------------------------------------- main


class _Parser(argparse.ArgumentParser):
    def error(self, message):  # one line, exit 2
        print(f"oracle.py: {message} (see --help)", file=sys.stderr)
        sys.exit(2)


def main():
    p = _Parser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--shardbench", default=os.path.join(REPO, "bench", "shardbench"),
                   help="the shardbench binary (default: bench/shardbench under the repository root)")
    p.add_argument("--out", help="scratch directory for the weights and traces (default: a temporary one, removed)")
    p.add_argument("--write-golden", metavar="FILE", help="write the golden JSON file read by make check")
    p.add_argument("--check-only", action="store_true",
                   help="write nothing; also report whether --golden is stale (its numbers differ from "
                        "what PyTorch computes now beyond the tolerances: exit 1)")
    p.add_argument("--golden", default=os.path.join(REPO, "verify", "golden", "debugmodel.json"),
                   help="the golden file --check-only compares with")
    p.add_argument("--runs", help="comma-separated indices into RUNS (default: all)")
    p.add_argument("--no-comm", action="store_true", help="skip the collective counts")
    p.add_argument("--no-torchtitan", action="store_true", help="do not try TorchTitan's own model")
    o = p.parse_args()

    if not (os.path.isfile(o.shardbench) and os.access(o.shardbench, os.X_OK)):
        p.error(f"--shardbench {o.shardbench}: not an executable file")
    if o.check_only and o.write_golden:
        p.error("--check-only writes nothing; drop --write-golden")
    all_runs = RUNS + RECIPE_RUNS + AC_RUNS
    runs = list(range(len(all_runs)))
    if o.runs:
        try:
            runs = [int(x) for x in o.runs.split(",")]
            if any(not 0 <= r < len(all_runs) for r in runs):
                raise ValueError
        except ValueError:
            p.error(f"--runs {o.runs}: expected indices in 0..{len(all_runs) - 1}, comma-separated")
    if o.write_golden and (o.runs or o.no_comm):
        p.error("--write-golden needs every run and the comm counts (drop --runs / --no-comm)")
    old_golden = None
    if o.check_only:
        try:
            with open(o.golden) as f:
                old_golden = json.load(f)
        except (OSError, json.JSONDecodeError) as e:
            p.error(f"--golden {o.golden}: {e}")
    sb = os.path.abspath(o.shardbench)
    plans = {}  # parsed, and their patterns matched against the model, before any work
    if not o.no_comm:
        a_comm = llama.args_from_spec(COMM_CFG["model"], COMM_CFG["seq"])
        names = [n for n, _ in llama.Transformer(a_comm, torch.float32).named_modules() if n]
        for plan_name in COMM_PLANS:
            path = os.path.join(REPO, "plans", plan_name + ".plan")
            try:
                plan = comm.parse_plan(path)
                comm.build_styles(plan, path, names)
            except (OSError, comm.PlanError) as e:
                fail_line(str(e))
                return 2
            plans[plan_name] = (path, plan, sp_param_count(plan, a_comm))
    torch.set_num_threads(1)  # the numbers must not depend on the machine's core count

    tt = None if o.no_torchtitan else torchtitan_model()
    if isinstance(tt, str):
        print(f"TorchTitan's model: not importable ({tt}); the transcription alone is compared")
    elif tt is not None:
        print(f"TorchTitan's model: torchtitan {tt[4]} imports; the f32 runs also go through it")

    t_start = time.monotonic()
    ok = True
    golden = {"format": "shardbench-golden", "version": GOLDEN_VERSION, "generator": "verify/torch/oracle.py",
              "torch": torch.__version__, "torchtitan": tt[4] if isinstance(tt, tuple) else None,
              "model_source": "verify/torch/llama.py: a transcription of TorchTitan v0.2.0 "
                              "torchtitan/models/llama3/model/model.py (rope and the loss in the model's "
                              "dtype), run by torch " + torch.__version__ + " on the CPU",
              "runs": [], "comm": []}
    with tempfile.TemporaryDirectory(prefix="sb-oracle-") as tmp:
        out_dir = o.out or tmp
        os.makedirs(out_dir, exist_ok=True)
        for ri in runs:
            run = all_runs[ri]
            label = f"{run['model']} {run['dtype']} batch {run['batch']} seq {run['seq']} steps {run['steps']}"
            if ri >= len(RUNS):
                label += " " + " ".join(recipe_flags(run))
            try:
                wp, tp_, sb_s = run_shardbench(sb, run, out_dir, f"run{ri}")
                w, _ = st_io.load(wp)
                t, meta = st_io.load(tp_)
                a = llama.args_for_trace(meta)
                check_trace(run, w, t, meta, a)
            except (RuntimeError, st_io.SafetensorsError, ValueError, KeyError, subprocess.TimeoutExpired) as e:
                print(f"\nrun {label}: FAIL: {e}")
                ok = False
                continue
            t0 = time.monotonic()
            q = pytorch_steps(run, a, w, t, meta, ac=run.get("ac"))
            pt_s = time.monotonic() - t0
            if "ac" in run:
                # PyTorch's AC must change no bits of PyTorch's own run without it
                q0 = pytorch_steps(run, a, w, t, meta)
                diff = [n for n in q if not torch.equal(q[n], q0[n])]
                label += (" (torch.utils.checkpoint, TorchTitan's policy: " +
                          ("bitwise PyTorch's no-AC run)" if not diff else
                           f"{len(diff)} quantities differ from PyTorch's no-AC run: FAIL)"))
                if diff:
                    ok = False
            tq = {name: trace_quantity(t, name) for name in q}
            kinds, bad = compare(q, tq, run)
            print(f"\nrun {label}: shardbench {sb_s:.1f} s, pytorch {pt_s:.1f} s")
            print(f"  {'kind':<12} {'max err':>9} {'tolerance':>9}  worst")
            for k, (e, name, tol) in kinds.items():
                print(f"  {k:<12} {e:9.2e} {tol:9.2e}  {name}{'' if e <= tol else '   FAIL'}")
            for name, e, tol in bad[:10]:
                print(f"  FAIL {name}: {e:.3e} > {tol:.3e}")
            if bad:
                ok = False
            fails, checked = init_check(w, a)
            print(f"  init: {checked} weights against TorchTitan's init_weights spec: "
                  f"{'ok' if not fails else f'{len(fails)} FAIL'}")
            for fqn, what, got, exp, allowed in fails[:10]:
                print(f"  FAIL init {fqn}: {what} {got:.6g}, expected {exp:.6g} +- {allowed:.3g}")
            if fails:
                ok = False
            if run["model"] == "debugmodel":
                # PyTorch's AC must change no bits of PyTorch's run; against shardbench's (whose
                # AC runs are bitwise its no-AC run: verify/test_ac.c) today's tolerances
                for ac in AC_MODES:
                    qa = pytorch_steps(run, a, w, t, meta, ac=ac)
                    diff = [n for n in q if not torch.equal(qa[n], q[n])]
                    ka, bada = compare(qa, tq, run)
                    print(f"  AC {ac:<12} (torch.utils.checkpoint, TorchTitan's policy): "
                          f"{'bitwise the no-AC run' if not diff else f'{len(diff)} quantities differ from no AC: FAIL'}"
                          "; vs shardbench: " + ", ".join(f"{k} {e:.2e}" for k, (e, _, _) in ka.items())
                          + ("" if not bada else f"  FAIL ({len(bada)} over tolerance)"))
                    if diff or bada:
                        ok = False
            if isinstance(tt, tuple) and run["dtype"] == "f32":
                qt = pytorch_steps(run, a, w, t, meta, tt)
                kt, badt = compare(qt, tq, run)
                same = max(rel_err(qt[n], q[n]) for n in q)
                print(f"  TorchTitan's model: vs the transcription max err {same:.2e}; vs shardbench: "
                      + ", ".join(f"{k} {e:.2e}" for k, (e, _, _) in kt.items())
                      + ("" if not badt else f"  FAIL ({len(badt)} over tolerance)"))
                if badt:
                    ok = False
            # what the numbers were computed from (shardbench's initial weights and token
            # batches): golden_check tells a stale golden (inputs changed) from a drift
            inputs = {f"init {n}": golden_stats(x) for n, x in sorted(w.items())}
            inputs.update({n: golden_stats(x) for n, x in sorted(t.items())
                           if n.startswith(("tokens.step", "targets.step"))})
            golden["runs"].append({**run, "inputs": inputs, "quantities": {
                name: golden_stats(x, name.startswith(("loss step ", "grad_norm step "))) for name, x in q.items()}})

        if plans:
            for plan_name, (plan_path, plan, n_sp) in plans.items():
                for tp in COMM_TPS:
                    try:
                        t0 = time.monotonic()
                        pt = comm.pytorch_counts(plan_path, tp, **COMM_CFG)
                        pt_s = time.monotonic() - t0
                        sbc = shardbench_comm(sb, plan_path, tp)
                    except (RuntimeError, OSError, comm.PlanError, subprocess.TimeoutExpired) as e:
                        print(f"\ncomm {plan_name} tp {tp}: FAIL: {e}")
                        ok = False
                        continue
                    rows, bad = comm_rows(plan_name, tp, pt["counts"], sbc, n_sp)
                    # The plan applied in PyTorch must give the unsharded model's loss (f32 sums
                    # in another order: the loss tolerance).
                    lerr = abs(pt["loss"] - pt["ref_loss"]) / abs(pt["ref_loss"])
                    ltol = tolerance("f32", "loss")
                    print(f"\ncomm {plan_name} tp {tp} ({COMM_CFG['model']} f32 batch {COMM_CFG['batch']} "
                          f"seq {COMM_CFG['seq']}; calls per step; pytorch {pt_s:.1f} s; PyTorch's TP loss vs "
                          f"unsharded {lerr:.1e}{'' if lerr <= ltol else ' FAIL'})")
                    print(f"  {'op':<15} {'phase':<10} {'pytorch':>7} {'shardbench':>10}  note")
                    for r in rows:
                        print(f"  {r['op']:<15} {r['phase']:<10} {r['pytorch']:>7} {r['shardbench']:>10}  {r['note']}")
                    if bad or lerr > ltol:
                        ok = False
                    golden["comm"].extend(rows)

    print(f"\ntotal {time.monotonic() - t_start:.0f} s")
    if o.check_only and old_golden is not None:
        stale = golden_stale(old_golden, golden)
        print(f"golden {o.golden}: " + ("up to date" if not stale else
                                        f"STALE ({len(stale)} quantities differ, first: {stale[0]}); "
                                        "regenerate it with --write-golden"))
        if stale:
            ok = False
    if o.write_golden:
        if not ok:
            fail_line(f"not writing {o.write_golden}: the checks above failed")
            return 1
        tmp_path = o.write_golden + ".tmp"
        os.makedirs(os.path.dirname(os.path.abspath(o.write_golden)), exist_ok=True)
        with open(tmp_path, "w") as f:
            f.write(golden_text(golden))
        os.replace(tmp_path, o.write_golden)  # never a half-written golden
        print(f"wrote {o.write_golden}")
    print("oracle: " + ("PASS" if ok else "FAIL"))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
