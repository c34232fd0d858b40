-- results/schema.sql: the shardbench results database (SQLite 3).
-- One file holds many runs; sweeps append and resume. Opened with
--   PRAGMA journal_mode = WAL; PRAGMA foreign_keys = ON; busy timeout 30 s
-- so that two sweeps can write one DB. A DB whose schema_version differs from
-- the program's, or a file that is not a SQLite DB, is refused untouched; a
-- version 1 to 6 DB is upgraded in place to version 7 (the statements at the
-- end of this comment, from its version on, in one transaction) by the first run
-- or sweep that writes it; its rows keep NULL in the added columns and have no
-- rows in the added tables:
--   version 1 -> 2:
--   ALTER TABLE runs ADD COLUMN peak_tflops REAL;
--   ALTER TABLE runs ADD COLUMN peak_source TEXT;
--   ALTER TABLE results ADD COLUMN worst TEXT;
--   UPDATE schema_version SET version = 2;
--   version 2 -> 3:
--   ALTER TABLE results ADD COLUMN mem_params_bytes INTEGER;
--   ALTER TABLE results ADD COLUMN mem_grads_bytes INTEGER;
--   ALTER TABLE results ADD COLUMN mem_optimizer_bytes INTEGER;
--   ALTER TABLE results ADD COLUMN mem_activations_bytes INTEGER;
--   UPDATE schema_version SET version = 3;
--   version 3 -> 4 (pipeline timelines: new tables only, made by this file's
--   CREATE TABLE IF NOT EXISTS, which runs on every open before the upgrade):
--   UPDATE schema_version SET version = 4;
--   version 4 -> 5 (the step's gradient norm; capacity planning's tables
--   hardware, plan_runs and predictions, made as in 3 -> 4):
--   ALTER TABLE results ADD COLUMN grad_norm REAL;
--   UPDATE schema_version SET version = 5;
--   version 5 -> 6 (shape-only runs, --device meta: shape_runs, shape_roles and
--   shape_comm, made as in 3 -> 4):
--   UPDATE schema_version SET version = 6;
--   version 6 -> 7 (shape_roles' caching-allocator reserved peak; a DB older
--   than 6 gets shape_roles from the CREATE TABLE, with the column, so the
--   ALTER runs only where the column is missing):
--   ALTER TABLE shape_roles ADD COLUMN reserved_peak_bytes INTEGER;
--   UPDATE schema_version SET version = 7;

CREATE TABLE IF NOT EXISTS schema_version (
  version INTEGER NOT NULL                -- 7
);

-- One invocation of shardbench (run or sweep).
CREATE TABLE IF NOT EXISTS runs (
  id        INTEGER PRIMARY KEY,
  started   TEXT NOT NULL,                -- UTC ISO 8601
  finished  TEXT,                         -- NULL while running or when killed
  host      TEXT NOT NULL,
  version   TEXT NOT NULL,                -- shardbench version
  versions  TEXT NOT NULL,                -- "sqlite 3.40.1; openmpi 4.1.4; cuda 13.0; ..."
  argv      TEXT NOT NULL,
  backend   TEXT NOT NULL,                -- threads | mpi
  world     INTEGER NOT NULL,
  peak_tflops REAL,                       -- the MFU denominator of every result of this run
  peak_source TEXT                        -- where it came from: "--peak-tflops" or the measurement
);

-- A configuration: what was run, independent of when. key is its canonical text.
CREATE TABLE IF NOT EXISTS configs (
  id           INTEGER PRIMARY KEY,
  key          TEXT NOT NULL UNIQUE,      -- "model=debugmodel workload=block plan=torchtitan-tp-sp mesh=dp_replicate:2,tp:4 dtype=f32 batch=8 seq=64 steps=3 backend=threads world=8"
  workload     TEXT NOT NULL,             -- embedding | attention | feed_forward | output | block | model
  model        TEXT NOT NULL,             -- debugmodel | 8B | 70B | 405B | custom:...
  plan         TEXT NOT NULL,             -- plan name (plans/NAME.plan)
  pp           INTEGER NOT NULL,
  dp_replicate INTEGER NOT NULL,
  dp_shard     INTEGER NOT NULL,
  cp           INTEGER NOT NULL,
  tp           INTEGER NOT NULL,
  dtype        TEXT NOT NULL,             -- f32 | f64 | bf16
  batch        INTEGER NOT NULL,          -- global batch
  seq          INTEGER NOT NULL,
  steps        INTEGER NOT NULL,
  backend      TEXT NOT NULL,
  world        INTEGER NOT NULL
);

