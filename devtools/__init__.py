"""Development tools, never shipped: the generators of committed files (the chart's copies, the GitOps
example, the dashboard and the rules), run from a checkout with `make chart|examples|observability`."""
