#!/usr/bin/env python3
"""stepcast's JSON Schemas (schemas/*.schema.json) against the files they describe.

  check_schemas.py SOURCE_DIR BUILD_DIR schemas   every schema is a valid draft 2020-12 schema, named
                                                  by its $id, and documents every property
  check_schemas.py SOURCE_DIR BUILD_DIR inputs    every shipped model, plan, topology, profile, jobs
                                                  file and sweep validates against its schema
  check_schemas.py SOURCE_DIR BUILD_DIR outputs GROUP
                                                  the commands of GROUP (sim: no MPI; mpi: run,
                                                  compare, validate) write their outputs, and each
                                                  validates against its schema

Every check also shows that its schema can fail: the same document with an unknown top-level key,
and with a required top-level key removed, must be rejected. Exit 0 when all hold, 1 otherwise,
77 (skipped, saying why) without python3-jsonschema.
"""

import copy
import glob
import gzip
import json
import os
import shlex
import subprocess
import sys
import tempfile

try:
    import jsonschema
except ImportError:
    print("skipped: python3-jsonschema is not installed (bash scripts/install-deps.sh)")
    sys.exit(77)

failures = []


def fail(message):
    failures.append(message)
    print("FAIL " + message)


def load(path):
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rt", encoding="utf-8") as f:
        return json.load(f)


def schema_path(source, name):
    return os.path.join(source, "schemas", name + ".schema.json")


def validator(source, name):
    return jsonschema.Draft202012Validator(load(schema_path(source, name)))


def first_error(v, document):
    error = jsonschema.exceptions.best_match(v.iter_errors(document))
    if error is None:
        return None
    where = "/".join(str(p) for p in error.absolute_path) or "(top level)"
    return f"{where}: {error.message[:300]}"


def check_document(source, name, document, label):
    """The document validates against schemas/NAME, and the schema rejects its two mutations."""
    v = validator(source, name)
    error = first_error(v, document)
    if error:
        fail(f"{label} against {name}.schema.json: {error}")
        return
    if isinstance(document, dict):
        unknown = copy.deepcopy(document)
        unknown["no_such_key_in_any_schema"] = 1
        if v.is_valid(unknown):
            fail(f"{label}: {name}.schema.json accepts an unknown top-level key")
        required = v.schema.get("required", [])
        if required:
            missing = copy.deepcopy(document)
            missing.pop(required[0], None)
            if v.is_valid(missing):
                fail(f"{label}: {name}.schema.json accepts it without its required '{required[0]}'")
    print(f"ok   {label} ({name}.schema.json)")


def undocumented(node, where):
    """Paths of properties without a description, anywhere in a schema."""
    found = []
    if isinstance(node, dict):
        for key, sub in node.get("properties", {}).items():
            if isinstance(sub, dict) and "description" not in sub and "$ref" not in sub:
                found.append(f"{where}/properties/{key}")
        for key, sub in node.items():
            found += undocumented(sub, f"{where}/{key}")
    elif isinstance(node, list):
        for i, sub in enumerate(node):
            found += undocumented(sub, f"{where}/{i}")
    return found


def check_schemas(source):
    paths = sorted(glob.glob(os.path.join(source, "schemas", "*.schema.json")))
    if not paths:
        fail("no schemas/*.schema.json")
    for path in paths:
        name = os.path.basename(path)[: -len(".schema.json")]
        schema = load(path)
        try:
            jsonschema.Draft202012Validator.check_schema(schema)
        except jsonschema.exceptions.SchemaError as e:
            fail(f"{name}.schema.json is not a valid draft 2020-12 schema: {e.message[:300]}")
            continue
        if schema.get("$schema") != "https://json-schema.org/draft/2020-12/schema":
            fail(f"{name}.schema.json: $schema is not draft 2020-12")
        if schema.get("$id") != "urn:stepcast:schema:" + name:
            fail(f"{name}.schema.json: $id {schema.get('$id')!r}, expected 'urn:stepcast:schema:{name}'")
        for key in ("title", "description"):
            if not schema.get(key):
                fail(f"{name}.schema.json: no {key}")
        missing = undocumented(schema, "")
        if missing:
            fail(f"{name}.schema.json: properties without a description: {', '.join(missing[:10])}")
        print(f"ok   {name}.schema.json is a documented draft 2020-12 schema")


