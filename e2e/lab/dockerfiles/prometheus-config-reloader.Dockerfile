# The Prometheus Operator's config reloader (the init container and sidecar it adds to every Prometheus pod: it
# writes the configuration from the operator's Secret and tells Prometheus to reload), from the same module as the
# operator (e2e/lab/tools/prometheus-operator/go.mod), on an empty base. e2e/lab/images.py tags it with the image
# the operator's `--prometheus-config-reloader` argument names in its bundle.yaml.
# By hand:  buildah bud -f e2e/lab/dockerfiles/prometheus-config-reloader.Dockerfile -t quay.io/prometheus-operator/prometheus-config-reloader:v0.85.0 .pagoda-dev/bin
FROM scratch
COPY prometheus-config-reloader /bin/prometheus-config-reloader
USER 65534:65534
ENTRYPOINT ["/bin/prometheus-config-reloader"]
