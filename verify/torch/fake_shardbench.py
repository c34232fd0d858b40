#!/usr/bin/env python3
"""A stand-in for `shardbench run --save-weights W --save-trace T`, written in PyTorch.

It writes the same two safetensors files shardbench does (initial weights under
TorchTitan fqns; per-step tokens, targets, loss, gradients, and the final weights),
computed by the transcription in llama.py. Its only use is to test oracle.py: run
against it the oracle must pass, and with SB_FAKE_PLANT set to one of PLANTS it
must fail (selftest.sh). It is not a model of shardbench's numerics.
"""

import argparse
import math
import os
import sys
from dataclasses import replace

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import llama  # noqa: E402
import st_io  # noqa: E402

ADAMW = {"lr": 8e-4, "beta1": 0.9, "beta2": 0.95, "eps": 1e-8, "weight_decay": 0.1}

# name -> (what it breaks, a line the oracle must print for it); each must make oracle.py exit 1.
# The moved values are about 3x the oracle's f64 tolerance for their kind (oracle.TOL_U).
PLANTS = {
    "grad": ("one element of layers.0.attention.wq's step-1 gradient moved by 1e-11 of the tensor's max",
             "FAIL layers.0.attention.wq.weight grad step 1:"),
    "loss": ("the step-0 loss moved by 1e-14 relative", "FAIL loss step 0:"),
    "param": ("one element of output.weight after the last step moved by 4e-11 of its max",
              "FAIL output.weight param after step 1:"),
    "init-depth": ("wo/w2/w3 drawn with std 0.02/sqrt(2 n_layers) (depth_init off) instead of "
                   "0.02/sqrt(2(layer+1))", "FAIL init layers.0.attention.wo.weight: std/std_spec"),
    "init-uniform": ("layers.0.feed_forward.w1 drawn uniform with std 0.02 instead of a normal",
                     "FAIL init layers.0.feed_forward.w1.weight: kurtosis"),
    "rope-halves": ("rope rotates (x[i], x[i+d/2]) pairs (rotate-half) instead of adjacent pairs",
                    "FAIL layers.0.attention.wq.weight grad step 0:"),
    "gqa-tile": ("repeat_kv tiles the kv heads (head h uses kv h % n_kv) instead of repeat_interleave",
                 "FAIL layers.0.attention.wk.weight grad step 0:"),
    "metadata": ("the trace's metadata says seq is one longer than the run's", "trace metadata"),
}


def _rope_halves(xq, xk, freqs_cis):
    def rot(x):
        h = x.shape[-1] // 2
        xc = torch.complex(x[..., :h], x[..., h:]) * llama.reshape_for_broadcast(
            freqs_cis, torch.empty(x.shape[:-1] + (h,), dtype=freqs_cis.dtype))
        return torch.cat([xc.real, xc.imag], -1).type_as(x)
    return rot(xq), rot(xk)


def _repeat_kv_tile(x, n_rep):
    return x if n_rep == 1 else x.repeat(1, 1, n_rep, 1)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("cmd", choices=["run"])
    p.add_argument("--world", type=int, default=1)
    p.add_argument("--model", default="debugmodel")
    p.add_argument("--dtype", choices=["f32", "f64"], default="f32")
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--seq", type=int, default=32)
    p.add_argument("--warmup", type=int, default=0)
    p.add_argument("--steps", type=int, default=2)
    p.add_argument("--save-weights", required=True)
    p.add_argument("--save-trace", required=True)
    p.add_argument("--no-mem-check", action="store_true")
    p.add_argument("--plans-dir")
    o = p.parse_args()
    plant = os.environ.get("SB_FAKE_PLANT", "")
    if plant and plant not in PLANTS:
        print(f"fake_shardbench: SB_FAKE_PLANT={plant}: not one of {', '.join(PLANTS)}", file=sys.stderr)
        return 2
    if o.world != 1 or o.warmup != 0:
        print("fake_shardbench: only --world 1 --warmup 0", file=sys.stderr)
        return 2
    dtype = torch.float64 if o.dtype == "f64" else torch.float32
    a = llama.args_from_spec(o.model, seq_len=o.seq)
    if plant == "init-depth":
        a_init = replace(a, depth_init=False)
    else:
        a_init = a
    if plant == "rope-halves":
        llama.apply_rotary_emb = _rope_halves
    if plant == "gqa-tile":
        llama.repeat_kv = _repeat_kv_tile
    torch.manual_seed(1234)
    model = llama.Transformer(a_init, dtype)
    model.init_weights()
    if plant == "init-uniform":
        with torch.no_grad():
            w = model.layers["0"].feed_forward.w1.weight
            w.uniform_(-0.02 * math.sqrt(3), 0.02 * math.sqrt(3))
    st_io.save(o.save_weights, {k: v for k, v in model.state_dict().items()})
    opt = torch.optim.AdamW(model.parameters(), lr=ADAMW["lr"], betas=(ADAMW["beta1"], ADAMW["beta2"]),
                            eps=ADAMW["eps"], weight_decay=ADAMW["weight_decay"], foreach=False)
    trace, losses = {}, []
    for s in range(o.steps):
        tokens = torch.randint(0, a.vocab, (o.batch, o.seq))
        targets = torch.randint(0, a.vocab, (o.batch, o.seq))
        trace[f"tokens.step{s}"] = tokens
        trace[f"targets.step{s}"] = targets
        loss = llama.cross_entropy_loss(model(tokens), targets)
        loss.backward()
        losses.append(loss.item())
        for n, prm in model.named_parameters():
            trace[f"grad.step{s}.{n}"] = prm.grad.detach().double().clone()
        opt.step()
        opt.zero_grad()
    for n, prm in model.named_parameters():
        trace[f"param.final.{n}"] = prm.detach().double().clone()
    trace["loss"] = torch.tensor(losses, dtype=torch.float64)
    if plant == "grad":
        g = trace["grad.step1.layers.0.attention.wq.weight"]
        g.view(-1)[7] += 1e-11 * g.abs().max()
    if plant == "loss":
        trace["loss"][0] *= 1 + 1e-14
    if plant == "param":
        w = trace["param.final.output.weight"]
        w.view(-1)[11] += 4e-11 * w.abs().max()
    meta = {"model": o.model, "dtype": o.dtype, "batch": o.batch, "seq": o.seq + (plant == "metadata"),
            "steps": o.steps, "dim": a.dim, "n_layers": a.n_layers, "n_heads": a.n_heads,
            "n_kv_heads": a.kv_heads, "vocab": a.vocab, "ffn_hidden": a.ffn_hidden,
            "multiple_of": a.multiple_of, "norm_eps": repr(a.norm_eps), "rope_theta": repr(a.rope_theta),
            "rope_scaling": "1" if a.rope_scaling else "0", **{k: repr(v) for k, v in ADAMW.items()}}
    st_io.save(o.save_trace, trace, meta)
    return 0


if __name__ == "__main__":
    sys.exit(main())
