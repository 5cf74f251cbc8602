"""Where the repository and the recorded fixtures are, for tests in any folder."""

from __future__ import annotations

from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
FIXTURES = REPO / "tests" / "fixtures"
