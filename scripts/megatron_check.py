#!/usr/bin/env python3
"""Check stepcast's Megatron-LM exports (NN-NAME.megatron.txt) with Megatron-LM's own validation.

Run through scripts/megatron-check.sh, which sets up torch and Megatron-LM (see its header).
For each file this runs, in a forked child so no global state leaks between files, what
pretrain_gpt.py's __main__ runs before pretrain() starts torch.distributed:
  1. parse_args           megatron/training/arguments.py, sys.argv = the file's arguments;
                          WORLD_SIZE = the plan's tp*pp*cp*dp, RANK = 0 (read at parse_args)
  2. validate_args        with pretrain_gpt.py's args_defaults
  3. set_global_variables num-microbatches calculator, NullTokenizer (vocab padding), timers
  4. gpt_config_from_args core_transformer_config_from_args: TransformerConfig and
                          ModelParallelConfig __post_init__, then GPTModelConfig
  5. pretrain_cfg_container_from_args  DDP, optimizer, checkpoint, logging ... configs
  6. gpt_builder          gpt_builders.py: the GPTModel these arguments build, on the meta device
                          (no memory) with Megatron's local layer spec, in one process: the
                          parallel sizes set to 1 (a gloo group of one), so it is the whole model,
                          every layer and expert; its parameters, counted once where shared (tied
                          embeddings), are compared with the export's "parameters:" note
The world size comes from the plan file beside it (NN-NAME.json), else from the plan's name
(tpN-ppN[-cpN]-dpN), else --world-size. The environment is what the file's
"# note: environment:" lines ask for: CUDA_DEVICE_MAX_CONNECTIONS is unset unless a note says
CUDA_DEVICE_MAX_CONNECTIONS=1 (arguments.py:1453-1479 asserts it with tp or cp before Blackwell).

Stubbed, because there is no GPU, no Transformer Engine and no process group here:
  - torch.cuda.get_device_capability -> the plan's device (arguments.py:1379, --moe-grouped-gemm)
  - get_device_arch_version (training/utils/common_utils.py:527, read at arguments.py:1454,
    1484 and 1524) -> the same major. The device is the plan's, read from plans.json beside
    the file (A100 8.0, H100/H200 9.0, B200/GB200 10.0), else --arch, default 9.0; stubbed
    on a GPU machine too, so the check is for the plan's cluster, not this machine.
  - Transformer Engine, where it is not installed, is taken as installed at 2.17.1 (the
    version in Megatron-LM's uv.lock at d98e8a64ddf3): megatron.core.utils' cached TE version
    is set, so is_te_min_version answers as it would there, and
    rope_utils.fused_apply_rotary_pos_emb(_thd) are placeholders (never called;
    TransformerConfig.__post_init__, transformer_config.py:2512-2520, checks only that they
    exist; rope fusion is on unless --no-rope-fusion, arguments.py:2902-2905)
  - torch.cuda.Stream -> None in stage 6 (the alltoall token dispatcher makes its copy stream
    when built; token_dispatcher.py:472)
  - torch.distributed is initialized only for stage 6, as a gloo group of one on this host;
    the model is built with the local (PyTorch) layers, not Transformer Engine's, whose
    parameters are the same tensors (Megatron's specs pair them one for one), and with the
    parallel sizes 1, so the sharding itself and pretrain() are not run.
A call that still reaches the GPU makes the file "skipped" (exit 77), not "rejected".
An accepted file is also compared with its plan: Megatron's data-parallel size, virtual stages,
microbatches per step, sequence parallelism and padded vocabulary against the plan file and the
export's vocabulary note; a difference is printed ("but differs from the plan"), not an error,
as are the warnings Megatron raises on the way ("Megatron warns").
"""
import argparse, contextlib, io, json, multiprocessing, os, re, shlex, sys, tempfile, traceback
import warnings

TE_VERSION = "2.17.1"
ARCH_BY_DEVICE = [("GB200", (10, 0)), ("B200", (10, 0)), ("B300", (10, 3)), ("H200", (9, 0)),
                  ("H100", (9, 0)), ("H800", (9, 0)), ("GH200", (9, 0)), ("A100", (8, 0))]
STAGES = ["parse_args", "validate_args", "set_global_variables", "gpt_config_from_args",
          "pretrain_cfg_container_from_args", "gpt_builder"]


