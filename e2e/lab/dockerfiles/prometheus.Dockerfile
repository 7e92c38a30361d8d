# Prometheus for the local cluster's monitoring stack: the static binary that `make tools` builds from the version
# pinned in e2e/lab/tools/prometheus/go.mod (with Kubernetes service discovery, the only one), on an empty base.
# e2e/lab/images.py tags it quay.io/prometheus/prometheus:v<release>, the image the Prometheus Operator runs for
# a Prometheus of that spec.version, so that its StatefulSet runs it unchanged and nothing is pulled from outside.
# Like the public image: /bin/prometheus as the entrypoint (the operator passes arguments only), /prometheus as
# the working directory (the operator mounts the data volume there), user nobody (the operator sets its own).
# Unlike it: no other service discovery than Kubernetes', no promtool, no web UI assets (not embedded without
# their build tag; the HTTP API is complete) and no CA bundle (it scrapes with the CAs its ServiceMonitors name).
# By hand:  buildah bud -f e2e/lab/dockerfiles/prometheus.Dockerfile -t quay.io/prometheus/prometheus:v3.16.0 .pagoda-dev/bin
FROM scratch
COPY prometheus /bin/prometheus
WORKDIR /prometheus
USER 65534:65534
ENTRYPOINT ["/bin/prometheus"]
