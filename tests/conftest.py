"""Settings for every tier. Each tier's own conftest registers the plugins (services) it needs:
unit/ none, integration/ PostgreSQL and Ray heads, cluster/ those and the envtest control plane."""

import os

# Every Ray the tests start runs on this one machine: keep its servers on loopback
# rather than the machine's network address (read by Ray when first imported; inherited
# by the Ray heads and drivers the tests start as subprocesses).
os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"
