"""trainer tests (see tests/conftest.py for what each folder marks)."""
