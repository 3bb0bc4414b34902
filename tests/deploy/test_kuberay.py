"""``deploy/kuberay_rayjob.yaml`` against KubeRay's RayJob API (``tests/deploy/kuberay.py``: a typed model of
``ray.io/v1`` RayJob / RayCluster written from KubeRay v1.7.0's sources), and its entrypoint against hybridrl:

- the manifest has no problems; hand-broken copies of it each name the problem they were given (so the check can
  fail);
- the entrypoint is a recipe run script whose overrides ``hybridrl plan`` accepts, and the placement pool it asks
  for is the cluster the manifest starts (nodes, GPUs and CPUs per node).

No Kubernetes cluster or KubeRay operator runs here: these check the manifest's text, not a deployment.
"""

from __future__ import annotations

import copy
import shlex
from pathlib import Path

import pytest
import yaml

from tests.deploy.kuberay import RELEASE, check
from tests.recipes.plans import plan
from tests.recipes.test_recipe_configs import _sections, script_configs

ROOT = Path(__file__).resolve().parents[2]
MANIFEST = ROOT / "deploy" / "kuberay_rayjob.yaml"
CLUSTER = "spec.rayClusterSpec"
HEAD_C = f"{CLUSTER}.headGroupSpec.template.spec.containers[0]"
WORKER = f"{CLUSTER}.workerGroupSpecs[0]"


def manifest() -> dict:
    return yaml.safe_load(MANIFEST.read_text())


def test_the_manifest_has_no_problems():
    assert RELEASE in MANIFEST.read_text(), f"the manifest names the API it is checked against ({RELEASE})"
    assert check(manifest()) == []


# ------------------------------------------------------------------------------------------- broken copies of it
def _cluster(m):
    return m["spec"]["rayClusterSpec"]


def _head(m):
    return _cluster(m)["headGroupSpec"]["template"]["spec"]["containers"][0]


def _worker(m):
    return _cluster(m)["workerGroupSpecs"][0]


def _rename(d: dict, old: str, new: str):
    d[new] = d.pop(old)


def _set(d: dict, key: str, value):
    d[key] = value


BROKEN = {
    # a misspelt field is dropped by the API server; without shutdownAfterJobFinishes the TTL is refused as well
    "misspelt field": (lambda m: _rename(m["spec"], "shutdownAfterJobFinishes", "shutdownAfterJobFinish"), [
        "spec.shutdownAfterJobFinish: unknown field of RayJobSpec (did you mean shutdownAfterJobFinishes?)",
        "spec.ttlSecondsAfterFinished: set without shutdownAfterJobFinishes: true (KubeRay refuses it)"]),
    "int rayStartParams value": (lambda m: _set(_worker(m)["rayStartParams"], "num-gpus", 8), [
        f"{WORKER}.rayStartParams.num-gpus: expected a string, got 8"]),
    "mount of no volume": (lambda m: _set(_head(m)["volumeMounts"][0], "name", "shard"), [
        f"{HEAD_C}.volumeMounts[0].name: 'shard' names no volume of the pod (volumes: shared)"]),
    "no entrypoint": (lambda m: m["spec"].pop("entrypoint"), [
        "spec.entrypoint: missing: K8sJobMode submits it as the job (only InteractiveMode goes without)"]),
    "bad apiVersion": (lambda m: _set(m, "apiVersion", "ray.io/v1alpha1"), [
        "apiVersion: expected ray.io/v1, got 'ray.io/v1alpha1'"]),
    "bad kind": (lambda m: _set(m, "kind", "RayCluster"), ["kind: expected RayJob, got 'RayCluster'"]),
    "worker group without groupName": (lambda m: _worker(m).pop("groupName"), [
        f"{WORKER}.groupName: missing (required by WorkerGroupSpec)"]),
    "int env value": (lambda m: _set(_head(m)["env"][0], "value", 600), [
        f"{HEAD_C}.env[0].value: expected a string, got 600"]),
    "bad memory quantity": (lambda m: _set(_head(m)["resources"]["limits"], "memory", "1000GB"), [
        f"{HEAD_C}.resources.limits.memory: expected a quantity (an integer, or a string such as \"64\", \"500m\", "
        "\"1000Gi\"), got '1000GB'"]),
    "replicas above maxReplicas": (lambda m: _worker(m).update(replicas=3, maxReplicas=2), [
        f"{WORKER}.replicas: 3 is outside [minReplicas 0, maxReplicas 2]: KubeRay runs 2"]),
    "misspelt volumeMounts": (lambda m: _rename(_head(m), "volumeMounts", "volumeMount"), [
        f"{HEAD_C}.volumeMount: unknown field of Container (did you mean volumeMounts?)"]),
    "bad submissionMode": (lambda m: _set(m["spec"], "submissionMode", "K8sJob"), [
        "spec.submissionMode: expected one of K8sJobMode, HTTPMode, InteractiveMode, SidecarMode, got 'K8sJob'"]),
    "token env without authOptions": (lambda m: (_cluster(m).pop("authOptions"),
                                                 _head(m)["env"].append({"name": "RAY_AUTH_MODE", "value": "token"})), [
        f"{HEAD_C}.env[1]: RAY_AUTH_MODE=token but no {CLUSTER}.authOptions.mode: token (only that shares one token "
        "with every pod)"]),
    "head without containers": (lambda m: _set(_cluster(m)["headGroupSpec"]["template"]["spec"], "containers", []), [
        f"{CLUSTER}.headGroupSpec.template.spec.containers: no container (KubeRay needs at least one: the first is "
        "the Ray one)"]),
}


