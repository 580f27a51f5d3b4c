"""The Grafana dashboard of the daemon's metrics (`dashboard.py` builds `mrc-daemon.json`)."""
