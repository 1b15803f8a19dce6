#!/usr/bin/env bash
# The checks that need a CUDA GPU, as one script (run on a lent GPU machine from the repo root).
# Prints everything; writes a log and the fp16 run's memory.csv and metrics.jsonl under $OUT.
# Needs torch/torchvision with CUDA and bigbatch's other dependencies importable (PYTHONPATH).
set -u
OUT=${OUT:-/tmp/gpu-check}
RUNS=/tmp/gpu-check-runs
mkdir -p "$OUT" "$RUNS"
export PYTHONUNBUFFERED=1 PYTHONPATH="${PYTHONPATH:-}:$PWD"
exec > >(tee "$OUT/log.txt") 2>&1
RESNET="model.name=resnet18 data.size=128 batch=256 eval.batch=64 log.tensorboard=false schedule.warmup=[]"

echo "== device"; nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
python3 -c "import torch, torchvision; print('torch', torch.__version__, 'torchvision', torchvision.__version__)"

echo "== 1. fp16 with the dynamic loss scale: the digits recipe on CUDA"
python3 -m bigbatch train digits --out $RUNS/fp16 --set precision=fp16 memory.interval=1 log.tensorboard=false \
  | grep -E "^(eval|done|memory|best)|skipped"
cp $RUNS/fp16/memory.csv "$OUT/fp16-memory.csv"; cp $RUNS/fp16/metrics.jsonl "$OUT/fp16-metrics.jsonl"
python3 - <<'PY'
import json
records = [json.loads(l) for l in open("/tmp/gpu-check-runs/fp16/metrics.jsonl")]
train = [r for r in records if "lr" in r]
print("loss scale first/last:", train[0].get("loss_scale"), train[-1].get("loss_scale"), "skipped:", train[-1]["skipped"])
PY

echo "== 2. bf16 on CUDA"
python3 -m bigbatch train digits --out $RUNS/bf16 --set precision=bf16 log.tensorboard=false | grep -E "^(done|memory)"

echo "== 3. a real torch.cuda.OutOfMemoryError: ResNet-18 128 px batch 256 in 2 GiB of the GPU"
python3 - <<'PY'
import json, torch
from pathlib import Path
torch.cuda.set_per_process_memory_fraction(2 * 2**30 / torch.cuda.get_device_properties(0).total_memory)
from bigbatch.config import load_config
from bigbatch.engine.trainer import train
cfg = load_config("digits", ["model.name=resnet18", "data.size=128", "batch=256", "subdivisions=1", "steps=3",
                             "eval.batch=16", "log.tensorboard=false", "schedule.warmup=[]"])
result = train(cfg, Path("/tmp/gpu-check-runs/oom"))
events = [json.loads(l) for l in open("/tmp/gpu-check-runs/oom/metrics.jsonl")]
for e in events:
    if e.get("event") in ("out_of_memory", "memory"):
        print(e)
print("finished steps:", result.steps, "peak reserved MiB:", torch.cuda.max_memory_reserved() / 2**20)
PY

echo "== 4. bigbatch plan on CUDA, fp32 and fp16, budget 4 GiB"
for dtype in ${PLAN_DTYPES-fp32 fp16}; do
  python3 -m bigbatch plan digits --set $RESNET precision=$dtype --memory-limit 4GiB
done
echo "== 5. issue 14: bigbatch train vs a bare loop on the same pipeline (ResNet-50 224 bf16, batch 256, 16 workers)"
python3 benchmarks/gpu_train_step.py --workers 16 --precision bf16
echo "== 6. model.compile on CUDA: eager against default and reduce-overhead (CUDA graphs), with 4 micro-batches"
# compile time, img/s and the losses against eager's (reduce-overhead with gradient accumulation is checked here only)
python3 benchmarks/compile.py --gpu --cases resnet18-128,yolov4-tiny-3l --modes default,reduce-overhead \
  --batch 128 --subdivisions 4 --steps 20 --warmup 5 --rounds 1 --threads 8 --workdir /tmp/gpu-check-runs/compile
echo "== 7. plan --devices on one GPU: 8 GPUs over NVLink predicted, beside one GPU's training measured"
# the advisor's prediction from a short measurement on this GPU, then a real run of the same layout on it
python3 -m bigbatch plan digits --set $RESNET precision=bf16 --devices 1,2,4,8 --batches 256,2048 --link nvlink \
  --measure-steps 20
python3 -m bigbatch train digits --out $RUNS/advisor-1gpu --set $RESNET precision=bf16 steps=40 eval.every=100000 \
  checkpoint.every=100000
python3 - <<'PY'
import json
records = [json.loads(l) for l in open("/tmp/gpu-check-runs/advisor-1gpu/metrics.jsonl")]
rates = [r["images_per_s"] for r in records if "images_per_s" in r][2:]  # the first ones hold start-up
print("one GPU measured: images/s", round(sum(rates) / max(len(rates), 1), 1), "over", len(rates), "records")
PY
echo "== done"