def read_export(path):
    """The file's arguments (shell words) and its '# note:' lines."""
    with open(path) as f:
        text = f.read()
    notes = [l[len("# note:"):].strip() for l in text.splitlines() if l.startswith("# note:")]
    body = " ".join(l.rstrip().rstrip("\\") for l in text.splitlines()
                    if l.strip() and not l.lstrip().startswith("#"))
    return shlex.split(body), notes, text


def plan_of(path):
    """The plan file stepcast wrote beside the export (NN-NAME.json), or None."""
    plan_json = re.sub(r"\.megatron\.txt$", ".json", path)
    if plan_json != path and os.path.exists(plan_json):
        with open(plan_json) as f:
            return json.load(f)
    return None


def world_size_of(plan, text, override):
    if override:
        return override, "--world-size"
    if plan:
        cp = plan.get("context_parallel_size", 1)
        return plan["tp_size"] * plan["pp_size"] * cp * plan["dp_size"], "the plan file"
    m = re.search(r"arguments for (\S+)", text)
    sizes = dict(re.findall(r"(?:^|-)(tp|pp|cp|dp)(\d+)", m.group(1))) if m else {}
    if {"tp", "pp", "dp"} <= sizes.keys():
        ws = 1
        for v in sizes.values():
            ws *= int(v)
        return ws, "the plan's name"
    return None, None


def arch_of(path, override):
    if override:
        major, _, minor = override.partition(".")
        return (int(major), int(minor or 0)), "--arch"
    plans = os.path.join(os.path.dirname(path) or ".", "plans.json")
    try:
        with open(plans) as f:
            name = json.load(f)["inputs"]["topology"]["node"]["device"]["name"]
        for key, cc in ARCH_BY_DEVICE:
            if key in name.upper():
                return cc, name
    except (OSError, KeyError, TypeError, ValueError):
        pass
    return (9, 0), "default"


def install_stubs(cc):
    """Stand-ins for the GPU and Transformer Engine queries validation makes (see header)."""
    import torch
    import megatron.core.utils as core_utils
    import megatron.core.models.common.embeddings.rope_utils as rope_utils
    import megatron.training.arguments as arguments
    import megatron.training.utils.common_utils as common_utils
    from packaging.version import Version

    torch.cuda.get_device_capability = lambda *a, **k: cc
    arguments.get_device_arch_version = lambda: cc[0]
    common_utils.get_device_arch_version = lambda: cc[0]
    try:
        import transformer_engine  # noqa: F401 - a real one answers for itself
    except ImportError:
        core_utils._te_version = Version(TE_VERSION)

    def _placeholder(*a, **k):
        raise RuntimeError("Transformer Engine placeholder from megatron_check.py was called")

    if rope_utils.fused_apply_rotary_pos_emb is None:
        rope_utils.fused_apply_rotary_pos_emb = _placeholder
    if rope_utils.fused_apply_rotary_pos_emb_thd is None:
        rope_utils.fused_apply_rotary_pos_emb_thd = _placeholder


def megatron_frame(tb, root):
    """file:line of the innermost frame in Megatron-LM's source, or None if none is."""
    for fr in reversed(traceback.extract_tb(tb)):
        if fr.filename.startswith(root):
            return "%s:%d" % (os.path.relpath(fr.filename, root), fr.lineno)
    return None


def warned_at(root):
    """file:line in Megatron-LM that warned, past warnings.warn and warn_rank_0."""
    for fr in reversed(traceback.extract_stack()):
        if fr.filename.startswith(root) and fr.name != "warn_rank_0":
            return "%s:%d" % (os.path.relpath(fr.filename, root), fr.lineno)
    return "outside Megatron-LM"


def output(log):
    sys.stdout.flush()
    sys.stderr.flush()
    log.seek(0)
    return log.read()


