"""``course capstone``: run the lesson 11 job under torchrun, with a progress bar and a summary.

    course capstone --run-dir runs/capstone                     # 4 ranks here, layout chosen by lesson 08's model
    course capstone --run-dir runs/capstone --resume            # continue from its newest checkpoint
    course capstone --run-dir runs/demo --kill-rank 3 --kill-at-update 60 --max-restarts 1
    course capstone --run-dir runs/sync --max-lag 0             # the synchronous baseline
    course capstone --run-dir runs/two --agents 2               # two torchrun agents, c10d rendezvous
    course capstone --print-command --run-dir runs/x            # only print the torchrun command

Every flag of the job (:class:`~course_lib.capstone.config.CapstoneConfig`) is accepted.
"""

from __future__ import annotations

import argparse
import shlex
import sys

from course_lib.capstone.config import add_arguments as add_job_arguments
from course_lib.capstone.config import from_args


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--nproc-per-node", type=int, default=4, help="ranks per torchrun agent (default 4)")
    parser.add_argument("--agents", type=int, default=1, help="torchrun agents on this machine (2: c10d rendezvous)")
    parser.add_argument("--max-restarts", type=int, default=2, help="torchrun restarts after a rank fails (default 2)")
    parser.add_argument(
        "--deadline-s", type=float, default=900.0, help="kill the whole job after this long (default 900)"
    )
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")
    parser.add_argument("--print-command", action="store_true", help="print the torchrun command and exit")
    add_job_arguments(parser)


def run(args: argparse.Namespace) -> int:
    from course_lib.capstone.launch import CapstoneFailed, torchrun_command
    from course_lib.capstone.launch import run as run_job

    try:
        config = from_args(args)
    except ValueError as exc:
        print(f"course capstone: {exc}", file=sys.stderr)
        return 2
    if not config.run_dir:
        print("course capstone: --run-dir is required (where the run writes metrics and checkpoints)", file=sys.stderr)
        return 2
    if args.print_command:
        endpoint = "HOST:29400" if args.agents > 1 else None
        cmd = torchrun_command(
            config, args.nproc_per_node, nnodes=args.agents, rdzv_endpoint=endpoint, max_restarts=args.max_restarts
        )
        print(shlex.join(cmd))
        return 0
    try:
        run_job(
            config,
            nproc_per_node=args.nproc_per_node,
            agents=args.agents,
            max_restarts=args.max_restarts,
            deadline_s=args.deadline_s,
            show_progress=not args.no_progress,
        )
    except ValueError as exc:
        print(f"course capstone: {exc}", file=sys.stderr)
        return 2
    except CapstoneFailed as exc:
        print(f"course capstone: {exc}", file=sys.stderr)
        return 1
    return 0
