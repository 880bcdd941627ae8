"""Privacy accountants (rdp, pld, zcdp) over dp-accounting DpEvents, noise calibration and DpEvent (de)serialisation."""
from components.accountants.accounting import (
    Accountant,
    FilterTracker,
    OncePerRowTracker,
    PrivacyFilterError,
    PrivacyTracker,
    ScheduledTracker,
    TreeTracker,
    ZCdpAccountant,
    beyond_plan,
    describe_event,
    event_from_json,
    event_to_json,
)

__all__ = ["Accountant", "FilterTracker", "PrivacyFilterError", "OncePerRowTracker", "PrivacyTracker", "ScheduledTracker", "TreeTracker", "ZCdpAccountant", "beyond_plan", "describe_event", "event_from_json", "event_to_json"]
