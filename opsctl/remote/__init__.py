"""Talking to the host and container: SSH transport, mux, agent client, payload."""
