"""What scripts/deepspeed_check.py and scripts/torchtitan_check.py share: the command line, the
plan file and the plans.json entry beside an export, its "parameters:" note, the differences
from the plan as lines, and the loop over the files with the
verdict lines and the exit status (0 every file accepted and equal to its plan; 1 some file
rejected or different; 2 a file or plan that cannot be read)."""
import argparse, json, os, re


def export_files(doc, pattern):
    """The command line: the export files (pattern, e.g. NN-NAME.deepspeed.json) to check."""
    ap = argparse.ArgumentParser(description=doc.splitlines()[0])
    ap.add_argument("files", nargs="+", help="%s files stepcast wrote" % pattern)
    return ap.parse_args().files


def differing(want, got, framework):
    """'key: <framework> got, plan want' for every key where the two differ."""
    return ["%s: %s %s, plan %s" % (k, framework, got[k], v) for k, v in want.items() if got[k] != v]


def plan_beside(path, suffix):
    """The plan file stepcast wrote beside the export (NN-NAME.json), or None."""
    plan_json = path[:-len(suffix)] + ".json" if path.endswith(suffix) else None
    if plan_json is None or not os.path.exists(plan_json):
        return None
    with open(plan_json) as f:
        return json.load(f)


def runnable_beside(path, suffix, framework):
    """plans.json's <framework>_runnable and <framework>_notes for the export (True, [] if absent)."""
    plans = os.path.join(os.path.dirname(path) or ".", "plans.json")
    name = os.path.basename(path)[:-len(suffix)] + ".json"
    try:
        with open(plans) as f:
            for entry in json.load(f).get("top", []):
                if entry.get("plan_file") == name:
                    return entry.get(framework + "_runnable", True), entry.get(framework + "_notes", [])
    except (OSError, ValueError):
        pass
    return True, []


def simulated_parameters(path):
    """The export's '# note: parameters: N as simulated', or None."""
    with open(path) as f:
        m = re.search(r"^# note: parameters: (\d+) as simulated", f.read(), re.M)
    return int(m.group(1)) if m else None


def check_files(files, suffix, framework, cannot_prefix, parse, differences):
    """For each export: parse(path, plan) -> the framework's config, or raises (rejected);
    differences(config, plan, path) -> lines where it differs from the plan. Prints the verdicts
    and returns the exit status."""
    counts = {"accepted": 0, "rejected": 0, "error": 0}
    different = 0
    for path in files:
        try:
            plan = plan_beside(path, suffix)
        except (OSError, ValueError) as e:
            print("error     %s: its plan file: %s" % (path, e))
            counts["error"] += 1
            continue
        if plan is None:
            print("error     %s: no plan file beside it (NN-NAME.json)" % path)
            counts["error"] += 1
            continue
        try:
            config, where = parse(path, plan)
        except (Exception, SystemExit) as e:  # noqa: BLE001 - report whatever the framework raised
            print("rejected  %s" % path)
            print("          %s: %s" % (type(e).__name__, " ".join(str(e).split())))
            counts["rejected"] += 1
            continue
        counts["accepted"] += 1
        print("accepted  %s%s" % (path, where))
        runnable, notes = runnable_beside(path, suffix, framework)
        if not runnable:  # the export says the framework runs another plan: nothing to compare
            for note in notes:
                if note.startswith(cannot_prefix):
                    print("          the export's own note: %s" % note)
            continue
        diffs = differences(config, plan, path)
        different += bool(diffs)
        for d in diffs:
            print("          but differs from the plan: %s" % d)
    print("%d accepted (%d differing from their plan), %d rejected, %d errors"
          % (counts["accepted"], different, counts["rejected"], counts["error"]))
    return 1 if counts["rejected"] or different else 2 if counts["error"] else 0
