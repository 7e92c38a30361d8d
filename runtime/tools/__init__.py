"""`pagoda-runtime make-tiny-model` and `make-tiny-adapter`: small random-weight models for tests and
demos."""
