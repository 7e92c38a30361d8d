// dashboard-lint: the chart's Grafana dashboards checked against Grafana's published schema, the
// grafana-foundation-sdk (Apache-2.0, no dependencies of its own), for tests/unit/test_dashboards.py.
// A module of its own so that its pins never meet the others'. Built by ../build.sh; the version is
// changed only here.
module pagoda.dev/e2e/tools/dashboard-lint

go 1.26.0

require github.com/grafana/grafana-foundation-sdk/go v0.0.22
