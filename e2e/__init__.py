"""The local control-plane harness (real Go-built Kubernetes binaries) and the end-to-end tests."""
