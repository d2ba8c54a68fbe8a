#!/usr/bin/env bash
# Training speed on a GPU beside the same machine's CPU, in one call (about 5 minutes):
#   1. TVW-RL at the paper's configuration (benchmarks/bench_rl.py): learner and actor on the CPU, the learner on
#      the GPU (actor on the CPU), both on the GPU; seconds per iteration split into simulation, observation and
#      network.
#   2. Our learned scheduler (benchmarks/bench_placer.py, base forecast_peak, ALGORITHMS (default PGPE, training's
#      default, whose update stays on the CPU, beside PPO and REINFORCE) with BUDGET seconds each; DeepPlace 50 %
#      unless PLACER_ARGS names a source, e.g. PLACER_ARGS="--source bitbrains --warehouse W --inputs rule"): the PG updates on the CPU and on the GPU, run side by side (one torch thread each; numba's
#      kernels use every core for batches of 64 envs or more, training's own batch of 32 envs uses one).
#   3. The EC proxy's forecaster fits (benchmarks/bench_grouped_forecaster.py, 91 fits of one seed, the sample and
#      small presets): one at a time and side by side, on the GPU and on the CPU.
# Logs go to $OUT (or /tmp/tvw_gpu). Needs python with torch (CUDA) and polars; on a machine without polars, put
# its wheels in .whl/ first (see /work/.library/device/README.md) and they are installed to /tmp/site.
#
#     bash benchmarks/gpu_speed.sh            # BUDGET=60 PYTHON=python3 PARTS="rl placer grouped" by default
set -uo pipefail
out=${OUT:-/tmp/tvw_gpu}
mkdir -p "$out"
py=${PYTHON:-python3}
budget=${BUDGET:-60}
parts=" ${PARTS:-rl placer grouped} "
placer_args=${PLACER_ARGS:-}
algorithms=${ALGORITHMS:-pgpe,ppo,reinforce}
if ! $py -c "import polars" 2>/dev/null && compgen -G ".whl/*.whl" >/dev/null; then
    $py -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
    export PYTHONPATH=/tmp/site
fi
export PYTHONPATH=.${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
nvidia-smi -L
$py -c "import torch, polars; print('torch', torch.__version__, torch.cuda.get_device_name(0), '| polars', polars.__version__)" || exit 1

if [[ $parts == *" rl "* ]]; then
    for pair in "cpu cpu" "cuda cpu" "cuda cuda"; do
        set -- $pair
        $py benchmarks/bench_rl.py --iterations 10 --device "$1" --act-device "$2"
    done 2>&1 | tee "$out/bench_rl.log"
fi

if [[ $parts == *" grouped "* ]]; then
    for preset in sample small; do
        for dev in cuda cpu; do
            $py benchmarks/bench_grouped_forecaster.py --preset "$preset" --device "$dev"
        done
    done 2>&1 | tee "$out/grouped.log"
fi

[[ $parts == *" placer "* ]] || exit 0
for dev in cpu cuda; do
    # shellcheck disable=SC2086  # PLACER_ARGS is a list of arguments
    $py benchmarks/bench_placer.py --base forecast_peak --algorithms "$algorithms" --budget "$budget" --skip-m50 \
        $placer_args --device "$dev" --out "/tmp/tvw_placer_$dev" >"$out/placer_$dev.log" 2>&1 &
done
wait
for dev in cpu cuda; do
    echo "== bench_placer, PG updates on $dev"
    grep -E "^(pgpe|ppo|reinforce|chosen|training rollout|seconds per stage|M = 10)|vs " "$out/placer_$dev.log"
done
