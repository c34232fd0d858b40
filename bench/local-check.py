#!/usr/bin/env python3
"""bench/local-check.py: the time model against measured step times on this machine.

    bench/local-check.py [--shardbench bench/shardbench] [--hardware local] [--reps 3]
                         [--dat FILE]

For world-8 configs of the debugmodel (threads backend, f32, batch 8, seq 32: `shardbench
run`'s defaults) over the shipped plans, it measures the step time with `shardbench run`
(its median of timed steps; the median of --reps runs) and predicts it with `shardbench
plan --hardware local` on the same layout (plan, mesh, local batch, no AC).
--save-measured / --load-measured FILE keep and reuse the measured times (to try a
hardware file's parameters without re-measuring). Prints
predicted / measured per config and the median |ln ratio| (goal <= 0.25); --dat writes
the pairs for a chart (scripts/local_check.gp draws it).
"""
import argparse, json, math, os, statistics, subprocess, sys

CONFIGS = [
    ('dp', 'dp_replicate:8'), ('fsdp', 'dp_shard:8'), ('zero2', 'dp_shard:8'),
    ('hsdp', 'dp_replicate:4,dp_shard:2'), ('torchtitan-tp-sp', 'tp:8'),
    ('megatron-tp', 'tp:8'), ('fsdp-tp-sp', 'dp_shard:4,tp:2'), ('fsdp-cp', 'dp_shard:4,cp:2'),
    ('fsdp-tp-cp', 'dp_shard:2,cp:2,tp:2'), ('dp-cp', 'dp_replicate:4,cp:2'),
    ('pp-fsdp', 'pp:2,dp_shard:4'), ('pp-tp-sp', 'pp:2,tp:4'), ('pp', 'pp:2,dp_replicate:4'),
]
BATCH, SEQ = 8, 32


def dims(mesh):
    d = {k: int(v) for k, v in (x.split(':') for x in mesh.split(','))}
    return d


def flags(mesh):
    out = []
    for k, v in dims(mesh).items():
        out += ['--' + k.replace('_', '-'), str(v)]
    return out


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    ap = argparse.ArgumentParser()
    ap.add_argument('--shardbench', default=os.path.join(here, 'shardbench'))
    ap.add_argument('--hardware', default='local')
    ap.add_argument('--reps', type=int, default=3)
    ap.add_argument('--dat')
    ap.add_argument('--save-measured')
    ap.add_argument('--load-measured')
    a = ap.parse_args()
    rows = []
    cache = json.load(open(a.load_measured)) if a.load_measured else {}
    saved = {}
    for plan, mesh in CONFIGS:
        d = dims(mesh)
        dp = d.get('dp_replicate', 1) * d.get('dp_shard', 1)
        ts = [cache[plan + ' ' + mesh]] if plan + ' ' + mesh in cache else []
        for _ in range(0 if ts else a.reps):
            p = subprocess.run([a.shardbench, 'run', '--plan', plan, '--batch', str(BATCH), '--seq',
                                str(SEQ), '--json'] + flags(mesh), capture_output=True, text=True)
            r = json.loads(p.stdout) if p.stdout.strip().startswith('{') else {}
            if r.get('status') != 'ok':
                print(f"local-check: {plan} {mesh}: run {r.get('status')}: {r.get('reason')}")
                break
            ts.append(r['step_time_s'])
        if not ts:
            continue
        measured = statistics.median(ts)
        saved[plan + ' ' + mesh] = measured
        q = subprocess.run([a.shardbench, 'plan', '--model', 'debugmodel', '--gpus', '8', '--hardware',
                            a.hardware, '--dtype', 'f32', '--seq', str(SEQ), '--global-batch', str(BATCH),
                            '--plans', plan, '--mesh', mesh, '--ac', 'none', '--local-batch',
                            str(BATCH // dp), '--json', '--jobs', '1'], capture_output=True, text=True)
        if q.returncode != 0:
            print(f"local-check: {plan} {mesh}: plan exit {q.returncode}: {q.stderr.strip()[:200]}")
            continue
        L = json.loads(q.stdout)['layouts']
        if len(L) != 1:
            print(f"local-check: {plan} {mesh}: {len(L)} layouts")
            continue
        pred = L[0]['step_s']
        rows.append((plan, mesh, measured, pred))
        print(f"{plan:18} {mesh:26} measured {measured * 1e3:8.2f} ms  predicted {pred * 1e3:8.2f} ms"
              f"  ratio {pred / measured:6.3f}", flush=True)
    if a.save_measured:
        json.dump(saved, open(a.save_measured, 'w'))
    if not rows:
        sys.exit("local-check: no config ran")
    lns = [abs(math.log(p / m)) for _, _, m, p in rows]
    print(f"local-check: {len(rows)} configs, median |ln(predicted / measured)| {statistics.median(lns):.3f} "
          f"(goal <= 0.25), max {max(lns):.3f}")
    if a.dat:
        with open(a.dat, 'w') as f:
            f.write('# plan mesh measured_s predicted_s (bench/local-check.py)\n')
            for plan, mesh, m, p in rows:
                f.write(f"{plan} {mesh} {m:.6g} {p:.6g}\n")


if __name__ == '__main__':
    main()
