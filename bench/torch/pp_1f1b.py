"""PyTorch's 1F1B pipeline step on the CPU: the baseline for shardbench's pp 2 step.

Two processes (gloo), one pipeline stage each, run TorchTitan's Llama 3
(verify/torch/llama.py, the debugmodel by default) split as TorchTitan's pipeline_llm
splits it (torchtitan/distributed/pipeline_parallel.py, v0.2.0:
generate_llm_fqn_per_model_part counts tok_embeddings and norm + output as one layer
each, so at pp 2 and 6 layers stage 0 holds tok_embeddings + layers 0-2, stage 1
layers 3-5 + norm + output), with torch.distributed.pipelining's PipelineStage and
Schedule1F1B, the loss divided by the number of microbatches (Schedule1F1B's
scale_grads), and AdamW's step. Each process uses one intra-op thread, as each of
shardbench's ranks uses one BLAS thread.

A step is optimizer.zero_grad, schedule.step and optimizer.step, between two barriers
of both processes; its time is the slower process's. Prints one JSON object:
{"step_s": median over the timed steps, "steps_s": [...], ...}.

    python3 bench/torch/pp_1f1b.py [--model debugmodel] [--batch 8] [--seq 32]
                                   [--microbatches 4] [--steps 10] [--warmup 2]

Exit 0 ok, 2 bad flags, 77 when torch (with torch.distributed.pipelining) is missing.
"""

import argparse
import json
import os
import socket
import statistics
import sys
import time

try:
    import torch
    import torch.distributed as dist
    import torch.multiprocessing as mp
    from torch.distributed.pipelining import PipelineStage, Schedule1F1B
except ImportError as e:  # no torch, or a torch older than 2.4
    print(f"pp_1f1b.py: needs torch >= 2.4 with torch.distributed.pipelining ({e})",
          file=sys.stderr)
    sys.exit(77)

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..",
                                "verify", "torch"))
import llama  # noqa: E402


class Stage(torch.nn.Module):
    """A pipeline stage of the Transformer: the modules pipeline_module_split keeps
    (the others deleted), with TorchTitan's forward that skips the missing ones."""

    def __init__(self, model, layers, first, last):
        super().__init__()
        self.tok_embeddings = model.tok_embeddings if first else None
        self.layers = torch.nn.ModuleDict({k: model.layers[k] for k in layers})
        self.norm = model.norm if last else None
        self.output = model.output if last else None
        self.register_buffer("freqs_cis", model.freqs_cis, persistent=False)

    def forward(self, h):
        if self.tok_embeddings is not None:
            h = self.tok_embeddings(h)
        for layer in self.layers.values():
            h = layer(h, self.freqs_cis, attention_masks=None)
        if self.norm is not None:
            h = self.output(self.norm(h))
        return h


def stage_layers(n_layers, pp, stage):
    """generate_llm_fqn_per_model_part with one layer less on the first and last stage."""
    units = n_layers + 2
    per = units // pp
    extra = units % pp
    sizes = [per + (1 if s < extra else 0) for s in range(pp)]
    lo = sum(sizes[:stage]) - (1 if stage > 0 else 0)
    n = sizes[stage] - (1 if stage == 0 else 0) - (1 if stage == pp - 1 else 0)
    return [str(i) for i in range(lo, lo + n)]


def rank_main(rank, world, port, o, out):
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    a = llama.args_from_spec(o.model, seq_len=o.seq)
    torch.manual_seed(0)
    model = llama.Transformer(a)
    model.init_weights()
    first, last = rank == 0, rank == world - 1
    mod = Stage(model, stage_layers(a.n_layers, world, rank), first, last)
    del model
    stage = PipelineStage(mod, rank, world, torch.device("cpu"))
    sched = Schedule1F1B(stage, o.microbatches, loss_fn=llama.cross_entropy_loss,
                         scale_grads=True)
    opt = torch.optim.AdamW(mod.parameters(), lr=8e-4)
    g = torch.Generator().manual_seed(1)
    times = []
    for step in range(o.warmup + o.steps):
        tok = torch.randint(0, a.vocab, (o.batch, o.seq), generator=g)
        tgt = torch.randint(0, a.vocab, (o.batch, o.seq), generator=g)
        dist.barrier()
        t0 = time.perf_counter()
        opt.zero_grad()
        if first:
            sched.step(tok)
        elif last:
            sched.step(target=tgt)
        else:
            sched.step()
        opt.step()
        dist.barrier()
        times.append(time.perf_counter() - t0)
    t = torch.tensor(times[o.warmup:], dtype=torch.float64)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    if rank == 0:
        out.put(t.tolist())
    dist.destroy_process_group()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="debugmodel")
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--seq", type=int, default=32)
    ap.add_argument("--microbatches", type=int, default=4)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--pp", type=int, default=2)
    o = ap.parse_args()
    if min(o.batch, o.seq, o.microbatches, o.steps, o.pp) < 1 or o.warmup < 0 or \
            o.batch % o.microbatches or o.pp < 2:
        ap.error("sizes must be positive, pp >= 2, and the batch a multiple of --microbatches")
    try:
        llama.args_from_spec(o.model)
    except ValueError as e:
        ap.error(str(e))
    with socket.socket() as s:  # a free port for the rendezvous
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ctx = mp.get_context("spawn")
    out = ctx.SimpleQueue()
    mp.start_processes(rank_main, args=(o.pp, port, o, out), nprocs=o.pp, join=True,
                       start_method="spawn")
    steps = out.get()
    print(json.dumps({"torch": torch.__version__, "schedule": "Schedule1F1B", "pp": o.pp,
                      "model": o.model, "batch": o.batch, "seq": o.seq,
                      "microbatches": o.microbatches, "step_s": statistics.median(steps),
                      "steps_s": steps}))


if __name__ == "__main__":
    main()
