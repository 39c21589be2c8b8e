#!/usr/bin/env python3
"""Check stepcast's DeepSpeed exports (NN-NAME.deepspeed.json) with DeepSpeed's own config parser.

Run through `scripts/megatron-check.sh --deepspeed FILES`, which sets up the virtualenv (its
--setup installs deepspeed with DS_BUILD_OPS=0: the Python package, no CUDA ops built). For each
file this runs what deepspeed.initialize does with a config before it touches the model:
deepspeed.runtime.config.DeepSpeedConfig(file, mpu) -- hjson parsing with duplicate keys refused,
the removed-key check, every section's parser (the ZeRO section is a pydantic model that refuses
unknown keys and wrong types), the batch-size triangle train_batch_size = micro batch x gradient
accumulation x data-parallel world, and the sanity checks. The data-parallel world is the plan's
(dp_size x cp_size, from NN-NAME.json beside the file), given through a stand-in for Megatron's
mpu (get_data_parallel_world_size), since no process group is started here; rank 0.

An accepted file is compared with its plan: DeepSpeed's parsed batch sizes, gradient
accumulation, ZeRO stage and precision against the plan's; a difference is printed ("but differs
from the plan") and makes the exit status 1. A file plans.json marks not runnable as simulated
(deepspeed_runnable false) is parsed but not compared; its note is printed.
Exit status: 0 every file accepted and equal to its plan; 1 some file rejected or different;
2 a file or plan that cannot be read; 77 DeepSpeed does not import (not set up).
"""
import contextlib, io, os, sys

from export_check_common import check_files, differing, export_files


class DataParallelGroup:
    """What DeepSpeedConfig asks of Megatron's mpu: the data-parallel world size."""

    def __init__(self, size):
        self.size = size

    def get_data_parallel_world_size(self):
        return self.size


def differences(cfg, plan, path):
    dtype = plan.get("dtype", "bf16")
    want = {"train_batch_size": plan["global_batch_size"],
            "train_micro_batch_size_per_gpu": plan["micro_batch_size"],
            "gradient_accumulation_steps": plan["global_batch_size"] //
            (plan["micro_batch_size"] * plan["dp_size"] * plan.get("context_parallel_size", 1)),
            "zero_optimization_stage": plan.get("zero_stage", 0),
            "bf16": dtype == "bf16", "fp16": dtype == "fp16"}
    got = {"train_batch_size": cfg.train_batch_size,
           "train_micro_batch_size_per_gpu": cfg.train_micro_batch_size_per_gpu,
           "gradient_accumulation_steps": cfg.gradient_accumulation_steps,
           "zero_optimization_stage": cfg.zero_optimization_stage,
           "bf16": cfg.bfloat16_config.enabled, "fp16": cfg.float16_config.enabled}
    return differing(want, got, "DeepSpeed")


def main():
    files = export_files(__doc__, "NN-NAME.deepspeed.json")
    try:
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
            import deepspeed
            import deepspeed.runtime.config as ds_config
    except Exception as e:  # noqa: BLE001 - any import failure means: not set up
        print("skipped: cannot import DeepSpeed (%s: %s); run scripts/megatron-check.sh --setup"
              % (type(e).__name__, e))
        return 77
    print("DeepSpeed %s (%s)" % (deepspeed.__version__, os.path.dirname(deepspeed.__file__)))
    ds_config.dist.get_rank = lambda *a, **k: 0  # no process group: rank 0 of the plan's world

    def parse(path, plan):
        world = plan["dp_size"] * plan.get("context_parallel_size", 1)
        with contextlib.redirect_stdout(io.StringIO()):
            config = ds_config.DeepSpeedConfig(path, mpu=DataParallelGroup(world))
        return config, "  [data-parallel world %d]" % world

    return check_files(files, ".deepspeed.json", "deepspeed", "DeepSpeed cannot run", parse, differences)


if __name__ == "__main__":
    sys.exit(main())
