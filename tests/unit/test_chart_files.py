"""The Helm chart's checked-in files (no helm needed): its CRDs are the repo's, its versions
follow the project, its RBAC rules file is the operator's permissions."""

from __future__ import annotations

import json

import yaml

from support.paths import CHART, REPO
from support.project import pinned_ray_version, pyproject

RBAC_RULES_FILE = CHART / "files" / "rbac-rules.json"


def test_chart_crds_are_the_repo_crds():
    repo_crds = {p.name: p.read_bytes() for p in (REPO / "crds").glob("*.yaml")}
    chart_crds = {p.name: p.read_bytes() for p in (CHART / "crds").glob("*.yaml")}
    assert repo_crds, "no CRDs under crds/"
    assert chart_crds == repo_crds, "charts/embedjob-operator/crds/ is stale: cp crds/*.yaml charts/embedjob-operator/crds/"


def test_chart_versions_follow_the_project():
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    assert chart["appVersion"] == pyproject()["project"]["version"]
    assert values["worker"]["rayVersion"] == pinned_ray_version()


def test_rbac_rules_file_is_the_operators_permissions():
    from controller import permissions

    assert json.loads(RBAC_RULES_FILE.read_text()) == permissions.as_document(), (
        "charts/embedjob-operator/files/rbac-rules.json is stale: "
        "python -m controller.permissions > charts/embedjob-operator/files/rbac-rules.json")