# Shipped inputs: a glob under the source tree and the schema its files follow.
SHIPPED_INPUTS = [
    ("models/*.json", "model"),
    ("examples/*.json", "plan"),
    ("examples/jobs/*.json", "jobs"),
    ("topologies/*.json", "topology"),
    ("profiles/*.json", "profile"),
    ("sweeps/*.json", "sweep"),
    # What the CUDA backend measured on the H200 (reports/gpu/README.md).
    ("reports/gpu/*.model.json", "model"),
    ("reports/gpu/*.plan.json", "plan"),
    ("reports/gpu/*.measurement.json", "step-result"),
    ("reports/gpu/h200-profile-quick.json", "profile"),
    # The profile the CPU sweep measured (validate --sweep sweeps/cpu.json).
    ("reports/cpu/profile.json", "profile"),
    # The netns sweep's (validate --sweep sweeps/netns-2node.json): its profile across the nodes,
    # the topologies its cluster wrote, its report.
    ("reports/netns/profile.json", "profile"),
    ("reports/netns/cluster-*/topology.json", "topology"),
    ("reports/netns/validate.json", "validate"),
]


def check_inputs(source):
    for pattern, name in SHIPPED_INPUTS:
        paths = sorted(glob.glob(os.path.join(source, pattern)))
        if not paths:
            fail(f"no shipped {pattern}")
        for path in paths:
            check_document(source, name, load(path), os.path.relpath(path, source))


# Inputs the commands below use beyond the shipped ones, written into {inputs}: shipped files with
# a few keys changed, so that the outputs carry their optional sections (heterogeneity, experts,
# context parallelism, FP8, asynchronous data parallelism).
def derived_inputs(source):
    def shipped(path, **changes):
        document = load(os.path.join(source, path))
        document.update(changes)
        return document

    hetero = shipped("topologies/localhost-cpu.json")
    hetero["heterogeneity"] = {
        "node_groups": [{"nodes": 1, "device_name": "cpu-slow", "compute_speed_factor": 0.9}],
        "devices": [{"device": 1, "compute_speed_factor": 0.5}],
    }
    small = {"tp_size": 1, "pp_size": 1, "dp_size": 1, "micro_batch_size": 2, "global_batch_size": 4}
    # Megatron-LM logs of GPT-2 124M on a DGX A100 node (its printed arguments and iteration
    # lines), for calibrate.
    def megatron_log(tp, micro, batch, ms):
        arguments = {"bf16": "True", "global_batch_size": batch, "hidden_dropout": 0.1, "micro_batch_size": micro,
                     "num_layers": 12, "pipeline_model_parallel_size": 1, "seq_length": 1024,
                     "tensor_model_parallel_size": tp, "use_distributed_optimizer": "False", "world_size": 8}
        lines = [f"using world size: 8, data-parallel size: {8 // tp}",
                 "------------------------ arguments ------------------------"]
        lines += [f"  {key} {'.' * (48 - len(key))} {value}" for key, value in arguments.items()]
        lines.append("-------------------- end of arguments ---------------------")
        for k in range(1, 7):
            lines.append(f" iteration {10 * k:9d}/     100 | consumed samples: {10 * k * batch} | "
                         f"elapsed time per iteration (ms): {ms * (1.8 if k == 1 else 1 + 0.001 * (k % 3)):.1f} |")
        return "\n".join(lines) + "\n"

    return {
        "run0.log": megatron_log(1, 4, 32, 210.0),
        "run1.log": megatron_log(2, 4, 16, 140.0),
        "hetero.json": hetero,
        "moe.json": shipped("examples/tiny-cpu.json", expert_model_parallel_size=2, moe_expert_capacity_factor=2.0),
        # A measured routing as `run --out` writes it: a row per MoE layer and samples to replay.
        "hist.json": {"tokens_per_expert": [[4, 3, 2, 1]] * 4, "samples": [[[5, 1, 1, 1], [1, 1, 1, 5]]] * 4},
        "moe-hist.json": shipped("examples/tiny-cpu.json", expert_model_parallel_size=2, moe_routing="histogram",
                                 moe_routing_histogram="hist.json"),
        "cp.json": dict(small, name="cp2", context_parallel_size=2, attention_impl="flash", dtype="fp32"),
        "fp8.json": dict(small, name="fp8", dtype="bf16", fp8="e4m3"),
        "async.json": dict(small, name="async", dp_size=2, dtype="fp32", data_parallel_mode="async", staleness=2),
        "ps.json": dict(small, name="ps", dtype="fp32", data_parallel_mode="async", staleness=1, parameter_servers=1),
        "unequal.json": dict(small, name="unequal", dp_size=2, dtype="fp32", global_batch_size=8,
                             microbatches_per_replica=[3, 1]),
    }