-- The outcome of one config in one run.
CREATE TABLE IF NOT EXISTS results (
  id             INTEGER PRIMARY KEY,
  run_id         INTEGER NOT NULL REFERENCES runs(id),
  config_id      INTEGER NOT NULL REFERENCES configs(id),
  status         TEXT NOT NULL CHECK (status IN ('ok', 'mismatch', 'failed', 'skipped')),
  reason         TEXT,                    -- why skipped / failed / mismatched
  step_time_s    REAL,                    -- median of the timed steps after warm-up
  tokens_per_s   REAL,
  tflops         REAL,                    -- achieved model TFLOP/s (all ranks)
  mfu            REAL,                    -- fraction of peak_tflops
  peak_tflops    REAL,                    -- the peak used for MFU (given or detected)
  peak_mem_bytes INTEGER,                 -- max over ranks of the host peak
  max_abs_err    REAL,                    -- vs the unsharded reference
  max_rel_err    REAL,
  tolerance      REAL,
  created        TEXT NOT NULL,
  worst          TEXT,                    -- the compared quantity with the largest error / its tolerance
                                          -- ("layers.0.attention.wq.weight grad step 1"), any status
  -- Rank 0's memory in the last timed step, from its tensors (NULL: not measured,
  -- or a row from before version 3). Their sum is that step's own peak on rank 0,
  -- so it is at most peak_mem_bytes (the max over ranks and the whole run).
  mem_params_bytes      INTEGER,          -- the weights rank 0 holds (its shard of the master under FSDP)
  mem_grads_bytes       INTEGER,          -- their gradients after the data-parallel reduction
  mem_optimizer_bytes   INTEGER,          -- AdamW's two states (exp_avg, exp_avg_sq)
  mem_activations_bytes INTEGER,          -- the rest of the step's peak: activations, FSDP's
                                          -- gathered copies, communication buffers
  grad_norm      REAL,                    -- the last timed step's total gradient norm
                                          -- (clip_grad_norm_, rank 0); NULL: no clipping
  UNIQUE (run_id, config_id)
);

-- Communication per (result, op, mesh dim, phase), summed over steps and ranks' ledgers.
CREATE TABLE IF NOT EXISTS comm (
  id            INTEGER PRIMARY KEY,
  result_id     INTEGER NOT NULL REFERENCES results(id) ON DELETE CASCADE,
  op            TEXT NOT NULL,            -- all_reduce | all_gather | reduce_scatter | all_to_all | ...
  mesh_dim      TEXT NOT NULL,            -- group name: tp | dp_replicate | ...
  phase         TEXT NOT NULL,            -- forward | backward | optimizer
  calls         INTEGER NOT NULL,         -- per step, per rank (rank 0)
  payload_bytes INTEGER NOT NULL,         -- per step, rank 0
  wire_bytes    REAL NOT NULL,            -- per step, rank 0, ring model
  seconds       REAL NOT NULL
);

