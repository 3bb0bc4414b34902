"""KubeRay's RayJob (``ray.io/v1``) as a small typed model, to check ``deploy/kuberay_rayjob.yaml`` with no cluster.

Written from KubeRay **v1.7.0** (github.com/ray-project/kuberay, tag ``v1.7.0``, commit
59d663aeec13760646da3db9c1cf8cfe883e30b7), read at that tag:

- ``ray-operator/apis/ray/v1/rayjob_types.go`` (``RayJobSpec``, ``JobSubmissionMode``, ``DeletionStrategy``,
  ``SubmitterConfig``) and ``ray-operator/apis/ray/v1/raycluster_types.go`` (``RayClusterSpec``, ``HeadGroupSpec``,
  ``WorkerGroupSpec``, ``AuthOptions``, ``AutoscalerOptions``): the fields, their JSON names (the ``json:`` tags) and
  Go types -- ``rayStartParams`` is ``map[string]string``, so every value is a string;
- ``ray-operator/config/crd/bases/ray.io_rayjobs.yaml``: the CRD generated from them, which the API server validates
  against: the required fields (``headGroupSpec``; a head's ``template``; a worker group's ``groupName`` and
  ``template`` -- its ``minReplicas`` / ``maxReplicas`` are required too but defaulted, 0 and 2147483647, before
  validation) and the Kubernetes core/v1 schemas it embeds (``PodTemplateSpec`` of k8s.io/api v0.36.0: the pod,
  container, env, resources, volume and volume-mount fields below);
- ``ray-operator/controllers/ray/utils/validation.go`` (``ValidateRayJobMetadata``, ``ValidateRayJobSpec``,
  ``ValidateRayClusterSpec``): what the operator refuses after the API server took the object (the RayJob goes to
  ``ValidationFailed``), with ``utils/util.go`` (``GetWorkerGroupDesiredReplicas``, ``IsAuthEnabled``),
  ``common/job.go`` (``BuildJobSubmitCommand``) and ``common/pod.go`` (``SetContainerTokenAuthEnvVars``) for the rest.
  ``docs/reference/api.md`` at the same tag is the rendered field reference.

Only what a RayJob manifest for hybridrl touches is typed in depth; fields this model names but does not descend into
(affinity, probes, tolerations, the other volume sources, ...) are checked as "a mapping" / "a list". A field the model
does not name is an unknown field: the API server prunes it from a custom resource, or refuses it under kubectl's
strict field validation -- either way it does not do what its author meant.

No Kubernetes cluster and no KubeRay operator ran any of this: ``check`` is a reading of the API, not the API.
"""

from __future__ import annotations

import difflib
import re
from dataclasses import dataclass, field
from typing import Callable, Union

import yaml

RELEASE = "KubeRay v1.7.0"


# ------------------------------------------------------------------------------------------------------------ types
@dataclass(frozen=True)
class Scalar:
    what: str  # "a string": what a problem says it expected
    ok: Callable[[object], bool] = field(compare=False)


@dataclass(frozen=True)
class Enum:
    values: tuple[str, ...]


@dataclass(frozen=True)
class MapOf:
    value: "Type"  # map[string]<value>


@dataclass(frozen=True)
class ListOf:
    item: "Type"


@dataclass(frozen=True)
class Opaque:
    kind: type  # dict or list: a field named here whose inside this model does not check


@dataclass(frozen=True)
class Obj:
    name: str  # the Go / Kubernetes type, for messages
    fields: dict[str, "Type"]
    required: tuple[str, ...] = ()  # required and not defaulted by the CRD


Type = Union[Scalar, Enum, MapOf, ListOf, Opaque, Obj]


def _is_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


# resource.Quantity in the CRD: an integer or a string of this pattern (x-kubernetes-int-or-string)
QUANTITY_RE = re.compile(r"^(\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))"
                         r"(([KMGTPE]i)|[numkMGTPE]|([eE](\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))))?$")