# The commands whose outputs are checked, by group: (command, [(output file or glob, schema)]).
# {bin} is the stepcast binary, {mpirun} the repository's launcher, {inputs} the derived inputs'
# folder, {out} a fresh folder for the command and {outN} command N's folder; commands run in the
# source tree, and each takes seconds.
TINY = "--model models/tiny.json --topology topologies/localhost-cpu.json"
A100_13B = "--model models/gpt3-13b.json --topology topologies/dgx-a100-80gb.json"
OUTPUTS = {
    "sim": [
        (f"{{bin}} simulate {TINY} --plan examples/tiny-cpu.json --out {{out}}",
         [("prediction.json", "step-result"), ("trace.json", "trace")]),
        (f"{{bin}} simulate {TINY} --plan examples/tiny-cpu-3d.json --nodes 4 --mode full --records all "
         "--variability off --out {out}", [("prediction.json", "step-result"), ("trace.json", "trace")]),
        ("{bin} simulate --model models/tiny.json --topology {inputs}/hetero.json --plan examples/tiny-cpu.json "
         "--profile roofline --no-records --out {out}", [("prediction.json", "step-result")]),
        ("{bin} simulate --model models/tiny-moe.json --topology topologies/localhost-cpu.json "
         "--plan {inputs}/moe.json --out {out}", [("prediction.json", "step-result")]),
        (f"{{bin}} simulate {TINY} --plan {{inputs}}/cp.json --out {{out}}", [("prediction.json", "step-result")]),
        ("{bin} simulate --model models/tiny.json --topology topologies/h200-1gpu.json --plan {inputs}/fp8.json "
         "--price-per-gpu-hour 2.5 USD --out {out}", [("prediction.json", "step-result")]),
        ("{bin} simulate --model models/gpt3-13b.json --topology topologies/dgx-a100-80gb.json "
         "--plan examples/gpt3-13b-a100-64.json --no-records --out {out}", [("prediction.json", "step-result")]),
        ("{bin} simulate --model models/gpt3-13b.json --topology topologies/dgx-a100-80gb.json "
         "--plan examples/gpt3-13b-a100-64.json --mode approx --no-records --no-program-hash --out {out}",
         [("prediction.json", "step-result")]),
        (f"{{bin}} lower {TINY} --plan examples/tiny-cpu.json --check --out {{out}}", [("program.json", "program")]),
        (f"{{bin}} lower {TINY} --plan {{inputs}}/cp.json --out {{out}}", [("program.json", "program")]),
        (f"{{bin}} simulate {TINY} --plan {{inputs}}/async.json --no-records --out {{out}}",
         [("prediction.json", "step-result")]),
        (f"{{bin}} lower {TINY} --plan {{inputs}}/async.json --check --out {{out}}", [("program.json", "program")]),
        ("{bin} lower --model models/tiny-moe.json --topology topologies/localhost-cpu.json "
         "--plan {inputs}/moe.json --out {out}", [("program.json", "program")]),
        ("{bin} lower --model models/tiny-moe.json --topology topologies/localhost-cpu.json "
         "--plan {inputs}/moe-hist.json --out {out}", [("program.json", "program")]),
        (f"{{bin}} memory {TINY} --plan examples/tiny-cpu-3d.json --nodes 4 --out {{out}}", [("memory.json", "memory")]),
        ("{bin} simulate --model models/tiny.json --topology {inputs}/hetero.json --plan {inputs}/unequal.json "
         "--profile roofline --out {out}", [("prediction.json", "step-result"), ("trace.json", "trace")]),
        (f"{{bin}} lower {TINY} --plan {{inputs}}/unequal.json --check --out {{out}}", [("program.json", "program")]),
        (f"{{bin}} simulate {TINY} --plan {{inputs}}/ps.json --profile roofline --out {{out}}",
         [("prediction.json", "step-result"), ("trace.json", "trace")]),
        (f"{{bin}} lower {TINY} --plan {{inputs}}/ps.json --check --out {{out}}", [("program.json", "program")]),
    ],
    "studies": [
        (f"{{bin}} plan {A100_13B} --nodes 8 --global-batch-size 512 --out {{out}}", [("plans.json", "plans")]),
        ("{bin} plan --model models/tiny.json --topology {inputs}/hetero.json --profile roofline --global-batch-size 8 "
         "--heterogeneous --out {out}", [("plans.json", "plans")]),
        (f"{{bin}} compare-strategies {A100_13B} --nodes 8 --global-batch-size 512 --out {{out}}",
         [("strategies.json", "strategies")]),
        (f"{{bin}} scale {A100_13B} --plan examples/gpt3-13b-a100-64.json --nodes 4,8,16 --out {{out}}",
         [("scale.json", "scale")]),
        (f"{{bin}} goodput {A100_13B} --plan examples/gpt3-13b-a100-64.json --tokens 300e9 --job-mtbf-hours 7.9 "
         "--monte-carlo 100 --seed 1 --failure-at-steps 5,10 --out {out}", [("goodput.json", "goodput")]),
        ("{bin} goodput --model models/tiny.json --topology topologies/dgx-a100-80gb.json --plan examples/tiny-cpu.json "
         "--tokens 1e6 --step-time-s 0.5 --job-mtbf-hours 0.0001 --checkpoint-every 100 --monte-carlo 10 --out {out}",
         [("goodput.json", "goodput")]),
        ("{bin} contention --jobs examples/jobs/gpt3-13b-2x64-interleaved.json --topology topologies/dgx-a100-80gb.json "
         "--nodes 16 --out {out}", [("contention.json", "contention")]),
        ("{bin} calibrate --topology topologies/dgx-a100-80gb.json --model models/gpt2-124m.json "
         "--megatron-log {inputs}/run0.log {inputs}/run1.log --params gemm,links --out {out}",
         [("calibrate.json", "calibrate"), ("profile.json", "profile")]),
        ("{bin} validate --sweep published --rows megatron-1.7b,nccl-149-dgx-a100 --out {out}",
         [("published.json", "published")]),
    ],
    "mpi": [
        (f"{{bin}} simulate {TINY} --plan examples/tiny-cpu.json --out {{out}}", [("prediction.json", "step-result")]),
        (f"{{mpirun}} -np 2 {{bin}} run {TINY} --plan examples/tiny-cpu.json --steps 4 "
         "--checkpoint-dir {out}/checkpoints --checkpoint-every 2 --out {out}",
         [("measurement.json", "step-result"), ("trace.json", "trace"),
          ("checkpoints/step-*/manifest.json", "checkpoint-manifest")]),
        (f"{{mpirun}} -np 2 {{bin}} run {TINY} --plan examples/tiny-cpu.json --steps 6 --resume {{out1}}/checkpoints "
         "--out {out}", [("measurement.json", "step-result")]),
        ("{mpirun} -np 2 {bin} run --model models/tiny-moe.json --topology topologies/localhost-cpu.json "
         "--plan {inputs}/moe.json --steps 3 --slowdown 1:1.5 --collectives mpi --out {out}",
         [("measurement.json", "step-result"), ("moe-routing.json", "routing-histogram")]),
        ("{bin} compare {out0}/prediction.json {out1}/measurement.json --out {out}", [("compare.json", "comparison")]),
        (f"{{mpirun}} -np 2 {{bin}} run {TINY} --plan {{inputs}}/ps.json --steps 3 --out {{out}}",
         [("measurement.json", "step-result"), ("trace.json", "trace")]),
        ("{bin} validate --sweep sweeps/ci.json --repeats 1 --out {out}", [("validate.json", "validate")]),
    ],
}