-- Analytic baselines for a config (shardbench baselines), next to the measurements.
CREATE TABLE IF NOT EXISTS baselines (
  id         INTEGER PRIMARY KEY,
  config_id  INTEGER REFERENCES configs(id),
  framework  TEXT NOT NULL,               -- megatron-tp | megatron-tp-sp | zero1 | zero2 | zero3 | fsdp | hsdp | ddp | gpipe | 1f1b | interleaved | ring-cp | allgather-cp,
                                          -- a sum of them ("megatron-tp-sp+ddp": quantity ..._combined, the comm chart's cross),
                                          -- or runtime-model (shardbench's own closed form: a regression model, not a framework)
  quantity   TEXT NOT NULL,               -- comm_bytes_per_step | comm_bytes_per_step_combined | comm_bytes_per_step_runtime_model | memory_bytes_per_rank | bubble_fraction | ...
  value      REAL NOT NULL,
  unit       TEXT NOT NULL,
  formula    TEXT NOT NULL                -- the formula and its published source (paper and section)
);

-- Published throughput numbers (results/published.csv), with their sources.
CREATE TABLE IF NOT EXISTS published (
  id        INTEGER PRIMARY KEY,
  framework TEXT NOT NULL,
  model     TEXT NOT NULL,
  hardware  TEXT NOT NULL,
  gpus      INTEGER NOT NULL,
  metric    TEXT NOT NULL,                -- tokens_per_s_per_gpu | mfu | tflops_per_gpu
  value     REAL NOT NULL,
  source    TEXT NOT NULL
);

-- Pipeline parallel (configs with pp > 1), measured, not assumed. Times come from
-- dt_pipeline_step's per-rank timeline (lib/parallel/pipeline.h: each action's
-- start and end; a RECV's event is the wait for its data, done just before the F
-- or B that consumes it), gathered from every rank after the run. Zero of a step:
-- every rank starts the pipelined step after a barrier; on the threads backend
-- (one clock) the zero is the earliest rank's exit from that barrier; under MPI
-- each rank's own exit (clocks of different hosts are not compared), so offsets
-- across ranks are good to the barrier's exit skew.

-- Every action of every rank in every timed step (warm-up steps are not kept).
CREATE TABLE IF NOT EXISTS pp_events (
  result_id  INTEGER NOT NULL REFERENCES results(id) ON DELETE CASCADE,
  step       INTEGER NOT NULL,            -- timed step, 0-based
  rank       INTEGER NOT NULL,            -- global rank
  pp_rank    INTEGER NOT NULL,            -- its coordinate on the pp mesh dim
  action     TEXT NOT NULL CHECK (action IN ('F', 'B', 'SEND_F', 'RECV_F', 'SEND_B', 'RECV_B')),
  stage      INTEGER NOT NULL,            -- global stage index (loop placement: stage % pp = pp_rank)
  microbatch INTEGER NOT NULL,
  t0_s       REAL NOT NULL,               -- start, seconds from the step's zero
  t1_s       REAL NOT NULL                -- end (>= t0_s)
);

-- One row per pipelined result.
--   bubble_measured: for each timed step and each rank, 1 - (the rank's F and B
--     seconds) / (the step's span: the first action's start to the last action's
--     end over the ranks of that rank's pipeline, i.e. the ranks that differ only
--     in pp_rank); the mean over ranks and timed steps. The idle share of the
--     step: sends, waits for receives and idling all count as bubble.
--   bubble_analytic: dt_pp_bubble_fraction, (p - 1) / (m + p - 1) for GPipe and
--     1F1B and (p - 1) / (v m + p - 1) for interleaved 1F1B (NULL for a CSV
--     schedule). Narayanan et al. 2021 (arXiv:2104.04473) sec. 2.2 state the
--     bubble relative to the ideal time, t_pb / t_id = (p - 1) / m; the step is
--     t_id + t_pb, so the idle share of the step, which is what is measured here,
--     is t_pb / (t_id + t_pb) = (p - 1) / (m + p - 1). Both assume equal stage
--     times and free communication.
CREATE TABLE IF NOT EXISTS pp_stats (
  result_id       INTEGER PRIMARY KEY REFERENCES results(id) ON DELETE CASCADE,
  schedule        TEXT NOT NULL,          -- GPipe | 1F1B | Interleaved1F1B | CSV
  pp              INTEGER NOT NULL,       -- p, ranks per pipeline
  virtual_stages  INTEGER NOT NULL,       -- v, stages per rank
  microbatches    INTEGER NOT NULL,       -- m
  steps           INTEGER NOT NULL,       -- timed steps in pp_events
  bubble_measured REAL NOT NULL,
  bubble_analytic REAL,
  span_s          REAL NOT NULL           -- the step's span, mean over pipelines and steps
);

-- Per pp rank (the stages it holds), over its ranks (one per pipeline) and the timed steps.
CREATE TABLE IF NOT EXISTS pp_stages (
  result_id      INTEGER NOT NULL REFERENCES results(id) ON DELETE CASCADE,
  pp_rank        INTEGER NOT NULL,
  max_in_flight  INTEGER NOT NULL,        -- most (stage, microbatch) forwards whose backward had
                                          -- not ended (their activations held), from the events:
                                          -- 1F1B min(p - pp_rank, m), GPipe m
  peak_act_bytes INTEGER NOT NULL,        -- max of the rank's host peak during the pipelined step
                                          -- above its level at the step's start: the held
                                          -- activations, plus its weights' gradients (made at
                                          -- their first backward) and the p2p buffers
  busy_s         REAL NOT NULL,           -- F + B seconds per step, mean
  bubble         REAL NOT NULL,           -- 1 - busy_s / span per step, mean
  PRIMARY KEY (result_id, pp_rank)
);

