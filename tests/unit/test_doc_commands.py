"""The README's and docs' commands match the code: every `embedjob` line parses, every file, module, chart value
and build argument they name exists (the local ones run for real in tests/integration/test_readme_commands.py)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import yaml

from support.doc_commands import doc_commands
from support.dockerfiles import build_arg_defaults, parse_dockerfile
from support.paths import REPO

REPO_DIRS = ("examples/", "charts/", "crds/", "controller/", "worker_image/", "bench/", "tests/")


def test_the_docs_have_the_commands_this_test_checks():
    programs = {c.argv[0] for c in doc_commands()}
    assert {"embedjob", "kubectl", "helm", "python", "docker"} <= programs, programs


def test_every_embedjob_command_in_the_docs_parses_with_the_real_cli():
    commands = doc_commands("embedjob")
    check = ("import json, sys\nfrom embedjob_cli.main import _parser\nbad = []\n"
             "for argv in json.loads(sys.argv[1]):\n"
             "    try:\n        _parser().parse_args(argv)\n"
             "    except SystemExit:\n        bad.append(argv)\n"
             "print(json.dumps(bad))\n")
    result = subprocess.run([sys.executable, "-c", check, json.dumps([c.argv[1:] for c in commands])],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout.splitlines()[-1]) == [], result.stderr
    assert {c.argv[1] for c in commands} >= {"run", "search", "logs", "render"}


def test_every_repository_path_the_docs_commands_name_exists():
    missing = [(str(c), word) for c in doc_commands() for word in c.argv
               if word.startswith(REPO_DIRS) and not (REPO / word).exists()]
    assert missing == []


def test_every_python_module_the_docs_run_exists():
    modules = {c.argv[c.argv.index("-m") + 1] for c in doc_commands("python") if "-m" in c.argv}
    assert modules, "no python -m in the docs"
    check = "import importlib.util, sys; print([m for m in sys.argv[1:] if importlib.util.find_spec(m) is None])"
    result = subprocess.run([sys.executable, "-c", check, *sorted(modules)], capture_output=True, text=True,
                            timeout=60, cwd=REPO)
    assert result.stdout.strip() == "[]", (modules, result.stderr)


def _has_value(values: dict, dotted: str) -> bool:
    node = values
    for key in dotted.split("."):
        if not isinstance(node, dict) or key not in node:
            return False
        node = node[key]
    return True


def test_every_chart_value_the_docs_set_exists():
    values = yaml.safe_load((REPO / "charts" / "embedjob-operator" / "values.yaml").read_text())
    sets = [(str(c), c.argv[i + 1].split("=", 1)[0]) for c in doc_commands("helm")
            for i, word in enumerate(c.argv) if word == "--set"]
    assert sets, "no helm --set in the docs"
    assert [s for s in sets if not _has_value(values, s[1])] == []


def test_every_docker_build_names_a_dockerfile_and_its_build_arguments():
    builds = [c for c in doc_commands("docker") if c.argv[1:2] == ["build"]]
    assert builds
    builds += [c for c in doc_commands("buildah") if c.argv[1:2] in (["bud"], ["build"])]
    for build in builds:
        declared = set(build_arg_defaults(parse_dockerfile(REPO / build.argv[build.argv.index("-f") + 1])))
        given = {build.argv[i + 1].split("=", 1)[0] for i, w in enumerate(build.argv) if w == "--build-arg"}
        assert given <= declared, (str(build), given - declared)


@pytest.mark.parametrize("word", ["ej", "embeddingjobs", "embeddingjobs.embedjob.dev"])
def test_the_resource_names_the_docs_use_are_the_crds(word):
    crd = yaml.safe_load((REPO / "crds" / "embeddingjobs.embedjob.dev.yaml").read_text())
    names = {crd["metadata"]["name"], crd["spec"]["names"]["plural"], *crd["spec"]["names"]["shortNames"]}
    used = {w.split("/")[0] for c in doc_commands("kubectl") for w in c.argv}
    assert word in used and word in names
