"""Shared pytest plugins: the real PostgreSQL, the real Kubernetes control plane, local Ray heads."""

import os

# Every Ray the tests start runs on this one machine: keep its servers on loopback
# rather than the machine's network address (read by Ray when first imported; inherited
# by the Ray heads and drivers the tests start as subprocesses).
os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"

pytest_plugins = ["plugins.postgres", "plugins.ray_heads", "envtest.plugin", "plugins.operator_process", "plugins.standin"]
