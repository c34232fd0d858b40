"""PyTorch's collective counts for a shardbench tensor-parallel plan file.

Builds the plan in PyTorch from the .plan text (settings `key = value`, a `[tp]`
section of `PATTERN = Style(kwargs)` lines; each style is evaluated in a namespace
holding only the ParallelStyle and placement classes), applies it with
torch.distributed.tensor.parallel.parallelize_module on a 1-D "tp" DeviceMesh over
gloo, one process per rank, and counts collectives with
torch.distributed.tensor.debug.CommDebugMode in three phases of one training step:
forward (+ loss), backward, optimizer (torch.optim.AdamW.step). With
`loss_parallel = true` the loss and the backward run under
torch.distributed.tensor.parallel.loss_parallel(), as TorchTitan's train context does
(get_train_context in torchtitan/distributed/utils.py, v0.2.0).
The model is the transcription in llama.py, in float32. Not a benchmark: counts only.
"""

import contextlib
import fnmatch
import json
import os
import re
import socket
import tempfile
import time
from collections import Counter
from datetime import timedelta

import torch

import llama

# CommDebugMode's op names (torch/distributed/tensor/debug/_comm_mode.py: funcol ops and
# c10d ops) -> the collective names shardbench's ledger uses.
_OP_NAMES = [
    (re.compile(r"all_gather|allgather"), "all_gather"),
    (re.compile(r"reduce_scatter"), "reduce_scatter"),
    (re.compile(r"all_reduce|allreduce"), "all_reduce"),
    (re.compile(r"all_to_all|alltoall"), "all_to_all"),
    (re.compile(r"broadcast"), "broadcast"),
]

PHASES = ("forward", "backward", "optimizer")


class PlanError(ValueError):
    """Bad plan text; str() is one line starting FILE:LINE."""


def op_name(packet):
    s = str(packet)
    for pat, name in _OP_NAMES:
        if pat.search(s):
            return name
    return s  # scatter / gather / reduce / send: reported under their own name


