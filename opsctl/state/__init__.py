"""Run-time state opsctl keeps between commands (not configuration: nobody writes it by hand).

``last_target``: the container the last command acted on, so the next needs no ``--host``.
"""
