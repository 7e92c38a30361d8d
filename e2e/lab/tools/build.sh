#!/usr/bin/env bash
# Builds the local control plane's programs and the real node's kubelet and kube-proxy from the Go module in this
# folder (versions pinned in go.mod), and, each from a module of its own (apart so that their dependency graphs
# never meet the Kubernetes pins): the real node's containerd, runc shim and ctr (containerd/go.mod), its CNI
# plugins bridge, host-local and loopback (cni/go.mod: apart from containerd's module too, which requires an older
# release of the plugins' module), the distribution registry (registry/go.mod), the MinIO server for the s3://
# model-source test (minio/go.mod), KEDA's operator and metrics adapter (keda/go.mod), kube-state-metrics
# (kube-state-metrics/go.mod) and the Gateway API Inference Extension's endpoint picker (gie/go.mod), Argo CD's
# application controller and repo server (argocd/go.mod: one small main, built with the Go toolchain its go.mod
# names), CoreDNS for the real node's cluster DNS (coredns/go.mod: a small main with the plugins it uses),
# kube-network-policies for the real node's NetworkPolicies (netpol/go.mod: a small main that takes a kubeconfig),
# Prometheus (prometheus/go.mod), the Prometheus Operator and its config reloader
# (prometheus-operator/go.mod: apart from Prometheus's, whose module its own requires at an older version),
# the e2e add-ons, actionlint (actionlint/go.mod: `make lint` checks .github/workflows with it), and
# dashboard-lint (dashboard-lint/go.mod: checks the chart's Grafana dashboards
# against Grafana's schema, for the unit tests).
# Copies the third-party CRDs out of their Go modules (KEDA's from the version in keda/go.mod, the
# InferencePool's from the version in gie/go.mod, Argo CD's Application and AppProject from argocd/go.mod, the
# Prometheus Operator's ServiceMonitor and PrometheusRule from prometheus-operator/go.mod), and the Prometheus
# Operator's own manifests (its bundle.yaml: every CRD, its RBAC and Deployment; and the example RBAC of a
# Prometheus) to OUTDIR/prometheus-operator-manifests/.
#
#   bash e2e/tools/build.sh OUTDIR      (the Makefile runs: bash e2e/tools/build.sh .pagoda-dev/bin)
#
# OUTDIR receives kube-apiserver, kube-controller-manager, kube-scheduler, kubectl, kubelet, kube-proxy, etcd,
# kwok, helm, containerd, containerd-shim-runc-v2, ctr, cni/{bridge,host-local,loopback}, registry, minio,
# keda-operator, keda-adapter, kube-state-metrics, epp, argocd (+ its git-verify-wrapper.sh), coredns,
# kube-network-policies, prometheus, prometheus-operator, prometheus-config-reloader,
# prometheus-operator-manifests/*.yaml, dashboard-lint, actionlint and crds/*.yaml; all static (CGO_ENABLED=0).
# Incremental per step: OUTDIR/.stamps/<step> holds a hash of what the step builds from (its module's go.mod,
# go.sum and main.go, the step's function and arguments); a step whose stamp matches and whose outputs exist
# is skipped. So a new or re-pinned tool builds only itself when OUTDIR holds the previous build (the Makefile
# seeds it from the last cached build), and Go's module and build caches make even a changed step incremental.
set -euo pipefail

CONTAINERD_MODULE=github.com/containerd/containerd/v2
CNI_MODULE=github.com/containernetworking/plugins
REGISTRY_MODULE=github.com/distribution/distribution/v3
KEDA_MODULE=github.com/kedacore/keda/v2
KSM_MODULE=k8s.io/kube-state-metrics/v2
GIE_MODULE=sigs.k8s.io/gateway-api-inference-extension
ARGOCD_MODULE=github.com/argoproj/argo-cd/v3
COREDNS_MODULE=github.com/coredns/coredns
NETPOL_MODULE=sigs.k8s.io/kube-network-policies
PROMETHEUS_MODULE=github.com/prometheus/prometheus
PROMOP_MODULE=github.com/prometheus-operator/prometheus-operator

# The CNI plugins go to OUTDIR/cni/, a directory of their own for the runtime's CNI bin_dir.
CNI_PLUGINS=(bridge host-local loopback)
K8S_BINARIES=(kube-apiserver kube-controller-manager kube-scheduler kubectl kubelet kube-proxy)
# All six of KEDA's CRDs (its operator watches every kind), then the Prometheus Operator's two.
KEDA_CRDS=(keda.sh_scaledobjects.yaml keda.sh_scaledjobs.yaml keda.sh_triggerauthentications.yaml
    keda.sh_clustertriggerauthentications.yaml eventing.keda.sh_cloudeventsources.yaml
    eventing.keda.sh_clustercloudeventsources.yaml)
