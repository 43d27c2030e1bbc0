"""One module per CLI sub-command; each exposes a click command named `cmd`."""