def check_outputs(source, build, group):
    binary = os.path.join(build, "stepcast")
    mpirun = os.path.join(source, "scripts", "mpirun")
    if not OUTPUTS[group]:
        fail(f"group {group}: no commands")
    with tempfile.TemporaryDirectory(prefix="stepcast-schemas-") as tmp:
        inputs = os.path.join(tmp, "inputs")
        os.makedirs(inputs)
        for name, document in derived_inputs(source).items():
            with open(os.path.join(inputs, name), "w", encoding="utf-8") as f:
                if isinstance(document, str):
                    f.write(document)
                else:
                    json.dump(document, f)
        folders = {}
        for i, (command, outputs) in enumerate(OUTPUTS[group]):
            folders[f"out{i}"] = os.path.join(tmp, f"c{i}")
            fields = dict(folders, bin=shlex.quote(binary), mpirun=shlex.quote(mpirun), inputs=inputs,
                          out=folders[f"out{i}"])
            line = command.format(**fields)
            shown = command.format(**dict({k: k.upper() for k in fields}, bin="stepcast", mpirun="mpirun"))
            done = subprocess.run(line, shell=True, cwd=source, capture_output=True, text=True, timeout=600)
            if done.returncode != 0:
                fail(f"`{shown}` exited {done.returncode}:\n{done.stdout[-2000:]}{done.stderr[-2000:]}")
                continue
            for pattern, name in outputs:
                paths = sorted(glob.glob(os.path.join(folders[f"out{i}"], pattern)))
                if not paths:
                    fail(f"`{shown}` wrote no {pattern}")
                for path in paths:
                    check_document(source, name, load(path), f"{os.path.relpath(path, folders[f'out{i}'])} of `{shown}`")


def main(argv):
    if len(argv) < 4 or argv[3] not in ("schemas", "inputs", "outputs") or (argv[3] == "outputs") != (len(argv) == 5):
        print(__doc__)
        return 2
    source, build, what = argv[1], argv[2], argv[3]
    if what == "schemas":
        check_schemas(source)
    elif what == "inputs":
        check_inputs(source)
    else:
        if argv[4] not in OUTPUTS:
            print(f"unknown group {argv[4]!r}: valid: {', '.join(OUTPUTS)}")
            return 2
        check_outputs(source, build, argv[4])
    if failures:
        print(f"{len(failures)} failure(s)")
        return 1
    print("all hold")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