# The InferencePool (inference.networking.k8s.io/v1) is all the endpoint picker needs: it looks for its
# optional x-k8s kinds (InferenceObjective, InferenceModelRewrite) by discovery.
GIE_CRDS=(inference.networking.k8s.io_inferencepools.yaml)
# The two kinds the application controller reads (no ApplicationSet controller runs).
ARGOCD_CRDS=(argoproj.io_applications.yaml argoproj.io_appprojects.yaml)
CRDS=("${KEDA_CRDS[@]}" "${GIE_CRDS[@]}" "${ARGOCD_CRDS[@]}" monitoring.coreos.com_servicemonitors.yaml
    monitoring.coreos.com_prometheusrules.yaml)
# kwok's own default stages (what kwokctl installs): nodes become Ready and keep a lease, scheduled pods
# become Running and Ready, deleted pods go away.
KWOK_STAGES=(node/fast/node-initialize.yaml node/heartbeat-with-lease/node-heartbeat-with-lease.yaml
    pod/fast/pod-ready.yaml pod/fast/pod-complete.yaml pod/fast/pod-delete.yaml)

if [[ $# -ne 1 ]]; then
    echo "usage: $0 OUTDIR" >&2
    exit 2
fi
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
mkdir -p "$1/crds" "$1/cni" "$1/.stamps"
out="$(cd "$1" && pwd)"
rm -f "$out/.build-stamp" # the whole-build stamp of earlier versions of this script

cd "$here"
export CGO_ENABLED=0 GOFLAGS=-buildvcs=false
# Version stamps that `make` in each project would set; kubectl, kube-apiserver and helm report them (Helm
# checks a chart's kubeVersion against chartutil's). Taken from go.mod, the single source of the versions.
k8s_version="$(go list -m -f '{{.Version}}' k8s.io/kubernetes)"
helm_version="$(go list -m -f '{{.Version}}' helm.sh/helm/v3)"
containerd_version="$(go -C containerd list -m -f '{{.Version}}' "$CONTAINERD_MODULE")"
cni_version="$(go -C cni list -m -f '{{.Version}}' "$CNI_MODULE")"
registry_version="$(go -C registry list -m -f '{{.Version}}' "$REGISTRY_MODULE")"
keda_version="$(go -C keda list -m -f '{{.Version}}' "$KEDA_MODULE")"
ksm_version="$(go -C kube-state-metrics list -m -f '{{.Version}}' "$KSM_MODULE")"
gie_version="$(go -C gie list -m -f '{{.Version}}' "$GIE_MODULE")"
# Argo CD's go.mod needs a newer Go than the rest: the toolchain line of argocd/go.mod, fetched by the go command.
argocd_toolchain="$(sed -n 's/^toolchain //p' argocd/go.mod)"
argocd_go() { GOTOOLCHAIN="$argocd_toolchain" go -C "$here/argocd" "$@"; }
argocd_version="$(argocd_go list -m -f '{{.Version}}' "$ARGOCD_MODULE")"
coredns_version="$(go -C coredns list -m -f '{{.Version}}' "$COREDNS_MODULE")"
netpol_version="$(go -C netpol list -m -f '{{.Version}}' "$NETPOL_MODULE")"
prometheus_version="$(go -C prometheus list -m -f '{{.Version}}' "$PROMETHEUS_MODULE")"
promop_version="$(go -C prometheus-operator list -m -f '{{.Version}}' "$PROMOP_MODULE")"
k8s_minor="$(cut -d. -f2 <<<"$k8s_version")"
k8s_x=""
for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
    k8s_x+=" -X $pkg.gitVersion=$k8s_version -X $pkg.gitMajor=1 -X $pkg.gitMinor=$k8s_minor -X $pkg.gitTreeState=clean"
done
helm_x="-X helm.sh/helm/v3/internal/version.version=$helm_version -X helm.sh/helm/v3/internal/version.gitTreeState=clean"
for pkg in helm.sh/helm/v3/pkg/chartutil helm.sh/helm/v3/pkg/lint/rules; do
    helm_x+=" -X $pkg.k8sVersionMajor=1 -X $pkg.k8sVersionMinor=$k8s_minor"
done
# A module has no commit to stamp as the revision: its go.sum hash (h1:...) names the exact source tree built.
containerd_x="-X $CONTAINERD_MODULE/version.Version=$containerd_version"
containerd_x+=" -X $CONTAINERD_MODULE/version.Revision=$(go -C containerd list -m -f '{{.Sum}}' "$CONTAINERD_MODULE")"
cni_x="-X $CNI_MODULE/pkg/utils/buildversion.BuildVersion=$cni_version"
registry_x="-X $REGISTRY_MODULE/version.version=$registry_version"
registry_x+=" -X $REGISTRY_MODULE/version.revision=$(go -C registry list -m -f '{{.Sum}}' "$REGISTRY_MODULE")"
keda_x="-X $KEDA_MODULE/version.Version=$keda_version"
ksm_x="-X github.com/prometheus/common/version.Version=$ksm_version"
gie_x="-X $GIE_MODULE/version.BuildRef=$gie_version"
# Prometheus's module v0.MMP.x is its release 3.MM.x (v0.316.0 is 3.16.0): what `prometheus --version` reports,
# and the tag its image carries (the Prometheus Operator names an image by that version).
prometheus_release="$(sed -E 's/^v0\.([0-9])([0-9]{2})\.([0-9]+)$/\1.\2.\3/; s/^([0-9])\.0([0-9])/\1.\2/' <<<"$prometheus_version")"
prometheus_x="-X github.com/prometheus/common/version.Version=$prometheus_release -X github.com/prometheus/common/version.Branch=HEAD"
prometheus_x+=" -X github.com/prometheus/common/version.Revision=$(go -C prometheus list -m -f '{{.Sum}}' "$PROMETHEUS_MODULE")"
promop_x="-X github.com/prometheus/common/version.Version=${promop_version#v}"
argocd_x="-X $ARGOCD_MODULE/common.version=${argocd_version#v} -X $ARGOCD_MODULE/common.gitTreeState=clean"
build_flags=(-trimpath)
total_start=$SECONDS
built=()
# step ID MODULE OUTPUTS LABEL FUNCTION [ARGS...]: runs FUNCTION ARGS unless OUTDIR/.stamps/ID matches the hash of
# MODULE's go.mod, go.sum and main.go (MODULE is a folder under e2e/tools, "." for the Kubernetes one), of this
# step's function and arguments, and every file of OUTPUTS (space-separated, relative to OUTDIR) exists.
step() {
    local id="$1" module="$2" outputs="$3" label="$4"
    shift 4
    local key f current=1 started=$SECONDS
    key="$({
        cat "$here/$module/go.mod" "$here/$module/go.sum"
        [[ ! -f "$here/$module/main.go" ]] || cat "$here/$module/main.go"
        declare -f "$1"
        echo "$*"
    } | sha1sum | cut -c1-16)"
    [[ "$(cat "$out/.stamps/$id" 2>/dev/null)" == "$key" ]] || current=0
    for f in $outputs; do [[ -s "$out/$f" ]] || current=0; done
    if [[ $current == 1 ]]; then
        echo "==> $label: up to date"
        return
    fi
    echo "==> $label"
    rm -f "$out/.stamps/$id"
    "$@"
    echo "$key" >"$out/.stamps/$id"
    built+=("$id")
    echo "    $label took $((SECONDS - started))s"
}

