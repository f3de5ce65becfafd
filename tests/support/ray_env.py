"""The environment of a process that talks to the tests' local Ray heads (plugins.ray_heads)."""

#: for a local Ray head and the drivers that talk to it: loopback addresses throughout, no
#: token (Ray turns authentication on when a token exists in ~/.ray), no hub
RAY_CLIENT_ENV = {"HF_HUB_OFFLINE": "1", "RAY_USAGE_STATS_ENABLED": "0", "RAY_AUTH_MODE": "disabled",
                  "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0"}