STR = Scalar("a string", lambda v: isinstance(v, str))
INT = Scalar("an integer", _is_int)
NUM = Scalar("a number", lambda v: _is_int(v) or isinstance(v, float))
BOOL = Scalar("a boolean", lambda v: isinstance(v, bool))
QUANTITY = Scalar("a quantity (an integer, or a string such as \"64\", \"500m\", \"1000Gi\")",
                  lambda v: _is_int(v) or isinstance(v, str) and bool(QUANTITY_RE.match(v)))
MAP, LIST = Opaque(dict), Opaque(list)
STRINGS = MapOf(STR)


# ------------------------------------------------------------------------- Kubernetes core/v1 (as the CRD embeds it)
ENV_VAR = Obj("EnvVar", {"name": STR, "value": STR, "valueFrom": MAP}, required=("name",))
RESOURCES = Obj("ResourceRequirements", {"limits": MapOf(QUANTITY), "requests": MapOf(QUANTITY), "claims": LIST})
VOLUME_MOUNT = Obj("VolumeMount", {
    "name": STR, "mountPath": STR, "readOnly": BOOL, "subPath": STR, "subPathExpr": STR,
    "mountPropagation": Enum(("None", "HostToContainer", "Bidirectional")),
    "recursiveReadOnly": Enum(("Disabled", "IfPossible", "Enabled")),
}, required=("mountPath", "name"))
CONTAINER_PORT = Obj("ContainerPort", {
    "containerPort": INT, "hostIP": STR, "hostPort": INT, "name": STR, "protocol": Enum(("TCP", "UDP", "SCTP")),
}, required=("containerPort",))
CONTAINER = Obj("Container", {
    "name": STR, "image": STR, "command": ListOf(STR), "args": ListOf(STR), "workingDir": STR,
    "env": ListOf(ENV_VAR), "envFrom": LIST, "ports": ListOf(CONTAINER_PORT), "resources": RESOURCES,
    "volumeMounts": ListOf(VOLUME_MOUNT), "volumeDevices": LIST,
    "imagePullPolicy": Enum(("Always", "Never", "IfNotPresent")),
    "lifecycle": MAP, "livenessProbe": MAP, "readinessProbe": MAP, "startupProbe": MAP, "securityContext": MAP,
    "resizePolicy": LIST, "restartPolicy": STR, "restartPolicyRules": LIST, "stdin": BOOL, "stdinOnce": BOOL,
    "tty": BOOL, "terminationMessagePath": STR,
    "terminationMessagePolicy": Enum(("File", "FallbackToLogsOnError")),
}, required=("name",))
PVC_SOURCE = Obj("PersistentVolumeClaimVolumeSource", {"claimName": STR, "readOnly": BOOL}, required=("claimName",))
VOLUME = Obj("Volume", {
    "name": STR, "persistentVolumeClaim": PVC_SOURCE,
    "emptyDir": Obj("EmptyDirVolumeSource", {"medium": STR, "sizeLimit": QUANTITY}),
    "hostPath": Obj("HostPathVolumeSource", {"path": STR, "type": STR}, required=("path",)),
    **{source: MAP for source in (
        "awsElasticBlockStore", "azureDisk", "azureFile", "cephfs", "cinder", "configMap", "csi", "downwardAPI",
        "ephemeral", "fc", "flexVolume", "flocker", "gcePersistentDisk", "gitRepo", "glusterfs", "image", "iscsi",
        "nfs", "photonPersistentDisk", "portworxVolume", "projected", "quobyte", "rbd", "scaleIO", "secret",
        "storageos", "vsphereVolume")},
}, required=("name",))
POD_SPEC = Obj("PodSpec", {
    "containers": ListOf(CONTAINER), "initContainers": ListOf(CONTAINER), "ephemeralContainers": LIST,
    "volumes": ListOf(VOLUME), "nodeSelector": STRINGS, "restartPolicy": Enum(("Always", "OnFailure", "Never")),
    "terminationGracePeriodSeconds": INT, "activeDeadlineSeconds": INT, "priority": INT,
    "resources": RESOURCES, "overhead": MapOf(QUANTITY),
    **{name: BOOL for name in ("automountServiceAccountToken", "enableServiceLinks", "hostIPC", "hostNetwork",
                               "hostPID", "hostUsers", "setHostnameAsFQDN", "shareProcessNamespace")},
    **{name: STR for name in ("dnsPolicy", "hostname", "hostnameOverride", "nodeName", "preemptionPolicy",
                              "priorityClassName", "runtimeClassName", "schedulerName", "serviceAccount",
                              "serviceAccountName", "subdomain")},
    **{name: MAP for name in ("affinity", "dnsConfig", "os", "schedulingGroup", "securityContext")},
    **{name: LIST for name in ("hostAliases", "imagePullSecrets", "readinessGates", "resourceClaims",
                               "schedulingGates", "tolerations", "topologySpreadConstraints")},
}, required=("containers",))
# the CRD keeps only these of a pod template's ObjectMeta
TEMPLATE_META = Obj("ObjectMeta", {"name": STR, "namespace": STR, "labels": STRINGS, "annotations": STRINGS,
                                   "finalizers": ListOf(STR)})