def check_one(argv, env, cc, conn):
    """Child process: run the stages; send (outcome, stage, message, where, log, warnings)."""
    import megatron.core
    root = os.path.dirname(os.path.dirname(os.path.dirname(megatron.core.__file__))) + os.sep
    stage, log, caught = STAGES[0], tempfile.TemporaryFile("w+"), []
    os.dup2(log.fileno(), 1)  # Megatron's prints and logging, kept for --verbose
    os.dup2(log.fileno(), 2)
    try:
        os.environ.pop("CUDA_DEVICE_MAX_CONNECTIONS", None)
        os.environ.update(env)
        install_stubs(cc)

        def keep(message, category, *rest, **kw):  # Megatron's warnings, warn_rank_0's too
            # Not Python's deprecations, nor the note that the export's --tokenizer-type
            # overrides pretrain_gpt.py's args_defaults.
            if not issubclass(category, DeprecationWarning) and not str(message).startswith(
                    "Overriding default arguments for tokenizer_type"):
                caught.append("%s (%s)" % (message, warned_at(root)))
        warnings.resetwarnings()
        warnings.simplefilter("always")
        warnings.showwarning = keep
        import megatron.training.arguments as A
        from megatron.training.argument_utils import (gpt_config_from_args,
                                                      pretrain_cfg_container_from_args)
        from megatron.training.global_vars import set_global_variables
        sys.argv = ["pretrain_gpt.py"] + argv
        args = A.parse_args()
        stage = STAGES[1]
        A.validate_args(args, {"tokenizer_type": "GPT2BPETokenizer"})
        stage = STAGES[2]
        set_global_variables(args)
        stage = STAGES[3]
        model_cfg = gpt_config_from_args(args)
        stage = STAGES[4]
        pretrain_cfg_container_from_args(args, model_cfg)
        from megatron.core.num_microbatches_calculator import get_num_microbatches
        derived = {"dp_size": args.data_parallel_size, "sequence_parallel": args.sequence_parallel,
                   "virtual_pp_size": args.virtual_pipeline_model_parallel_size or 1,
                   "microbatches": get_num_microbatches(), "padded_vocab": args.padded_vocab_size}
        stage = STAGES[5]
        derived["parameters"] = build_whole_model(args)
        conn.send(("accepted", stage, derived, "", output(log), caught))
    except SystemExit as e:  # argparse: unknown flag or bad value
        out = output(log)
        msg = [l for l in out.splitlines() if "error:" in l] or ["exit %s" % e.code]
        where = "argparse, from parse_args (megatron/training/arguments.py:131)"
        conn.send(("rejected", stage, msg[-1], where, out, caught))
    except BaseException as e:  # noqa: BLE001 - report whatever Megatron raised
        where = megatron_frame(e.__traceback__, root)
        text = "%s: %s" % (type(e).__name__, str(e).strip())
        # Not a verdict: a GPU query the stubs miss, or a package this setup lacks.
        env_limit = isinstance(e, ModuleNotFoundError) or (
            isinstance(e, RuntimeError) and re.search(
                r"NVIDIA driver|No CUDA GPUs|CUDA driver|not compiled with CUDA|"
                r"from megatron_check", str(e)))
        outcome = "skipped" if env_limit else "rejected" if where else "error"
        where = where or "megatron_check.py itself (a checker bug, not Megatron's verdict)"
        conn.send((outcome, stage, text, where, output(log) + traceback.format_exc(), caught))
    finally:
        conn.close()


def build_whole_model(args):
    """Stage 6: the parameters of the GPTModel `args` describe, built whole on the meta device."""
    import torch
    import torch.distributed as dist
    from megatron.core import parallel_state
    from megatron.training.arguments import core_transformer_config_from_args
    from gpt_builders import gpt_builder

    for size in ("tensor_model_parallel_size", "pipeline_model_parallel_size",
                 "context_parallel_size", "expert_model_parallel_size"):
        setattr(args, size, 1)
    args.expert_tensor_parallel_size = 1
    args.virtual_pipeline_model_parallel_size = None
    args.pipeline_model_parallel_layout = None
    args.sequence_parallel = False
    args.transformer_impl = "local"
    # Fused kernels of Apex and Transformer Engine that the local layers do not have: how the
    # step runs, not which parameters the model holds.
    args.no_persist_layer_norm = True
    args.gradient_accumulation_fusion = False
    args.use_cpu_initialization = True
    args.perform_initialization = False
    torch.cuda.Stream = lambda *a, **k: None  # the all-to-all dispatcher's copy stream, made at init
    config = core_transformer_config_from_args(args)
    dist.init_process_group("gloo", init_method="tcp://127.0.0.1:%d" % free_port(), rank=0, world_size=1)
    parallel_state.initialize_model_parallel()
    with torch.device("meta"):
        model = gpt_builder(args, pre_process=True, post_process=True, config=config)
    return sum(p.numel() for p in model.parameters())  # a shared tensor once


