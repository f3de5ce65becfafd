"""The cluster tier: the envtest control plane (kube-apiserver + etcd), KubeRay, helm, the
operator as a process, the real scheduler, controller-manager and test node (envtest.realnode),
the stand-in for KubeRay + kubelet, on top of the integration
tier's PostgreSQL and Ray heads."""


def pytest_configure(config):
    # a conftest below the rootdir may not set pytest_plugins: register this tier's plugins here
    for plugin in ("plugins.postgres", "plugins.ray_heads", "envtest.plugin", "envtest.realnode",
                   "plugins.operator_process", "plugins.standin", "plugins.pod_postgres",
                   "plugins.harness_images", "plugins.s3"):
        config.pluginmanager.import_plugin(plugin)