build_kubernetes() {
    go build "${build_flags[@]}" -ldflags="-s -w$k8s_x" -o "$out/" "${K8S_BINARIES[@]/#/k8s.io/kubernetes/cmd/}"
}

build_etcd() {
    go build "${build_flags[@]}" -ldflags="-s -w" -o "$out/etcd" ./cmd/etcd
}

build_kwok() {
    go build "${build_flags[@]}" -ldflags="-s -w" -o "$out/kwok" sigs.k8s.io/kwok/cmd/kwok
}

build_helm() {
    go build "${build_flags[@]}" -ldflags="-s -w $helm_x" -o "$out/helm" helm.sh/helm/v3/cmd/helm
}

# Without the btrfs (needs cgo), devmapper and ZFS snapshotters; overlayfs and native remain. All three programs
# in one go build: they share the tags and the version stamps.
build_containerd() {
    (cd "$here/containerd" && go build "${build_flags[@]}" -tags "no_btrfs no_devmapper no_zfs" \
        -ldflags="-s -w $containerd_x" -o "$out/" "$CONTAINERD_MODULE/cmd/containerd" \
        "$CONTAINERD_MODULE/cmd/containerd-shim-runc-v2" "$CONTAINERD_MODULE/cmd/ctr")
}

build_cni_plugins() {
    (cd "$here/cni" && go build "${build_flags[@]}" -ldflags="-s -w $cni_x" -o "$out/cni/" \
        "$CNI_MODULE/plugins/main/bridge" "$CNI_MODULE/plugins/ipam/host-local" "$CNI_MODULE/plugins/main/loopback")
}

