"""`embedjob render MANIFEST`: the RayJob the operator would create for an EmbeddingJob, from the same builder.

For a reviewer of a GitOps pull request, or a user debugging placement: the manifest is
checked as the operator's review checks it where no cluster is needed (the spec, the
source, the model's pin, the pod settings against the pod policy of the operator's
settings: EMBEDJOB_POD_POLICY, else the restrictive default), then given to `controller.rayjob.build_rayjob` with the
operator's settings (the chart's defaults, overridden by the operator's environment
variables, then by flags). Two things only the cluster can tell are not checked: that
the database Secret and key exist, and what a `clusterSelector` cluster hands the driver.
A RayJob's name and owner carry the EmbeddingJob's uid, which exists only once it was
applied: `--uid` gives it (`kubectl get ej NAME -o jsonpath='{.metadata.uid}'`),
otherwise a placeholder is used. A comment line above the RayJob says the batching the
driver will choose (`EmbeddingJobSpec.chosen_batching`: a token budget by default).
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import sys
from typing import Any, Mapping

import yaml

from controller import acceptance
from controller.rayjob import build_rayjob
from controller.scheduled_runs import run_manifest
from controller.settings import POD_DEFAULTS_ENV, POD_DEFAULTS_FILE_ENV, POD_POLICY_ENV, Settings, SettingsError
from embedjob.api import EmbeddingJobSpec, SpecError
from embedjob.crd import spec_as_stored
from embedjob.cron import next_tick, parse, zone
from embedjob.contract import ExitCode
from embedjob.manifest import load_manifest

COMMAND = "render"
PLACEHOLDER_UID = "00000000-0000-0000-0000-000000000000"


class RenderRefused(Exception):
    """The operator would refuse this job: the reason and message of its review."""

    def __init__(self, verdict: acceptance.Verdict):
        super().__init__(f"{verdict.reason}: {verdict.message}")
        self.verdict = verdict


def render(manifest: dict[str, Any], settings: Settings, uid: str = PLACEHOLDER_UID,
           namespace: str | None = None) -> dict[str, Any]:
    """The RayJob for a manifest whose envelope was checked (`embedjob.manifest.check_envelope`),
    applied in `namespace` (else the manifest's, else default) and given `uid`."""
    return _rendered(manifest, settings, uid, namespace)[0]


def _rendered(manifest: dict[str, Any], settings: Settings, uid: str,
              namespace: str | None) -> tuple[dict[str, Any], EmbeddingJobSpec]:
    """render's RayJob, and the spec it was built from."""
    parsed = acceptance.parse(manifest["spec"])
    if isinstance(parsed, acceptance.Verdict):
        raise RenderRefused(parsed)
    refused = (acceptance.check_scheduled_name(manifest["metadata"].get("name", ""), parsed)
               or acceptance.review_without_cluster(parsed, settings.pod_policy))
    if refused is not None:
        raise RenderRefused(refused)
    metadata = {**manifest["metadata"], "uid": uid}
    metadata["namespace"] = namespace or metadata.get("namespace") or "default"
    # the entrypoint carries the spec as the operator reads it: as stored, defaults applied
    stored = {**manifest, "metadata": metadata, "spec": spec_as_stored(manifest["spec"])}
    if parsed.schedule is not None:  # the operator creates no RayJob for it, one per run: the next tick's run's
        tick = next_tick(parse(parsed.schedule.cron), zone(parsed.schedule.time_zone), dt.datetime.now(dt.UTC))
        stored = run_manifest(stored, tick)
        stored["metadata"]["uid"] = uid
        parsed = parsed.model_copy(update={"schedule": None, "suspend": False})
    return build_rayjob(stored, parsed, settings), parsed


def add_command(commands: argparse._SubParsersAction) -> None:
    parser = commands.add_parser(COMMAND, help="print the RayJob the operator would create for a manifest")
    parser.add_argument("manifest", help="the EmbeddingJob manifest (YAML or JSON)")
    parser.add_argument("-n", "--namespace", help="where it would be applied (default: the manifest's, else default)")
    parser.add_argument("--uid", default=PLACEHOLDER_UID,
                        help="the EmbeddingJob's uid, for the RayJob's exact name and owner (default: a placeholder)")
    parser.add_argument("--worker-image", help="the worker image the chart gives the operator (worker.image); "
                                               "default: $EMBEDJOB_WORKER_IMAGE, else the operator's built-in default")
    parser.add_argument("--ray-version", help="the chart's worker.rayVersion; default: $EMBEDJOB_RAY_VERSION, "
                                              "else the operator's built-in default")
    parser.add_argument("--pod-defaults", metavar="FILE",
                        help="the operator's default pod settings (YAML/JSON: head, workers; the chart's podDefaults); "
                             f"default: ${POD_DEFAULTS_ENV} or the file ${POD_DEFAULTS_FILE_ENV} names, else none")
    parser.add_argument("--pod-policy", metavar="FILE",
                        help="the pod policy's parameters (JSON: the chart's podPolicy, as in its pod-policy "
                             f"ConfigMap); default: ${POD_POLICY_ENV}, else the restrictive default of the worker "
                             "image's repository")


def settings_of(args: argparse.Namespace, env: Mapping[str, str]) -> Settings:
    """The operator's settings from `env`, each flag given in place of its variable, so that what follows from
    them (the restrictive default pod policy from the worker image and the pod defaults' account) follows the
    flags too."""
    flags = {"EMBEDJOB_WORKER_IMAGE": args.worker_image, "EMBEDJOB_RAY_VERSION": args.ray_version,
             POD_DEFAULTS_FILE_ENV: args.pod_defaults}
    env = {**env, **{name: value for name, value in flags.items() if value}}
    if args.pod_defaults:
        env.pop(POD_DEFAULTS_ENV, None)  # the inline variable would win over the file
    if args.pod_policy:
        with open(args.pod_policy, encoding="utf-8") as policy:
            env[POD_POLICY_ENV] = policy.read()
    return Settings.from_env(env)


def run(args: argparse.Namespace) -> int:
    try:
        rayjob, spec = _rendered(load_manifest(args.manifest), settings_of(args, os.environ), args.uid, args.namespace)
    except (OSError, SpecError, SettingsError) as exc:
        print(f"embedjob: {args.manifest}: {exc}", file=sys.stderr)
        return ExitCode.INVALID_CONFIG
    except RenderRefused as exc:
        print(f"embedjob: the operator would refuse {args.manifest}: {exc}", file=sys.stderr)
        return ExitCode.INVALID_CONFIG
    # A comment, so that the output stays the RayJob to apply: the batching its driver will choose for the spec.
    sys.stdout.write(f"# spec.batching: {spec.chosen_batching}\n# spec.model.prompt: {spec.model.prompt_choice}\n"
                     + yaml.safe_dump(rayjob, sort_keys=False))
    return ExitCode.SUCCEEDED
