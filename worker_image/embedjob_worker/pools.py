"""The pool-removal entrypoint (embedjob.contract.POOLS_MODULE), run by the operator on a shared Ray cluster.

    python -m embedjob_worker.pools remove --pool NAME
"""

from __future__ import annotations

import argparse
import json
import sys

from embedjob_worker.core.actor_names import POOL_NAMESPACE
from embedjob_worker.encode.pools import remove_pool


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m embedjob_worker.pools",
                                     description="Manage detached EmbeddingWorker pools (run on the Ray cluster).")
    commands = parser.add_subparsers(dest="command", required=True)
    remove = commands.add_parser("remove", help="kill every actor of a pool")
    remove.add_argument("--pool", required=True)
    args = parser.parse_args(argv)
    import ray

    # Run as a Ray job: RAY_ADDRESS points at this cluster, never a new local one.
    ray.init(address="auto", namespace=POOL_NAMESPACE, log_to_driver=False)
    print(json.dumps({"pool": args.pool, "removed": remove_pool(args.pool)}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
