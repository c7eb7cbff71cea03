"""The fleet seen over time: Prometheus's scrape configuration, alert rules and Grafana dashboards,
generated from what specdeploy knows (the inventory's engines, the gate's recorded acceptance) and
installed by roles/monitoring. Each engine's metric names live once, in engine_metrics."""
