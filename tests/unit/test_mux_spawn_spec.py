"""The host spec a mux server is started with validates again as the same spec, for a pct
host and a direct one (the server refusing it meant no mux ever started)."""

from __future__ import annotations

import pytest

from opsctl.config.inventory import HostSpec
from opsctl.remote import mux_client


@pytest.mark.parametrize("spec", [
    HostSpec(name="pve1", address="10.1.2.6"),
    HostSpec(name="pve1", address="10.1.2.6", port=2222, user="ops", sudo=True),
    HostSpec(name="gpu1", address="10.1.2.7", enter="direct"),
], ids=["pct", "pct-sudo", "direct"])
def test_the_spec_sent_to_the_mux_server_validates_as_the_same_spec(spec):
    assert HostSpec.model_validate_json(mux_client._spec_json(spec)) == spec