def free_port():
    """A TCP port of this host nobody listens on now (the gloo group's rendezvous)."""
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def differences(derived, plan, notes):
    """Where Megatron's derived sizes differ from the plan stepcast simulated."""
    want = {}
    if plan:
        dp = plan["dp_size"]
        want = {"dp_size": dp, "sequence_parallel": plan.get("sequence_parallel", False),
                "virtual_pp_size": plan.get("virtual_pp_size", 1),
                "microbatches": plan["global_batch_size"] // (plan["micro_batch_size"] * dp)}
    for note in notes:
        m = re.search(r"padded to (\d+) as simulated", note)
        if m:
            want["padded_vocab"] = int(m.group(1))
        m = re.search(r"^parameters: (\d+) as simulated", note)
        if m:
            want["parameters"] = int(m.group(1))
    return ["%s: Megatron %s, plan %s" % (k, derived[k], v)
            for k, v in want.items() if derived[k] != v]


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("files", nargs="+", help="NN-NAME.megatron.txt files stepcast wrote")
    ap.add_argument("--world-size", type=int, help="override the plan's world size")
    ap.add_argument("--arch", help="device compute capability, e.g. 9.0 (default: plans.json)")
    ap.add_argument("-v", "--verbose", action="store_true", help="print Megatron's output")
    opts = ap.parse_args()

    warnings.filterwarnings("ignore")
    try:
        with contextlib.redirect_stderr(io.StringIO()):
            import torch
            import megatron.core.package_info as info
            import megatron.training.arguments  # noqa: F401 - the import chain checked here
    except Exception as e:  # noqa: BLE001 - any import failure means: not set up
        print("skipped: cannot import torch and Megatron-LM (%s: %s); run "
              "scripts/megatron-check.sh --setup" % (type(e).__name__, e))
        return 77
    print("Megatron-LM %s (%s), torch %s" % (info.__version__, os.path.dirname(os.path.dirname(
          os.path.dirname(info.__file__))), torch.__version__))

    ctx = multiprocessing.get_context("fork")
    counts = {"accepted": 0, "rejected": 0, "skipped": 0, "error": 0}
    for path in opts.files:
        try:
            argv, notes, text = read_export(path)
        except (OSError, ValueError) as e:
            print("error     %s: %s" % (path, e))
            counts["error"] += 1
            continue
        plan = plan_of(path)
        ws, ws_from = world_size_of(plan, text, opts.world_size)
        if ws is None:
            print("error     %s: no world size (no plan file beside it; use --world-size)" % path)
            counts["error"] += 1
            continue
        cc, cc_from = arch_of(path, opts.arch)
        env = {"WORLD_SIZE": str(ws), "RANK": "0"}
        for note in notes:
            if note.startswith("environment:"):
                env.update(re.findall(r"\b([A-Z_]+)=(\S+)", note))
        parent, child = ctx.Pipe(duplex=False)
        proc = ctx.Process(target=check_one, args=(argv, env, cc, child))
        proc.start()
        child.close()
        try:
            outcome, stage, msg, where, log, caught = parent.recv()
        except EOFError:
            outcome, stage, msg, where, log, caught = ("skipped", "?", "checker died", "", "", [])
        proc.join()
        counts[outcome] += 1
        extra = "".join(", %s=%s" % kv for kv in env.items() if kv[0] not in ("RANK", "WORLD_SIZE"))
        print("%-9s %s  [world %d (%s)%s, sm%d%d (%s)]"
              % (outcome, path, ws, ws_from, extra, cc[0], cc[1], cc_from))
        if outcome == "accepted":
            print("          builds a GPTModel of %d parameters" % msg["parameters"])
            for d in differences(msg, plan, notes):
                print("          but differs from the plan: %s" % d)
        else:
            print("          at %s: %s" % (stage, msg))
            print("          raised at %s" % where)
            for note in notes:
                if note.startswith("Megatron-LM cannot run"):
                    print("          the export's own note: %s" % note)
        for w in dict.fromkeys(caught):
            print("          Megatron warns: %s" % w)
        if opts.verbose and log:
            print(log)
    print("%d accepted, %d rejected, %d skipped, %d errors" % tuple(counts.values()))
    return 1 if counts["rejected"] else 2 if counts["error"] else 77 if counts["skipped"] else 0


if __name__ == "__main__":
    sys.exit(main())