POD_TEMPLATE = Obj("PodTemplateSpec", {"metadata": TEMPLATE_META, "spec": POD_SPEC})
OBJECT_META = Obj("ObjectMeta", {
    "name": STR, "generateName": STR, "namespace": STR, "labels": STRINGS, "annotations": STRINGS,
    "finalizers": ListOf(STR), "ownerReferences": LIST, "managedFields": LIST, "uid": STR, "resourceVersion": STR,
    "generation": INT, "creationTimestamp": STR, "deletionTimestamp": STR, "deletionGracePeriodSeconds": INT,
    "selfLink": STR,
}, required=("name",))  # `kubectl apply` needs the name (generateName is for `kubectl create`)


# -------------------------------------------------------------------------------------- ray.io/v1 (raycluster_types.go)
HEAD_GROUP = Obj("HeadGroupSpec", {
    "template": POD_TEMPLATE, "headService": MAP, "enableIngress": BOOL, "ingressOptions": MAP,
    "resources": STRINGS, "labels": STRINGS, "rayStartParams": STRINGS,
    "serviceType": Enum(("ClusterIP", "NodePort", "LoadBalancer", "ExternalName")),  # core/v1 ServiceType
}, required=("template",))
WORKER_GROUP = Obj("WorkerGroupSpec", {
    "suspend": BOOL, "groupName": STR, "replicas": INT, "minReplicas": INT, "maxReplicas": INT,
    "idleTimeoutSeconds": INT, "priority": INT, "resources": STRINGS, "labels": STRINGS, "rayStartParams": STRINGS,
    "template": POD_TEMPLATE, "scaleStrategy": Obj("ScaleStrategy", {"workersToDelete": ListOf(STR)}),
    "numOfHosts": INT,
}, required=("groupName", "template"))
AUTOSCALER_OPTIONS = Obj("AutoscalerOptions", {
    "resources": RESOURCES, "image": STR, "imagePullPolicy": Enum(("Always", "Never", "IfNotPresent")),
    "securityContext": MAP, "idleTimeoutSeconds": INT,
    "upscalingMode": Enum(("Default", "Aggressive", "Conservative")), "version": Enum(("v1", "v2")),
    "env": ListOf(ENV_VAR), "envFrom": LIST, "volumeMounts": ListOf(VOLUME_MOUNT), "command": ListOf(STR),
    "args": ListOf(STR),
})
MANAGED_BY = Enum(("ray.io/kuberay-operator", "kueue.x-k8s.io/multikueue"))
RAY_CLUSTER_SPEC = Obj("RayClusterSpec", {
    "upgradeStrategy": Obj("RayClusterUpgradeStrategy", {"type": Enum(("Recreate", "None"))}),
    "authOptions": Obj("AuthOptions", {"enableK8sTokenAuth": BOOL, "secretName": STR,
                                       "mode": Enum(("disabled", "token"))}),
    "suspend": BOOL, "managedBy": MANAGED_BY, "autoscalerOptions": AUTOSCALER_OPTIONS,
    "headServiceAnnotations": STRINGS, "enableInTreeAutoscaling": BOOL, "gcsFaultToleranceOptions": MAP,
    "historyServerOptions": MAP, "networkPolicy": MAP, "tlsOptions": Obj("TLSOptions", {"enabled": BOOL}),
    "headGroupSpec": HEAD_GROUP, "rayVersion": STR, "workerGroupSpecs": ListOf(WORKER_GROUP),
}, required=("headGroupSpec",))


