#!/usr/bin/env bash
# Validates the Kubernetes manifests in deploy/k8s (or in the directory given as $1) for real:
#   1. every manifest against the Kubernetes API's JSON schemas with kubernetes-validate
#      --strict (unknown fields are errors), for each version in KUBE_VERSIONS;
#   2. the cross-file rules no schema knows (consistency.py): terminationGracePeriodSeconds ≥
#      the ConfigMap's drain_timeout_s + 30, a per-pod Service and Ingress path for every pod
#      the HPA may create, the headless Service publishing not-ready addresses, every ${VAR}
#      of patter.toml and every Secret key the pods need being there, kustomization.yaml
#      listing every manifest but the Secret template;
#   3. with a patterd binary (PATTERD_BIN, default target/debug/patterd when it exists),
#      `patterd check --strict` on the ConfigMap's patter.toml in the environment a pod has.
# kubernetes-validate comes from PyPI into a venv under target/, every package pinned by
# sha256 (requirements-validate.txt, pip --require-hashes); no network means a loud failure.
# Exits non-zero on any invalid manifest. Run by .ci/run; takes a few seconds once the venv
# exists.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
dir=$(cd "${1:-$here}" && pwd)
# The oldest Kubernetes we support (autoscaling/v2, policy/v1, networking.k8s.io/v1 are all
# GA there) and the newest kubernetes-validate 1.37.0 knows.
KUBE_VERSIONS=${KUBE_VERSIONS:-"1.30.0 1.37.0"}
venv=${PATTERD_K8S_VENV:-$root/target/k8s-validate-venv}
reqs=$here/requirements-validate.txt

want=$(sha256sum "$reqs" | cut -d' ' -f1)
if [ "$(cat "$venv/.requirements-sha256" 2>/dev/null)" != "$want" ]; then
  rm -rf "$venv"
  python3 -m venv "$venv"
  if ! "$venv/bin/python" -m pip install --quiet --disable-pip-version-check \
      --require-hashes --only-binary=:all: -r "$reqs"; then
    echo "deploy/k8s/validate.sh: FAILED to install kubernetes-validate from PyPI" \
      "(pinned by hash in $reqs); the manifests were NOT validated" >&2
    exit 1
  fi
  echo "$want" > "$venv/.requirements-sha256"
fi

# Every manifest but kustomization.yaml (kustomize's own file, no Kubernetes API object).
mapfile -t files < <(find "$dir" -maxdepth 1 -name '*.yaml' ! -name kustomization.yaml | sort)
if [ "${#files[@]}" -eq 0 ]; then
  echo "deploy/k8s/validate.sh: no manifests in $dir" >&2
  exit 1
fi
for v in $KUBE_VERSIONS; do
  echo "kubernetes-validate --strict -k $v: ${#files[@]} files"
  status=0
  out=$("$venv/bin/kubernetes-validate" --strict --quiet -k "$v" "${files[@]}" 2>&1) || status=$?
  [ -z "$out" ] || printf '%s\n' "$out" >&2
  # kubernetes-validate only warns about a kind or apiVersion it has no schema for (a typo,
  # or an API removed in that version): that is a failure here too.
  if [ "$status" -ne 0 ] || grep -q "Couldn't find schema" <<<"$out"; then
    echo "deploy/k8s/validate.sh: manifests in $dir are NOT valid for Kubernetes $v" >&2
    exit 1
  fi
done

"$venv/bin/python" "$here/consistency.py" "$dir"

bin=${PATTERD_BIN:-$root/target/debug/patterd}
if [ -x "$bin" ]; then
  tmp=$(mktemp -d)
  trap 'rm -rf "$tmp"' EXIT
  "$venv/bin/python" "$here/consistency.py" "$dir" --print-config > "$tmp/patter.toml"
  # What a pod's environment holds (statefulset.yaml, the image's own variables), with
  # stand-in secrets of a valid shape.
  token=0123456789abcdef0123456789abcdef
  env -i PATH="$PATH" POD_NAME=patterd-0 POD_NAMESPACE=voice \
    PATTERD_PUBLIC_HOST=voice.example.com \
    PATTERD_DATABASE_URL=postgres://patterd:pw@postgres.example.internal:5432/patterd \
    PATTERD_API_TOKEN=$token PATTERD_CLUSTER_TOKEN=$token-cluster \
    API_SERVER_KEY=k DEEPGRAM_API_KEY=k ELEVENLABS_API_KEY=k \
    TWILIO_ACCOUNT_SID=ACxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx TWILIO_AUTH_TOKEN=k \
    PATTERD_SERVER__LISTEN=0.0.0.0:8080 PATTERD_DATA_DIR=/var/lib/patterd \
    "$bin" check --strict --config "$tmp/patter.toml" > "$tmp/effective" 2> "$tmp/err" || {
      cat "$tmp/err" >&2
      echo "deploy/k8s/validate.sh: patterd check --strict refused the ConfigMap's patter.toml" >&2
      exit 1
    }
  echo "patterd check --strict: the ConfigMap's patter.toml is valid"
else
  echo "patterd check skipped: no binary at $bin (cargo build, or set PATTERD_BIN)"
fi
echo "deploy/k8s: manifests valid"
