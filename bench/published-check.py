#!/usr/bin/env python3
"""bench/published-check.py: the capacity planner's predictions against published runs.

    bench/published-check.py [--shardbench bench/shardbench] [--layouts results/published-layouts.csv]
                             [--plans-dir plans] [--save FILE] [--load FILE] [--table FILE]
                             [--only ID,ID]

Each row of results/published-layouts.csv names a published run's layout (model, hardware
file, GPUs, seq, local batch, plan, mesh, AC, features). The plan is one of
plans/published/ (the published run's layout with its activation checkpointing), and the
row's AC must be the plan's activation_checkpoint_mode / selective_ac_option: a row whose
AC differs, or whose plan states none, is refused (one line, exit 2) before any
prediction, so the two cannot drift apart. Every distinct layout is predicted once by
`shardbench plan --json` with that layout fixed and the plan searched at its own AC (no
--ac); the row's metric (tokens/s per GPU or peak memory in GiB) is compared with the
published value. Prints one line per row
(predicted, published, ratio, |ln ratio|) and the summary, and exits 1 when a goal is missed:

  - tokens/s per GPU: median |ln(predicted / published)| <= 0.15 over every row, and every
    row within 1.5x (|ln| <= ln 1.5);
  - memory: every row within 15% (|predicted / published - 1| <= 0.15).

Rows marked `miss` are printed but held to no goal: the layouts file says what the model
does not cover for them.

It also reports the median on the rows marked `check` alone (those not used to calibrate).
--save FILE keeps the predictions (JSON); --load FILE reuses them (no shardbench run), so a
test can plant a wrong published value and see the check fail without re-running.
"""
import argparse, json, math, os, re, statistics, subprocess, sys

TOK_MEDIAN, TOK_MAX, MEM_MAX = 0.15, math.log(1.5), 0.15


def refuse(msg):
    """Bad input: one line on stderr, exit 2."""
    sys.stderr.write(f"published-check: {msg}\n")
    sys.exit(2)


def plan_ac(path):
    """The AC a plan file states, as `shardbench plan` prints it (none, full, selective:op,
    selective:N; selective_ac_option defaults to 2, TorchTitan's), or None when it states
    no activation_checkpoint_mode. The settings are `key = value` lines, '#' comments."""
    mode = opt = None
    with open(path) as f:
        for line in f:
            m = re.match(r'\s*(activation_checkpoint_mode|selective_ac_option)\s*=\s*(\S+)',
                         line.split('#', 1)[0])
            if m and m.group(1) == 'activation_checkpoint_mode':
                mode = m.group(2)
            elif m:
                opt = m.group(2)
    if mode is None:
        return None
    return f"selective:{opt or '2'}" if mode == 'selective' else mode


def read_layouts(path, plans_dir):
    rows = []
    try:
        text = open(path).read().splitlines()
    except OSError as e:
        refuse(f"{path}: {e.strerror}")
    for n, line in enumerate(text, 1):
        line = line.strip()
        if not line or line.startswith('#'):
            continue
        p = line.split(';')
        if len(p) != 14:
            refuse(f"{path}:{n}: expected 14 ';'-separated fields, got {len(p)}")
        rid, model, hw, gpus, seq, lb, plan, mesh, ac, feats, metric, value, role, src = p
        try:
            rows.append(dict(id=rid, model=model, hw=hw, gpus=int(gpus), seq=int(seq),
                             lb=int(lb), plan=plan, mesh=mesh, ac=ac, features=feats,
                             metric=metric, value=float(value), role=role, source=src))
        except ValueError as e:
            refuse(f"{path}:{n}: {e}")
        if metric not in ('tokens_per_s_per_gpu', 'peak_mem_gib') or role not in ('calibrate', 'check', 'miss'):
            refuse(f"{path}:{n}: metric or role '{metric}', '{role}' unknown")
        pf = os.path.join(plans_dir, 'published', plan + '.plan')
        if not os.path.isfile(pf):
            refuse(f"{path}:{n}: {rid}: plan '{plan}' is not in {os.path.join(plans_dir, 'published')}")
        want = plan_ac(pf)
        if want is None:
            refuse(f"{path}:{n}: {rid}: plan {pf} states no activation_checkpoint_mode")
        if ac != want:
            refuse(f"{path}:{n}: {rid}: ac '{ac}' differs from plan {pf}'s '{want}'")
        rows[-1]['plan_path'] = pf
    return rows


def layout_key(r):
    return (r['model'], r['hw'], r['gpus'], r['seq'], r['lb'], r['plan'], r['mesh'], r['ac'], r['features'])


def dp_degree(mesh):
    d = dict(x.split(':') for x in mesh.split(','))
    return int(d.get('dp_replicate', 1)) * int(d.get('dp_shard', 1))


