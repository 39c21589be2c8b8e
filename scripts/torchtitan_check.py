#!/usr/bin/env python3
"""Check stepcast's TorchTitan exports (NN-NAME.torchtitan.toml) with TorchTitan's own parser.

Run through `scripts/megatron-check.sh --torchtitan FILES`, whose --setup installs torchtitan
0.2.2, the last release whose job config is a TOML file (0.3 takes Python config functions).
For each file this runs what torchtitan/train.py runs with it before any process group:
torchtitan.config.ConfigManager().parse_args(["--job.config_file", FILE]) -- TOML parsing, every
section and key checked against JobConfig's dataclasses (an unknown key is refused), the values
set on them -- and then, for a file plans.json marks runnable as simulated, the model it names:
the llama3 train spec's flavor, updated from the config (update_from_config) and built on
PyTorch's meta device (no memory), its parameters counted.

An accepted file is compared with its plan: the parallel degrees (data-parallel shard x
replicate, tensor, pipeline, context), the batch sizes and the sequence length, and the built
model's parameters against the export's "parameters:" note; a difference is printed ("but
differs from the plan") and makes the exit status 1. A file marked not runnable as simulated
(torchtitan_runnable false in plans.json) is parsed, not compared; its notes are printed.
Exit status: 0 every file accepted and equal to its plan; 1 some file rejected or different;
2 a file or plan that cannot be read; 77 TorchTitan does not import (not set up).
"""
import contextlib, io, logging, os, sys

from export_check_common import check_files, differing, export_files, simulated_parameters


def built_parameters(cfg):
    import torch
    from torchtitan.protocols.train_spec import get_train_spec
    spec = get_train_spec(cfg.model.name)
    args = spec.model_args[cfg.model.flavor]
    args.update_from_config(cfg)
    with torch.device("meta"):
        model = spec.model_cls(args)
    return sum(p.numel() for p in model.parameters())


def differences(cfg, plan, path):
    par, train = cfg.parallelism, cfg.training
    dp = plan["dp_size"]
    want = {"data-parallel ranks": dp, "tensor_parallel_degree": plan.get("tp_size", 1),
            "pipeline_parallel_degree": plan.get("pp_size", 1),
            "context_parallel_degree": plan.get("context_parallel_size", 1),
            "global_batch_size": plan["global_batch_size"],
            # A dp rank's batch of one forward-backward: the microbatch, accumulated to the global
            # batch; under a pipeline every microbatch of the step, which the schedule splits.
            "local_batch_size": plan["global_batch_size"] // dp if plan.get("pp_size", 1) > 1
            else plan["micro_batch_size"]}
    got = {"data-parallel ranks": par.data_parallel_shard_degree * par.data_parallel_replicate_degree,
           "tensor_parallel_degree": par.tensor_parallel_degree,
           "pipeline_parallel_degree": par.pipeline_parallel_degree,
           "context_parallel_degree": par.context_parallel_degree,
           "global_batch_size": train.global_batch_size, "local_batch_size": train.local_batch_size}
    simulated = simulated_parameters(path)
    if simulated is not None:
        want["parameters"] = simulated
        got["parameters"] = built_parameters(cfg)
        print("          builds a %s %s of %d parameters" % (cfg.model.name, cfg.model.flavor, got["parameters"]))
    return differing(want, got, "TorchTitan")


def main():
    files = export_files(__doc__, "NN-NAME.torchtitan.toml")
    try:
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
            import torchtitan
            from importlib.metadata import version
            from torchtitan.config import ConfigManager
    except Exception as e:  # noqa: BLE001 - any import failure means: not set up
        print("skipped: cannot import TorchTitan's ConfigManager (%s: %s); run "
              "scripts/megatron-check.sh --setup" % (type(e).__name__, e))
        return 77
    print("TorchTitan %s (%s)" % (version("torchtitan"), os.path.dirname(torchtitan.__file__)))
    logging.disable(logging.WARNING)  # the missing tokenizer assets: not what is checked

    def parse(path, plan):
        with contextlib.redirect_stdout(io.StringIO()):
            return ConfigManager().parse_args(["--job.config_file", path]), ""

    return check_files(files, ".torchtitan.toml", "torchtitan", "TorchTitan cannot run", parse, differences)


if __name__ == "__main__":
    sys.exit(main())