-- Capacity planning (`shardbench plan`): the hardware files it read, one row per
-- GPU count it planned, and every layout's prediction (bench/harness/timemodel.h).
CREATE TABLE IF NOT EXISTS hardware (
  id   INTEGER PRIMARY KEY,
  name TEXT NOT NULL,                     -- the --hardware name (results/hardware/NAME)
  text TEXT NOT NULL,                     -- the whole file as read
  UNIQUE (name, text)
);

CREATE TABLE IF NOT EXISTS plan_runs (
  id           INTEGER PRIMARY KEY,
  run_id       INTEGER NOT NULL REFERENCES runs(id),
  hardware_id  INTEGER NOT NULL REFERENCES hardware(id),
  model        TEXT NOT NULL,
  gpus         INTEGER NOT NULL,
  seq          INTEGER NOT NULL,
  global_batch INTEGER NOT NULL,          -- sequences per optimizer step
  dtype        TEXT NOT NULL,             -- bf16 | fp8 (Float8 linears)
  tokens       REAL,                      -- --tokens (NULL: none)
  features     TEXT NOT NULL              -- "float8,compile,async_tp" subset or ""
);

CREATE TABLE IF NOT EXISTS predictions (
  id            INTEGER PRIMARY KEY,
  plan_run_id   INTEGER NOT NULL REFERENCES plan_runs(id) ON DELETE CASCADE,
  rank          INTEGER,                  -- 1 = fastest that fits; NULL: does not fit
  plan          TEXT NOT NULL,
  pp INTEGER NOT NULL, dp_replicate INTEGER NOT NULL, dp_shard INTEGER NOT NULL,
  cp INTEGER NOT NULL, tp INTEGER NOT NULL,
  ac            TEXT NOT NULL,            -- none | selective:op | selective:N | full
  local_batch   INTEGER NOT NULL,         -- sequences per dp rank per microstep
  accum_steps   INTEGER NOT NULL,
  microbatches  INTEGER NOT NULL,         -- pipeline microbatches (1 without pp)
  schedule      TEXT,                     -- NULL without pp
  fits          INTEGER NOT NULL,
  peak_bytes    REAL NOT NULL,            -- per GPU: the worst role's peak + allocator + reserved
  over_bytes    REAL,                     -- NULL when it fits
  mem_params_bytes REAL NOT NULL, mem_grads_bytes REAL NOT NULL,
  mem_optimizer_bytes REAL NOT NULL, mem_activations_bytes REAL NOT NULL,
  step_s REAL NOT NULL, compute_s REAL NOT NULL, recompute_s REAL NOT NULL, bubble_s REAL NOT NULL,
  exposed_pp_s REAL NOT NULL, exposed_dp_replicate_s REAL NOT NULL,
  exposed_dp_shard_s REAL NOT NULL, exposed_cp_s REAL NOT NULL, exposed_tp_s REAL NOT NULL,
  tokens_per_s_per_gpu REAL NOT NULL,
  mfu           REAL NOT NULL,            -- TorchTitan's 6N + 12 L H Q T per token / bf16 peak
  train_s       REAL, gpu_hours REAL,     -- for --tokens; NULL without
  verdict       TEXT,                     -- --verify: ok | mismatch | failed | skipped; NULL: not run
  verify_reason TEXT
);

