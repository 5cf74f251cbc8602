"""Use cases behind the commands (no click, no rich): deploy, jobs, watch, torch, hosts."""
