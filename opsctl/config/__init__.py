"""Local configuration: paths, YAML files, inventory, playbooks, torch builds, last target."""
