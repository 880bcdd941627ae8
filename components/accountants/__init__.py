"""Privacy accountants (rdp, pld, zcdp) over dp-accounting DpEvents, noise calibration and DpEvent (de)serialisation."""
from components.accountants.accounting import (
    Accountant,
    OncePerRowTracker,
    PrivacyTracker,
    ScheduledTracker,
    TreeTracker,
    ZCdpAccountant,
    describe_event,
    event_from_json,
    event_to_json,
)

__all__ = ["Accountant", "OncePerRowTracker", "PrivacyTracker", "ScheduledTracker", "TreeTracker", "ZCdpAccountant", "describe_event", "event_from_json", "event_to_json"]