def predict(sb, r):
    feats = [f for f in r['features'].split(',') if f]
    cmd = [sb, 'plan', '--model', r['model'], '--gpus', str(r['gpus']), '--hardware', r['hw'],
           '--seq', str(r['seq']), '--global-batch', str(r['lb'] * dp_degree(r['mesh'])),
           '--plans', r['plan_path'], '--mesh', r['mesh'], '--local-batch', str(r['lb']),
           '--max-local-batch', str(r['lb']), '--max-cp', '64', '--max-pp', '64', '--json']
    if 'float8' in feats:
        cmd += ['--dtype', 'fp8']
    rest = [f for f in feats if f != 'float8']
    if rest:
        cmd += ['--features', ','.join(rest)]
    p = subprocess.run(cmd, capture_output=True, text=True)
    if p.returncode not in (0,):
        sys.exit(f"published-check: {r['id']}: shardbench plan exit {p.returncode}: {p.stderr.strip()[:300]}")
    ls = json.loads(p.stdout)['layouts']
    if len(ls) != 1:
        sys.exit(f"published-check: {r['id']}: expected one layout, got {len(ls)}")
    if ls[0]['ac'] != r['ac']:  # the plan's own AC is what shardbench searched
        sys.exit(f"published-check: {r['id']}: shardbench plan ran ac '{ls[0]['ac']}', the plan states '{r['ac']}'")
    return ls[0]


def main():
    ap = argparse.ArgumentParser()
    here = os.path.dirname(os.path.abspath(__file__))
    ap.add_argument('--shardbench', default=os.path.join(here, 'shardbench'))
    ap.add_argument('--layouts', default=os.path.join(here, '..', 'results', 'published-layouts.csv'))
    ap.add_argument('--plans-dir', default=os.path.join(here, '..', 'plans'))
    ap.add_argument('--save')
    ap.add_argument('--load')
    ap.add_argument('--table')
    ap.add_argument('--only')
    a = ap.parse_args()
    rows = read_layouts(a.layouts, a.plans_dir)
    if a.only:
        keep = set(a.only.split(','))
        rows = [r for r in rows if r['id'] in keep]
    preds = {}
    if a.load:
        with open(a.load) as f:
            preds = {tuple(json.loads(k)): v for k, v in json.load(f).items()}
    for r in rows:
        k = layout_key(r)
        if k not in preds:
            if a.load:
                refuse(f"{r['id']}: no saved prediction in {a.load}")
            preds[k] = predict(a.shardbench, r)
    if a.save:
        with open(a.save, 'w') as f:
            json.dump({json.dumps(list(k)): v for k, v in preds.items()}, f)
    out = []
    tok, tok_check, mem, bad = [], [], [], []
    out.append(f"{'id':22} {'metric':20} {'predicted':>10} {'published':>10} {'ratio':>6} {'|ln|':>6} role")
    for r in rows:
        p = preds[layout_key(r)]
        got = p['tokens_per_s_per_gpu'] if r['metric'] == 'tokens_per_s_per_gpu' else p['peak_bytes'] / 2**30
        ratio = got / r['value']
        ln = abs(math.log(ratio))
        out.append(f"{r['id']:22} {r['metric']:20} {got:10.1f} {r['value']:10.1f} {ratio:6.3f} {ln:6.3f} {r['role']}")
        if r['role'] == 'miss':
            continue  # printed, not held to a goal (the layouts file says why)
        if r['metric'] == 'tokens_per_s_per_gpu':
            tok.append(ln)
            if r['role'] == 'check':
                tok_check.append(ln)
            if ln > TOK_MAX:
                bad.append(f"{r['id']}: tokens/s ratio {ratio:.3f} outside 1.5x")
        else:
            mem.append(abs(ratio - 1))
            if abs(ratio - 1) > MEM_MAX:
                bad.append(f"{r['id']}: memory ratio {ratio:.3f} outside 15%")
    med = statistics.median(tok) if tok else float('nan')
    medc = statistics.median(tok_check) if tok_check else float('nan')
    out.append(f"tokens/s per GPU: {len(tok)} rows, median |ln| {med:.3f} (goal <= {TOK_MEDIAN}), "
               f"max |ln| {max(tok) if tok else float('nan'):.3f} (goal <= {TOK_MAX:.3f}); "
               f"on the {len(tok_check)} rows not used to calibrate: median |ln| {medc:.3f}")
    misses = sum(1 for r in rows if r['role'] == 'miss')
    if misses:
        out.append(f"{misses} rows marked miss are printed above and held to no goal")
    out.append(f"memory: {len(mem)} rows, max |ratio - 1| {max(mem) if mem else float('nan'):.3f} "
               f"(goal <= {MEM_MAX}), median {statistics.median(mem) if mem else float('nan'):.3f}")
    if tok and med > TOK_MEDIAN:
        bad.append(f"median |ln| {med:.3f} over {TOK_MEDIAN}")
    text = '\n'.join(out) + '\n'
    sys.stdout.write(text)
    if a.table:
        with open(a.table, 'w') as f:
            f.write(text)
    for b in bad:
        print(f"published-check: FAIL: {b}")
    sys.exit(1 if bad else 0)


if __name__ == '__main__':
    main()