-- Shape-only runs (`run --device meta`, `sweep --device meta`): one rank per role
-- (ranks alike in shapes and communication) ran one step on the meta device with
-- the fake comm: shapes, no data, no reference, no timing. They are kept apart
-- from the measured runs: never in configs or results, so `report`, `status` and
-- the charts, which read those, never show one as measured.
CREATE TABLE IF NOT EXISTS shape_runs (
  id           INTEGER PRIMARY KEY,
  run_id       INTEGER NOT NULL REFERENCES runs(id),
  key          TEXT NOT NULL,             -- the config's key, as configs.key ("... device=meta")
  workload     TEXT NOT NULL,
  model        TEXT NOT NULL,
  plan         TEXT NOT NULL,
  pp INTEGER NOT NULL, dp_replicate INTEGER NOT NULL, dp_shard INTEGER NOT NULL,
  cp INTEGER NOT NULL, tp INTEGER NOT NULL,
  dtype        TEXT NOT NULL,
  batch        INTEGER NOT NULL,          -- global batch
  seq          INTEGER NOT NULL,
  ac           TEXT NOT NULL,             -- none | full | selective:op | selective:N
  world        INTEGER NOT NULL,
  status       TEXT NOT NULL CHECK (status IN ('shape-only', 'failed', 'skipped')),
  reason       TEXT,                      -- why skipped / failed
  n_roles      INTEGER NOT NULL,          -- 0 unless shape-only
  -- the max over the roles (NULL unless shape-only): the memory split of the
  -- step and its device peak, as results.mem_*_bytes and peak_mem_bytes
  peak_mem_bytes INTEGER,
  mem_params_bytes INTEGER, mem_grads_bytes INTEGER, mem_optimizer_bytes INTEGER,
  mem_activations_bytes INTEGER,
  -- the compute ledger of the whole step, summed over every rank (each role's
  -- times its rank count): all kernels per phase, and of them the linear layers'
  -- GEMMs (op "gemm"; attention's are "attn_gemm")
  flops_forward REAL, flops_backward REAL, flops_recompute REAL, flops_optimizer REAL,
  flops_other REAL,
  gemm_flops_forward REAL, gemm_flops_backward REAL, gemm_flops_recompute REAL,
  created      TEXT NOT NULL,
  UNIQUE (run_id, key)
);

-- Each role of a shape-only run: its first rank, how many ranks it stands for,
-- its step's memory split, device peak, the caching allocator's reserved peak and
-- compute ledger per phase (one rank's).
CREATE TABLE IF NOT EXISTS shape_roles (
  shape_run_id INTEGER NOT NULL REFERENCES shape_runs(id) ON DELETE CASCADE,
  role         INTEGER NOT NULL,          -- 0-based, in the order of its first rank
  first_rank   INTEGER NOT NULL,
  ranks        INTEGER NOT NULL,
  peak_mem_bytes INTEGER NOT NULL,
  mem_params_bytes INTEGER NOT NULL, mem_grads_bytes INTEGER NOT NULL,
  mem_optimizer_bytes INTEGER NOT NULL, mem_activations_bytes INTEGER NOT NULL,
  flops_forward REAL NOT NULL, flops_backward REAL NOT NULL, flops_recompute REAL NOT NULL,
  flops_optimizer REAL NOT NULL, flops_other REAL NOT NULL,
  gemm_flops_forward REAL NOT NULL, gemm_flops_backward REAL NOT NULL,
  gemm_flops_recompute REAL NOT NULL,
  kernels_dropped_calls INTEGER NOT NULL, -- compute-ledger calls not merged (its sums count them)
  peak_phase   TEXT NOT NULL,             -- where the step's peak was reached: forward, backward,
  peak_module  TEXT NOT NULL,             --   recompute or optimizer, in the module (fqn; '': none)
  peak_fsdp_params_bytes INTEGER NOT NULL, -- of the peak: FSDP's unsharded parameters then
  peak_comm_buffers_bytes INTEGER NOT NULL, -- and the collectives' flat buffers
  reserved_peak_bytes INTEGER,            -- the step's peak of the caching allocator's segments
                                          -- (the meta device's model of PyTorch's
                                          -- max_memory_reserved, JSON reserved_peak_bytes);
                                          -- NULL: no allocator model (0), or a row from before
                                          -- version 7
  PRIMARY KEY (shape_run_id, role)
);

-- A role's comm ledger of the step per (op, mesh dim, phase, fqn): one rank's, as
-- comm's rows of a measured run are rank 0's (summing a role's rows over fqn gives
-- the comm rows of its first rank).
CREATE TABLE IF NOT EXISTS shape_comm (
  shape_run_id  INTEGER NOT NULL REFERENCES shape_runs(id) ON DELETE CASCADE,
  role          INTEGER NOT NULL,
  op            TEXT NOT NULL,
  mesh_dim      TEXT NOT NULL,
  phase         TEXT NOT NULL,            -- forward | backward | recompute | optimizer | other
  fqn           TEXT NOT NULL,            -- the module the call ran in (the ledger row's scope:
                                          -- forward's module, backward's tape node's); "" outside one
  calls         INTEGER NOT NULL,
  payload_bytes INTEGER NOT NULL,
  wire_bytes    REAL NOT NULL
);

CREATE INDEX IF NOT EXISTS results_config ON results(config_id);
CREATE INDEX IF NOT EXISTS predictions_run ON predictions(plan_run_id);
CREATE INDEX IF NOT EXISTS pp_events_result ON pp_events(result_id);
CREATE INDEX IF NOT EXISTS comm_result ON comm(result_id);
CREATE INDEX IF NOT EXISTS shape_comm_run ON shape_comm(shape_run_id);
