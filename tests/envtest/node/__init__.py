"""The test node: a small kubelet + kube-proxy stand-in that runs pods as processes (see README.md)."""
