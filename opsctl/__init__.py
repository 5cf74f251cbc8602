"""opsctl: run GPU training jobs in a Proxmox host's LXC containers and keep them healthy.

This package is the side on the user's machine; what runs in the container is ``remote_payload``.
"""
