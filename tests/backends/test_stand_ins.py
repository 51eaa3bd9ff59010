"""The fault-injection options both local stand-ins take (``rlkit emulate sagemaker``, ``rlkit serve
tinker``) are checked once (rlkit/backends/stand_ins.py): the same values are refused by both, at
start-up (a ConfigError naming the flag) and by ``configure`` while serving (``POST .../config``)."""

from __future__ import annotations

import math

import pytest

from rlkit.backends.sagemaker.emulator.options import EmulatorOptions
from rlkit.backends.stand_ins import MAX_LATENCY_MS, FaultOptions, check_fault_flags
from rlkit.backends.tinker.server.state import ServerOptions
from rlkit.errors import ConfigError

GOOD = [("throttle_rate", 0), ("error_rate", 1), ("lost_response_rate", 0.25), ("latency_ms", 0), ("latency_ms", MAX_LATENCY_MS),
        ("latency_ms", 5), ("fault_seed", 0), ("fault_seed", 7)]
BAD = [("error_rate", "lots"), ("error_rate", 1.5), ("error_rate", -0.1), ("error_rate", math.nan), ("error_rate", True),
       ("latency_ms", -1), ("latency_ms", MAX_LATENCY_MS + 1), ("latency_ms", math.inf), ("fault_seed", 1.5), ("fault_seed", "s")]


@pytest.mark.parametrize("options", [EmulatorOptions, ServerOptions])
def test_both_stand_ins_take_and_refuse_the_same_fault_values(options):
    assert set(FaultOptions.FAULT_FIELDS) <= set(options.FAULT_FIELDS)
    for key, value in GOOD:
        assert options.checked(key, value) == value
    for key, value in BAD:
        with pytest.raises(ValueError, match=key):
            options.checked(key, value)


def test_start_up_flags_are_checked_like_configure():
    check_fault_flags(ServerOptions(throttle_rate=0.5, latency_ms=100))
    with pytest.raises(ConfigError, match=r"^--error-rate: error_rate=2 must be a number between 0 and 1$"):
        check_fault_flags(EmulatorOptions(error_rate=2))
    with pytest.raises(ConfigError, match=r"^--latency-ms: "):
        check_fault_flags(ServerOptions(latency_ms=MAX_LATENCY_MS + 1))


def test_the_emulator_copies_its_per_operation_faults():
    ops = {"CreateTrainingSession": 1}
    assert EmulatorOptions.checked("error_ops", ops) == ops and EmulatorOptions.checked("error_ops", ops) is not ops
    assert EmulatorOptions.checked("lost_response_ops", None) == {}