# ----------------------------------------------------------------------------------------- ray.io/v1 (rayjob_types.go)
SUBMISSION_MODES = ("K8sJobMode", "HTTPMode", "InteractiveMode", "SidecarMode")
DELETION_POLICY = Enum(("DeleteCluster", "DeleteWorkers", "DeleteSelf", "DeleteNone"))
DELETION_STRATEGY = Obj("DeletionStrategy", {
    "onSuccess": Obj("DeletionPolicy", {"policy": DELETION_POLICY}),
    "onFailure": Obj("DeletionPolicy", {"policy": DELETION_POLICY}),
    "deletionRules": ListOf(Obj("DeletionRule", {
        "policy": DELETION_POLICY,
        "condition": Obj("DeletionCondition", {"jobStatus": Enum(("SUCCEEDED", "FAILED")),
                                               "jobDeploymentStatus": Enum(("Failed",)), "ttlSeconds": INT}),
    }, required=("condition", "policy"))),
})
RAY_JOB_SPEC = Obj("RayJobSpec", {
    "activeDeadlineSeconds": INT, "backoffLimit": INT, "rayClusterSpec": RAY_CLUSTER_SPEC,
    "submitterPodTemplate": POD_TEMPLATE, "metadata": STRINGS, "clusterSelector": STRINGS,
    "submitterConfig": Obj("SubmitterConfig", {"backoffLimit": INT}), "managedBy": MANAGED_BY,
    "deletionStrategy": DELETION_STRATEGY, "entrypoint": STR, "runtimeEnvYAML": STR, "jobId": STR,
    "submissionMode": Enum(SUBMISSION_MODES), "entrypointResources": STR, "entrypointNumCpus": NUM,
    "entrypointNumGpus": NUM, "ttlSecondsAfterFinished": INT, "preRunningDeadlineSeconds": INT,
    "shutdownAfterJobFinishes": BOOL, "suspend": BOOL,
})
RAY_JOB = Obj("RayJob", {
    "apiVersion": Enum(("ray.io/v1",)), "kind": Enum(("RayJob",)), "metadata": OBJECT_META, "spec": RAY_JOB_SPEC,
    "status": MAP,
}, required=("apiVersion", "kind", "metadata", "spec"))


# --------------------------------------------------------------------------------------------------------- checking
def _show(v) -> str:
    if isinstance(v, dict):
        return "a mapping"
    if isinstance(v, list):
        return "a list"
    if v is None or isinstance(v, bool):
        return {None: "null", True: "true", False: "false"}[v]
    return repr(v) if isinstance(v, str) else str(v)


