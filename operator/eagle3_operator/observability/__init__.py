"""Observability as code: the PromQL queries, the Grafana dashboard and the Prometheus alerting rules.

`queries` (vLLM and the operator) and `progress_queries` (the stage pods' live progress) are pure (no
dependencies) and `alerts` needs only the standard library; `dashboard`, `panels` and `progress_panels` need
the grafana-foundation-sdk (a `dev` extra), so only `generate` imports them. `generate` writes the committed
files `observability/grafana/eagle3-dashboard.json` and `observability/prometheus/eagle3-rules.yaml`
(`make observability`).
"""
