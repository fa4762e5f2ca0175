"""Cross-file checks of deploy/k8s that no schema knows (validate.sh runs this after the
schema validation). Usage: consistency.py DIR [--print-config]

--print-config prints the ConfigMap's patter.toml and exits (validate.sh feeds it to
`patterd check`). Otherwise every rule below is checked and each broken one is printed;
the exit status is 1 when any is.
"""
import pathlib
import re
import sys
import tomllib

import yaml

GRACE_MARGIN_S = 30  # flush + exit after drain_timeout_s


def load(directory):
    objects = {}
    for path in sorted(pathlib.Path(directory).glob("*.yaml")):
        if path.name == "kustomization.yaml":
            continue
        for doc in yaml.safe_load_all(path.read_text()):
            if doc:
                objects[(doc["kind"], doc["metadata"]["name"])] = doc
    return objects


def main():
    directory = sys.argv[1]
    objects = load(directory)
    problems = []

    def need(kind, name):
        obj = objects.get((kind, name))
        if obj is None:
            problems.append(f"missing {kind} {name}")
        return obj

    cm = need("ConfigMap", "patterd")
    sts = need("StatefulSet", "patterd")
    hpa = need("HorizontalPodAutoscaler", "patterd")
    secret = need("Secret", "patterd")
    if cm is None or sts is None or hpa is None or secret is None:
        return report(problems)
    text = cm["data"]["patter.toml"]
    if "--print-config" in sys.argv:
        sys.stdout.write(text)
        return 0
    toml = tomllib.loads(text)
    pod = sts["spec"]["template"]["spec"]
    container = next(c for c in pod["containers"] if c["name"] == "patterd")

    # The grace period covers the drain.
    drain = toml.get("server", {}).get("drain_timeout_s", 300)
    grace = pod.get("terminationGracePeriodSeconds", 30)
    if grace < drain + GRACE_MARGIN_S:
        problems.append(
            f"statefulset.yaml terminationGracePeriodSeconds = {grace} is less than the "
            f"ConfigMap's drain_timeout_s ({drain}) + {GRACE_MARGIN_S}: Kubernetes would "
            "kill pods with live calls"
        )

    # The cluster store and the keys a cluster needs.
    if toml.get("store", {}).get("backend") != "postgres":
        problems.append('patter.toml: [store] backend must be "postgres" for N instances')
    cluster = toml.get("cluster", {})
    for key in ("instance_name", "advertise_url", "internal_url", "token"):
        if key not in cluster:
            problems.append(f"patter.toml: [cluster] {key} is not set")

    # The headless Service the pods' DNS names (internal_url) come from.
    headless = need("Service", sts["spec"]["serviceName"])
    if headless is not None:
        spec = headless["spec"]
        if spec.get("clusterIP") != "None" or not spec.get("publishNotReadyAddresses"):
            problems.append(
                f"Service {sts['spec']['serviceName']} (the StatefulSet's serviceName) must be "
                "headless (clusterIP: None) with publishNotReadyAddresses: true"
            )
        if f".{sts['spec']['serviceName']}." not in cluster.get("internal_url", ""):
            problems.append("patter.toml: [cluster] internal_url is not under the headless Service")

    # A route for every pod the HPA may create: a per-pod Service and an Ingress path.
    if hpa["spec"]["scaleTargetRef"]["name"] != sts["metadata"]["name"]:
        problems.append("hpa.yaml does not scale the StatefulSet")
    if hpa["spec"]["minReplicas"] < 2:
        problems.append("hpa.yaml minReplicas < 2: a rolling restart would leave no ready pod")
    routes = {}
    for (kind, _), ing in objects.items():
        if kind != "Ingress":
            continue
        for rule in ing["spec"].get("rules", []):
            for p in rule.get("http", {}).get("paths", []):
                routes[p["path"]] = p["backend"]["service"]["name"]
    name = sts["metadata"]["name"]
    count = max(hpa["spec"]["maxReplicas"], sts["spec"].get("replicas", 1))
    for i in range(count):
        pod_name = f"{name}-{i}"
        svc = objects.get(("Service", pod_name))
        if svc is None:
            problems.append(f"no Service {pod_name} (per-pod-services.yaml) for pod {pod_name}")
        else:
            if svc["spec"].get("selector", {}).get("statefulset.kubernetes.io/pod-name") != pod_name:
                problems.append(f"Service {pod_name} does not select pod {pod_name}")
            if not svc["spec"].get("publishNotReadyAddresses"):
                problems.append(f"Service {pod_name} must publish not-ready addresses (draining pod)")
        if routes.get(f"/i/{pod_name}") != pod_name:
            problems.append(f"no Ingress path /i/{pod_name} to Service {pod_name}")
    if "/i/${POD_NAME}" not in cluster.get("advertise_url", ""):
        problems.append("patter.toml: [cluster] advertise_url is not the /i/<pod> route")

    # Every ${VAR} without a default is in the pod's environment, every secretKeyRef in the
    # Secret template.
    env = {e["name"]: e for e in container.get("env", [])}
    image_env = {"PATTERD_CONFIG", "PATTERD_DATA_DIR", "PATTERD_SERVER__LISTEN"}  # deploy/Dockerfile
    for var in sorted(set(re.findall(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}", text))):
        if var not in env and var not in image_env:
            problems.append(f"patter.toml needs ${{{var}}}, which statefulset.yaml does not set")
    keys = set(secret.get("stringData", {})) | set(secret.get("data", {}))
    for e in env.values():
        ref = e.get("valueFrom", {}).get("secretKeyRef")
        if ref and ref["name"] == secret["metadata"]["name"] and ref["key"] not in keys:
            problems.append(f"statefulset.yaml reads Secret key {ref['key']}, absent from the template")

    # kustomization.yaml applies every manifest but the Secret template.
    kustomization = pathlib.Path(directory, "kustomization.yaml")
    if kustomization.exists():
        listed = set(yaml.safe_load(kustomization.read_text()).get("resources", []))
        present = {
            p.name for p in pathlib.Path(directory).glob("*.yaml") if p.name != "kustomization.yaml"
        }
        for name in sorted(present - listed - {"secret.example.yaml"}):
            problems.append(f"kustomization.yaml does not list {name}")
        for name in sorted(listed - present):
            problems.append(f"kustomization.yaml lists {name}, which does not exist")
        if "secret.example.yaml" in listed:
            problems.append("kustomization.yaml must not apply the Secret template")

    # Probes on the daemon's own endpoints.
    if container.get("readinessProbe", {}).get("httpGet", {}).get("path") != "/readyz":
        problems.append("the readiness probe must be GET /readyz (503 while draining)")
    if container.get("livenessProbe", {}).get("httpGet", {}).get("path") != "/healthz":
        problems.append("the liveness probe must be GET /healthz")
    return report(problems)


def report(problems):
    for p in problems:
        print(f"deploy/k8s: {p}", file=sys.stderr)
    if problems:
        print(f"deploy/k8s: {len(problems)} problem(s)", file=sys.stderr)
        return 1
    print("deploy/k8s: cross-file checks passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
