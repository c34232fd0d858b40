#!/bin/sh
# verify/weights.sh: `shardbench run --save-weights / --load-weights / --save-trace`
# end to end. Checks:
#   - the initial weights exported by four layouts (1 rank, TP+SP tp 2, Megatron
#     tp 4, DP x TP) are the same file, byte for byte (weights are global tensors);
#   - a run started from that file computes exactly what a run from the generated
#     weights computes (their --save-trace files are identical), sharded too;
#   - a Hugging Face-named and a bf16 export load and run (ok);
#   - bad weights files and flags are refused before any work (exit 2, one line
#     naming the flag and the file), an existing output file is left untouched and
#     no PATH.tmp stays behind; a file asked for but not written (the config is
#     skipped) is an error.
NAME=weights
. "${srcdir:-.}/verify/harness-common.sh"

run() { "$SB" run --plans-dir "$PLANS" --steps 1 --warmup 0 --batch 4 --seq 16 "$@"; }
ok_run() { # ok_run LABEL FLAGS...: the run exits 0 with status ok
  label=$1
  shift
  checks=$((checks + 1))
  if ! run "$@" >"$tmp/o" 2>"$tmp/e" || ! grep -q "status: ok" "$tmp/o"; then
    fail "$label: $(cat "$tmp/e") $(grep status "$tmp/o")"
  fi
}

ok_run "export, 1 rank" --world 1 --save-weights "$tmp/w1.st"
ok_run "export, tp 2" --tp 2 --save-weights "$tmp/w2.st"
ok_run "export, megatron tp 4" --plan megatron-tp --tp 4 --save-weights "$tmp/w4.st"
ok_run "export, dp 2 x tp 2" --dp-replicate 2 --tp 2 --save-weights "$tmp/wd.st"
for w in w2 w4 wd; do
  checks=$((checks + 1))
  cmp -s "$tmp/w1.st" "$tmp/$w.st" || fail "$w.st differs from the 1-rank export"
done

ok_run "trace, generated weights" --world 1 --save-trace "$tmp/t0.st"
ok_run "trace, loaded weights" --world 1 --load-weights "$tmp/w1.st" \
  --save-trace "$tmp/t1.st"
checks=$((checks + 1))
cmp -s "$tmp/t0.st" "$tmp/t1.st" || fail "a run from the exported f32 weights differs from the run that exported them"
ok_run "tp 2 from the file" --tp 2 --load-weights "$tmp/w1.st"

ok_run "export, HF names" --tp 2 --save-weights "$tmp/hf.st" --weights-names hf
ok_run "export, bf16" --world 1 --save-weights "$tmp/bf.st" --weights-dtype bf16
ok_run "HF file, tp 2" --tp 2 --load-weights "$tmp/hf.st" --save-weights "$tmp/back.st"
checks=$((checks + 1))
cmp -s "$tmp/w1.st" "$tmp/back.st" || fail "HF names -> TorchTitan names is not the original file"
ok_run "bf16 file, megatron tp 2" --plan megatron-tp --tp 2 --load-weights "$tmp/bf.st"
checks=$((checks + 1))
[ "$(stat -c %s "$tmp/bf.st")" -lt "$(stat -c %s "$tmp/w1.st")" ] || fail "the bf16 file is not smaller"

# bad input
head -c 1000 "$tmp/w1.st" >"$tmp/trunc.st"
printf 'not a safetensors file\n' >"$tmp/text.st"
cp "$tmp/w1.st" "$tmp/keep.st"
refused "missing file" "--load-weights: .*nope.st" run --world 1 --load-weights "$tmp/nope.st"
refused "truncated file" "--load-weights: .*trunc.st: header size" run --world 1 --load-weights "$tmp/trunc.st"
refused "not safetensors" "--load-weights: .*text.st" run --world 1 --load-weights "$tmp/text.st"
refused "another model" "--load-weights: .*'layers.2.attention_norm.weight' is not a weight of model debugmodel:n_layers=2" \
  run --world 1 --model debugmodel:n_layers=2 --load-weights "$tmp/w1.st"
refused "another model's shapes" "has shape \[2048, 256\]; model debugmodel:vocab=1024 needs \[1024, 256\]" \
  run --world 1 --model debugmodel:vocab=1024 --load-weights "$tmp/w1.st"
refused "a trace as weights" "--load-weights: .*no tensor 'tok_embeddings.weight'" \
  run --world 1 --load-weights "$tmp/t0.st"
refused "weights dtype" "--weights-dtype: expected f32, f64 or bf16, got 'i64'" \
  run --world 1 --save-weights "$tmp/x.st" --weights-dtype i64
refused "weights names" "--weights-names: expected torchtitan or hf, got 'meta'" \
  run --world 1 --save-weights "$tmp/x.st" --weights-names meta
refused "dtype without a file" "--weights-dtype: applies to --save-weights" \
  run --world 1 --weights-dtype bf16
refused "no directory" "--save-weights: cannot write in directory '$tmp/no/such'" \
  run --world 1 --save-weights "$tmp/no/such/w.st"
refused "same file twice" "--save-trace: is the same file as --save-weights" \
  run --world 1 --save-weights "$tmp/keep.st" --save-trace "$tmp/keep.st"
refused "bad model override" "--model: .*unknown override 'layers'" \
  run --world 1 --model debugmodel:layers=2
checks=$((checks + 1))
cmp -s "$tmp/w1.st" "$tmp/keep.st" || fail "a refused run changed the existing --save-weights file"
checks=$((checks + 1))
[ -z "$(find "$tmp" -name '*.tmp')" ] || fail "a .tmp file stayed behind: $(find "$tmp" -name '*.tmp')"

# asked for, not written: the config is skipped (dp_shard)
checks=$((checks + 1))
run --dp-shard 2 --save-trace "$tmp/skip.st" >"$tmp/o" 2>"$tmp/e"
rc=$?
{ [ $rc -eq 1 ] && grep -q "save-trace: not written: the config is skipped" "$tmp/e" &&
  [ ! -e "$tmp/skip.st" ]; } || fail "a skipped config with --save-trace: exit $rc: $(cat "$tmp/e")"
finish
