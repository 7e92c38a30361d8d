# The Gateway API Inference Extension's endpoint picker (GIE's `epp`) for the local cluster: the static Go binary
# that `make tools` builds from the version pinned in e2e/lab/tools/gie/go.mod, on an empty base. e2e/lab/images.py tags
# it with the operator's default picker image (operator/api/routing.py DEFAULT_PICKER_IMAGE), so that the
# Deployments the operator writes run it unchanged and nothing is pulled. GIE's own image also carries a
# distroless base (CA bundle, /etc/passwd); the picker needs neither: it talks only to the API server, with the
# service account's CA.
# By hand:  buildah bud -f e2e/lab/dockerfiles/epp.Dockerfile -t registry.k8s.io/gateway-api-inference-extension/epp:v1.5.0 .pagoda-dev/bin
FROM scratch
COPY epp /epp
USER 65532:65532
ENTRYPOINT ["/epp"]
