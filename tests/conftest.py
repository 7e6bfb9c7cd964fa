"""What the pytest modules under tests/ share: the gate_forward binary (tests/converter/gate_forward.cpp),
which ctest names in KVPOLICY_GATE_FORWARD ($<TARGET_FILE:gate_forward>)."""
import os

import pytest


@pytest.fixture(scope="session")
def gate_forward():
    """The gate_forward binary's path; a clear failure when KVPOLICY_GATE_FORWARD is unset or wrong."""
    path = os.environ.get("KVPOLICY_GATE_FORWARD", "")
    if not path:
        pytest.fail("KVPOLICY_GATE_FORWARD is not set: it names the gate_forward binary "
                    "(ctest sets it: $<TARGET_FILE:gate_forward>)", pytrace=False)
    if not os.path.isfile(path):
        pytest.fail(f"KVPOLICY_GATE_FORWARD={path}: no such file (build the gate_forward target)", pytrace=False)
    return os.path.abspath(path)