build_registry() {
    (cd "$here/registry" &&
        go build "${build_flags[@]}" -ldflags="-s -w $registry_x" -o "$out/registry" "$REGISTRY_MODULE/cmd/registry")
}

build_minio() {
    (cd "$here/minio" && go build "${build_flags[@]}" -ldflags="-s -w" -o "$out/minio" github.com/minio/minio)
}

build_keda() {
    (cd "$here/keda" && go build "${build_flags[@]}" -ldflags="-s -w $keda_x" -o "$out/keda-$1" "$KEDA_MODULE/cmd/$1")
}

build_kube_state_metrics() {
    (cd "$here/kube-state-metrics" &&
        go build "${build_flags[@]}" -ldflags="-s -w $ksm_x" -o "$out/kube-state-metrics" "$KSM_MODULE")
}

build_epp() {
    (cd "$here/gie" && go build "${build_flags[@]}" -ldflags="-s -w $gie_x" -o "$out/epp" "$GIE_MODULE/cmd/epp")
}

# The repo server runs Argo CD's git-verify-wrapper.sh from PATH on every checkout (v3.6 verifies commit signatures
# even with GPG off); Argo CD's image copies it from hack/ to /usr/local/bin.
build_argocd() {
    argocd_go build "${build_flags[@]}" -ldflags="-s -w $argocd_x" -o "$out/argocd" .
    install -m 0755 "$(module_dir argocd "$ARGOCD_MODULE")/hack/git-verify-wrapper.sh" "$out/"
}

build_coredns() {
    (cd "$here/coredns" && go build "${build_flags[@]}" -ldflags="-s -w" -o "$out/coredns" .)
}

build_netpol() {
    (cd "$here/netpol" && go build "${build_flags[@]}" -ldflags="-s -w" -o "$out/kube-network-policies" .)
}

# Kubernetes service discovery only, with upstream's build tags (plugins/plugin_*.go): the cloud providers' SDKs
# are most of a full build's time.
build_prometheus() {
    (cd "$here/prometheus" && go build "${build_flags[@]}" -tags "remove_all_sd enable_kubernetes_sd" \
        -ldflags="-s -w $prometheus_x" -o "$out/prometheus" "$PROMETHEUS_MODULE/cmd/prometheus")
}

build_prometheus_operator() {
    (cd "$here/prometheus-operator" && go build "${build_flags[@]}" -ldflags="-s -w $promop_x" -o "$out/" \
        "$PROMOP_MODULE/cmd/operator" "$PROMOP_MODULE/cmd/prometheus-config-reloader")
    mv "$out/operator" "$out/prometheus-operator"
}

build_actionlint() {
    local version
    version="$(go -C "$here/actionlint" list -m -f '{{.Version}}' github.com/rhysd/actionlint)"
    (cd "$here/actionlint" && go build "${build_flags[@]}" \
        -ldflags="-s -w -X github.com/rhysd/actionlint.version=$version" -o "$out/actionlint" \
        github.com/rhysd/actionlint/cmd/actionlint)
}

build_dashboard_lint() {
    (cd "$here/dashboard-lint" && go build "${build_flags[@]}" -ldflags="-s -w" -o "$out/dashboard-lint" .)
}

# module_dir FOLDER MODULE[@VERSION]: where the module (the version FOLDER's go.mod requires, unless given) lies
# in the module cache, downloaded if it is not there yet.
module_dir() {
    local run=(go -C "$here/$1")
    [[ "$1" != argocd ]] || run=(argocd_go)
    "${run[@]}" mod download -json "$2" | sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$/\1/p'
}

copy_crds() {
    local keda gie argocd promop
    keda="$(module_dir keda "$KEDA_MODULE")"
    gie="$(module_dir gie "$GIE_MODULE")"
    argocd="$(module_dir argocd "$ARGOCD_MODULE")"
    promop="$(module_dir prometheus-operator "$PROMOP_MODULE")"
    for f in "${KEDA_CRDS[@]}"; do
        install -m 0644 "$keda/config/crd/bases/$f" "$out/crds/"
    done
    for f in "${GIE_CRDS[@]}"; do
        install -m 0644 "$gie/config/crd/bases/$f" "$out/crds/"
    done
    install -m 0644 "$argocd/manifests/crds/application-crd.yaml" "$out/crds/argoproj.io_applications.yaml"
    install -m 0644 "$argocd/manifests/crds/appproject-crd.yaml" "$out/crds/argoproj.io_appprojects.yaml"
    for kind in servicemonitors prometheusrules; do
        install -m 0644 "$promop/example/prometheus-operator-crd/monitoring.coreos.com_$kind.yaml" "$out/crds/"
    done
}

