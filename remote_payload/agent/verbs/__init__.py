"""The container agent's verbs: one module per family, dispatched by ``agent/__main__``."""
