"""The control plane's side of the in-sandbox daemon: port, models and the Connect client."""
