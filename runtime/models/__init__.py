"""Where the weights come from: model URIs and their downloads (sources.py), the node's model cache
(modelcache.py), and vLLM's model-registry answers ahead of time (modelinfo.py, also run by the image
build)."""
