"""Privacy accountants over dp-accounting DpEvents, noise calibration and DpEvent (de)serialisation."""
from components.accountants.accounting import (
    Accountant,
    PrivacyTracker,
    describe_event,
    event_from_json,
    event_to_json,
)

__all__ = ["Accountant", "PrivacyTracker", "describe_event", "event_from_json", "event_to_json"]
