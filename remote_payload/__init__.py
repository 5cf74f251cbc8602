"""What opsctl ships into the container: the agent, the trainer, probes and the wire contract.

Stdlib only except the trainer; never imports ``opsctl``.
"""
