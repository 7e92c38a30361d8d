# The Prometheus Operator for the local cluster's monitoring stack: the static binary that `make tools` builds from
# the version pinned in e2e/lab/tools/prometheus-operator/go.mod, on an empty base. e2e/lab/images.py tags it
# with the image its own manifests (bundle.yaml) name, so that its Deployment runs unchanged.
# By hand:  buildah bud -f e2e/lab/dockerfiles/prometheus-operator.Dockerfile -t quay.io/prometheus-operator/prometheus-operator:v0.85.0 .pagoda-dev/bin
FROM scratch
COPY prometheus-operator /bin/operator
USER 65534:65534
ENTRYPOINT ["/bin/operator"]
