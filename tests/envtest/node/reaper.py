"""Removes a run's leftovers once its agent is gone, however it ended (SIGKILL included).

The agent starts ``python reaper.py RUN_ID`` in a session of its own, with a pipe on
stdin whose other end only the agent holds. When the agent exits, is killed, or its
whole process group is killed, the pipe reads EOF and this process removes the run's
processes, network namespaces, bridge, memory volumes and state (runs.remove_run).
After a clean shutdown there is nothing left to remove.
"""

import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import runs  # noqa: E402 - this file runs as a script, outside the package


def main() -> None:
    names = runs.RunNames(sys.argv[1])
    while sys.stdin.buffer.read(65536):
        pass
    with runs.host_lock():
        removed = runs.remove_run(names)
    stamp = time.strftime("%H:%M:%S")
    print(f"{stamp} reaper {names.tag}: agent gone; removed {removed or 'nothing'}", flush=True)


if __name__ == "__main__":
    main()