def _typed(value, t: Type, path: str, out: list[str]) -> None:
    """Problems of ``value`` against type ``t`` (unknown fields, wrong types, missing required fields)."""
    if isinstance(t, Scalar):
        if not t.ok(value):
            out.append(f"{path}: expected {t.what}, got {_show(value)}")
    elif isinstance(t, Enum):
        if value not in t.values:
            want = " or ".join(t.values) if len(t.values) < 3 else "one of " + ", ".join(t.values)
            out.append(f"{path}: expected {want}, got {_show(value)}")
    elif isinstance(t, Opaque):
        if not isinstance(value, t.kind):
            out.append(f"{path}: expected {'a mapping' if t.kind is dict else 'a list'}, got {_show(value)}")
    elif isinstance(t, MapOf):
        if not isinstance(value, dict):
            out.append(f"{path}: expected a mapping, got {_show(value)}")
            return
        for k, v in value.items():
            _typed(v, t.value, f"{path}.{k}", out)
    elif isinstance(t, ListOf):
        if not isinstance(value, list):
            out.append(f"{path}: expected a list, got {_show(value)}")
            return
        for i, v in enumerate(value):
            _typed(v, t.item, f"{path}[{i}]", out)
    else:
        if not isinstance(value, dict):
            out.append(f"{path}: expected a mapping ({t.name}), got {_show(value)}")
            return
        for k, v in value.items():
            where = f"{path}.{k}" if path else str(k)
            if k in t.fields:
                _typed(v, t.fields[k], where, out)
            else:
                near = difflib.get_close_matches(str(k), list(t.fields), n=1, cutoff=0.6)
                out.append(f"{where}: unknown field of {t.name}" + (f" (did you mean {near[0]}?)" if near else ""))
        for k in t.required:
            if k not in value:
                out.append(f"{path + '.' if path else ''}{k}: missing (required by {t.name})")


def _d(v) -> dict:
    return v if isinstance(v, dict) else {}


def _l(v) -> list:
    return v if isinstance(v, list) else []


def _version(s) -> tuple[int, ...]:
    m = re.match(r"^v?(\d+)(?:\.(\d+))?(?:\.(\d+))?", str(s))
    return tuple(int(x or 0) for x in m.groups()) if m else ()


DNS1035 = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")
MAX_RAYJOB_NAME = 47  # utils/constant.go: MaxRayJobNameLength = MaxRayClusterNameLength (53) - 6
RAY_START_RESOURCES = ("num-cpus", "num-gpus", "memory", "resources")  # validation.go validateRayGroupResources


def _pod_rules(template, path: str, out: list[str]) -> None:
    """A pod template: at least one container (validation.go), unique container and volume names, and every volume
    mount naming a volume of the pod (Kubernetes pod validation: VolumeMount.name "must match the Name of a Volume";
    the RayJob is accepted, the pod is refused when KubeRay creates it)."""
    spec = _d(_d(template).get("spec"))
    if isinstance(template, dict) and ("spec" not in template or spec.get("containers") == []):
        out.append(f"{path}.spec.containers: no container (KubeRay needs at least one: the first is the Ray one)")
    volumes = [v.get("name") for v in _l(spec.get("volumes")) if isinstance(v, dict)]
    for i, name in enumerate(volumes):
        if name in volumes[:i]:
            out.append(f"{path}.spec.volumes[{i}].name: {name!r} names a second volume of the pod")
    for kind in ("initContainers", "containers"):
        names = []
        for i, c in enumerate(_l(spec.get(kind))):
            c = _d(c)
            if "name" in c and c["name"] in names:
                out.append(f"{path}.spec.{kind}[{i}].name: {c['name']!r} names a second container of the pod")
            names.append(c.get("name"))
            for j, mount in enumerate(_l(c.get("volumeMounts"))):
                name = _d(mount).get("name")
                if isinstance(name, str) and name not in volumes:
                    have = ", ".join(str(v) for v in volumes) or "none"
                    out.append(f"{path}.spec.{kind}[{i}].volumeMounts[{j}].name: {name!r} names no volume of the "
                               f"pod (volumes: {have})")


def _group_rules(group: dict, path: str, label: str, out: list[str]) -> None:
    params, resources = _d(group.get("rayStartParams")), _d(group.get("resources"))
    if resources and any(params.get(k) for k in RAY_START_RESOURCES):
        out.append(f"{path}.resources: set with rayStartParams' num-cpus / num-gpus / memory / resources for the "
                   f"{label} group: KubeRay takes only one of them")
    if "labels" in params:
        out.append(f"{path}.rayStartParams.labels: not supported for the {label} group: use {path}.labels")
    _pod_rules(group.get("template"), f"{path}.template", out)


