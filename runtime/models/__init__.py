"""Where the weights come from: model URIs (modeluri.py) and their downloads (sources.py, the entry point;
hfhub.py, s3store.py and download.py), the node's model cache (modelcache.py), and vLLM's model-registry
answers ahead of time (modelinfo.py, also run by the image build)."""