@pytest.mark.parametrize("case", list(BROKEN))
def test_a_broken_copy_names_its_problem(case):
    broken, expected = copy.deepcopy(manifest()), BROKEN[case][1]
    BROKEN[case][0](broken)
    assert check(broken) == expected


# ---------------------------------------------------------------------------------------------- the entrypoint
def _entrypoint() -> tuple[Path, str, list[str]]:
    """The run script the entrypoint runs (resolved in the checkout: the head container's workingDir holds it), its
    --config-name, and the overrides the entrypoint passes."""
    m = manifest()
    argv = shlex.split(m["spec"]["entrypoint"])
    assert argv[:1] == ["bash"] and len(argv) >= 2, argv
    assert _head(m)["workingDir"] == "/workspace/hybridrl" and not argv[1].startswith("/"), \
        "the script's path is relative to the head container's workingDir, the checkout in the image"
    script = ROOT / argv[1]
    assert script.is_file() and script.match("recipes/*/run_*.sh"), f"{argv[1]} is not a recipe run script"
    names = script_configs(script)
    assert len(names) == 1, f"{script.name} trains {names}: the manifest cannot say which"
    overrides = argv[2:]
    assert "--dry-run" not in overrides, "a dry run trains nothing"
    return script, names[0], overrides


def test_the_entrypoint_is_a_run_script_whose_overrides_plan(capsys):
    script, config_name, overrides = _entrypoint()
    rc, out = plan(capsys, script.parent.name, config_name, *overrides)
    assert rc == 0, out


def _gpus(group: dict) -> int:
    container = group["template"]["spec"]["containers"][0]
    gpus = int(container["resources"]["limits"]["nvidia.com/gpu"])
    assert int(group["rayStartParams"].get("num-gpus", gpus)) == gpus, "num-gpus is the container's GPUs"
    return gpus


def _cpus(group: dict) -> float:
    return float(group["template"]["spec"]["containers"][0]["resources"]["limits"]["cpu"])


def test_the_placement_pools_are_the_cluster_the_manifest_starts():
    """Every Ray node is a pod: the head and each worker group's replicas x numOfHosts. The run's pools take
    distinct nodes (STRICT_SPREAD), each ``slots_per_node`` GPUs and ``slots_per_node x cpus_per_slot`` CPUs."""
    from core.run import load_recipe_config

    script, config_name, overrides = _entrypoint()
    cfg, _ = load_recipe_config(script.parent, config_name, overrides, sections=_sections(script.parent))
    cluster = _cluster(manifest())
    nodes = [cluster["headGroupSpec"]] + [g for g in cluster.get("workerGroupSpecs", [])
                                          for _ in range(g.get("replicas", 0) * g.get("numOfHosts", 1))]
    pools = cfg.placement.pools.values()
    assert sum(p.nnodes for p in pools) == len(nodes), (
        f"the pools ask for {sum(p.nnodes for p in pools)} node(s), the manifest starts {len(nodes)}")
    for name, pool in cfg.placement.pools.items():
        assert pool.device == "cuda"
        for group in nodes:
            assert _gpus(group) == pool.slots_per_node, f"pool {name}: {pool.slots_per_node} GPUs a node"
            assert pool.slots_per_node * pool.cpus_per_slot <= _cpus(group), f"pool {name}: CPUs a node"
