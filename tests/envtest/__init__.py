"""embedjob's Kubernetes test harness (see README.md); the pytest plugin is envtest.plugin."""