copy_prometheus_operator_manifests() {
    local promop
    promop="$(module_dir prometheus-operator "$PROMOP_MODULE")"
    mkdir -p "$out/prometheus-operator-manifests"
    install -m 0644 "$promop/bundle.yaml" "$out/prometheus-operator-manifests/bundle.yaml"
    for f in prometheus-service-account prometheus-cluster-role prometheus-cluster-role-binding; do
        install -m 0644 "$promop/example/rbac/prometheus/$f.yaml" "$out/prometheus-operator-manifests/"
    done
}

copy_kwok_stages() {
    local kwok
    kwok="$(module_dir . sigs.k8s.io/kwok)/kustomize/stage"
    for f in "${KWOK_STAGES[@]}"; do
        echo "---"
        cat "$kwok/$f"
    done >"$out/kwok-stages.yaml"
}

step kubernetes . "${K8S_BINARIES[*]}" "build ${K8S_BINARIES[*]} (k8s.io/kubernetes $k8s_version)" build_kubernetes
step etcd . etcd "build etcd (go.etcd.io/etcd/server/v3)" build_etcd
step kwok . kwok "build kwok (sigs.k8s.io/kwok)" build_kwok
step helm . helm "build helm (helm.sh/helm/v3 $helm_version)" build_helm
step containerd containerd "containerd containerd-shim-runc-v2 ctr" \
    "build containerd, containerd-shim-runc-v2, ctr ($CONTAINERD_MODULE $containerd_version, module containerd/)" \
    build_containerd
step cni cni "${CNI_PLUGINS[*]/#/cni/}" "build CNI plugins ${CNI_PLUGINS[*]} ($CNI_MODULE $cni_version, module cni/)" \
    build_cni_plugins
step registry registry registry "build registry ($REGISTRY_MODULE $registry_version, module registry/)" build_registry
step minio minio minio "build minio (github.com/minio/minio, module minio/)" build_minio
step keda-operator keda keda-operator "build keda-operator ($KEDA_MODULE $keda_version, module keda/)" build_keda operator
step keda-adapter keda keda-adapter "build keda-adapter ($KEDA_MODULE $keda_version, module keda/)" build_keda adapter
step kube-state-metrics kube-state-metrics kube-state-metrics \
    "build kube-state-metrics ($KSM_MODULE $ksm_version, module kube-state-metrics/)" build_kube_state_metrics
step epp gie epp "build epp ($GIE_MODULE $gie_version, module gie/)" build_epp
step argocd argocd "argocd git-verify-wrapper.sh" \
    "build argocd: application-controller, repo-server ($ARGOCD_MODULE $argocd_version, module argocd/)" build_argocd
step coredns coredns coredns "build coredns ($COREDNS_MODULE $coredns_version, module coredns/)" build_coredns
step netpol netpol kube-network-policies \
    "build kube-network-policies ($NETPOL_MODULE $netpol_version, module netpol/)" build_netpol
step prometheus prometheus prometheus \
    "build prometheus ($PROMETHEUS_MODULE $prometheus_version = $prometheus_release, module prometheus/)" \
    build_prometheus
step prometheus-operator prometheus-operator "prometheus-operator prometheus-config-reloader" \
    "build prometheus-operator, prometheus-config-reloader ($PROMOP_MODULE $promop_version, module prometheus-operator/)" \
    build_prometheus_operator
step prometheus-operator-manifests prometheus-operator \
    "prometheus-operator-manifests/bundle.yaml prometheus-operator-manifests/prometheus-cluster-role.yaml" \
    "copy the Prometheus Operator's manifests ($promop_version)" copy_prometheus_operator_manifests
step dashboard-lint dashboard-lint dashboard-lint \
    "build dashboard-lint (github.com/grafana/grafana-foundation-sdk/go, module dashboard-lint/)" build_dashboard_lint
step actionlint actionlint actionlint "build actionlint (github.com/rhysd/actionlint, module actionlint/)" \
    build_actionlint
step kwok-stages . kwok-stages.yaml "copy kwok's default stages" copy_kwok_stages
step crds . "${CRDS[*]/#/crds/}" \
    "copy CRDs (KEDA $keda_version, GIE $gie_version, Argo CD $argocd_version, Prometheus Operator $promop_version)" \
    copy_crds "$keda_version" "$gie_version" "$argocd_version" "$promop_version"

echo "Built ${built[*]:-nothing (all up to date)} into $out in $((SECONDS - total_start))s."
