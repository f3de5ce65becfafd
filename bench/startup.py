"""Seconds from `embedjob run examples/quickstart.yaml` to each phase of its start, its first batch and its summary.

Each round runs the quickstart once per checkout, as a user does (a process of its own,
`--verbose`), against a fresh embedded PostgreSQL (its own XDG_DATA_HOME: initdb included,
nothing to skip). A phase's time is when its line reaches this script, from the command's
start: the database up (`local_database_ready`) and Ray up (`ray_ready`), where the checkout
logs them; the tokenizer built or read back (`tokenizer_ready`, where the checkout builds it while Ray starts);
the run announced (the command's first line: both are up); `run_started`;
`workers_ready` (the actor has loaded the model); the first `batch_written`; the summary;
and the whole command. Checkouts alternate within each round (bench/rounds.py):

    HF_HUB_OFFLINE=1 python bench/startup.py [--rounds 3] [--first-run] [--checkout NAME=PATH ...]
                                             [--backend torch --backend onnx]

Without --checkout it measures this checkout; `--checkout main=../main --checkout this=.`
compares two trees, each run with the same interpreter and its own packages first on the path.
--backend runs the quickstart with that `spec.model.backend` (repeat to compare; each checkout with each);
an export (onnx, openvino) is made before the rounds, as a machine's earlier run would have left it.
--first-run gives each run an empty cache too (XDG_CACHE_HOME): nothing an earlier run kept (the tokenizer), as
on a machine's first run.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

from rounds import report, run_rounds

REPO = Path(__file__).resolve().parent.parent
QUICKSTART = Path("examples") / "quickstart.yaml"
COMMAND = ["-c", "import sys; from embedjob_cli.main import main; sys.exit(main())", "run"]
# The figure each line names, by the first text in it that names one; the summary's first line last.
PHASES = (("event=local_database_ready", "database up s"), ("event=tokenizer_ready", "tokenizer s"),
          ("event=ray_ready", "ray up s"),
          ("embedjob: quickstart: ", "run announced s"), ("event=run_started", "run_started s"),
          ("event=workers_ready", "workers_ready s"), ("event=batch_written", "first batch s"),
          ("state              ", "summary s"))


def phase_of(line: str) -> str | None:
    """The figure a line of the command's output marks, if any."""
    return next((figure for marker, figure in PHASES if marker in line), None)


def quickstart_with(checkout: Path, backend: str | None, directory: Path) -> Path:
    """The checkout's quickstart manifest, with `spec.model.backend` set (written into `directory`), or as it is."""
    if backend is None:
        return checkout / QUICKSTART
    manifest = yaml.safe_load((checkout / QUICKSTART).read_text())
    manifest["spec"]["source"]["uri"] = str(checkout / QUICKSTART.parent / manifest["spec"]["source"]["uri"])
    manifest["spec"]["model"]["backend"] = backend
    directory.mkdir(parents=True, exist_ok=True)
    written = directory / f"quickstart-{backend}.yaml"
    written.write_text(yaml.safe_dump(manifest))
    return written


def quickstart(checkout: Path, first_run: bool, manifest: Path) -> dict[str, float]:
    """One run of `manifest` in `checkout` against a fresh embedded PostgreSQL (and, `first_run`, an empty
    cache): each phase's first line's time."""
    with tempfile.TemporaryDirectory(prefix="embedjob-startup-") as home:
        env = {**os.environ, "XDG_DATA_HOME": str(Path(home) / "data"), "HF_HUB_OFFLINE": "1", "PYTHONUNBUFFERED": "1",
               "PYTHONPATH": os.pathsep.join([str(checkout), str(checkout / "worker_image")]),
               **({"XDG_CACHE_HOME": str(Path(home) / "cache")} if first_run else {})}
        env.pop("EMBEDJOB_DATABASE_URL", None)
        started = time.monotonic()
        process = subprocess.Popen([sys.executable, *COMMAND, str(manifest), "--verbose"], cwd=checkout, env=env,
                                   stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        figures: dict[str, float] = {}
        tail: list[bytes] = []
        for raw in process.stdout:  # a line at a time, as it arrives (tqdm's bar ends no line: its states join)
            phase = phase_of(raw.decode(errors="replace"))
            if phase is not None:
                figures.setdefault(phase, time.monotonic() - started)
            tail = (tail + [raw])[-20:]
        if process.wait() != 0 or "summary s" not in figures:
            raise SystemExit(f"{checkout}: exit {process.returncode}:\n" + b"".join(tail).decode(errors="replace"))
        figures["command s"] = time.monotonic() - started
        return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--first-run", action="store_true", help="each run with an empty cache (XDG_CACHE_HOME)")
    parser.add_argument("--checkout", action="append", metavar="NAME=PATH",
                        help="a tree to run the quickstart in (repeat to compare; default: this checkout)")
    parser.add_argument("--backend", action="append", help="spec.model.backend (repeat to compare; default: the "
                                                               "quickstart's own)")
    args = parser.parse_args()
    checkouts = {name: Path(path).resolve()
                 for name, path in (item.split("=", 1) for item in args.checkout or [f"this={REPO}"])}
    with tempfile.TemporaryDirectory(prefix="embedjob-manifests-") as manifests:
        contenders = {}
        for name, path in checkouts.items():
            for backend in args.backend or [None]:
                manifest = quickstart_with(path, backend, Path(manifests) / name)
                if backend not in (None, "torch"):
                    quickstart(path, False, manifest)  # the export, made once, as an earlier run leaves it
                label = name if backend is None else f"{name} {backend}"
                contenders[label] = lambda path=path, manifest=manifest: quickstart(path, args.first_run, manifest)
        results = run_rounds(contenders, rounds=args.rounds)
    print(f"quickstart (989 records), {args.rounds} rounds, a fresh embedded PostgreSQL each run"
          + (", an empty cache each run" if args.first_run else ""))
    print(report(results, unit="s (lower is better)"))


if __name__ == "__main__":
    main()
