# The pod sandbox image (containerd's and the kubelet's "pause"): one static binary, nothing else.
# e2e/lab/images.py compiles pause.c (gcc -static -O2 -s) into the build context and tags the result
# registry.k8s.io/pause:3.10, the name the kubelet and containerd look for, so that nothing has to be pulled.
# By hand:  gcc -static -O2 -s -o /tmp/ctx/pause e2e/lab/dockerfiles/pause.c
#           buildah bud -f e2e/lab/dockerfiles/pause.Dockerfile -t registry.k8s.io/pause:3.10 /tmp/ctx
FROM scratch
COPY pause /pause
USER 65535:65535
ENTRYPOINT ["/pause"]
