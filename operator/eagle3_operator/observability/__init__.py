"""Observability as code: the PromQL queries, the Grafana dashboard and the Prometheus alerting rules.

`queries` is pure (no dependencies) and `alerts` needs only the standard library; `dashboard` needs the
grafana-foundation-sdk (a `dev` extra), so only `generate` imports it. `generate` writes the committed files
`observability/grafana/eagle3-dashboard.json` and `observability/prometheus/eagle3-rules.yaml`
(`make observability`).
"""