def _rules(m: dict) -> list[str]:
    """The cross-field rules, each from the file named beside it."""
    out: list[str] = []
    name = _d(m.get("metadata")).get("name")
    if isinstance(name, str) and (len(name) > MAX_RAYJOB_NAME or not DNS1035.match(name)):  # ValidateRayJobMetadata
        out.append(f"metadata.name: {name!r} is not a DNS-1035 label of at most {MAX_RAYJOB_NAME} characters "
                   "(lower-case letters, digits, '-'; a letter first)")
    if "spec" not in m:
        return out
    spec = _d(m["spec"])
    mode = spec.get("submissionMode", "K8sJobMode")  # +kubebuilder:default:=K8sJobMode
    selector, cluster = spec.get("clusterSelector"), spec.get("rayClusterSpec")
    shutdown, ttl = spec.get("shutdownAfterJobFinishes") is True, spec.get("ttlSecondsAfterFinished", 0)
    backoff = spec.get("backoffLimit")
    # ValidateRayJobSpec
    if cluster is None and not selector:
        out.append("spec: neither rayClusterSpec nor clusterSelector (a RayJob needs one of them)")
    if mode != "InteractiveMode" and not (isinstance(spec.get("entrypoint"), str) and spec["entrypoint"].strip()):
        # optional in the ray.io/v1 schema (InteractiveMode waits for a job submitted by hand); every other mode
        # submits `ray job submit -- <entrypoint>` (common/job.go BuildJobSubmitCommand)
        out.append(f"spec.entrypoint: missing: {mode} submits it as the job (only InteractiveMode goes without)")
    if _is_int(ttl) and ttl < 0:
        out.append("spec.ttlSecondsAfterFinished: negative")
    elif _is_int(ttl) and ttl > 0 and not shutdown:
        out.append("spec.ttlSecondsAfterFinished: set without shutdownAfterJobFinishes: true (KubeRay refuses it)")
    if spec.get("suspend") is True and not shutdown:
        out.append("spec.suspend: true needs shutdownAfterJobFinishes: true")
    for key in ("activeDeadlineSeconds", "preRunningDeadlineSeconds"):
        if _is_int(spec.get(key)) and spec[key] <= 0:
            out.append(f"spec.{key}: must be a positive integer, got {spec[key]}")
    if _is_int(backoff) and backoff < 0:
        out.append(f"spec.backoffLimit: must not be negative, got {backoff}")
    if _is_int(backoff) and backoff > 0 and (mode == "InteractiveMode" or selector):
        out.append(f"spec.backoffLimit: retries are not supported with "
                   f"{'InteractiveMode' if mode == 'InteractiveMode' else 'clusterSelector'}")
    if mode == "SidecarMode":
        for key in ("submitterPodTemplate", "submitterConfig", "clusterSelector"):
            if key in spec:
                out.append(f"spec.{key}: not supported in SidecarMode")
    if _d(spec.get("deletionStrategy")).get("deletionRules") and shutdown:
        out.append("spec.deletionStrategy.deletionRules: exclusive with shutdownAfterJobFinishes: true")
    if isinstance(spec.get("runtimeEnvYAML"), str):  # dashboardclient.UnmarshalRuntimeEnvYAML: a YAML mapping
        try:
            env = yaml.safe_load(spec["runtimeEnvYAML"])
            if env is not None and not isinstance(env, dict):
                out.append(f"spec.runtimeEnvYAML: expected a YAML mapping (a runtime_env), got {_show(env)}")
        except yaml.YAMLError as e:
            out.append(f"spec.runtimeEnvYAML: not YAML: {str(e).splitlines()[0]}")
    if isinstance(spec.get("submitterPodTemplate"), dict):
        _pod_rules(spec["submitterPodTemplate"], "spec.submitterPodTemplate", out)
    if isinstance(cluster, dict):
        out += _cluster_rules(cluster, "spec.rayClusterSpec")
    return out