def parse_plan(path):
    """Returns {"name", "dims", "loss_parallel", "entries": [(pattern, style_text, line)]}.

    Only what the oracle needs: the [tp] section of a `dims = tp:-1` plan."""
    plan = {"name": os.path.basename(path)[:-5] if path.endswith(".plan") else os.path.basename(path),
            "dims": None, "loss_parallel": False, "entries": []}
    section = None
    with open(path) as f:
        lines = f.read().split("\n")
    for i, raw in enumerate(lines, 1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        m = re.fullmatch(r"\[(\w+)\]", line)
        if m:
            section = m.group(1)
            if section != "tp":
                raise PlanError(f"{path}:{i}: section [{section}]: only [tp] is built in PyTorch here")
            continue
        key, sep, val = line.partition("=")
        key, val = key.strip(), val.strip()
        if not sep or not key or not val:
            raise PlanError(f"{path}:{i}: expected 'key = value' or 'PATTERN = Style(...)'")
        if section is None:
            if key == "name":
                plan["name"] = val
            elif key == "dims":
                plan["dims"] = val
            elif key == "loss_parallel":
                if val not in ("true", "false"):
                    raise PlanError(f"{path}:{i}: loss_parallel must be true or false, not '{val}'")
                plan["loss_parallel"] = val == "true"
            else:
                raise PlanError(f"{path}:{i}: unknown setting '{key}'")
        else:
            if any(p == key for p, _, _ in plan["entries"]):
                raise PlanError(f"{path}:{i}: pattern '{key}' appears twice")
            plan["entries"].append((key, val, i))
    if plan["dims"] is None or [d.strip() for d in plan["dims"].split(",")] != ["tp:-1"]:
        raise PlanError(f"{path}: dims = {plan['dims']}: the oracle builds 1-D tp plans (dims = tp:-1) only")
    return plan


def build_styles(plan, path, module_names):
    """{pattern: ParallelStyle}, in file order; checks every pattern matches a module."""
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import (ColwiseParallel, PrepareModuleInput,
                                                   PrepareModuleOutput, RowwiseParallel,
                                                   SequenceParallel)
    ns = {"ColwiseParallel": ColwiseParallel, "RowwiseParallel": RowwiseParallel,
          "SequenceParallel": SequenceParallel, "PrepareModuleInput": PrepareModuleInput,
          "PrepareModuleOutput": PrepareModuleOutput, "Shard": Shard, "Replicate": Replicate}
    styles = {}
    for pattern, text, line in plan["entries"]:
        toks = pattern.split(".")
        if not any(len(n.split(".")) == len(toks) and
                   all(fnmatch.fnmatchcase(a, b) for a, b in zip(n.split("."), toks))
                   for n in module_names):
            raise PlanError(f"{path}:{line}: pattern '{pattern}' matches no module of the model")
        try:
            styles[pattern] = eval(text, {"__builtins__": {}}, ns)  # noqa: S307 (names limited to ns)
        except Exception as e:  # the style text is the user's input
            raise PlanError(f"{path}:{line}: {text}: {type(e).__name__}: {e}") from None
    return styles


def _free_port():
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _worker(rank, world, port, cfg, out_dir):
    """One rank: parallelize, one training step under CommDebugMode, write rank{r}.json."""
    import torch.distributed as dist
    import torch.nn.functional as F
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.debug import CommDebugMode
    from torch.distributed.tensor.parallel import loss_parallel, parallelize_module

    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    torch.set_num_threads(1)  # world processes share the cores
    dist.init_process_group("gloo", rank=rank, world_size=world, timeout=timedelta(seconds=120))
    try:
        mesh = init_device_mesh("cpu", (world,), mesh_dim_names=("tp",))
        a = llama.args_from_spec(cfg["model"], seq_len=cfg["seq"])
        torch.manual_seed(cfg["seed"])  # same weights and tokens on every rank
        model = llama.Transformer(a, torch.float32)
        model.init_weights()
        tokens = torch.randint(0, a.vocab, (cfg["batch"], cfg["seq"]))
        targets = torch.randint(0, a.vocab, (cfg["batch"], cfg["seq"]))
        with torch.no_grad():
            ref_loss = llama.cross_entropy_loss(model(tokens), targets).item()
        plan = parse_plan(cfg["plan"])
        styles = build_styles(plan, cfg["plan"], [n for n, _ in model.named_modules() if n])
        parallelize_module(model, mesh, styles)
        opt = torch.optim.AdamW(model.parameters(), lr=8e-4, betas=(0.9, 0.95), eps=1e-8,
                                weight_decay=0.1, foreach=False)
        lp = loss_parallel if plan["loss_parallel"] else contextlib.nullcontext
        counts = {}
        with CommDebugMode() as cm:
            with lp():
                logits = model(tokens)
                loss = F.cross_entropy(logits.flatten(0, 1), targets.flatten(0, 1))
        counts["forward"] = cm.get_comm_counts().copy()
        with CommDebugMode() as cm:
            with lp():
                loss.backward()
        counts["backward"] = cm.get_comm_counts().copy()
        with CommDebugMode() as cm:
            opt.step()
            opt.zero_grad()
        counts["optimizer"] = cm.get_comm_counts().copy()
        loss_v = loss.full_tensor().item() if hasattr(loss, "full_tensor") else loss.item()
        res = {"loss": loss_v, "ref_loss": ref_loss, "counts": {}}
        for ph, c in counts.items():
            agg = Counter()
            for packet, n in c.items():
                agg[op_name(packet)] += n
            res["counts"][ph] = dict(agg)
        with open(os.path.join(out_dir, f"rank{rank}.json"), "w") as f:
            json.dump(res, f)
    finally:
        dist.destroy_process_group()


def pytorch_counts(plan_path, tp, model="debugmodel", batch=8, seq=32, seed=0, timeout_s=300):
    """Runs `tp` processes; returns {"counts": {phase: {op: calls}}, "loss", "ref_loss"}.

    Raises RuntimeError when a rank fails, hangs past timeout_s, or ranks disagree."""
    import torch.multiprocessing as mp
    cfg = {"plan": plan_path, "model": model, "batch": batch, "seq": seq, "seed": seed}
    with tempfile.TemporaryDirectory(prefix="sb-comm-") as out_dir:
        env_before = os.environ.get("GLOO_SOCKET_IFNAME")
        os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")  # loopback: no name resolution needed
        try:
            ctx = mp.start_processes(_worker, args=(tp, _free_port(), cfg, out_dir), nprocs=tp,
                                     join=False, start_method="spawn")
            deadline = time.monotonic() + timeout_s
            while not ctx.join(timeout=1.0):
                if time.monotonic() > deadline:
                    for p in ctx.processes:
                        if p.is_alive():
                            p.terminate()
                    raise RuntimeError(f"{os.path.basename(plan_path)} tp {tp}: ranks still running "
                                       f"after {timeout_s} s; terminated")
        finally:
            if env_before is None:
                os.environ.pop("GLOO_SOCKET_IFNAME", None)
        res = []
        for r in range(tp):
            with open(os.path.join(out_dir, f"rank{r}.json")) as f:
                res.append(json.load(f))
    for r in range(1, tp):
        if res[r]["counts"] != res[0]["counts"]:
            raise RuntimeError(f"rank {r} counted {res[r]['counts']}, rank 0 {res[0]['counts']}")
    return res[0]
