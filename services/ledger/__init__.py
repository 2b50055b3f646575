"""The usage ledger: running and paused time per sandbox and user, from the event stream."""