def _cluster_rules(cluster: dict, path: str) -> list[str]:
    """ValidateRayClusterSpec (validation.go), and the worker replicas KubeRay would clamp (util.go)."""
    out: list[str] = []
    head = cluster.get("headGroupSpec")
    if isinstance(head, dict):
        _group_rules(head, f"{path}.headGroupSpec", "Head", out)
    autoscaling = cluster.get("enableInTreeAutoscaling") is True
    for i, group in enumerate(_l(cluster.get("workerGroupSpecs"))):
        if not isinstance(group, dict):
            continue
        where = f"{path}.workerGroupSpecs[{i}]"
        lo, hi, n = group.get("minReplicas", 0), group.get("maxReplicas", 2**31 - 1), group.get("replicas")
        for key, v in (("minReplicas", lo), ("maxReplicas", hi)):
            if _is_int(v) and v < 0:
                out.append(f"{where}.{key}: negative")
        if _is_int(lo) and _is_int(hi) and lo > hi:
            out.append(f"{where}: minReplicas {lo} > maxReplicas {hi}")
        elif _is_int(n) and _is_int(lo) and _is_int(hi) and not lo <= n <= hi:
            # GetWorkerGroupDesiredReplicas: replicas outside [min, max] is clamped, not refused
            out.append(f"{where}.replicas: {n} is outside [minReplicas {lo}, maxReplicas {hi}]: KubeRay runs "
                       f"{min(max(n, lo), hi)}")
        if _is_int(group.get("numOfHosts")) and group["numOfHosts"] < 1:
            out.append(f"{where}.numOfHosts: must be at least 1")
        if group.get("suspend") is True and autoscaling:
            out.append(f"{where}.suspend: a worker group cannot be suspended with enableInTreeAutoscaling")
        _group_rules(group, where, str(group.get("groupName")), out)
    auth = _d(cluster.get("authOptions"))
    token = auth.get("mode") == "token"  # utils.IsAuthEnabled: authOptions.mode == token, nothing else
    if token and _version(cluster.get("rayVersion", "")) < (2, 52, 0):
        out.append(f"{path}.rayVersion: authOptions.mode token needs Ray 2.52.0 or later, got "
                   f"{_show(cluster.get('rayVersion'))}")
    if auth.get("enableK8sTokenAuth") is True:
        out.append(f"{path}.authOptions.enableK8sTokenAuth: not supported for a RayJob")
    if not token:
        # common/pod.go SetContainerTokenAuthEnvVars: KubeRay gives every Ray container (and the submitter) the
        # cluster's token from a Secret only when authOptions.mode is token; RAY_AUTH_MODE=token alone leaves each
        # pod without a shared token (the head makes one of its own, the workers find none)
        groups = [(f"{path}.headGroupSpec", head)] + [(f"{path}.workerGroupSpecs[{i}]", g)
                                                      for i, g in enumerate(_l(cluster.get("workerGroupSpecs")))]
        for where, group in groups:
            for i, c in enumerate(_l(_d(_d(_d(group).get("template")).get("spec")).get("containers"))):
                for j, env in enumerate(_l(_d(c).get("env"))):
                    if _d(env).get("name") == "RAY_AUTH_MODE" and _d(env).get("value") == "token":
                        out.append(f"{where}.template.spec.containers[{i}].env[{j}]: RAY_AUTH_MODE=token but no "
                                   f"{path}.authOptions.mode: token (only that shares one token with every pod)")
    return out


def check(manifest: dict) -> list[str]:
    """The problems of a RayJob manifest (a parsed yaml document), one a line, each led by its dotted path: unknown
    fields (with the nearest known one), wrong types, missing required fields, then the cross-field rules."""
    out: list[str] = []
    _typed(manifest, RAY_JOB, "", out)
    if isinstance(manifest, dict):
        out += _rules(manifest)
    return out
